"""The one place that talks to AMD SMI (the ``amdsmi`` Python binding ROCm ships, for AMD Instinct GPUs).

``AmdSmiBackend`` implements ``GpuBackend`` (backend.py) and fills the same ``GpuReading``
fields, in the same base units, with these rules:

- ``amdsmi`` is imported at the first initialisation, never at module import. A missing package, a
  package that cannot load ROCm's ``libamd_smi.so``, or an init failure (no amdgpu driver) leaves
  the backend unavailable with a one-line reason in ``error``; init is retried at most every
  ``retry_seconds``.
- a field the GPU, driver or binding does not report (AMDSMI_STATUS_NOT_SUPPORTED,
  NOT_YET_IMPLEMENTED, NO_PERM, a function this release lacks, an "N/A" value or a max-uint
  sentinel) is None, never 0; any other failure of a field is logged once and gives None.
- a GPU is lost (``up=False``, the others still report) when a call on it fails with
  AMDSMI_STATUS_NOT_FOUND, IO, DRM_ERROR or AMDGPU_RESTART_ERR, or when a GPU that answered before
  answers none of its live readings (memory, activity, power, energy, clocks) any more.

Releases differ (later ones renamed the first releases' ``amdsmi_get_power_measure``,
``amdsmi_get_clock_measure`` and its ``cur_clk``, the energy count's ``power`` key,
``amdsmi_get_gpu_ecc_error_count``, ``amdsmi_get_gpu_driver_version``, and replaced the process
handles for ``amdsmi_get_gpu_process_info``): each is read both ways, and values are read from dicts
or structs alike.

Temperature: ``temperature_celsius`` is the edge (board) temperature, the reading closest to
NVIDIA's GPU core temperature that the VerlGpuHot threshold (85 °C) is meant for. The hotspot
(junction) temperature of a healthy, loaded MI300X runs well above 85 °C, so it is not served.
MI300-class GPUs report no edge sensor: there ``temperature_celsius`` is None.

AMD's ECC counters count since the driver was loaded: they fill ``ecc_volatile_errors``.
There are no XID events on AMD (``xid_counts`` is empty), no CUDA version, no clock-event reasons,
no remapped rows and no PCIe throughput sampling.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import logging
import math
import time
from typing import Any, Callable

from verl_exporter.gpu.backend import GpuLibrary, GpuReading, GpuUnavailable

log = logging.getLogger(__name__)

# amdsmi_status_t values (amdsmi_wrapper.AMDSMI_STATUS_*); read from the binding when it has them.
STATUS_CODES = {
    "NOT_SUPPORTED": 2, "NOT_YET_IMPLEMENTED": 3, "DRM_ERROR": 6, "NO_PERM": 10, "IO": 12,
    "NOT_FOUND": 31, "DRIVER_NOT_LOADED": 34, "AMDGPU_RESTART_ERR": 54,
}
UNSUPPORTED = ("NOT_SUPPORTED", "NOT_YET_IMPLEMENTED", "NO_PERM")
LOST = ("NOT_FOUND", "IO", "DRM_ERROR", "AMDGPU_RESTART_ERR")
MAX_UINTS = (0xFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)  # "not supported" sentinels in raw structs
MIB = 1 << 20  # amdsmi_get_gpu_vram_usage reports MB
MICRO = 1e-6  # power caps in µW, the energy counter's resolution in µJ
MHZ = 1e6
LIVE_FIELDS = ("memory_used_bytes", "utilization_ratio", "power_watts", "energy_joules", "sm_clock_hertz")


class _GpuLost(Exception):
    """This GPU stopped answering."""


class _Unsupported(Exception):
    """This GPU, driver or binding cannot report the field."""


def _get(record: Any, key: str) -> Any:
    """``record[key]`` of a dict, ``record.key`` of a struct; None if absent."""
    if record is None:
        return None
    if isinstance(record, dict):
        return record.get(key)
    return getattr(record, key, None)


def _number(value: Any) -> float | None:
    """A reported number, or None for "N/A", text, a negative or NaN value or a max-uint sentinel."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value < 0 or (isinstance(value, float) and math.isnan(value)) or value in MAX_UINTS:
        return None
    return value


def _first_number(record: Any, *keys: str) -> float | None:
    """The first positive number among ``keys`` of ``record``, else a 0 one of them holds, else None."""
    numbers = [n for n in (_number(_get(record, key)) for key in keys) if n is not None]
    return next((n for n in numbers if n > 0), numbers[0] if numbers else None)


def _ratio(value: Any) -> float | None:
    percent = _number(value)
    return None if percent is None or percent > 100 else percent / 100.0


def _text(value: Any) -> str | None:
    text = (value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")).strip()
    return None if text in ("", "N/A") else text


def _describe(exc: BaseException) -> str:
    """One line for an amdsmi error (its str() spans lines)."""
    info = getattr(exc, "err_info", None)
    code = getattr(exc, "err_code", None)
    if info:
        return f"{info} (code {code})" if code is not None else str(info)
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _import_amdsmi() -> Any:
    """``import amdsmi``; what its loader prints (a missing libamd_smi.so) goes into the error."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return importlib.import_module("amdsmi")
    except ImportError:
        raise
    except Exception as exc:  # the binding's loader raises KeyError/OSError without libamd_smi.so
        said = " ".join(printed.getvalue().split())
        raise RuntimeError(f"{type(exc).__name__}: {exc}" + (f"; {said}" if said else "")) from exc


class AmdSmiBackend(GpuLibrary):
    """``GpuBackend`` over amdsmi: init/shutdown, device count and per-device snapshots."""

    def __init__(self, amdsmi_module: Any = None, *, retry_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, pcie_throughput: bool = False):
        super().__init__(retry_seconds=retry_seconds, clock=clock)
        self._smi: Any = None
        self._codes = dict(STATUS_CODES)
        self._library_errors: tuple = ()
        if amdsmi_module is not None:
            self._bind(amdsmi_module)
        self.pcie_throughput = pcie_throughput  # not sampled on AMD (amdsmi's sample takes a second)
        self._handles: list[Any] = []
        self._answered: set[int] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    def _bind(self, module: Any) -> None:
        self._smi = module
        wrapper = getattr(module, "amdsmi_wrapper", None)
        self._codes = {name: getattr(wrapper, f"AMDSMI_STATUS_{name}", code) for name, code in STATUS_CODES.items()}
        error = getattr(module, "AmdSmiLibraryException", None)
        self._library_errors = (error,) if isinstance(error, type) else ()

    def _initialize(self) -> str | None:
        reason = self._init()
        return None if reason is None else f"{reason}; {self.retry_note}"

    def _init(self) -> str | None:
        """Import and initialise amdsmi and list the GPUs; the reason it failed, or None."""
        if self._smi is None:
            try:
                self._bind(_import_amdsmi())
            except ImportError as exc:
                missing = isinstance(exc, ModuleNotFoundError) and exc.name == "amdsmi"
                return f"the amdsmi Python package {'is not installed' if missing else 'cannot be imported'} ({exc})"
            except RuntimeError as exc:
                return f"the amdsmi package cannot load ROCm's libamd_smi.so ({exc})"
        smi = self._smi
        try:
            smi.amdsmi_init()
        except Exception as exc:
            log.debug("amdsmi init failed: %s", exc)
            if getattr(exc, "err_code", None) == self._codes["DRIVER_NOT_LOADED"]:
                return "amdgpu driver not loaded: no AMD GPU visible here"
            return f"amdsmi init failed ({_describe(exc)})"
        try:
            handles = list(smi.amdsmi_get_processor_handles())
        except Exception as exc:
            self._shut_down()
            return f"amdsmi cannot list the GPUs ({_describe(exc)})"
        if not handles:
            self._shut_down()
            return "amdsmi sees no AMD GPU"
        self._handles = handles
        self._static.clear()
        self._answered.clear()
        return None

    def _shut_down_library(self) -> None:
        self._handles = []
        self._shut_down()

    def _shut_down(self) -> None:
        try:
            self._smi.amdsmi_shut_down()
        except Exception as exc:
            log.debug("amdsmi_shut_down failed: %s", exc)

    def start_xid_watcher(self) -> bool:
        return False  # AMD GPUs have no XID events

    def stop_xid_watcher(self) -> None:
        """Nothing to stop."""

    # -- system ------------------------------------------------------------------------------

    def device_count(self) -> int:
        """Number of GPUs amdsmi listed at init; raises GpuUnavailable while it is not initialised."""
        if not self._initialized:
            raise GpuUnavailable(self.error or "amdsmi is not initialised")
        return len(self._handles)

    def driver_version(self) -> str | None:
        """The amdgpu driver's version, as the first GPU reports it."""
        if not self._handles:
            return None
        handle, smi = self._handles[0], self._smi
        attempts = []
        if hasattr(smi, "amdsmi_get_gpu_driver_info"):
            attempts.append(lambda: _text(_get(smi.amdsmi_get_gpu_driver_info(handle), "driver_version")))
        if hasattr(smi, "amdsmi_get_gpu_driver_version"):  # the first releases
            attempts.append(lambda: _text(smi.amdsmi_get_gpu_driver_version(handle)))
        try:
            return self._field("driver_version", *attempts)
        except _GpuLost:
            return None

    def cuda_driver_version(self) -> str | None:
        return None

    def xid_counts(self) -> dict[tuple[int, int], int]:
        return {}

    # -- per device --------------------------------------------------------------------------

    def read_device(self, index: int) -> GpuReading:
        """A snapshot of GPU ``index``; ``up`` is False when the GPU is lost."""
        try:
            handle = self._handles[index]
            uuid, name, bus_id = self._identity(index, handle)
            reading = GpuReading(index=index, uuid=uuid, name=name, pci_bus_id=bus_id)
            self._read_fields(handle, reading)
            if any(getattr(reading, field) is not None for field in LIVE_FIELDS):
                self._answered.add(index)
            elif index in self._answered:
                raise _GpuLost("it answers none of its readings any more")
        except _GpuLost as lost:
            return self._lost_reading(index, lost)
        self._warned.discard(f"lost:{index}")
        return reading

    def _identity(self, index: int, handle: Any) -> tuple[str, str | None, str | None]:
        """(uuid, market name, PCI BDF), read once per GPU; a lost GPU keeps them."""
        if index not in self._static:
            smi = self._smi
            self._static[index] = (
                self._field("uuid", lambda: _text(smi.amdsmi_get_gpu_device_uuid(handle))) or "",
                self._field("name", lambda: _text(_get(smi.amdsmi_get_gpu_asic_info(handle), "market_name")),
                            lambda: _text(_get(smi.amdsmi_get_gpu_board_info(handle), "product_name"))),
                self._field("pci_bus_id", lambda: _text(smi.amdsmi_get_gpu_device_bdf(handle))),
            )
        return self._static[index]

    def _read_fields(self, handle: Any, r: GpuReading) -> None:
        smi = self._smi
        self._memory(handle, r)
        activity = self._field("activity", lambda: smi.amdsmi_get_gpu_activity(handle))
        r.utilization_ratio = _ratio(_get(activity, "gfx_activity"))
        r.memory_utilization_ratio = _ratio(_get(activity, "umc_activity"))
        r.temperature_celsius = self._edge_temperature(handle)
        power = self._call_first("power", handle, "amdsmi_get_power_info", "amdsmi_get_power_measure")
        r.power_watts = _first_number(power, "socket_power", "current_socket_power", "average_socket_power")
        r.power_limit_watts = self._power_limit(handle, power)
        energy = self._field("energy", lambda: smi.amdsmi_get_energy_count(handle))
        ticks = _number(_get(energy, "energy_accumulator"))
        ticks = _number(_get(energy, "power")) if ticks is None else ticks  # the first releases' key
        resolution = _number(_get(energy, "counter_resolution"))  # µJ per tick
        r.energy_joules = None if ticks is None or not resolution else ticks * resolution * MICRO
        r.sm_clock_hertz = self._clock_hertz("gfx_clock", handle, "GFX")
        r.memory_clock_hertz = self._clock_hertz("mem_clock", handle, "MEM")
        ecc = self._call_first("ecc", handle, "amdsmi_get_gpu_total_ecc_count", "amdsmi_get_gpu_ecc_error_count")
        counts = {"corrected": _number(_get(ecc, "correctable_count")),
                  "uncorrected": _number(_get(ecc, "uncorrectable_count"))}
        r.ecc_volatile_errors = {kind: int(n) for kind, n in counts.items() if n is not None} or None
        replays = self._field("pcie_replay", lambda: smi.amdsmi_get_gpu_pci_replay_counter(handle))
        r.pcie_replay_errors = None if _number(replays) is None else int(replays)

    def _memory(self, handle: Any, r: GpuReading) -> None:
        """VRAM total and used in bytes; the MB-grained ``amdsmi_get_gpu_vram_usage`` as the fallback."""
        smi = self._smi
        vram = getattr(getattr(smi, "AmdSmiMemoryType", None), "VRAM", None)
        total = _number(self._field("memory_total", lambda: smi.amdsmi_get_gpu_memory_total(handle, vram)))
        used = _number(self._field("memory_used", lambda: smi.amdsmi_get_gpu_memory_usage(handle, vram)))
        if total is None or used is None:
            usage = self._field("vram_usage", lambda: smi.amdsmi_get_gpu_vram_usage(handle))
            total_mb, used_mb = _number(_get(usage, "vram_total")), _number(_get(usage, "vram_used"))
            total = total if total is not None or total_mb is None else total_mb * MIB
            used = used if used is not None or used_mb is None else used_mb * MIB
        r.memory_total_bytes = None if total is None else int(total)
        r.memory_used_bytes = None if used is None else int(used)
        if total is not None and used is not None:
            r.memory_free_bytes = max(int(total) - int(used), 0)

    def _edge_temperature(self, handle: Any) -> float | None:
        """The edge temperature in °C (see the module docstring); None where the GPU has no edge sensor."""
        smi = self._smi
        sensor = getattr(getattr(smi, "AmdSmiTemperatureType", None), "EDGE", None)
        metric = getattr(getattr(smi, "AmdSmiTemperatureMetric", None), "CURRENT", None)
        value = _number(self._field("temperature", lambda: smi.amdsmi_get_temp_metric(handle, sensor, metric)))
        return float(value) if value else None  # 0: a GPU without the sensor

    def _power_limit(self, handle: Any, power: Any) -> float | None:
        cap = _number(_get(self._field("power_cap", lambda: self._smi.amdsmi_get_power_cap_info(handle)), "power_cap"))
        if cap:
            return cap * MICRO  # µW
        return _number(_get(power, "power_limit")) or None  # W, in amdsmi_get_power_info

    def _clock_hertz(self, name: str, handle: Any, kind: str) -> float | None:
        clock_type = getattr(getattr(self._smi, "AmdSmiClkType", None), kind, None)
        info = self._call_first(name, handle, "amdsmi_get_clock_info", "amdsmi_get_clock_measure", args=(clock_type,))
        mhz = _number(_get(info, "clk"))
        mhz = _number(_get(info, "cur_clk")) if mhz is None else mhz
        return None if not mhz else mhz * MHZ

    def running_processes(self, index: int) -> list[tuple[int, int | None]]:
        """(pid, VRAM bytes or None) of the processes on GPU ``index``."""
        smi = self._smi
        try:
            handle = self._handles[index]
            procs = self._field("processes", lambda: smi.amdsmi_get_gpu_process_list(handle))
            found = []
            for proc in procs if isinstance(procs, (list, tuple)) else []:
                if not isinstance(proc, dict) and not hasattr(proc, "pid"):  # an older binding's process handle
                    proc = self._field("process_info", functools.partial(smi.amdsmi_get_gpu_process_info, handle, proc))
                pid = _number(_get(proc, "pid"))
                if pid:
                    used = _number(_get(_get(proc, "memory_usage"), "vram_mem"))
                    used = _number(_get(proc, "mem")) if used is None else used
                    found.append((int(pid), None if used is None else int(used)))
        except (_GpuLost, IndexError):
            return []
        return found

    # -- amdsmi call helpers -----------------------------------------------------------------

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run one amdsmi call, translating lost-GPU and unsupported status codes."""
        try:
            return fn()
        except self._library_errors as exc:
            code = getattr(exc, "err_code", None)
            if code in {self._codes[name] for name in LOST}:
                raise _GpuLost(_describe(exc)) from exc
            if code in {self._codes[name] for name in UNSUPPORTED}:
                raise _Unsupported(_describe(exc)) from exc
            raise

    def _field(self, name: str, *attempts: Callable[[], Any]) -> Any:
        """The first of ``attempts`` the GPU, driver and binding support; None if none is.

        Other failures (a retry or timeout status, a release's changed signature) are logged once
        per field and kind of error, and give None; a lost GPU raises _GpuLost.
        """
        for attempt in attempts:
            try:
                return self._call(attempt)
            except _Unsupported:
                continue
            except _GpuLost:
                raise
            except Exception as exc:
                self._warn_once(f"field:{name}:{type(exc).__name__}", "amdsmi %s read failed: %s", name,
                                _describe(exc))
                return None
        return None

    def _call_first(self, name: str, handle: Any, *functions: str, args: tuple = ()) -> Any:
        """The first of the amdsmi ``functions`` this binding has and the GPU supports."""
        found = [getattr(self._smi, function) for function in functions if hasattr(self._smi, function)]
        return self._field(name, *[lambda fn=fn: fn(handle, *args) for fn in found])
