"""The scheduler's job of each run: which Slurm job or Kubernetes pod writes it, and its GPUs.

Emits, for every run a scheduler watcher (``schedulers.slurm``, ``schedulers.kubernetes``) ties to a
job; a label the scheduler lacks is empty::

    # HELP verl_job_info The scheduler's job that writes the run (Slurm or Kubernetes); always 1.
    # TYPE verl_job_info gauge
    verl_job_info{experiment="grpo-7b",job_id="4242",job_name="grpo",namespace="",partition="gpu",pod="",
                  project="gsm8k",scheduler="slurm",team="rl",user="alice"} 1.0
    # HELP verl_job_gpu_info A GPU of this node the run's job holds (gpu: its index, ...); always 1.
    # TYPE verl_job_gpu_info gauge
    verl_job_gpu_info{experiment="grpo-7b",gpu="0",project="gsm8k",team="rl",user="alice"} 1.0

and, where the watcher follows the job's processes itself (``--slurm``), one ``verl_job_running``
per run (the family of ``schema.JOB``, with the run's labels): 1 while the job has a live process on
this node, 0 once it ended; a run it left unfinished then reads as crashed
(``VerlTrainingJobCrashed``). Once a job ended, the node that decided its runs (the batch host) says
how Slurm ended it, which the crash alerts quote::

    # HELP verl_job_ended_timestamp_seconds When the run's job ended, and how the scheduler ended it ...
    # TYPE verl_job_ended_timestamp_seconds gauge
    verl_job_ended_timestamp_seconds{experiment="grpo-7b",exit_code="0:0",job_id="4242",project="gsm8k",
                                     reason="TimeLimit",scheduler="slurm",state="TIMEOUT",team="rl",user="alice"} 1.7e9
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from prometheus_client.core import Metric

from verl_exporter.collectors import Collector
from verl_exporter.store.records import RunKey

from .. import schema

MAX_END_LABEL = 64  # characters of a state, exit code or reason: words of Slurm's, never longer


@dataclass(frozen=True)
class JobEnd:
    """How the scheduler ended a job (its final state, exit code, reason) and when it was seen ended."""

    state: str
    exit_code: str
    reason: str
    at: float

    def labels(self) -> list[str]:
        return [value[:MAX_END_LABEL] for value in (self.state, self.exit_code, self.reason)]


@dataclass(frozen=True)
class JobRun:
    """One run (its owner included: Slurm's user of the job) and the scheduler's job that writes it."""

    run: RunKey
    scheduler: str  # "slurm" or "kubernetes"
    job_id: str
    job_name: str = ""
    partition: str = ""
    namespace: str = ""
    pod: str = ""
    gpus: tuple[str, ...] = ()
    running: bool | None = None  # None: the watcher does not follow the job's processes
    end: JobEnd | None = None  # once the job ended, where the scheduler said how

    def info_labels(self) -> list[str]:
        return [*self.run.labels, self.scheduler, self.job_id, self.job_name, self.partition, self.namespace,
                self.pod]


class JobInfoCollector(Collector):
    """``rows()`` gives the runs and their jobs at scrape time; ``serves_running``: it serves
    ``verl_job_running`` per run (then no job selector of the host collector does)."""

    def __init__(self, rows: Callable[[], Iterable[JobRun]], serves_running: bool = False):
        self.rows = rows
        self.serves_running = serves_running

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        gpus: dict[tuple[str, str, str, str], set[str]] = {}
        running: dict[tuple[str, str, str, str], bool] = {}
        for row in sorted(self.rows(), key=lambda row: (row.run, row.job_id)):
            run = row.run.labels
            families["info"].add_metric(row.info_labels(), 1.0)
            gpus.setdefault(run, set()).update(row.gpus)
            if row.running is not None:  # a run two jobs wrote (a resumed job) runs while one of them does
                running[run] = running.get(run, False) or row.running
            if row.end is not None and "ended" in families:
                families["ended"].add_metric([*run, row.scheduler, row.job_id, *row.end.labels()], row.end.at)
        for run, indices in gpus.items():
            for gpu in sorted(indices, key=lambda gpu: (len(gpu), gpu)):
                families["gpu"].add_metric([*run, gpu], 1.0)
        if "running" in families:
            for run, live in running.items():
                families["running"].add_metric(list(run), 1.0 if live else 0.0)
        return list(families.values())

    def _families(self) -> dict[str, schema.Built]:
        # A watcher that follows the jobs' processes (--slurm) sees them run and end.
        families = {key: family.new() for key, family in schema.JOB_INFO.items()
                    if key != "ended" or self.serves_running}
        if self.serves_running:
            families["running"] = schema.JOB["running"].new(schema.RUN)
        return families
