"""The runs this node works for, so that rules can attribute its GPUs and host to them.

Emits the runs the node's scheduler names (``schedulers.scheduler.Scheduler.node_runs``): the run of
``--project``/``--experiment`` (or ``VERL_EXPORTER_PROJECT``/``VERL_EXPORTER_EXPERIMENT``) and the
unfinished runs it follows, while they are at most ``--node.max-runs`` (8: a node has at most 8
GPUs, so it cannot be a node of more runs at once; an exporter following more reads a shared log
directory, and its GPUs are none of theirs)::

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

from typing import Callable, Iterable

from prometheus_client.core import Metric

from verl_exporter.collectors import Collector
from verl_exporter.store.records import RunKey

from .. import schema


class NodeCollector(Collector):
    def __init__(self, runs: Callable[[], Iterable[RunKey]]):
        self.runs = runs  # asked at scrape time: the jobs come and go, a reload changes the flags

    def describe(self) -> Iterable[Metric]:
        return [schema.NODE["run_info"].new()]

    def collect(self) -> Iterable[Metric]:
        family = schema.NODE["run_info"].new()
        for run in self.runs():
            family.add_metric(list(run.labels), 1.0)
        yield family
