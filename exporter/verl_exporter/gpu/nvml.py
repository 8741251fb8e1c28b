"""The one place that talks to NVML (pynvml, from the nvidia-ml-py package).

``NvmlBackend`` turns NVML calls into plain Python values and owns every NVML error rule:

- a field the GPU or driver does not support (NotSupported, NoPermission, FunctionNotFound) is
  None, never 0 or NaN;
- GpuIsLost / Unknown / ResetRequired on one GPU marks that GPU down; the others still report;
- any init failure (LibraryNotFound, DriverNotLoaded, ...) leaves the backend unavailable with a
  clear message in ``error``; init is retried at most every ``retry_seconds``.

XID errors arrive as NVML events: a watcher thread waits on an event set and counts them per
(gpu, xid). ``FakeNvmlBackend`` (``fake.py``) implements the same ``GpuBackend`` interface for tests and demos.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable

from verl_exporter.gpu.backend import GpuLibrary, GpuReading, GpuUnavailable

log = logging.getLogger(__name__)

# Bits of nvmlDeviceGetCurrentClocksEventReasons (same values as the older ...ThrottleReasons).
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
REMAPPED_ROW_STATES = ("correctable", "uncorrectable", "pending", "failure")
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
PCIE_KB = 1024  # nvmlDeviceGetPcieThroughput reports KB/s
# NVML enum values used below (stable ABI; named here so the calls read plainly).
TEMPERATURE_GPU = 0
CLOCK_SM, CLOCK_MEM = 1, 2
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1
ECC_VOLATILE, ECC_AGGREGATE = 0, 1
PCIE_TX, PCIE_RX = 0, 1
LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_Unknown", "NVMLError_ResetRequired")
UNSUPPORTED_ERRORS = (
    "NVMLError_NotSupported",
    "NVMLError_NoPermission",
    "NVMLError_FunctionNotFound",
    "NVMLError_ArgumentVersionMismatch",
)


class _GpuLost(Exception):
    """This GPU stopped answering (lost, reset required, unknown error)."""


class _Unsupported(Exception):
    """This GPU, driver or binding cannot report the field."""


def decode_clock_event_reasons(mask: int) -> dict[str, bool]:
    """Named reasons from an NVML clock-event bitmask."""
    return {name: bool(mask & bit) for name, bit in CLOCK_EVENT_REASONS.items()}


def format_cuda_version(version: int) -> str:
    """NVML's CUDA driver version integer (12040) as "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend(GpuLibrary):
    """``GpuBackend`` over pynvml: init/shutdown, device count and per-device snapshots."""

    def __init__(
        self,
        nvml_module: Any = None,
        *,
        pcie_throughput: bool = False,
        watch_xid: bool = True,
        retry_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        xid_poll_ms: int = 500,
    ):
        super().__init__(retry_seconds=retry_seconds, clock=clock)
        self._nv: Any = None
        self._lost_errors: tuple = ()
        self._unsupported_errors: tuple = ()
        if nvml_module is not None:
            self._bind(nvml_module)
        self.pcie_throughput = pcie_throughput
        self.watch_xid = watch_xid
        self._xid_poll_ms = xid_poll_ms
        self._handles: dict[int, Any] = {}
        self._memory_v1_only = False
        self._xid_counts: Counter = Counter()
        self._xid_lock = threading.Lock()
        self._xid_stop = threading.Event()
        self._xid_thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def _bind(self, module: Any) -> None:
        """Use ``module`` as pynvml; error classes an older binding lacks are simply not matched."""
        self._nv = module
        self._lost_errors = tuple(getattr(module, n) for n in LOST_ERRORS if hasattr(module, n))
        self._unsupported_errors = tuple(getattr(module, n) for n in UNSUPPORTED_ERRORS if hasattr(module, n))

    def _initialize(self) -> str | None:
        try:
            if self._nv is None:
                self._bind(importlib.import_module("pynvml"))
            self._nv.nvmlInit()
        except ImportError as exc:
            return f"nvidia-ml-py is not installed ({exc}); GPU metrics are off"
        except Exception as exc:
            log.debug("NVML init failed: %s", exc)
            return self._init_error_message(exc)
        return None

    def _on_initialized(self) -> None:
        self._handles.clear()
        if self.watch_xid:
            self.start_xid_watcher()

    def _init_error_message(self, exc: Exception) -> str:
        retry = self.retry_note
        if isinstance(exc, getattr(self._nv, "NVMLError_LibraryNotFound", ())):
            return f"NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver visible here; {retry}"
        if isinstance(exc, getattr(self._nv, "NVMLError_DriverNotLoaded", ())):
            return f"NVIDIA driver not loaded; {retry}"
        return f"NVML init failed ({type(exc).__name__}: {exc}); {retry}"

    def shutdown(self) -> None:
        """Stop the XID watcher and release NVML."""
        self.stop_xid_watcher()
        super().shutdown()

    def _shut_down_library(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed: %s", exc)

    def _mark_unavailable(self, exc: Exception) -> None:
        self.shutdown()
        self._last_attempt = self._clock()
        retry = f"retrying every {self.retry_seconds:g} s"
        self.error = f"NVML stopped answering ({type(exc).__name__}: {exc}); {retry}"

    # -- system ------------------------------------------------------------------------------

    def device_count(self) -> int:
        """Number of GPUs NVML sees; raises GpuUnavailable when NVML is down."""
        if not self._initialized:
            raise GpuUnavailable(self.error or "NVML is not initialised")
        try:
            return int(self._nv.nvmlDeviceGetCount())
        except self._nv.NVMLError as exc:
            self._mark_unavailable(exc)
            raise GpuUnavailable(self.error) from exc

    def driver_version(self) -> str | None:
        return self._optional("driver_version", lambda: _text(self._nv.nvmlSystemGetDriverVersion()))

    def cuda_driver_version(self) -> str | None:
        return self._optional(
            "cuda_driver_version", lambda: format_cuda_version(int(self._nv.nvmlSystemGetCudaDriverVersion()))
        )

    # -- per device --------------------------------------------------------------------------

    def read_device(self, index: int) -> GpuReading:
        """A snapshot of GPU ``index``; ``up`` is False when the GPU is lost."""
        try:
            handle = self._handle(index)
            uuid, name, bus_id = self._identity(index, handle)
            reading = GpuReading(index=index, uuid=uuid, name=name, pci_bus_id=bus_id)
            self._read_fields(handle, reading)
        except _GpuLost as lost:
            self._handles.pop(index, None)
            return self._lost_reading(index, lost)
        self._warned.discard(f"lost:{index}")
        return reading

    def _identity(self, index: int, handle: Any) -> tuple[str, str | None, str | None]:
        """(uuid, name, PCI bus id), read once per GPU; a lost GPU keeps them."""
        if index not in self._static:
            nv = self._nv
            self._static[index] = (
                self._field("uuid", lambda: _text(nv.nvmlDeviceGetUUID(handle))) or "",
                self._field("name", lambda: _text(nv.nvmlDeviceGetName(handle))),
                self._field("pci_bus_id", lambda: _text(nv.nvmlDeviceGetPciInfo(handle).busId)),
            )
        return self._static[index]

    def _read_fields(self, handle: Any, r: GpuReading) -> None:
        nv = self._nv
        memory = self._memory_info(handle)
        if memory is not None:
            r.memory_total_bytes, r.memory_used_bytes, r.memory_free_bytes = memory.total, memory.used, memory.free
            r.memory_reserved_bytes = getattr(memory, "reserved", None)
        util = self._field("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            r.utilization_ratio, r.memory_utilization_ratio = util.gpu / 100.0, util.memory / 100.0
        r.temperature_celsius = self._field("temp", lambda: nv.nvmlDeviceGetTemperature(handle, TEMPERATURE_GPU))
        r.power_watts = self._scaled("power", lambda: nv.nvmlDeviceGetPowerUsage(handle), 1e-3)
        r.power_limit_watts = self._scaled("power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle), 1e-3)
        r.energy_joules = self._scaled("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle), 1e-3)
        r.sm_clock_hertz = self._scaled("sm_clock", lambda: nv.nvmlDeviceGetClockInfo(handle, CLOCK_SM), 1e6)
        r.memory_clock_hertz = self._scaled("mem_clock", lambda: nv.nvmlDeviceGetClockInfo(handle, CLOCK_MEM), 1e6)
        mask = self._first_supported(
            "clock_event_reasons", handle, "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",  # drivers before 535
        )
        r.clock_event_reasons = None if mask is None else decode_clock_event_reasons(int(mask))
        r.ecc_errors = self._ecc(handle, ECC_AGGREGATE)
        r.ecc_volatile_errors = self._ecc(handle, ECC_VOLATILE)
        rows = self._field("remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(handle))
        r.remapped_rows = None if rows is None else dict(zip(REMAPPED_ROW_STATES, map(int, rows)))
        r.pcie_replay_errors = self._field("pcie_replay", lambda: nv.nvmlDeviceGetPcieReplayCounter(handle))
        if self.pcie_throughput:  # each call samples for ~20 ms, so only on request
            tx = self._scaled("pcie_tx", lambda: nv.nvmlDeviceGetPcieThroughput(handle, PCIE_TX), PCIE_KB)
            rx = self._scaled("pcie_rx", lambda: nv.nvmlDeviceGetPcieThroughput(handle, PCIE_RX), PCIE_KB)
            both = {"tx": tx, "rx": rx}
            r.pcie_throughput_bytes_per_second = {k: v for k, v in both.items() if v is not None} or None

    def _memory_info(self, handle: Any) -> Any:
        """Memory info v2 (has ``reserved``); v1 on drivers or bindings without it."""
        nv = self._nv
        if not self._memory_v1_only:
            version = getattr(nv, "nvmlMemory_v2", None)
            try:
                if version is None:
                    raise TypeError("pynvml has no nvmlMemory_v2")
                return self._call(lambda: nv.nvmlDeviceGetMemoryInfo(handle, version=version))
            except (TypeError, _Unsupported, nv.NVMLError) as exc:
                log.info("NVML memory info v2 unavailable (%s); using v1, no reserved bytes", exc)
                self._memory_v1_only = True
        return self._field("memory", lambda: nv.nvmlDeviceGetMemoryInfo(handle))

    def _ecc(self, handle: Any, counter: int) -> dict[str, int] | None:
        """Corrected and uncorrected ECC totals of one counter (volatile or aggregate)."""
        values = {
            kind: self._field("ecc",
                              functools.partial(self._nv.nvmlDeviceGetTotalEccErrors, handle, error_type, counter))
            for kind, error_type in (("corrected", ECC_CORRECTED), ("uncorrected", ECC_UNCORRECTED))
        }
        return {k: int(v) for k, v in values.items() if v is not None} or None

    def running_processes(self, index: int) -> list[tuple[int, int | None]]:
        """(pid, used GPU memory bytes or None) of the compute processes on GPU ``index``."""
        try:
            handle = self._handle(index)
            procs = self._first_supported(
                "processes", handle, "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetComputeRunningProcesses_v2",  # drivers without the v3 call
            )
        except _GpuLost:
            return []
        return [(int(p.pid), p.usedGpuMemory) for p in procs or []]

    # -- NVML call helpers -------------------------------------------------------------------

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._call(lambda: self._nv.nvmlDeviceGetHandleByIndex(index))
        return self._handles[index]

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run one NVML call, translating lost-GPU and unsupported errors."""
        try:
            return fn()
        except self._lost_errors as exc:
            raise _GpuLost(str(exc)) from exc
        except self._unsupported_errors as exc:
            raise _Unsupported(str(exc)) from exc

    def _field(self, name: str, *attempts: Callable[[], Any]) -> Any:
        """The first of ``attempts`` the GPU and driver support; None if none is.

        NVML errors other than unsupported or lost are logged once per field and give None.
        """
        for attempt in attempts:
            try:
                return self._call(attempt)
            except _Unsupported:
                continue
            except self._nv.NVMLError as exc:
                self._warn_once(f"field:{name}:{type(exc).__name__}", "NVML %s read failed: %s", name, exc)
                return None
        return None

    def _scaled(self, name: str, fn: Callable[[], Any], factor: float) -> float | None:
        value = self._field(name, fn)
        return None if value is None else value * factor

    def _first_supported(self, name: str, handle: Any, *functions: str) -> Any:
        """The first of the pynvml ``functions`` this binding has and the driver supports."""
        found = [getattr(self._nv, function) for function in functions if hasattr(self._nv, function)]
        return self._field(name, *[lambda fn=fn: fn(handle) for fn in found])

    def _optional(self, name: str, fn: Callable[[], Any]) -> Any:
        try:
            return self._field(name, fn)
        except _GpuLost:
            return None

    # -- XID events --------------------------------------------------------------------------

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """XID errors seen since start, keyed by (gpu index, xid)."""
        with self._xid_lock:
            return dict(self._xid_counts)

    def start_xid_watcher(self) -> bool:
        """Register for XID events on every GPU and count them in a thread; False if not possible."""
        if self._xid_thread is not None or not self._initialized:
            return self._xid_thread is not None
        nv = self._nv
        try:
            event_set = nv.nvmlEventSetCreate()
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:
            self._warn_once("xid", "XID error events unavailable: %s", exc)
            return False
        registered, failed = [], []
        for index in range(count):
            try:
                nv.nvmlDeviceRegisterEvents(self._handle(index), XID_EVENT, event_set)
                registered.append(index)
            except Exception as exc:
                failed.append(f"GPU {index}: {exc}")
        if failed:
            self._warn_once("xid", "XID error events unavailable on %s", "; ".join(failed))
        if not registered:
            self._free_event_set(event_set)
            return False
        self._xid_stop.clear()
        self._xid_thread = threading.Thread(
            target=self._watch_xid, args=(event_set,), name="verl-nvml-xid", daemon=True
        )
        self._xid_thread.start()
        return True

    def stop_xid_watcher(self) -> None:
        thread, self._xid_thread = self._xid_thread, None
        if thread is not None:
            self._xid_stop.set()
            thread.join(timeout=self._xid_poll_ms / 1000 + 2)

    def _watch_xid(self, event_set: Any) -> None:
        nv = self._nv
        while not self._xid_stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(event_set, self._xid_poll_ms)
            except nv.NVMLError_Timeout:
                continue
            except Exception as exc:
                self._warn_once("xid_wait", "waiting for XID events failed: %s", exc)
                self._xid_stop.wait(1.0)
                continue
            if not int(data.eventType) & XID_EVENT:
                continue
            try:
                index = int(nv.nvmlDeviceGetIndex(data.device))
            except Exception as exc:
                self._warn_once("xid_index", "XID event from an unknown GPU: %s", exc)
                continue
            xid = int(data.eventData)
            log.warning("GPU %d reported XID %d", index, xid)
            with self._xid_lock:
                self._xid_counts[(index, xid)] += 1
        self._free_event_set(event_set)

    def _free_event_set(self, event_set: Any) -> None:
        try:
            self._nv.nvmlEventSetFree(event_set)
        except Exception as exc:
            log.debug("nvmlEventSetFree failed: %s", exc)
