"""Which GPU library the exporter reads (``--gpu.backend``): NVML, amdsmi, or the first that initialises.

``make_backend("auto")`` tries NVML (NVIDIA), then amdsmi (AMD ROCm), at start and at each retry
until one initialises, and keeps that one; while none does, ``error`` gives both reasons in one
line. ``make_backend("nvml")`` / ``make_backend("amdsmi")`` use that library only, with its own
error messages. Either way the choice is logged once, when the library first answers.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from verl_exporter.gpu.amdsmi import AmdSmiBackend
from verl_exporter.gpu.backend import GpuBackend, GpuReading, GpuUnavailable
from verl_exporter.gpu.nvml import NvmlBackend

log = logging.getLogger(__name__)

LIBRARIES = {"nvml": "NVML (NVIDIA)", "amdsmi": "amdsmi (AMD ROCm)"}
BACKENDS = ("auto", *LIBRARIES)


def _reason(error: str | None) -> str:
    """A backend's init error without its "GPU metrics are off, retrying ..." tail."""
    return (error or "not initialised").split("; GPU metrics are off")[0]


class SelectedGpuBackend:
    """``GpuBackend`` over the first of ``candidates`` ((library, backend) pairs) that
    initialises; once one has, it is the backend for good (a node does not change GPU vendor)."""

    def __init__(self, candidates: list[tuple[str, GpuBackend]], *, retry_seconds: float = 60.0):
        self.candidates = candidates
        self.retry_seconds = retry_seconds
        self.library: str | None = None  # "nvml" or "amdsmi" once chosen
        self.backend: GpuBackend | None = None
        self.error: str | None = None

    @property
    def available(self) -> bool:
        return self.backend is not None and self.backend.available

    def ensure_initialized(self) -> bool:
        if self.backend is not None:
            ready = self.backend.ensure_initialized()
            self.error = self.backend.error
            return bool(ready)
        reasons: list[tuple[str, str | None]] = []
        for library, backend in self.candidates:
            if backend.ensure_initialized():
                self._choose(library, backend, reasons)
                return True
            reasons.append((library, backend.error))
        if len(reasons) == 1:
            self.error = reasons[0][1]
        else:
            tried = "; ".join(f"{LIBRARIES[library]}: {_reason(error)}" for library, error in reasons)
            self.error = (f"no GPU library initialises ({tried}); GPU metrics are off, "
                          f"retrying every {self.retry_seconds:g} s")
        return False

    def _choose(self, library: str, backend: GpuBackend, passed_over: list[tuple[str, str | None]]) -> None:
        self.library, self.backend, self.error = library, backend, None
        others = "".join(f"; {LIBRARIES[name]} did not initialise: {_reason(error)}" for name, error in passed_over)
        try:
            count: Any = backend.device_count()
        except GpuUnavailable:
            count = "?"
        log.info("GPU metrics from %s: %s GPUs, driver %s%s", LIBRARIES[library], count,
                 backend.driver_version() or "unknown", others)

    def start(self) -> None:
        """Initialise now rather than at the first scrape (the collector runner logs a failure)."""
        self.ensure_initialized()

    def stop(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        for _, backend in self.candidates:
            backend.stop()

    def device_count(self) -> int:
        if self.backend is None:
            raise GpuUnavailable(self.error or "no GPU library is initialised")
        return int(self.backend.device_count())

    def driver_version(self) -> str | None:
        return None if self.backend is None else self.backend.driver_version()

    def cuda_driver_version(self) -> str | None:
        return None if self.backend is None else self.backend.cuda_driver_version()

    def read_device(self, index: int) -> GpuReading:
        if self.backend is None:
            raise GpuUnavailable(self.error or "no GPU library is initialised")
        return self.backend.read_device(index)

    def running_processes(self, index: int) -> list[tuple[int, int | None]]:
        return [] if self.backend is None else self.backend.running_processes(index)

    def xid_counts(self) -> dict[tuple[int, int], int]:
        return {} if self.backend is None else self.backend.xid_counts()


def make_backend(choice: str = "auto", *, pcie_throughput: bool = False, retry_seconds: float = 60.0,
                 nvml_module: Any = None, amdsmi_module: Any = None) -> SelectedGpuBackend:
    """The backend for ``--gpu.backend`` ``choice``; the modules stand in for pynvml / amdsmi in tests."""
    if choice not in BACKENDS:
        raise ValueError(f"unknown GPU backend {choice!r}; choose one of {', '.join(BACKENDS)}")
    made: dict[str, Callable[[], GpuBackend]] = {
        "nvml": lambda: NvmlBackend(nvml_module, pcie_throughput=pcie_throughput, retry_seconds=retry_seconds),
        "amdsmi": lambda: AmdSmiBackend(amdsmi_module, pcie_throughput=pcie_throughput,
                                        retry_seconds=retry_seconds),
    }
    libraries = list(LIBRARIES) if choice == "auto" else [choice]
    return SelectedGpuBackend([(library, made[library]()) for library in libraries], retry_seconds=retry_seconds)
