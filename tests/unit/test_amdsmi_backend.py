"""AmdSmiBackend through GpuCollector against a fake ``amdsmi`` module, and the --gpu.backend choice."""

import logging
import sys
from types import SimpleNamespace

import pytest

from exposition import samples, scrape
from fake_amdsmi import ENERGY_RESOLUTION_UJ, MB, STATUS, FakeAmdSmi, install_broken_amdsmi
from promtool import check_metrics
from verl_exporter.app import Exporter
from verl_exporter.collectors.gpu import GpuCollector
from verl_exporter.config import options
from verl_exporter.config.options import OptionsError, load_options
from verl_exporter.gpu import backends as gpu_backends
from verl_exporter.gpu.amdsmi import AmdSmiBackend

HOT_CELSIUS = 85  # VerlGpuHot's threshold


class ManualClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class StubJob:
    configured = True

    def processes(self):
        return [SimpleNamespace(pid=4242)]


def one(values, metric, /, **labels):
    wanted = {k: str(v) for k, v in labels.items() if str(v)}  # an empty label is no label
    found = [v for (n, lbls), v in values.items() if n == metric and wanted.items() <= dict(lbls).items()]
    assert len(found) == 1, f"expected one {metric}{labels}, got {found}"
    return found[0]


def names(values):
    return {name for name, _ in values}


def gpu_text(backend, **kwargs):
    return scrape(gpu=GpuCollector(backend, timeout_seconds=None, **kwargs))


def amd(fake, **kwargs):
    return AmdSmiBackend(fake, **kwargs)


# -- what a healthy GPU serves ------------------------------------------------------------------------


def test_mi300x_serves_every_series_it_reports_in_base_units():
    fake = FakeAmdSmi(gpus=8, model="MI300X")
    values = samples(gpu_text(amd(fake), job=StubJob()))
    assert one(values, "verl_gpus") == 8
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 1
    uuid = "00ff74a1-0000-1000-80a3-4c2d6dbd7a5c"
    info = one(values, "verl_gpu_info", gpu=0, uuid=uuid, name="AMD Instinct MI300X", driver_version="6.8.5",
               cuda_driver_version="", pci_bus_id="0000:05:00.0")
    assert info == 1
    gpu = {"gpu": 0, "uuid": uuid}
    assert one(values, "verl_gpu_up", **gpu) == 1
    assert one(values, "verl_gpu_memory_total_bytes", **gpu) == 196592 * MB  # bytes, not MB
    assert one(values, "verl_gpu_memory_used_bytes", **gpu) == 153600 * MB
    assert one(values, "verl_gpu_memory_free_bytes", **gpu) == (196592 - 153600) * MB
    assert one(values, "verl_gpu_utilization_ratio", **gpu) == pytest.approx(0.97)  # gfx activity
    assert one(values, "verl_gpu_memory_utilization_ratio", **gpu) == pytest.approx(0.45)  # umc activity
    assert one(values, "verl_gpu_power_watts", **gpu) == 650  # current_socket_power on MI300
    assert one(values, "verl_gpu_power_limit_watts", **gpu) == 750  # the power cap, reported in µW
    joules = one(values, "verl_gpu_energy_joules_total", **gpu)
    assert joules == pytest.approx((10**9 + 1000) * ENERGY_RESOLUTION_UJ * 1e-6)  # ticks x µJ, in J
    assert one(values, "verl_gpu_sm_clock_hertz", **gpu) == 2100e6
    assert one(values, "verl_gpu_memory_clock_hertz", **gpu) == 1300e6
    assert one(values, "verl_gpu_ecc_volatile_errors_total", type="corrected", **gpu) == 3
    assert one(values, "verl_gpu_ecc_volatile_errors_total", type="uncorrected", **gpu) == 0
    assert one(values, "verl_gpu_pcie_replay_errors_total", **gpu) == 2
    assert one(values, "verl_gpu_process_memory_bytes", pid=4242, **gpu) == 60 * 1024 * MB
    assert one(values, "verl_job_gpu_memory_bytes") == 60 * 1024 * MB
    assert one(values, "verl_job_gpus") == 1
    # MI300X has no edge sensor, and its hotspot (96 °C here) is not the temperature served.
    absent = {"verl_gpu_temperature_celsius", "verl_gpu_xid_errors_total", "verl_gpu_clock_event_active",
              "verl_gpu_remapped_rows", "verl_gpu_memory_reserved_bytes", "verl_gpu_ecc_errors_total",
              "verl_gpu_pcie_throughput_bytes_per_second"}
    assert not absent & names(values)


def test_the_temperature_served_is_the_edge_one_so_a_healthy_gpu_does_not_run_hot():
    values = samples(gpu_text(amd(FakeAmdSmi(gpus=2, model="MI250X"))))
    temperatures = [v for (name, _), v in values.items() if name == "verl_gpu_temperature_celsius"]
    assert temperatures == [52, 52]  # the edge sensor, not the 97 °C hotspot
    assert max(temperatures) <= HOT_CELSIUS
    assert one(values, "verl_gpu_power_watts", gpu=1) == 480  # average_socket_power before MI300


def test_output_with_a_job_is_promtool_clean():
    text = gpu_text(amd(FakeAmdSmi(gpus=8, model="MI250X")), job=StubJob())
    assert "verl_gpu_temperature_celsius" in text and "verl_job_gpu_memory_bytes" in text
    assert check_metrics(text) == ""


def test_the_first_releases_are_read_through_their_own_function_names_and_keys():
    fake = FakeAmdSmi(gpus=2, model="MI250X", release="legacy")
    values = samples(gpu_text(amd(fake)))
    assert one(values, "verl_gpu_info", gpu=0)
    assert one(values, "verl_gpu_info", gpu=1, driver_version="6.2.4") == 1  # amdsmi_get_gpu_driver_version
    assert one(values, "verl_gpu_power_watts", gpu=0) == 480  # amdsmi_get_power_measure
    assert one(values, "verl_gpu_sm_clock_hertz", gpu=0) == 1700e6  # amdsmi_get_clock_measure, cur_clk
    assert one(values, "verl_gpu_energy_joules_total", gpu=0) > 15e3  # the accumulator under "power"
    assert one(values, "verl_gpu_ecc_volatile_errors_total", gpu=0, type="corrected") == 3
    assert one(values, "verl_gpu_process_memory_bytes", gpu=0, pid=4242) == 60 * 1024 * MB  # via process handles
    assert fake.calls["amdsmi_get_gpu_process_info"] == 1


# -- what a GPU or library does not report ------------------------------------------------------------


def test_na_values_and_unsupported_fields_are_left_out_silently(caplog):
    fake = FakeAmdSmi(gpus=1, model="MI300X")
    fake.na = {"amdsmi_get_gpu_activity": {"umc_activity"}, "amdsmi_get_power_info": {"current_socket_power"},
               "amdsmi_get_clock_info": {"clk"}, "amdsmi_get_energy_count": {"energy_accumulator"}}
    fake.unsupported = {"amdsmi_get_gpu_total_ecc_count", "amdsmi_get_gpu_pci_replay_counter",
                        "amdsmi_get_power_cap_info", "amdsmi_get_gpu_memory_total"}
    with caplog.at_level(logging.WARNING):
        values = samples(gpu_text(amd(fake)))
    served = names(values)
    for name in ("verl_gpu_memory_utilization_ratio", "verl_gpu_power_watts", "verl_gpu_sm_clock_hertz",
                 "verl_gpu_memory_clock_hertz", "verl_gpu_energy_joules_total", "verl_gpu_ecc_volatile_errors_total",
                 "verl_gpu_pcie_replay_errors_total"):
        assert name not in served, name
    assert one(values, "verl_gpu_utilization_ratio", gpu=0) == pytest.approx(0.97)
    assert one(values, "verl_gpu_power_limit_watts", gpu=0) == 750  # power_info's power_limit, in W
    assert one(values, "verl_gpu_memory_total_bytes", gpu=0) == 196592 * MB  # from amdsmi_get_gpu_vram_usage's MB
    assert one(values, "verl_gpu_up", gpu=0) == 1
    assert caplog.records == []


def test_max_uint_sentinels_and_percentages_above_100_are_not_values():
    fake = FakeAmdSmi(gpus=1)
    fake.replace = {"amdsmi_get_gpu_activity": {"gfx_activity": 0xFFFF, "umc_activity": 101, "mm_activity": []},
                    "amdsmi_get_gpu_pci_replay_counter": 0xFFFFFFFFFFFFFFFF}
    values = samples(gpu_text(amd(fake)))
    gone = {"verl_gpu_utilization_ratio", "verl_gpu_memory_utilization_ratio", "verl_gpu_pcie_replay_errors_total"}
    assert gone.isdisjoint(names(values))
    assert one(values, "verl_gpu_power_watts", gpu=0) == 650


def test_other_failures_give_none_and_are_logged_once(caplog):
    fake = FakeAmdSmi(gpus=2)
    fake.failing = {"amdsmi_get_energy_count": "RETRY", "amdsmi_get_gpu_activity": "TIMEOUT"}
    backend = amd(fake)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            values = samples(gpu_text(backend))
    assert "verl_gpu_energy_joules_total" not in names(values)
    assert "verl_gpu_utilization_ratio" not in names(values)
    assert one(values, "verl_gpu_up", gpu=1) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert all("\n" not in m for m in messages)  # amdsmi's multi-line error text made one line
    assert any("energy" in m and "AMDSMI_STATUS_RETRY" in m for m in messages)


# -- a lost GPU ----------------------------------------------------------------------------------------


def test_a_gpu_off_the_bus_is_down_and_the_others_still_report(caplog):
    fake = FakeAmdSmi(gpus=4)
    backend = amd(fake)
    assert one(samples(gpu_text(backend)), "verl_gpu_up", gpu=3) == 1
    fake.lost = {3}
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            values = samples(gpu_text(backend))
    uuid = "03ff74a1-0000-1000-80a3-4c2d6dbd7a5c"
    assert one(values, "verl_gpu_up", gpu=3, uuid=uuid) == 0  # keeps the identity read before
    assert one(values, "verl_gpu_info", gpu=3, name="AMD Instinct MI300X") == 1
    assert [name for name, labels in values if dict(labels).get("gpu") == "3"] == ["verl_gpu_info", "verl_gpu_up"]
    assert one(values, "verl_gpu_up", gpu=2) == 1 and one(values, "verl_gpus") == 4
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 1
    assert len([r for r in caplog.records if "is lost" in r.getMessage()]) == 1
    fake.lost = set()
    assert one(samples(gpu_text(backend)), "verl_gpu_up", gpu=3) == 1


@pytest.mark.parametrize("status", ["IO", "DRM_ERROR"])
def test_other_lost_gpu_statuses(status):
    fake = FakeAmdSmi(gpus=2)
    fake.lost, fake.lost_status = {0}, status
    values = samples(gpu_text(amd(fake)))
    assert one(values, "verl_gpu_up", gpu=0) == 0
    assert one(values, "verl_gpu_up", gpu=1) == 1


def test_a_gpu_that_falls_silent_after_answering_is_down():
    fake = FakeAmdSmi(gpus=2)
    backend = amd(fake)
    assert one(samples(gpu_text(backend)), "verl_gpu_up", gpu=1) == 1
    fake.silent = {1}  # every call now says NOT_SUPPORTED, as when its sysfs files are gone
    values = samples(gpu_text(backend))
    assert one(values, "verl_gpu_up", gpu=1) == 0
    assert one(values, "verl_gpu_up", gpu=0) == 1


def test_a_gpu_that_never_answered_is_not_called_lost():
    fake = FakeAmdSmi(gpus=1)
    fake.silent = {0}
    assert one(samples(gpu_text(amd(fake))), "verl_gpu_up", gpu=0) == 1


# -- no library, no driver -------------------------------------------------------------------------------


def test_library_not_installed_is_one_clear_line_and_retried(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi raises ImportError
    clock = ManualClock()
    backend = AmdSmiBackend(clock=clock, retry_seconds=60)
    collector = GpuCollector(backend, timeout_seconds=None)
    values = samples(scrape(gpu=collector))
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 0
    assert not {name for name in names(values) if name.startswith("verl_gpu")}
    assert "amdsmi Python package is not installed" in backend.error and "\n" not in backend.error
    assert "retrying every 60 s" in backend.error
    fake = FakeAmdSmi(gpus=2)
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    clock.now += 30
    assert not backend.ensure_initialized()  # not before retry_seconds
    clock.now += 31
    assert one(samples(scrape(gpu=collector)), "verl_gpus") == 2  # imported lazily, now that it is there


def test_a_binding_without_libamd_smi_so_fails_to_import_cleanly(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(install_broken_amdsmi(tmp_path)))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    backend = AmdSmiBackend()
    assert not backend.ensure_initialized()
    assert "cannot load ROCm's libamd_smi.so" in backend.error
    assert "cannot open shared object file" in backend.error and "\n" not in backend.error
    assert capsys.readouterr().out == ""  # what the binding printed went into the error


def test_driver_not_loaded_then_loaded(caplog):
    fake = FakeAmdSmi(gpus=2)
    fake.init_status = "DRIVER_NOT_LOADED"
    clock = ManualClock()
    backend = amd(fake, clock=clock, retry_seconds=60)
    collector = GpuCollector(backend, timeout_seconds=None)
    for _ in range(3):
        values = samples(scrape(gpu=collector))
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 0
    assert fake.calls["amdsmi_init"] == 1  # retried at most every retry_seconds
    assert backend.error.startswith("amdgpu driver not loaded") and not backend.available
    fake.init_status = None
    clock.now += 60
    assert one(samples(scrape(gpu=collector)), "verl_gpus") == 2
    assert backend.error is None and backend.available


def test_init_failure_other_than_the_driver_names_the_status():
    fake = FakeAmdSmi(gpus=2)
    fake.init_status = "INIT_ERROR"
    backend = amd(fake)
    assert not backend.ensure_initialized()
    assert "amdsmi init failed (AMDSMI_STATUS_INIT_ERROR" in backend.error and "code 18" in backend.error


def test_no_gpu_listed_is_an_init_failure_and_shuts_amdsmi_down():
    fake = FakeAmdSmi(gpus=0)
    backend = amd(fake)
    assert not backend.ensure_initialized()
    assert backend.error.startswith("amdsmi sees no AMD GPU")
    assert not fake.initialized


def test_shutdown_releases_the_library_and_the_interface_has_no_nvidia_extras():
    fake = FakeAmdSmi(gpus=1)
    backend = amd(fake)
    backend.start()
    assert backend.cuda_driver_version() is None and backend.xid_counts() == {}
    assert backend.start_xid_watcher() is False
    backend.stop()
    assert not fake.initialized and fake.calls["amdsmi_shut_down"] == 1


# -- --gpu.backend -----------------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 (pynvml's name)
    pass


def fake_pynvml(works):
    def init():
        if not works:
            raise NVMLError_LibraryNotFound()

    return SimpleNamespace(NVMLError=NVMLError, NVMLError_LibraryNotFound=NVMLError_LibraryNotFound,
                           nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
                           nvmlSystemGetDriverVersion=lambda: "550.54.15")


def test_auto_takes_amdsmi_when_nvml_does_not_initialise(caplog):
    fake = FakeAmdSmi(gpus=8)
    backend = gpu_backends.make_backend("auto", nvml_module=fake_pynvml(False), amdsmi_module=fake)
    with caplog.at_level(logging.INFO, logger="verl_exporter.gpu.backends"):
        values = samples(gpu_text(backend))
    assert backend.library == "amdsmi"
    assert one(values, "verl_gpus") == 8 and one(values, "verl_gpu_up", gpu=7) == 1
    [chosen] = [r.getMessage() for r in caplog.records]
    assert chosen.startswith("GPU metrics from amdsmi (AMD ROCm): 8 GPUs, driver 6.8.5")
    assert "NVML (NVIDIA) did not initialise: NVML library (libnvidia-ml.so.1) not found" in chosen


def test_auto_takes_nvml_first_and_leaves_amdsmi_alone():
    fake = FakeAmdSmi(gpus=8)
    nvml = fake_pynvml(True)
    backend = gpu_backends.make_backend("auto", nvml_module=nvml, amdsmi_module=fake)
    backend.candidates[0][1].watch_xid = False
    assert backend.ensure_initialized() and backend.library == "nvml"
    assert backend.device_count() == 2 and backend.driver_version() == "550.54.15"
    assert fake.calls["amdsmi_init"] == 0


def test_auto_with_neither_gives_both_reasons_in_one_line():
    fake = FakeAmdSmi(gpus=8)
    fake.init_status = "DRIVER_NOT_LOADED"
    backend = gpu_backends.make_backend("auto", nvml_module=fake_pynvml(False), amdsmi_module=fake)
    values = samples(gpu_text(backend))
    assert one(values, "verl_exporter_collector_success", collector="gpu") == 0
    assert backend.error == (
        "no GPU library initialises (NVML (NVIDIA): NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver "
        "visible here; amdsmi (AMD ROCm): amdgpu driver not loaded: no AMD GPU visible here); GPU metrics are "
        "off, retrying every 60 s")


def test_a_named_backend_is_the_only_one_tried_and_keeps_its_own_message():
    fake = FakeAmdSmi(gpus=1)
    fake.init_status = "DRIVER_NOT_LOADED"
    backend = gpu_backends.make_backend("nvml", nvml_module=fake_pynvml(False), amdsmi_module=fake)
    assert not backend.ensure_initialized()
    assert backend.error.startswith("NVML library (libnvidia-ml.so.1) not found")
    assert fake.calls["amdsmi_init"] == 0
    backend = gpu_backends.make_backend("amdsmi", nvml_module=fake_pynvml(True), amdsmi_module=fake)
    assert not backend.ensure_initialized()
    assert backend.error.startswith("amdgpu driver not loaded")
    with pytest.raises(ValueError, match="unknown GPU backend 'rocm'"):
        gpu_backends.make_backend("rocm")


def test_the_option_and_its_choices():
    assert options.GPU_BACKENDS == gpu_backends.BACKENDS
    assert load_options([]).gpu_backend == "auto"
    assert load_options(["--gpu.backend", "AMDSMI"]).gpu_backend == "amdsmi"
    with pytest.raises(OptionsError, match="gpu.backend.*must be one of auto, nvml, amdsmi"):
        load_options(["--gpu.backend", "rocm"])


def test_the_exporter_wires_the_flag_and_gpu_fake_still_wins(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi(gpus=3))
    app = Exporter(load_options(["--gpu.backend", "amdsmi", "--no-forensics"]))
    assert [library for library, _ in app.gpu_backend.candidates] == ["amdsmi"]
    assert app.gpu_backend.ensure_initialized() and app.gpu_backend.device_count() == 3
    app.gpu_backend.stop()
    app = Exporter(load_options(["--gpu.backend", "amdsmi", "--gpu.fake", "healthy:2", "--no-forensics"]))
    assert type(app.gpu_backend).__name__ == "FakeNvmlBackend"


def test_status_codes_are_read_from_the_binding():
    assert AmdSmiBackend()._codes["NOT_FOUND"] == STATUS["NOT_FOUND"]  # amdsmi_wrapper's values by default
    fake = FakeAmdSmi(gpus=1)
    fake.amdsmi_wrapper.AMDSMI_STATUS_NOT_FOUND = 77
    assert amd(fake)._codes["NOT_FOUND"] == 77
