"""Host CPU, load and memory, and the training job's processes, read from psutil at scrape time."""

from __future__ import annotations

from typing import Any, Iterable

import psutil
from prometheus_client.core import Metric

from verl_exporter.collectors import Collector
from verl_exporter.collectors.job_processes import JobSelector

from .. import schema


class HostCollector(Collector):
    """Host stats from psutil; job stats when a ``JobSelector`` is configured.

    Emits (job series only with a configured job; the sums only while it runs; ``verl_job_running``
    not where ``job_running`` is False: under ``--slurm`` it is per run, the job info collector's)::

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

    def __init__(self, psutil_module: Any = psutil, job: JobSelector | None = None, job_running: bool = True):
        self._psutil = psutil_module
        self.job_running = job_running
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
        host["cpu_utilization"].add_metric([], ps.cpu_percent(None) / 100.0)
        for mode, seconds in ps.cpu_times()._asdict().items():
            host["cpu_seconds"].add_metric([mode], seconds)
        host["cpus"].add_metric([], ps.cpu_count(logical=True) or 0)
        for name, value in zip(("load1", "load5", "load15"), ps.getloadavg()):
            host[name].add_metric([], value)
        memory, swap = ps.virtual_memory(), ps.swap_memory()
        host["memory_total"].add_metric([], memory.total)
        host["memory_available"].add_metric([], memory.available)
        host["memory_used"].add_metric([], memory.used)
        host["swap_total"].add_metric([], swap.total)
        host["swap_used"].add_metric([], swap.used)
        yield from host.values()
        if self.job is not None:
            yield from self._collect_job(self.job)

    def _collect_job(self, job: JobSelector) -> Iterable[Metric]:
        families = self._job_families()
        processes = job.processes()
        totals = self._job_totals(processes)
        if "running" in families:
            families["running"].add_metric([], 1.0 if totals["processes"] else 0.0)
        families["processes"].add_metric([], totals["processes"])
        if totals["processes"]:
            families["resident_memory"].add_metric([], totals["rss"])
            families["cpu_seconds"].add_metric([], totals["cpu"])
            families["threads"].add_metric([], totals["threads"])
            if totals["fds"] is not None:
                families["open_fds"].add_metric([], totals["fds"])
        return list(families.values())

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
    def _host_families() -> dict[str, schema.Built]:
        return {key: family.new() for key, family in schema.HOST.items()}

    def _job_families(self) -> dict[str, schema.Built]:
        return {key: family.new() for key, family in schema.JOB.items() if self.job_running or key != "running"}
