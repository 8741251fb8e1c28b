import logging
import re
from pathlib import Path

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exposition import samples, scrape
from promtool import check_metrics
from servers import wait_until
from verl_exporter.collectors import CollectorRunner
from verl_exporter.collectors.gpu import GpuCollector
from verl_exporter.collectors.host import HostCollector
from verl_exporter.gpu.fake import GIB, H100_MEMORY_BYTES, FakeNvmlBackend, fake_backend_from_spec
from verl_exporter.gpu.nvml import CLOCK_EVENT_REASONS


class ManualClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class StubJob:
    configured = True

    def __init__(self, *pids):
        self._pids = pids

    def processes(self):
        return [type("Proc", (), {"pid": pid})() for pid in self._pids]


class ThisProcessAsJob:
    """A job of one live process (this one), so the host collector serves every job series."""

    configured = True

    def processes(self):
        return [psutil.Process()]




def series(values, name, **labels):
    """Samples of ``name`` whose labels include ``labels``, keyed by their full label dict."""
    wanted = {k: str(v) for k, v in labels.items()}
    return {
        key[1]: value
        for key, value in values.items()
        if key[0] == name and wanted.items() <= dict(key[1]).items()
    }


def one(values, name, **labels):
    found = series(values, name, **labels)
    assert len(found) == 1, f"expected one {name}{labels}, got {found}"
    return next(iter(found.values()))


def gpu_scrape(backend, **kwargs):
    return samples(scrape(gpu=GpuCollector(backend, **kwargs)))


def test_healthy_gpus_report_every_series_in_base_units():
    values = gpu_scrape(FakeNvmlBackend("healthy", gpus=8))
    assert one(values, "verl_gpus") == 8
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 1
    for gpu in range(8):
        uuid = FakeNvmlBackend.uuid_of(gpu)
        labels = {"gpu": gpu, "uuid": uuid}
        assert one(values, "verl_gpu_up", **labels) == 1
        info = series(values, "verl_gpu_info", **labels)
        assert [dict(k)["name"] for k in info] == ["NVIDIA H100 80GB HBM3"]
        assert dict(next(iter(info)))["driver_version"] == "550.54.15"
        assert dict(next(iter(info)))["cuda_driver_version"] == "12.4"
        assert one(values, "verl_gpu_memory_total_bytes", **labels) == H100_MEMORY_BYTES
        used = one(values, "verl_gpu_memory_used_bytes", **labels)
        assert 69 * GIB < used < 71 * GIB
        assert one(values, "verl_gpu_memory_free_bytes", **labels) > 0
        assert one(values, "verl_gpu_memory_reserved_bytes", **labels) > 0
        assert 0.8 <= one(values, "verl_gpu_utilization_ratio", **labels) <= 1.0
        assert 0.0 <= one(values, "verl_gpu_memory_utilization_ratio", **labels) <= 1.0
        assert 55 <= one(values, "verl_gpu_temperature_celsius", **labels) <= 70
        assert 500 <= one(values, "verl_gpu_power_watts", **labels) <= 600
        assert one(values, "verl_gpu_power_limit_watts", **labels) == 700
        assert one(values, "verl_gpu_sm_clock_hertz", **labels) == 1.98e9
        assert one(values, "verl_gpu_memory_clock_hertz", **labels) == 2.619e9
        reasons = series(values, "verl_gpu_clock_event_active", **labels)
        assert sorted(dict(k)["reason"] for k in reasons) == sorted(CLOCK_EVENT_REASONS)
        assert set(reasons.values()) == {0.0}
        assert one(values, "verl_gpu_ecc_errors_total", type="uncorrected", **labels) == 0
        assert one(values, "verl_gpu_remapped_rows", state="failure", **labels) == 0
        assert one(values, "verl_gpu_pcie_replay_errors_total", **labels) == 0
        assert one(values, "verl_gpu_process_memory_bytes", **labels) == 69 * GIB
    assert not series(values, "verl_gpu_xid_errors_total")
    assert not series(values, "verl_gpu_pcie_throughput_bytes_per_second")
    assert not series(values, "verl_job_gpus")


def test_every_gpu_series_carries_gpu_and_uuid_labels():
    values = gpu_scrape(FakeNvmlBackend("hot", gpus=2))
    gpu_series = [key for key in values if key[0].startswith("verl_gpu_") and key[0] != "verl_gpus"]
    assert gpu_series
    for name, labels in gpu_series:
        assert {"gpu", "uuid"} <= dict(labels).keys(), name


def test_energy_is_a_counter_that_grows_with_time():
    clock = ManualClock()
    collector = GpuCollector(FakeNvmlBackend("healthy", gpus=1, clock=clock))
    first = one(samples(scrape(gpu=collector)), "verl_gpu_energy_joules_total", gpu=0)
    clock.now += 60
    second = one(samples(scrape(gpu=collector)), "verl_gpu_energy_joules_total", gpu=0)
    assert second - first == pytest.approx(550 * 60)
    text = scrape(gpu=collector)
    assert "# TYPE verl_gpu_energy_joules_total counter" in text


def test_idle_gpu_holds_memory_at_zero_utilization():
    values = gpu_scrape(FakeNvmlBackend("idle", gpus=2))
    assert one(values, "verl_gpu_utilization_ratio", gpu=1) == 0
    assert one(values, "verl_gpu_memory_used_bytes", gpu=1) > 60 * GIB
    assert one(values, "verl_gpu_clock_event_active", gpu=1, reason="gpu_idle") == 1


def test_old_driver_omits_reserved_memory_and_remapped_rows():
    values = gpu_scrape(FakeNvmlBackend("old-driver", gpus=2))
    assert not series(values, "verl_gpu_memory_reserved_bytes")
    assert not series(values, "verl_gpu_remapped_rows")
    assert one(values, "verl_gpu_memory_used_bytes", gpu=0) > 0
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 1


def test_unsupported_fields_are_omitted_not_zero():
    values = gpu_scrape(FakeNvmlBackend("not-supported", gpus=2))
    for name in ("verl_gpu_ecc_errors_total", "verl_gpu_power_limit_watts", "verl_gpu_clock_event_active"):
        assert not series(values, name), name
    assert one(values, "verl_gpu_temperature_celsius", gpu=0) > 0
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 1


def test_a_lost_gpu_reports_down_while_the_others_still_report():
    values = gpu_scrape(FakeNvmlBackend("gpu-lost", gpus=8))
    assert one(values, "verl_gpus") == 8
    assert one(values, "verl_gpu_up", gpu=3) == 0
    assert not series(values, "verl_gpu_memory_used_bytes", gpu=3)
    assert not series(values, "verl_gpu_process_memory_bytes", gpu=3)
    for gpu in (0, 1, 2, 4, 5, 6, 7):
        assert one(values, "verl_gpu_up", gpu=gpu) == 1
        assert one(values, "verl_gpu_memory_used_bytes", gpu=gpu) > 0
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 1


def test_a_gpu_lost_mid_run_keeps_its_uuid():
    collector = GpuCollector(FakeNvmlBackend("gpu-lost", gpus=4, lost_after_reads=2))
    uuid = FakeNvmlBackend.uuid_of(3)
    for _ in range(2):
        assert one(samples(scrape(gpu=collector)), "verl_gpu_up", gpu=3, uuid=uuid) == 1
    values = samples(scrape(gpu=collector))
    assert one(values, "verl_gpu_up", gpu=3, uuid=uuid) == 0
    assert not series(values, "verl_gpu_temperature_celsius", gpu=3)


def test_hot_gpu_shows_throttling_xid_and_memory_errors():
    values = gpu_scrape(FakeNvmlBackend("hot", gpus=8))
    uuid = FakeNvmlBackend.uuid_of(0)
    assert one(values, "verl_gpu_temperature_celsius", gpu=0) == 92
    assert one(values, "verl_gpu_clock_event_active", gpu=0, reason="hw_thermal_slowdown") == 1
    assert one(values, "verl_gpu_clock_event_active", gpu=0, reason="sw_power_cap") == 1
    assert one(values, "verl_gpu_clock_event_active", gpu=0, reason="sw_thermal_slowdown") == 0
    assert one(values, "verl_gpu_xid_errors_total", gpu=0, uuid=uuid, xid=79) == 1
    assert one(values, "verl_gpu_ecc_errors_total", gpu=0, type="uncorrected") == 1
    assert one(values, "verl_gpu_remapped_rows", gpu=0, state="failure") == 1
    assert one(values, "verl_gpu_temperature_celsius", gpu=1) < 90
    assert one(values, "verl_gpu_ecc_errors_total", gpu=1, type="uncorrected") == 0


def test_process_memory_follows_the_processes_and_drops_exited_ones():
    processes = {0: [(111, 1 * GIB), (222, 2 * GIB)], 1: [(333, None)]}
    collector = GpuCollector(FakeNvmlBackend("healthy", gpus=2, processes=processes))
    values = samples(scrape(gpu=collector))
    assert one(values, "verl_gpu_process_memory_bytes", gpu=0, pid=111) == GIB
    assert one(values, "verl_gpu_process_memory_bytes", gpu=0, pid=222) == 2 * GIB
    assert not series(values, "verl_gpu_process_memory_bytes", pid=333)  # memory not reported: left out
    processes[0].pop(0)
    values = samples(scrape(gpu=collector))
    assert not series(values, "verl_gpu_process_memory_bytes", pid=111)
    assert one(values, "verl_gpu_process_memory_bytes", gpu=0, pid=222) == 2 * GIB


def test_job_gpu_memory_sums_the_job_processes_only():
    processes = {0: [(111, 1 * GIB), (222, 2 * GIB)], 1: [(333, None)], 2: [(444, 4 * GIB)]}
    backend = FakeNvmlBackend("healthy", gpus=3, processes=processes)
    values = gpu_scrape(backend, job=StubJob(111, 333, 999))
    assert one(values, "verl_job_gpu_memory_bytes") == GIB
    assert one(values, "verl_job_gpus") == 2
    values = gpu_scrape(backend, job=StubJob(555))
    assert one(values, "verl_job_gpu_memory_bytes") == 0
    assert one(values, "verl_job_gpus") == 0


def test_pcie_throughput_appears_only_when_sampling_is_enabled():
    values = gpu_scrape(FakeNvmlBackend("healthy", gpus=1, pcie_throughput=True))
    assert one(values, "verl_gpu_pcie_throughput_bytes_per_second", gpu=0, direction="tx") > 1e9
    assert one(values, "verl_gpu_pcie_throughput_bytes_per_second", gpu=0, direction="rx") > 1e9


def test_missing_library_fails_only_the_gpu_collector_and_logs_once(caplog):
    backend = FakeNvmlBackend("library-missing")
    runner_collectors = {"gpu": GpuCollector(backend), "host": HostCollector()}
    registry = CollectorRegistry()
    registry.register(CollectorRunner(runner_collectors))
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            values = samples(generate_latest(registry).decode())
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 0
    assert one(values, "verl_exporter_collector_success", collector="host") == 1
    assert one(values, "verl_host_cpus") >= 1
    assert not [key for key in values if key[0].startswith("verl_gpu")]
    failures = [r.getMessage() for r in caplog.records if "collector gpu failed" in r.getMessage()]
    assert len(failures) == 1
    assert "libnvidia-ml.so.1" in failures[0]


def test_describe_does_not_touch_the_backend():
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"describe() called backend.{name}")

    registry = CollectorRegistry()
    registry.register(CollectorRunner({"gpu": GpuCollector(Untouchable(), job=StubJob(1))}))
    names = {family.name for family in GpuCollector(Untouchable(), job=StubJob(1)).describe()}
    assert {"verl_gpus", "verl_gpu_info", "verl_gpu_energy_joules", "verl_job_gpus"} <= names


def test_a_backend_error_is_reported_as_failure_not_raised():
    class Broken(FakeNvmlBackend):
        def read_device(self, index):
            raise RuntimeError("driver returned garbage")

    values = samples(scrape(gpu=GpuCollector(Broken())))
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 0
    assert not series(values, "verl_gpus")


def test_a_hung_read_fails_the_scrape_and_is_not_stacked():
    backend = FakeNvmlBackend("hang", gpus=8, hang_seconds=30)
    collector = GpuCollector(backend, timeout_seconds=0.2)
    try:
        for _ in range(3):
            values = samples(scrape(gpu=collector))
            assert one(values, "verl_exporter_collector_success", collector="gpu") == 0
            assert not series(values, "verl_gpus")
        assert backend.reads == 1  # later scrapes did not start reads of their own
        assert "still stuck" in collector.last_error
    finally:
        backend.release()
    wait_until(
        lambda: one(samples(scrape(gpu=collector)), "verl_exporter_collector_success", collector="gpu") == 1,
        timeout=10,
        message="the GPU collector to recover once the read returns",
    )


def test_fake_backend_spec_parsing():
    backend = fake_backend_from_spec("hot:4")
    assert (backend.scenario, backend.gpus) == ("hot", 4)
    assert fake_backend_from_spec("idle").gpus == 8
    with pytest.raises(ValueError, match="unknown fake GPU scenario"):
        fake_backend_from_spec("melting:8")
    with pytest.raises(ValueError, match="SCENARIO"):
        fake_backend_from_spec("healthy:lots")


def test_full_output_with_eight_gpus_and_host_is_promtool_clean():
    registry = CollectorRegistry()
    runner = CollectorRunner(
        {"gpu": GpuCollector(FakeNvmlBackend("hot", gpus=8, pcie_throughput=True), job=StubJob(3_900_000)),
         "host": HostCollector(job=ThisProcessAsJob())}
    )
    registry.register(runner)
    text = generate_latest(registry).decode()
    assert "verl_gpu_xid_errors_total" in text and "verl_host_cpu_seconds_total" in text
    assert check_metrics(text) == ""


def test_the_metrics_doc_lists_exactly_the_served_gpu_host_and_job_series():
    runner = CollectorRunner(
        {"gpu": GpuCollector(FakeNvmlBackend("hot", gpus=2, pcie_throughput=True), job=StubJob(1)),
         "host": HostCollector(job=ThisProcessAsJob())}
    )
    served = {name for name, _ in samples(scrape(**runner.collectors)) if not name.startswith("verl_exporter_")}
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics-gpu-host.md").read_text()
    documented = set(re.findall(r"`(verl_(?:gpu|gpus|host|job)\w*)`", doc)) - {"verl_gpu_count"}
    assert served == documented
