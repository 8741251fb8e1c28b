"""The one answer to "which job is this node's, which runs and processes are its, who owns them":
a ``Scheduler``, chosen once from the options (``choose``), that the collectors and the forensics
ask and nothing else.

======================  ===============================  ==================================  ==========
scheduler               the job's processes (``job``)     the node's runs (``node_runs``)     job info
======================  ===============================  ==================================  ==========
``slurm`` (--slurm)     every followed job's, each run's  the runs of the jobs live here      per run,
                        own (``pids_of``)                                                     ``verl_job_running``
``kubernetes`` (a pod)  --job.pid / --job.match            the flags' run and the store's      the pod
``local``               --job.pid / --job.match            the flags' run and the store's      none
======================  ===============================  ==================================  ==========

A run's owner (``RunKey.user``) is the owner of the file that named it, or under Slurm the job's
user, and its team comes from ``store.owners.Owners``: the operator's teams file, else the job's
Slurm account, else the pod's namespace.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from verl_exporter.collectors.job_info import JobRun
from verl_exporter.collectors.job_processes import JobSelector
from verl_exporter.store.owners import Owners, user_name
from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore

from .kubernetes import KubernetesPod, KubernetesRuns
from .slurm import SlurmWatcher

MAX_NODE_RUNS = 8  # a node has at most 8 GPUs: an exporter following more runs reads a shared folder


@dataclass
class Scheduler:
    """What the node's scheduler says of its jobs. ``rows`` (verl_job_info) is None where no
    scheduler names the job; ``pids_of`` is None where the node's job is one (``job``'s)."""

    name: str
    store: RunStore | None
    owners: Owners
    job: JobSelector | None = None
    named_run: Callable[[], tuple[str | None, str | None]] = lambda: (None, None)
    max_runs: Callable[[], int] = lambda: MAX_NODE_RUNS
    rows: Callable[[], Iterable[JobRun]] | None = None
    pids_of: Callable[[RunKey], set[int]] | None = None
    watcher: SlurmWatcher | None = None
    _job_runs: Callable[[], Iterable[RunKey]] | None = field(default=None, repr=False)

    @property
    def serves_running(self) -> bool:
        """``verl_job_running`` is per run (the job info collector's), not the node's job's."""
        return self.watcher is not None

    def node_runs(self) -> list[RunKey]:
        """The runs this node's job(s) work for, sorted: under Slurm the runs of the jobs with a live
        process here; else the run the flags name (owned by the exporter's user, as a job's sidecar
        runs as the job's user) and the store's unfinished runs, while they are at most ``max_runs``."""
        runs: set[RunKey] = set()
        project, experiment = self.named_run()
        if project and experiment:
            runs.add(self.owners.run(project, experiment, user_name(os.getuid())))
        if self._job_runs is not None:
            runs.update(self._job_runs())
        elif self.store is not None:
            most = self.max_runs()
            followed = set(self.store.unfinished_runs(limit=most + 1))  # one more tells that there are too many
            if len(followed) <= most:
                runs.update(followed)
        return sorted(runs)

    def start(self) -> None:
        if self.watcher is not None:
            self.watcher.start()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()


def slurm(store: RunStore, owners: Owners, watcher: SlurmWatcher) -> Scheduler:
    """--slurm: the watcher finds the node's jobs, their processes, files, runs and owners."""
    return Scheduler("slurm", store, owners, job=JobSelector(pids=watcher.pids), rows=watcher.rows,
                     pids_of=watcher.pids_of, watcher=watcher, _job_runs=watcher.node_runs)


def local(store: RunStore | None, owners: Owners, job: JobSelector | None,
          named_run: Callable[[], tuple[str | None, str | None]], max_runs: Callable[[], int]) -> Scheduler:
    """A sidecar: the job of --job.pid / --job.match; a Kubernetes pod's job where the downward API
    names one (its rows: every run the store follows is the pod's)."""
    pod = KubernetesPod.from_env()
    if pod is not None and store is not None:
        return Scheduler("kubernetes", store, owners, job=job, named_run=named_run, max_runs=max_runs,
                         rows=KubernetesRuns(pod, store).rows)
    return Scheduler("local", store, owners, job=job, named_run=named_run, max_runs=max_runs)
