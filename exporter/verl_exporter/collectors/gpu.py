"""Live GPU stats from NVML (through an ``NvmlBackend`` or ``FakeNvmlBackend``) at scrape time."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from prometheus_client.core import Metric

from verl_exporter.collectors import Collector
from verl_exporter.collectors.job_processes import JobSelector
from verl_exporter.gpu.backend import GpuBackend, GpuReading, GpuUnavailable

from .. import schema


@dataclass
class GpuSnapshot:
    """Everything one scrape read from the backend."""

    count: int
    driver_version: str | None
    cuda_driver_version: str | None
    readings: list[GpuReading]
    processes: dict[int, list[tuple[int, int | None]]] = field(default_factory=dict)
    xid_counts: dict[tuple[int, int], int] = field(default_factory=dict)


class _Attempt:
    """One read asked of the reader thread: ``done`` once it returned or raised."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _Reader:
    """One daemon thread that runs ``fn`` for each attempt asked of it, so that a caller can stop
    waiting for a read (started on the first request; a thread per read costs a scrape more)."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self._requests: queue.SimpleQueue[_Attempt] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ask(self) -> _Attempt:
        attempt = _Attempt()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="verl-gpu-read", daemon=True)
                self._thread.start()
        self._requests.put(attempt)
        return attempt

    def _serve(self) -> None:
        while True:
            attempt = self._requests.get()
            try:
                attempt.result = self.fn()
            except BaseException as exc:  # handed back to the scrape thread
                attempt.error = exc
            finally:
                attempt.done.set()


class GpuCollector(Collector):
    """Per-GPU series labelled ``gpu`` (index) and ``uuid``; a field NVML cannot report is left out.

    Emits (see docs/metrics-gpu-host.md for the full table)::

        # HELP verl_gpus Number of GPUs the GPU library (NVML or amdsmi) sees.
        # TYPE verl_gpus gauge
        # HELP verl_gpu_info GPU identity; always 1.
        # TYPE verl_gpu_info gauge
        verl_gpu_info{gpu="0",uuid="GPU-...",name="NVIDIA H100 80GB HBM3",driver_version="550.54.15",
                      cuda_driver_version="12.4",pci_bus_id="00000000:18:00.0"} 1.0
        # HELP verl_gpu_up Whether the GPU answers the GPU library (1) or is lost (0).
        # TYPE verl_gpu_up gauge
        # TYPE verl_gpu_memory_used_bytes gauge          (and the other schema.GPU_READINGS)
        # TYPE verl_gpu_energy_joules_total counter      (and verl_gpu_pcie_replay_errors_total)
        # TYPE verl_gpu_clock_event_active gauge         {reason="hw_thermal_slowdown"} 0/1
        # TYPE verl_gpu_ecc_errors_total counter         {type="corrected"|"uncorrected"}
        # TYPE verl_gpu_remapped_rows gauge              {state="correctable"|"uncorrectable"|"pending"|"failure"}
        # TYPE verl_gpu_xid_errors_total counter         {xid="79"}
        # TYPE verl_gpu_process_memory_bytes gauge       {pid="1234"}
        # TYPE verl_job_gpu_memory_bytes gauge           (with a job selector)
        # TYPE verl_job_gpus gauge                       (with a job selector)

    The NVML read runs in a worker thread; a scrape waits at most ``timeout_seconds`` for it. While
    a timed-out read is still stuck, later scrapes do not start another one; they report failure.
    """

    def __init__(self, backend: GpuBackend, *, job: JobSelector | None = None,
                 timeout_seconds: float | None = 2.0):
        self.backend = backend
        self.job = job if job is not None and job.configured else None
        self.timeout_seconds = timeout_seconds
        self.last_error: str | None = None
        self._error: str | None = None  # why the read under way gave nothing
        self._one_read = threading.Lock()
        self._stuck: _Attempt | None = None
        self._reader = _Reader(self._read)
        self._pids_on: dict[int, frozenset[int]] = {}  # GPU index: the pids NVML saw on it, last read

    def gpus_used_by(self, pids: Iterable[int]) -> tuple[str, ...]:
        """The indices (NVML's) of the GPUs on which any of ``pids`` ran at the last read; () when
        none did or nothing was read."""
        wanted = set(pids)
        return tuple(str(index) for index, seen in sorted(self._pids_on.items()) if seen & wanted)

    def describe(self) -> Iterable[Metric]:
        return self._families().values()

    def collect(self) -> Iterable[Metric]:
        families, self.last_error = self.read_now()
        return families

    def read_now(self) -> tuple[list[Metric], str | None]:
        """The GPUs' families now and why they could not be read (None when they could). A scrape
        and the forensics share this one collector: one read at a time, each with its own answer."""
        with self._one_read:
            self._error = None
            try:
                snapshot = self._read_with_deadline()
            except GpuUnavailable as exc:
                return [], str(exc) or "NVML is unavailable"
            if snapshot is None:
                return [], self._error
            self._pids_on = {index: frozenset(pid for pid, _ in procs) for index, procs in snapshot.processes.items()}
            return [family for family in self._build(snapshot).values() if family.samples], None

    def _read_with_deadline(self) -> GpuSnapshot | None:
        if self.timeout_seconds is None:
            return self._read()
        if self._stuck is not None:
            if not self._stuck.done.is_set():
                self._error = "an earlier NVML read is still stuck; skipping this scrape's read"
                return None
            self._stuck = None
        attempt = self._reader.ask()
        if not attempt.done.wait(self.timeout_seconds):
            self._stuck = attempt
            self._error = f"NVML read took longer than {self.timeout_seconds:g} s; skipped"
            return None
        if attempt.error is not None:
            raise attempt.error
        return attempt.result

    def _read(self) -> GpuSnapshot:
        backend = self.backend
        if not backend.ensure_initialized():
            raise GpuUnavailable(backend.error or "NVML is unavailable")
        count = backend.device_count()
        readings = [backend.read_device(index) for index in range(count)]
        return GpuSnapshot(
            count=count,
            driver_version=backend.driver_version(),
            cuda_driver_version=backend.cuda_driver_version(),
            readings=readings,
            processes={r.index: backend.running_processes(r.index) for r in readings if r.up},
            xid_counts=backend.xid_counts(),
        )

    def _build(self, snap: GpuSnapshot) -> dict[str, schema.Built]:
        fams = self._families()
        fams["gpus"].add_metric([], snap.count)
        uuids = {r.index: r.uuid or "" for r in snap.readings}
        for r in snap.readings:
            gpu = [str(r.index), uuids[r.index]]
            info = [r.name or "", snap.driver_version or "", snap.cuda_driver_version or "", r.pci_bus_id or ""]
            fams["info"].add_metric(gpu + info, 1.0)
            fams["up"].add_metric(gpu, 1.0 if r.up else 0.0)
            for attribute in schema.GPU_READINGS:
                value = getattr(r, attribute)
                if value is not None:
                    fams[attribute].add_metric(gpu, value)
            for reason, active in (r.clock_event_reasons or {}).items():
                fams["clock_event_active"].add_metric(gpu + [reason], 1.0 if active else 0.0)
            for kind, count in (r.ecc_errors or {}).items():
                fams["ecc_errors"].add_metric(gpu + [kind], count)
            for kind, count in (r.ecc_volatile_errors or {}).items():
                fams["ecc_volatile_errors"].add_metric(gpu + [kind], count)
            for state, rows in (r.remapped_rows or {}).items():
                fams["remapped_rows"].add_metric(gpu + [state], rows)
            for direction, rate in (r.pcie_throughput_bytes_per_second or {}).items():
                fams["pcie_throughput"].add_metric(gpu + [direction], rate)
        for (index, xid), count in sorted(snap.xid_counts.items()):
            fams["xid_errors"].add_metric([str(index), uuids.get(index, ""), str(xid)], count)
        for index, procs in sorted(snap.processes.items()):
            for pid, used in procs:
                if used is not None:
                    fams["process_memory"].add_metric([str(index), uuids[index], str(pid)], used)
        if self.job is not None:
            self._add_job(fams, snap, self.job)
        return fams

    def _add_job(self, fams: dict[str, schema.Built], snap: GpuSnapshot, job: JobSelector) -> None:
        pids = {p.pid for p in job.processes()}
        used_bytes, gpus = 0, 0
        for procs in snap.processes.values():
            mine = [used for pid, used in procs if pid in pids]
            gpus += 1 if mine else 0
            used_bytes += sum(used or 0 for used in mine)
        fams["job_memory"].add_metric([], used_bytes)
        fams["job_gpus"].add_metric([], gpus)

    def _families(self) -> dict[str, schema.Built]:
        """Fresh, empty families for every series this collector can emit (schema.GPUS, and
        schema.JOB_GPUS with a job selector)."""
        fams: dict[str, schema.Built] = {key: family.new() for key, family in schema.GPUS.items()}
        if self.job is not None:
            fams.update((f"job_{key}", family.new()) for key, family in schema.JOB_GPUS.items())
        return fams
