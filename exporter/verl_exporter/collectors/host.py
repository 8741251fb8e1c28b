"""Host CPU, load and memory, and the training job's processes, read from psutil at scrape time."""

from __future__ import annotations

from typing import Any, Iterable

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..job import JobSelector

HOST_GAUGES = {
    "verl_host_cpu_utilization_ratio": "Busy share of all CPUs since the previous scrape (0-1).",
    "verl_host_cpus": "Number of logical CPUs.",
    "verl_host_load1": "1-minute load average.",
    "verl_host_load5": "5-minute load average.",
    "verl_host_load15": "15-minute load average.",
    "verl_host_memory_total_bytes": "Total physical memory.",
    "verl_host_memory_available_bytes": "Memory available to new processes without swapping.",
    "verl_host_memory_used_bytes": "Memory in use (psutil's definition: total minus free, buffers and cache).",
    "verl_host_swap_total_bytes": "Total swap space.",
    "verl_host_swap_used_bytes": "Swap space in use.",
}
JOB_GAUGES = {
    "verl_job_processes": "Number of live processes of the training job (the root process and its children).",
    "verl_job_resident_memory_bytes": "Resident memory (RSS) summed over the training job's processes.",
    "verl_job_threads": "Threads summed over the training job's processes.",
    "verl_job_open_fds": "Open file descriptors summed over the training job's processes.",
}


class HostCollector:
    """Host stats from psutil; job stats when a ``JobSelector`` is configured.

    Emits (job series only with a configured job; the sums only while it runs)::

        # HELP verl_host_cpu_utilization_ratio Busy share of all CPUs since the previous scrape (0-1).
        # TYPE verl_host_cpu_utilization_ratio gauge
        # HELP verl_host_cpu_seconds_total CPU time spent in each mode, summed over all CPUs.
        # TYPE verl_host_cpu_seconds_total counter
        verl_host_cpu_seconds_total{mode="user"} 12345.6
        # TYPE verl_host_cpus gauge            (also verl_host_load1/5/15)
        # TYPE verl_host_memory_total_bytes gauge   (also _available_, _used_; verl_host_swap_total/used_bytes)
        # HELP verl_job_running Whether the training job has a live process (1) or not (0).
        # TYPE verl_job_running gauge
        # TYPE verl_job_processes gauge        (also verl_job_resident_memory_bytes, _threads, _open_fds)
        # HELP verl_job_cpu_seconds_total CPU time (user + system) of the job's live processes.
        # TYPE verl_job_cpu_seconds_total counter
    """

    def __init__(self, psutil_module: Any = psutil, job: JobSelector | None = None):
        self._psutil = psutil_module
        self.job = job if job is not None and job.configured else None
        self.last_error: str | None = None
        self._psutil.cpu_percent(None)  # the first call only sets the baseline

    def describe(self) -> Iterable[Metric]:
        yield from self._host_families().values()
        if self.job is not None:
            yield from self._job_families().values()

    def collect(self) -> Iterable[Metric]:
        ps = self._psutil
        host = self._host_families()
        host["verl_host_cpu_utilization_ratio"].add_metric([], ps.cpu_percent(None) / 100.0)
        for mode, seconds in ps.cpu_times()._asdict().items():
            host["verl_host_cpu_seconds_total"].add_metric([mode], seconds)
        host["verl_host_cpus"].add_metric([], ps.cpu_count(logical=True) or 0)
        for name, value in zip(("verl_host_load1", "verl_host_load5", "verl_host_load15"), ps.getloadavg()):
            host[name].add_metric([], value)
        memory, swap = ps.virtual_memory(), ps.swap_memory()
        host["verl_host_memory_total_bytes"].add_metric([], memory.total)
        host["verl_host_memory_available_bytes"].add_metric([], memory.available)
        host["verl_host_memory_used_bytes"].add_metric([], memory.used)
        host["verl_host_swap_total_bytes"].add_metric([], swap.total)
        host["verl_host_swap_used_bytes"].add_metric([], swap.used)
        yield from host.values()
        if self.job is not None:
            yield from self._collect_job()

    def _collect_job(self) -> Iterable[Metric]:
        families = self._job_families()
        processes = self.job.processes()
        totals = self._job_totals(processes)
        families["verl_job_running"].add_metric([], 1.0 if totals["processes"] else 0.0)
        families["verl_job_processes"].add_metric([], totals["processes"])
        if totals["processes"]:
            families["verl_job_resident_memory_bytes"].add_metric([], totals["rss"])
            families["verl_job_cpu_seconds_total"].add_metric([], totals["cpu"])
            families["verl_job_threads"].add_metric([], totals["threads"])
            if totals["fds"] is not None:
                families["verl_job_open_fds"].add_metric([], totals["fds"])
        return families.values()

    def _job_totals(self, processes: list) -> dict:
        """Sums over the processes that are still there when read; exited ones are skipped."""
        ps = self._psutil
        totals: dict = {"processes": 0, "rss": 0, "cpu": 0.0, "threads": 0, "fds": None}
        for proc in processes:
            try:
                with proc.oneshot():
                    rss = proc.memory_info().rss
                    times = proc.cpu_times()
                    threads = proc.num_threads()
                    fds = self._open_fds(proc)
            except ps.NoSuchProcess:
                continue
            except ps.AccessDenied:
                totals["processes"] += 1  # it is there, we just may not look inside
                continue
            totals["processes"] += 1
            totals["rss"] += rss
            totals["cpu"] += times.user + times.system
            totals["threads"] += threads
            if fds is not None:
                totals["fds"] = (totals["fds"] or 0) + fds
        return totals

    def _open_fds(self, proc: Any) -> int | None:
        try:
            return proc.num_fds()
        except (AttributeError, self._psutil.AccessDenied):  # no num_fds on Windows
            return None

    @staticmethod
    def _host_families() -> dict[str, Metric]:
        families: dict[str, Metric] = {name: GaugeMetricFamily(name, text) for name, text in HOST_GAUGES.items()}
        families["verl_host_cpu_seconds_total"] = CounterMetricFamily(
            "verl_host_cpu_seconds", "CPU time spent in each mode, summed over all CPUs.", labels=["mode"]
        )
        return families

    @staticmethod
    def _job_families() -> dict[str, Metric]:
        families: dict[str, Metric] = {
            "verl_job_running": GaugeMetricFamily(
                "verl_job_running", "Whether the training job has a live process (1) or not (0)."
            ),
            "verl_job_cpu_seconds_total": CounterMetricFamily(
                "verl_job_cpu_seconds",
                "CPU time (user + system) of the job's live processes; drops when a process exits.",
            ),
        }
        families.update({name: GaugeMetricFamily(name, text) for name, text in JOB_GAUGES.items()})
        return families
