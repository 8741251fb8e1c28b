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

A node whose exporter knows the GPUs of each job (``--slurm``: ``verl_job_gpu_info`` of a job with a
live process) has its GPU figures attributed GPU by GPU (``JOB_GPUS``): a node shared by two jobs
(four GPUs each) gives each run its own four, and a job without GPUs claims none. The GPUs of a job
must match the node's GPU series by index (``gpu``); where none does (Slurm names them otherwise), the
node is attributed whole, as a node without ``verl_job_gpu_info`` is.

Stragglers (VerlGpuStraggler) compare each GPU of a run with the run's other GPUs: each GPU's mean
utilisation over ``STRAGGLER_WINDOW`` (``RUN_GPU_BUSY``), its node's mean (``RUN_NODE_BUSY``) and the
run's median over its GPUs (a ``FIGURES`` row). Only the GPUs of targets that work for one unfinished
run count (``SOLE_RUN``): a node shared by two runs holds GPUs of both, and no label says which GPU is
whose, so comparing them would find the other run's GPUs "slow". Where the node's exporter knows each
job's GPUs (``JOB_GPUS``), each GPU counts for the run whose job holds it (``JOB_GPU_SOLE``), on a
shared node too.
"""

from __future__ import annotations

from verl_exporter.store.catalog import default_catalog

from . import fleet
from .model import run_query, sub

NODES = "run_instance:verl_node_run_info:unfinished"
# The runs a target works for.
NODE_RUNS = "verl_node_run_info"
# Recorded first in the same group (system.py): one series per run, 1 once finished.
FINISHED = "project_experiment:verl_training_finished:max"


# Per GPU of a node (job, instance, gpu, project, experiment): the GPUs a scheduler gave a run's live job,
# where they are GPUs the node serves figures for.
JOB_GPUS = "run_gpu:verl_job_gpu_info:running"
# One series per GPU and run, whatever other labels a target carries (a service discovery's).
JOB_GPUS_EXPR = ("max by (job, instance, gpu, project, experiment, user, team) ("
                 "(verl_job_gpu_info and on(job, instance, project, experiment, user, team) verl_job_running == 1"
                 " and on(job, instance, gpu) verl_gpu_up)"
                 " unless on(project, experiment, user, team) ${FINISHED} == 1)")


# The window a GPU's utilisation is averaged over before it is compared with the run's: several PPO
# steps, so that the phases of a step (generation, reference, actor update), which idle some GPUs on
# purpose, average out.
STRAGGLER_WINDOW = "10m"
# The unfinished run of each target that works for exactly one.
SOLE_RUN = "(${NODES} unless on(job, instance) count by (job, instance) (${NODES}) > 1)"
# The GPUs that exactly one run's live job holds.
JOB_GPU_SOLE = "(${JOB_GPUS} unless on(job, instance, gpu) count by (job, instance, gpu) (${JOB_GPUS}) > 1)"
# Per GPU (job, instance, gpu, uuid, project, experiment): its mean utilisation over the window.
RUN_GPU_BUSY = "run_gpu:verl_gpu_utilization_ratio:avg10m"
# Per node of a run (job, instance, project, experiment): the mean of its GPUs' figure above.
RUN_NODE_BUSY = "run_instance:verl_gpu_utilization_ratio:avg10m"
# Per run: the median of its GPUs' figure above (a FIGURES row).
RUN_MEDIAN_BUSY = "project_experiment:verl_gpu_utilization_ratio:median10m"
# Its numbers are the catalog's table ``rules.nodes`` (``${nodes:NAME}``).
THRESHOLDS = default_catalog().rules["nodes"]
# Recorded first in the same group (system.py): one series per run that has gone without a step for
# several times its usual step time.
STALLED_RUNS = "project_experiment:verl_training_stalled:seconds"
# Runs that step: they took a first step and are not stalled. A stalled run (one rank hung outside a
# collective at 0%, the others spinning in NCCL at 100%) is VerlTrainingStalled's; a run still loading
# its models keeps some GPUs busy and others idle for reasons of its own.
RUN_STEPPING = ("(group by (project, experiment, user, team) (verl_training_last_step_timestamp_seconds)"
                " unless on(project, experiment, user, team) ${STALLED_RUNS})")
# The guards of VerlGpuStraggler, each its own fragment (the unit tests drop each in turn).
STRAGGLER_GAP = ("${RUN_GPU_BUSY} < on(project, experiment, user, team) group_left()"
                 " (${nodes:straggler_ratio} * ${RUN_MEDIAN_BUSY})")
STRAGGLER_BUSY_RUN = "and on(project, experiment, user, team) ${RUN_MEDIAN_BUSY} > ${nodes:straggler_min_median}"
STRAGGLER_STEPPING = "and on(project, experiment, user, team) ${RUN_STEPPING}"
STRAGGLER = "${STRAGGLER_GAP} ${STRAGGLER_BUSY_RUN} ${STRAGGLER_STEPPING}"
# The run's median and the straggler's node, for the description.
RUN_MEDIAN_QUOTED = (run_query("${RUN_MEDIAN_BUSY}{project=%q,experiment=%q,user=%q}")
                     + ", under ${nodes:straggler_ratio} times the run's median GPU"
                     " ({{ . | first | value | humanizePercentage }}){{ end }}")
NODE_BUSY_QUOTED = ("{{ with printf `${RUN_NODE_BUSY}{instance=%q,project=%q,experiment=%q,user=%q}`"
                    " $labels.instance $labels.project $labels.experiment $labels.user | query }};"
                    " the GPUs of {{ $labels.instance }} average"
                    " {{ . | first | value | humanizePercentage }}{{ end }}")


def per_run(per_target: str, nodes: str = NODES) -> str:
    """``per_target`` (one series per job, instance) summed over the targets of each run."""
    return sub("sum by (project, experiment, user, team) (${per_target} * on(job, instance) group_right() ${nodes})",
               per_target=per_target, nodes=nodes)


# Per-run GPU figures over every node of the run (the verl-run-gpus group): (recorded name, aggregation
# per target, metric); "avg" is the sum over the run's GPUs divided by their count. A node's part is its
# figure recorded by the verl-nodes group (fleet.py), so that the group reads a GPU's raw series only
# for the GPUs a scheduler gave a job (JOB_GPUS).
GPU_FIGURES = (
    ("project_experiment:verl_gpus:count", "count", "verl_gpu_up"),
    ("project_experiment:verl_gpus_up:sum", "sum", "verl_gpu_up"),
    ("project_experiment:verl_gpu_utilization_ratio:avg", "avg", "verl_gpu_utilization_ratio"),
    ("project_experiment:verl_gpu_memory_used_bytes:sum", "sum", "verl_gpu_memory_used_bytes"),
    ("project_experiment:verl_gpu_memory_total_bytes:sum", "sum", "verl_gpu_memory_total_bytes"),
    ("project_experiment:verl_gpu_power_watts:sum", "sum", "verl_gpu_power_watts"),
)
# Per-run host and job figures, and the run's median GPU (the verl-fleet group).
FIGURES = (
    ("project_experiment:verl_host_cpu_utilization_ratio:avg", "avg", "verl_host_cpu_utilization_ratio"),
    ("project_experiment:verl_host_memory_used_bytes:sum", "sum", "verl_host_memory_used_bytes"),
    ("project_experiment:verl_job_processes:sum", "sum", "verl_job_processes"),
    ("project_experiment:verl_job_resident_memory_bytes:sum", "sum", "verl_job_resident_memory_bytes"),
    ("project_experiment:verl_job_running_nodes:sum", "max", "verl_job_running"),
    (RUN_MEDIAN_BUSY, "median", RUN_GPU_BUSY),
)
RUN_GPUS_GROUP = "verl-run-gpus"


def per_gpu_run(aggregation: str, metric: str) -> str:
    """A GPU figure over the runs' own GPUs (``JOB_GPUS``) where the node knows them, else over the whole
    node (its ``NODES`` runs, the node's recorded figure), summed per run. The GPUs of a job are counted
    from ``JOB_GPUS`` itself, which holds only GPUs the node serves."""
    if (aggregation, metric) == ("count", "verl_gpu_up"):
        job_gpus = "count by (job, instance, project, experiment, user, team) (${JOB_GPUS})"
    else:
        job_gpus = ("${aggregation} by (job, instance, project, experiment, user, team)"
                    " (max by (job, instance, gpu) (${metric})"
                    " * on(job, instance, gpu) group_right() ${JOB_GPUS})")
    return sub("sum by (project, experiment, user, team) (" + job_gpus
               + " or ${per_node} * on(job, instance) group_right()"
               " (${NODES} unless on(job, instance) ${JOB_GPUS}))",
               aggregation=aggregation, metric=metric, per_node=fleet.NODE_FIGURES[aggregation, metric])


def figure(aggregation: str, metric: str) -> str:
    if aggregation == "median":  # of a series already attributed to runs (project, experiment)
        return sub("quantile by (project, experiment, user, team) (0.5, ${metric})", metric=metric)
    if aggregation == "avg":
        return sub("${sum} / ${count}", sum=figure("sum", metric), count=figure("count", metric))
    if metric.startswith("verl_gpu_"):
        return per_gpu_run(aggregation, metric)
    return per_run(sub("${aggregation} by (job, instance) (${metric})", aggregation=aggregation, metric=metric))


def recording_rules() -> list[dict]:
    """Rules of the verl-fleet group that come first: the run's nodes, the stragglers' figures, then per-run
    host and job figures."""
    return [
        {"record": NODES, "expr": "${NODE_RUNS} unless on(project, experiment, user, team) ${FINISHED} == 1"},
        {"record": "project_experiment:verl_nodes:count",
         "expr": "count by (project, experiment, user, team) (${NODES})"},
        {"record": JOB_GPUS, "expr": JOB_GPUS_EXPR},
        {"record": RUN_GPU_BUSY,
         "expr": "(avg_over_time(verl_gpu_utilization_ratio[${STRAGGLER_WINDOW}]) unless on(job, instance) ${JOB_GPUS})"
                 " * on(job, instance) group_left(project, experiment, user, team) ${SOLE_RUN}"
                 " or avg_over_time(verl_gpu_utilization_ratio[${STRAGGLER_WINDOW}])"
                 " * on(job, instance, gpu) group_left(project, experiment, user, team) ${JOB_GPU_SOLE}"},
        {"record": RUN_NODE_BUSY,
         "expr": sub("avg by (job, instance, project, experiment, user, team) (${busy})", busy=RUN_GPU_BUSY)},
        *({"record": record, "expr": figure(aggregation, metric)} for record, aggregation, metric in FIGURES),
    ]


def run_gpu_groups() -> list[dict]:
    """The verl-run-gpus group: per-run GPU figures over every node of each run, from the per-node figures
    of the verl-nodes group and the runs' nodes of the verl-fleet group."""
    return [{"name": RUN_GPUS_GROUP,
             "rules": [{"record": record, "expr": figure(aggregation, metric)}
                       for record, aggregation, metric in GPU_FIGURES]}]
