"""AmdSmiBackend and GpuCollector against a real AMD GPU driver (amdsmi); skipped where there is none."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exposition import scrape
from promtool import check_metrics
from verl_exporter.collectors.gpu import GpuCollector
from verl_exporter.gpu.amdsmi import AmdSmiBackend

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend():
    amd = AmdSmiBackend()
    if not amd.ensure_initialized():  # imports amdsmi, calls amdsmi_init()
        pytest.skip(f"no usable AMD GPU driver: {amd.error}")
    yield amd
    amd.shutdown()


def test_the_driver_sees_gpus_and_reports_sane_values(backend):
    count = backend.device_count()
    assert count > 0
    assert backend.driver_version()
    for index in range(count):
        r = backend.read_device(index)
        assert r.up, f"GPU {index} is lost"
        assert r.uuid and r.name and r.pci_bus_id
        assert r.memory_total_bytes > 1 << 30  # bytes, not MB
        assert 0 <= r.memory_used_bytes <= r.memory_total_bytes
        for ratio in (r.utilization_ratio, r.memory_utilization_ratio):
            assert ratio is None or 0 <= ratio <= 1
        if r.temperature_celsius is not None:
            assert 0 < r.temperature_celsius < 120  # the edge temperature, in °C
        if r.power_watts is not None:
            assert 0 < r.power_watts < 2000
        if r.power_limit_watts is not None:
            assert 50 < r.power_limit_watts < 2000  # watts, not µW
        if r.energy_joules is not None:
            assert r.energy_joules > 0
        if r.sm_clock_hertz is not None:
            assert r.sm_clock_hertz > 1e6  # hertz, not MHz
        for pid, used in backend.running_processes(index):
            assert pid > 0 and (used is None or used >= 0)
    assert backend.cuda_driver_version() is None and backend.xid_counts() == {}


def test_collector_output_is_promtool_clean(backend):
    text = scrape(gpu=GpuCollector(backend))
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    assert values["verl_gpus"] == backend.device_count()
    assert "verl_exporter_collector_success{collector=\"gpu\"} 1.0" in text
    assert check_metrics(text) == ""
