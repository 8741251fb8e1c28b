"""The interface every GPU library is read through, and what they share.

- ``GpuReading``: one GPU at one moment; a field is None when the GPU or driver cannot report it.
- ``GpuUnavailable``: the library could not be initialised (no driver, no library) or stopped answering.
- ``GpuBackend``: what the GPU collector, the forensics and the exporter's start and stop call.
  NVML (``nvml.NvmlBackend``), amdsmi (``amdsmi.AmdSmiBackend``), the fake
  (``fake.FakeNvmlBackend``) and the choice among them (``backends.SelectedGpuBackend``) implement it.
- ``RetryingInit``: initialisation retried at most every ``retry_seconds`` after a failure, with
  the reason in ``error``; ``GpuLibrary`` adds what a real library's backend shares (a GPU's
  identity kept for when it is lost, warnings once). NVML and amdsmi both build on it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol


class GpuUnavailable(Exception):
    """The GPU library could not be initialised (no driver, no library) or stopped answering."""


@dataclass
class GpuReading:
    """One GPU at one moment; a field is None when the GPU or driver cannot report it."""

    index: int
    uuid: str = ""
    name: str | None = None
    pci_bus_id: str | None = None
    up: bool = True
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clock_event_reasons: dict[str, bool] | None = None
    ecc_errors: dict[str, int] | None = None  # corrected / uncorrected, aggregate (lifetime)
    ecc_volatile_errors: dict[str, int] | None = None  # since the last driver load
    remapped_rows: dict[str, int] | None = None  # nvml.REMAPPED_ROW_STATES
    pcie_replay_errors: int | None = None
    pcie_throughput_bytes_per_second: dict[str, float] | None = None  # tx / rx


class GpuBackend(Protocol):
    """A GPU library as the exporter reads it. ``error`` says why it is not ``available``."""

    error: str | None

    @property
    def available(self) -> bool: ...

    def ensure_initialized(self) -> bool:
        """Initialise if needed (retrying after a failure only every so often); True once ready."""
        ...

    def start(self) -> None:
        """Initialise now rather than at the first scrape."""
        ...

    def stop(self) -> None:
        """Release the library (and any watcher thread)."""
        ...

    def device_count(self) -> int:
        """The GPUs the library sees; raises ``GpuUnavailable`` while it is down."""
        ...

    def driver_version(self) -> str | None: ...

    def cuda_driver_version(self) -> str | None: ...

    def read_device(self, index: int) -> GpuReading: ...

    def running_processes(self, index: int) -> list[tuple[int, int | None]]:
        """(pid, GPU memory in bytes or None) of the processes on GPU ``index``."""
        ...

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """XID errors seen since start, per (gpu, xid); empty where the library has none."""
        ...


class RetryingInit:
    """Initialisation that, after a failure, is tried again at most every ``retry_seconds``.

    A subclass's ``_initialize()`` returns None once the library is ready, or the one-line reason
    it is not (which becomes ``error``); ``_shut_down_library()`` releases it.
    """

    def __init__(self, *, retry_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.retry_seconds = retry_seconds
        self._clock = clock
        self.error: str | None = None
        self._initialized = False
        self._last_attempt: float | None = None

    @property
    def available(self) -> bool:
        return self._initialized

    @property
    def retry_note(self) -> str:
        """The tail of an init error: what the exporter does about it."""
        return f"GPU metrics are off, retrying every {self.retry_seconds:g} s"

    def ensure_initialized(self) -> bool:
        """Initialise if needed; after a failure, try again only every ``retry_seconds``."""
        if self._initialized:
            return True
        now = self._clock()
        if self._last_attempt is not None and now - self._last_attempt < self.retry_seconds:
            return False
        self._last_attempt = now
        reason = self._initialize()
        if reason is not None:
            self.error = reason
            return False
        self._initialized = True
        self.error = None
        self._on_initialized()
        return True

    def start(self) -> None:
        """Initialise now rather than at the first scrape; a failure is logged by the collector runner."""
        self.ensure_initialized()

    def stop(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Release the library; the next ``ensure_initialized`` may initialise it again."""
        if self._initialized:
            self._initialized = False
            self._shut_down_library()

    def _initialize(self) -> str | None:
        raise NotImplementedError

    def _on_initialized(self) -> None:
        """What follows a successful init (e.g. starting an event watcher)."""

    def _shut_down_library(self) -> None:
        raise NotImplementedError


class GpuLibrary(RetryingInit):
    """A backend over a vendor library: each GPU's identity (uuid, name, PCI bus id) kept once read,
    so a GPU that stops answering is still named, and each kind of warning logged once (in the
    subclass's module's logger)."""

    def __init__(self, *, retry_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__(retry_seconds=retry_seconds, clock=clock)
        self._static: dict[int, tuple[str, str | None, str | None]] = {}
        self._warned: set[str] = set()

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logging.getLogger(type(self).__module__).warning(message, *args)

    def _lost_reading(self, index: int, reason: Exception) -> GpuReading:
        """GPU ``index`` stopped answering: its reading is down, under the identity it had."""
        uuid, name, bus_id = self._static.get(index, ("", None, None))
        self._warn_once(f"lost:{index}", "GPU %d (%s) is lost: %s", index, uuid or "uuid unknown", reason)
        return GpuReading(index=index, uuid=uuid, name=name, pci_bus_id=bus_id, up=False)
