"""The scheduler's job of each run: which Slurm job or Kubernetes pod writes it, and its GPUs.

Emits, for every run a scheduler watcher (``schedulers.slurm``, ``schedulers.kubernetes``) ties to a
job; a label the scheduler lacks is empty::

    # HELP verl_job_info The scheduler's job that writes the run (Slurm or Kubernetes); always 1.
    # TYPE verl_job_info gauge
    verl_job_info{experiment="grpo-7b",job_id="4242",job_name="grpo",namespace="",partition="gpu",pod="",
                  project="gsm8k",scheduler="slurm",user="alice"} 1.0
    # HELP verl_job_gpu_info A GPU of this node the run's job holds (gpu: NVML's index, ...); always 1.
    # TYPE verl_job_gpu_info gauge
    verl_job_gpu_info{experiment="grpo-7b",gpu="0",project="gsm8k"} 1.0

and, where the watcher follows the job's processes itself (``--slurm``), one ``verl_job_running``
per run (the family of ``schema.JOB``, with the run's labels): 1 while the job has a live process on
this node, 0 once it ended; a run it left unfinished then reads as crashed
(``VerlTrainingJobCrashed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from prometheus_client.core import Metric

from .. import schema


@dataclass(frozen=True)
class JobRun:
    """One run and the scheduler's job that writes it."""

    project: str
    experiment: str
    scheduler: str  # "slurm" or "kubernetes"
    job_id: str
    job_name: str = ""
    user: str = ""
    partition: str = ""
    namespace: str = ""
    pod: str = ""
    gpus: tuple[str, ...] = ()
    running: bool | None = None  # None: the watcher does not follow the job's processes

    def info_labels(self) -> list[str]:
        return [self.project, self.experiment, self.scheduler, self.job_id, self.job_name, self.user,
                self.partition, self.namespace, self.pod]


class JobInfoCollector:
    """``rows()`` gives the runs and their jobs at scrape time; ``serves_running``: it serves
    ``verl_job_running{project, experiment}`` (then no job selector of the host collector does)."""

    def __init__(self, rows: Callable[[], Iterable[JobRun]], serves_running: bool = False):
        self.rows = rows
        self.serves_running = serves_running

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        gpus: dict[tuple[str, str], set[str]] = {}
        running: dict[tuple[str, str], bool] = {}
        for row in sorted(self.rows(), key=lambda row: (row.project, row.experiment, row.job_id)):
            run = (row.project, row.experiment)
            families["info"].add_metric(row.info_labels(), 1.0)
            gpus.setdefault(run, set()).update(row.gpus)
            if row.running is not None:  # a run two jobs wrote (a resumed job) runs while one of them does
                running[run] = running.get(run, False) or row.running
        for run, indices in gpus.items():
            for gpu in sorted(indices, key=lambda gpu: (len(gpu), gpu)):
                families["gpu"].add_metric([*run, gpu], 1.0)
        if "running" in families:
            for run, live in running.items():
                families["running"].add_metric(list(run), 1.0 if live else 0.0)
        return list(families.values())

    def _families(self) -> dict[str, schema.Built]:
        families = {key: family.new() for key, family in schema.JOB_INFO.items()}
        if self.serves_running:
            families["running"] = schema.JOB["running"].new(schema.RUN)
        return families
