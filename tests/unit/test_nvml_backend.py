"""NvmlBackend's value conversions and NVML error rules, against a fake pynvml module."""

import logging
import queue
from collections import Counter
from types import SimpleNamespace

import pytest

from servers import wait_until
from verl_exporter.gpu.backend import GpuUnavailable
from verl_exporter.gpu.nvml import NvmlBackend, format_cuda_version


class NVMLError(Exception):
    def __str__(self):
        return type(self).__name__.replace("NVMLError_", "")


ERROR_NAMES = [
    "NotSupported", "NoPermission", "GpuIsLost", "Unknown", "ResetRequired", "LibraryNotFound",
    "DriverNotLoaded", "FunctionNotFound", "ArgumentVersionMismatch", "Timeout", "Uninitialized",
]
ERRORS = {name: type(f"NVMLError_{name}", (NVMLError,), {}) for name in ERROR_NAMES}


class FakePynvml:
    """Enough of pynvml for NvmlBackend; ``fail[(function, gpu)]`` makes a call raise that error."""

    nvmlMemory_v2 = 0x02000028

    def __init__(self, gpus=2):
        self.NVMLError = NVMLError
        for name, cls in ERRORS.items():
            setattr(self, f"NVMLError_{name}", cls)
        self.gpus = gpus
        self.fail: dict = {}
        self.calls = Counter()
        self.events: queue.Queue = queue.Queue()
        self.freed = []

    def _check(self, function, gpu=None):
        self.calls[function] += 1
        error = self.fail.get((function, gpu)) or self.fail.get((function, None))
        if error is not None:
            raise ERRORS[error]()

    def __getattr__(self, function):
        if not function.startswith("nvml"):
            raise AttributeError(function)
        handler = getattr(self, "_" + function)

        def call(*args, **kwargs):
            gpu = args[0] if args and isinstance(args[0], int) else None
            self._check(function, gpu)
            return handler(*args, **kwargs)

        return call

    def _nvmlInit(self):
        pass

    def _nvmlShutdown(self):
        pass

    def _nvmlDeviceGetCount(self):
        return self.gpus

    def _nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def _nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def _nvmlDeviceGetHandleByIndex(self, index):
        return index  # a handle is just the index here

    def _nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:08d}"

    def _nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def _nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{h + 0x18:02X}:00.0".encode())

    def _nvmlDeviceGetMemoryInfo(self, h, version=None):
        if version:
            return SimpleNamespace(total=80, reserved=1, used=60, free=19)
        return SimpleNamespace(total=80, used=61, free=19)

    def _nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=93, memory=45)

    def _nvmlDeviceGetTemperature(self, h, sensor):
        return 64

    def _nvmlDeviceGetPowerUsage(self, h):
        return 551_250  # mW

    def _nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def _nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 123_456_789  # mJ

    def _nvmlDeviceGetClockInfo(self, h, clock):
        return {1: 1980, 2: 2619}[clock]  # MHz

    def _nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x44

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0x1

    def _nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        return {(0, 1): 7, (1, 1): 2, (0, 0): 3, (1, 0): 0}[(error_type, counter)]

    def _nvmlDeviceGetRemappedRows(self, h):
        return (4, 1, 0, 1)

    def _nvmlDeviceGetPcieReplayCounter(self, h):
        return 5

    def _nvmlDeviceGetPcieThroughput(self, h, counter):
        return [1000, 2000][counter]  # KB/s

    def _nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=100 + h, usedGpuMemory=1 << 30)]

    def _nvmlDeviceGetComputeRunningProcesses_v2(self, h):
        return [SimpleNamespace(pid=200 + h, usedGpuMemory=None)]

    def _nvmlEventSetCreate(self):
        return "event-set"

    def _nvmlDeviceRegisterEvents(self, h, types, event_set):
        pass

    def _nvmlEventSetWait_v2(self, event_set, timeout_ms):
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise ERRORS["Timeout"]() from None

    def _nvmlDeviceGetIndex(self, h):
        return h

    def _nvmlEventSetFree(self, event_set):
        self.freed.append(event_set)


class ManualClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def ready_backend(nv=None, **kwargs):
    kwargs.setdefault("watch_xid", False)
    backend = NvmlBackend(nv or FakePynvml(), **kwargs)
    assert backend.ensure_initialized(), backend.error
    return backend


def test_read_device_converts_to_base_units():
    backend = ready_backend()
    r = backend.read_device(1)
    assert (r.index, r.uuid, r.name, r.up) == (1, "GPU-00000001", "NVIDIA H100 80GB HBM3", True)
    assert r.pci_bus_id == "00000000:19:00.0"  # decoded from bytes
    assert (r.memory_total_bytes, r.memory_used_bytes, r.memory_free_bytes) == (80, 60, 19)
    assert r.memory_reserved_bytes == 1
    assert (r.utilization_ratio, r.memory_utilization_ratio) == (0.93, 0.45)
    assert r.temperature_celsius == 64
    assert r.power_watts == pytest.approx(551.25)
    assert r.power_limit_watts == pytest.approx(700.0)
    assert r.energy_joules == pytest.approx(123_456.789)
    assert (r.sm_clock_hertz, r.memory_clock_hertz) == (1.98e9, 2.619e9)
    active = {name for name, on in r.clock_event_reasons.items() if on}
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}
    assert r.ecc_errors == {"corrected": 7, "uncorrected": 2}
    assert r.ecc_volatile_errors == {"corrected": 3, "uncorrected": 0}
    assert r.remapped_rows == {"correctable": 4, "uncorrectable": 1, "pending": 0, "failure": 1}
    assert r.pcie_replay_errors == 5
    assert r.pcie_throughput_bytes_per_second is None
    assert backend.driver_version() == "550.54.15"
    assert backend.cuda_driver_version() == "12.4"
    assert backend.running_processes(1) == [(101, 1 << 30)]


def test_cuda_version_formatting():
    assert format_cuda_version(12040) == "12.4"
    assert format_cuda_version(11080) == "11.8"


@pytest.mark.parametrize("error", ["NotSupported", "NoPermission"])
def test_unsupported_fields_are_none_never_zero_and_not_logged(error, caplog):
    nv = FakePynvml()
    for function in ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
                     "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage"):
        nv.fail[(function, None)] = error
    with caplog.at_level(logging.WARNING, logger="verl_exporter.gpu.nvml"):
        r = ready_backend(nv).read_device(0)
    assert not caplog.records
    assert r.up
    assert (r.power_limit_watts, r.ecc_errors, r.ecc_volatile_errors, r.remapped_rows) == (None, None, None, None)
    assert (r.energy_joules, r.power_watts) == (None, None)
    assert r.temperature_celsius == 64


def test_memory_falls_back_to_v1_once_on_an_old_driver():
    nv = FakePynvml()
    v1_only = nv._nvmlDeviceGetMemoryInfo

    def old_driver(h, version=None):
        if version:
            raise ERRORS["FunctionNotFound"]()
        return v1_only(h)

    nv._nvmlDeviceGetMemoryInfo = old_driver
    backend = ready_backend(nv)
    first, second = backend.read_device(0), backend.read_device(1)
    assert (first.memory_total_bytes, first.memory_used_bytes, first.memory_reserved_bytes) == (80, 61, None)
    assert (second.memory_total_bytes, second.memory_reserved_bytes) == (80, None)
    assert nv.calls["nvmlDeviceGetMemoryInfo"] == 3  # v2 tried once, then v1 for both GPUs


def test_clock_reasons_fall_back_to_the_throttle_reasons_call():
    nv = FakePynvml()
    nv.fail[("nvmlDeviceGetCurrentClocksEventReasons", None)] = "FunctionNotFound"
    r = ready_backend(nv).read_device(0)
    assert {name for name, on in r.clock_event_reasons.items() if on} == {"gpu_idle"}


@pytest.mark.parametrize("error", ["GpuIsLost", "Unknown"])
def test_a_lost_gpu_is_down_and_the_others_still_read(error):
    nv = FakePynvml(gpus=3)
    backend = ready_backend(nv)
    assert backend.read_device(1).up
    nv.fail[("nvmlDeviceGetTemperature", 1)] = error
    lost = backend.read_device(1)
    assert (lost.up, lost.uuid, lost.memory_used_bytes) == (False, "GPU-00000001", None)
    nv.fail[("nvmlDeviceGetComputeRunningProcesses", 1)] = error
    assert backend.running_processes(1) == []
    assert backend.read_device(0).up and backend.read_device(2).up
    assert backend.read_device(0).temperature_celsius == 64


def test_a_gpu_lost_before_its_first_read_has_no_uuid():
    nv = FakePynvml()
    nv.fail[("nvmlDeviceGetHandleByIndex", 1)] = "GpuIsLost"
    backend = ready_backend(nv)
    lost = backend.read_device(1)
    assert (lost.up, lost.uuid) == (False, "")
    assert backend.running_processes(1) == []
    assert backend.read_device(0).up


def test_an_unexpected_field_error_is_logged_once_and_omitted(caplog):
    nv = FakePynvml()
    nv.fail[("nvmlDeviceGetPcieReplayCounter", None)] = "Uninitialized"
    backend = ready_backend(nv)
    with caplog.at_level(logging.WARNING, logger="verl_exporter.gpu.nvml"):
        readings = [backend.read_device(0) for _ in range(3)]
    assert [r.pcie_replay_errors for r in readings] == [None, None, None]
    assert all(r.temperature_celsius == 64 for r in readings)
    assert len([r for r in caplog.records if "pcie_replay" in r.getMessage()]) == 1


def test_processes_fall_back_to_v2_and_keep_unknown_memory_as_none():
    nv = FakePynvml()
    nv.fail[("nvmlDeviceGetComputeRunningProcesses", None)] = "FunctionNotFound"
    assert ready_backend(nv).running_processes(0) == [(200, None)]


def test_pcie_throughput_is_sampled_only_when_enabled():
    nv = FakePynvml()
    ready_backend(nv).read_device(0)
    assert nv.calls["nvmlDeviceGetPcieThroughput"] == 0
    r = ready_backend(nv, pcie_throughput=True).read_device(0)
    assert r.pcie_throughput_bytes_per_second == {"tx": 1000 * 1024, "rx": 2000 * 1024}


@pytest.mark.parametrize(
    "error, message",
    [("LibraryNotFound", "libnvidia-ml.so.1"), ("DriverNotLoaded", "driver not loaded"),
     ("Uninitialized", "init failed")],
)
def test_init_failure_makes_the_backend_unavailable_and_retries_every_minute(error, message):
    nv = FakePynvml()
    nv.fail[("nvmlInit", None)] = error
    clock = ManualClock()
    backend = NvmlBackend(nv, clock=clock, watch_xid=False)
    assert not backend.ensure_initialized()
    assert message in backend.error and "retrying every 60 s" in backend.error
    with pytest.raises(GpuUnavailable):
        backend.device_count()
    clock.now = 59
    assert not backend.ensure_initialized()
    assert nv.calls["nvmlInit"] == 1
    nv.fail.clear()
    clock.now = 61
    assert backend.ensure_initialized()
    assert nv.calls["nvmlInit"] == 2
    assert backend.error is None and backend.device_count() == 2


def test_a_driver_that_stops_answering_makes_the_backend_unavailable():
    nv = FakePynvml()
    clock = ManualClock()
    backend = ready_backend(nv, clock=clock)
    nv.fail[("nvmlDeviceGetCount", None)] = "Uninitialized"
    with pytest.raises(GpuUnavailable, match="stopped answering"):
        backend.device_count()
    assert not backend.available
    assert not backend.ensure_initialized()  # no retry before a minute has passed
    nv.fail.clear()
    clock.now = 60
    assert backend.ensure_initialized()


def test_xid_events_are_counted_per_gpu_and_xid():
    nv = FakePynvml(gpus=2)
    backend = ready_backend(nv, watch_xid=True, xid_poll_ms=20)
    try:
        for gpu, xid in [(1, 79), (1, 79), (0, 48)]:
            nv.events.put(SimpleNamespace(device=gpu, eventType=0x8, eventData=xid))
        nv.events.put(SimpleNamespace(device=0, eventType=0x2, eventData=0))  # not an XID event
        wait_until(lambda: sum(backend.xid_counts().values()) == 3, timeout=10, message="three XID events")
        assert backend.xid_counts() == {(1, 79): 2, (0, 48): 1}
    finally:
        backend.shutdown()
    assert nv.freed == ["event-set"]


def test_xid_registration_failure_is_logged_once_and_not_fatal(caplog):
    nv = FakePynvml(gpus=2)
    nv.fail[("nvmlDeviceRegisterEvents", 0)] = "NotSupported"
    backend = ready_backend(nv, xid_poll_ms=20)
    with caplog.at_level(logging.WARNING, logger="verl_exporter.gpu.nvml"):
        assert backend.start_xid_watcher()  # GPU 1 still registered
        backend.stop_xid_watcher()
        nv.fail[("nvmlDeviceRegisterEvents", None)] = "NotSupported"
        assert not backend.start_xid_watcher()
    assert len([r for r in caplog.records if "XID" in r.getMessage()]) == 1
    assert backend.read_device(0).up
    assert backend.xid_counts() == {}


def test_missing_binding_is_reported_as_unavailable(monkeypatch):
    import importlib

    def no_module(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", no_module)
    backend = NvmlBackend()
    assert not backend.ensure_initialized()
    assert "nvidia-ml-py is not installed" in backend.error
