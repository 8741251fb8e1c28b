"""Every node of a run: the recording rules that attribute GPUs, host and job stats to runs.

A multi-node verl job logs on its head node only; every node's exporter serves
``verl_node_run_info{project, experiment} 1`` for the runs it works for (the head from the runs it
follows, a worker from ``--project``/``--experiment``). ``run_instance:verl_node_run_info:unfinished``
is the set of (target, run) pairs of runs that have not finished (finished anywhere: the head
knows); every per-run figure joins a per-target aggregate to it on ``job, instance``, so a run's
figures cover all of its nodes. An exporter that reads a shared log directory (more unfinished runs
than ``--node.max-runs``) serves ``verl_training_run_info`` for every run but ``verl_node_run_info``
for none: its GPUs are not theirs, and joining them to every run would cost 1,000 series per GPU
figure at 1,000 runs.
"""

from __future__ import annotations

from .model import sub

NODES = "run_instance:verl_node_run_info:unfinished"
# The runs a target works for.
NODE_RUNS = "verl_node_run_info"
# Recorded first in the same group (system.py): one series per run, 1 once finished.
FINISHED = "project_experiment:verl_training_finished:max"


def per_run(per_target: str, nodes: str = NODES) -> str:
    """``per_target`` (one series per job, instance) summed over the targets of each run."""
    return sub("sum by (project, experiment) (${per_target} * on(job, instance) group_right() ${nodes})",
               per_target=per_target, nodes=nodes)


# Per-run figures over every node of the run: (recorded name, aggregation per target, metric);
# "avg" is the sum over the run's GPUs or hosts divided by their count.
FIGURES = (
    ("project_experiment:verl_gpus:count", "count", "verl_gpu_up"),
    ("project_experiment:verl_gpus_up:sum", "sum", "verl_gpu_up"),
    ("project_experiment:verl_gpu_utilization_ratio:avg", "avg", "verl_gpu_utilization_ratio"),
    ("project_experiment:verl_gpu_memory_used_bytes:sum", "sum", "verl_gpu_memory_used_bytes"),
    ("project_experiment:verl_gpu_memory_total_bytes:sum", "sum", "verl_gpu_memory_total_bytes"),
    ("project_experiment:verl_gpu_power_watts:sum", "sum", "verl_gpu_power_watts"),
    ("project_experiment:verl_host_cpu_utilization_ratio:avg", "avg", "verl_host_cpu_utilization_ratio"),
    ("project_experiment:verl_host_memory_used_bytes:sum", "sum", "verl_host_memory_used_bytes"),
    ("project_experiment:verl_job_processes:sum", "sum", "verl_job_processes"),
    ("project_experiment:verl_job_resident_memory_bytes:sum", "sum", "verl_job_resident_memory_bytes"),
    ("project_experiment:verl_job_running_nodes:sum", "max", "verl_job_running"),
)


def figure(aggregation: str, metric: str) -> str:
    if aggregation == "avg":
        return sub("${sum} / ${count}", sum=figure("sum", metric), count=figure("count", metric))
    return per_run(sub("${aggregation} by (job, instance) (${metric})", aggregation=aggregation, metric=metric))


def recording_rules() -> list[dict]:
    """Rules of the verl-fleet group that come first: the run's nodes, then per-run GPU and host figures."""
    return [
        {"record": NODES, "expr": "${NODE_RUNS} unless on(project, experiment) ${FINISHED} == 1"},
        {"record": "project_experiment:verl_nodes:count", "expr": "count by (project, experiment) (${NODES})"},
        *({"record": record, "expr": figure(aggregation, metric)} for record, aggregation, metric in FIGURES),
    ]
