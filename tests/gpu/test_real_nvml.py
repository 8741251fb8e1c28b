"""NvmlBackend and GpuCollector against the real NVIDIA driver; skipped where there is none."""

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from promtool import check_metrics
from verl_exporter.collectors import CollectorRunner
from verl_exporter.collectors.gpu import GpuCollector
from verl_exporter.gpu.nvml import NvmlBackend

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend():
    nvml = NvmlBackend()
    if not nvml.ensure_initialized():  # calls pynvml.nvmlInit()
        pytest.skip(f"no usable NVIDIA driver: {nvml.error}")
    yield nvml
    nvml.shutdown()


def test_the_driver_sees_gpus_and_reports_sane_values(backend):
    count = backend.device_count()
    assert count > 0
    assert backend.driver_version()
    for index in range(count):
        r = backend.read_device(index)
        assert r.up, f"GPU {index} is lost"
        assert r.uuid.startswith(("GPU-", "MIG-")) and r.name
        assert r.memory_total_bytes > 0
        assert 0 <= r.memory_used_bytes <= r.memory_total_bytes
        assert 0 <= r.utilization_ratio <= 1
        assert 0 <= r.temperature_celsius <= 120
        if r.power_watts is not None:
            assert 0 < r.power_watts < 2000
        if r.sm_clock_hertz is not None:
            assert r.sm_clock_hertz > 1e6  # hertz, not MHz
        if r.clock_event_reasons is not None:
            assert set(r.clock_event_reasons.values()) <= {True, False}
        for pid, used in backend.running_processes(index):
            assert pid > 0 and (used is None or used >= 0)


def test_xid_watcher_starts_or_declines_without_raising(backend):
    started = backend.start_xid_watcher()
    print(f"XID watcher started: {started}")
    assert backend.xid_counts() == {} or all(count > 0 for count in backend.xid_counts().values())


def test_collector_output_is_promtool_clean(backend):
    registry = CollectorRegistry()
    registry.register(CollectorRunner({"gpu": GpuCollector(backend)}))
    text = generate_latest(registry).decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    assert values["verl_gpus"] == backend.device_count()
    assert "verl_exporter_collector_success{collector=\"gpu\"} 1.0" in text
    assert check_metrics(text) == ""
