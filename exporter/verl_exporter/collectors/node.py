"""The runs this node works for, so that rules can attribute its GPUs and host to them.

Emits, for the run of ``--project``/``--experiment`` (or ``VERL_EXPORTER_PROJECT``/
``VERL_EXPORTER_EXPERIMENT``) and for the unfinished runs it follows, while they are at most
``--node.max-runs`` (8: a node has at most 8 GPUs, so it cannot be a node of more runs at once; an
exporter following more reads a shared log directory, and its GPUs are none of theirs)::

    # HELP verl_node_run_info The runs whose job uses this node's GPUs and host; always 1.
    # TYPE verl_node_run_info gauge
    verl_node_run_info{experiment="grpo-qwen2-7b",project="gsm8k",team="rl",user="alice"} 1.0

A worker node of a multi-node job reads no logs: it serves its GPUs with the run named by the flags
or the environment (owned by the exporter's own user, as a job's sidecar runs as the job's user),
and the rules join its GPU and host series to the run on ``instance``. Under
``--slurm`` the runs come from the Slurm watcher instead of the store (``job_runs``): the runs of the
jobs with a live process on this node, head or worker, and none of a job that has ended (a crashed
run stays unfinished in the store, but its node is no longer its own).
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

from prometheus_client.core import Metric

from verl_exporter.collectors import Collector
from verl_exporter.store.owners import NO_TEAMS, Owners, user_name
from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore

from .. import schema


class NodeCollector(Collector):
    def __init__(self, store: RunStore | None, named_run: Callable[[], tuple[str | None, str | None]],
                 max_runs: Callable[[], int] = lambda: 8,
                 job_runs: Callable[[], Iterable[RunKey]] | None = None, owners: Owners = NO_TEAMS):
        self.store = store
        self.owners = owners
        self.job_runs = job_runs
        # Read at scrape time, so that a reload applies: (project, experiment) of the flags, the cap.
        self.named_run = named_run
        self.max_runs = max_runs

    def describe(self) -> Iterable[Metric]:
        return [schema.NODE["run_info"].new()]

    def runs(self) -> list[RunKey]:
        """The runs this node serves, sorted."""
        runs = set()
        project, experiment = self.named_run()
        if project and experiment:
            runs.add(self.owners.run(project, experiment, user_name(os.getuid())))
        if self.job_runs is not None:
            runs.update(self.job_runs())
        elif self.store is not None:
            followed = set(self.store.unfinished_runs())
            if len(followed) <= self.max_runs():
                runs.update(followed)
        return sorted(runs)

    def collect(self) -> Iterable[Metric]:
        family = schema.NODE["run_info"].new()
        for run in self.runs():
            family.add_metric(list(run.labels), 1.0)
        yield family
