"""Run detail: one verl run, laid out after the guide's four recommended panels (section 11.3).

Rows: training progress; policy update (pg_loss, pg_clipfrac, ppo_kl, entropy); critic quality
(vf_loss, vf_explained_var, vpred_mean vs returns/mean); performance (throughput, MFU, step time);
then rewards and advantages, lengths and clip ratios, the timing breakdown of a step,
the rollout engines (vLLM, SGLang) beside the generation phase, validation, memory and the GPUs
of every node of the run; last, collapsed, the rows only some runs have (``v1``: the V1 trainer's
replay buffer, the async trainers, speculative decoding and MoE). Firing alerts of the run are
annotations on every graph.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.models.dashboard import (
    DataTransformerConfig,
    DynamicConfigValue,
    VariableHide,
    VariableOption,
)

from verl_mixin import nodes

from . import rollout, v1
from .common import (
    DATASOURCE,
    GREEN,
    NEUTRAL,
    ORANGE,
    RED,
    RUN,
    SYSTEM,
    datasource_variable,
    describe,
    metric_panel,
    new_dashboard,
    query,
    query_variable,
    run_variables,
    several,
    since_last_step_steps,
    spec,
    stat_panel,
    steps,
    threshold,
    thresholds,
    timeseries_panel,
    to_json,
    unit_of,
)

UID = "verl-run"
TITLE = "verl / Run detail"
PHASES = ("gen", "ref", "values", "adv", "update_critic", "update_actor")
GPU_LEGEND = "{{instance}} GPU {{gpu}}"
GPU_HOT_CELSIUS, GPU_CRITICAL_CELSIUS = SYSTEM["gpu_hot_celsius"], SYSTEM["gpu_critical_celsius"]
GPU_BUSY_RATIO = 0.5


# The run's nodes: every exporter that serves verl_node_run_info for it (the head, from the logs it
# follows, and the workers, from --project/--experiment); not one that reads a shared log directory.
RUN_NODES = f"group by (instance) (verl_node_run_info{{{RUN}}})"
# The same nodes as a selector: the hidden ``instance`` variable holds them all (Grafana's "All" of a
# variable without a custom all value is the regex of its values), so a GPU panel reads the run's GPUs
# only, not every GPU of the fleet before the join.
NODES = 'instance=~"$instance"'


def run_gpus(expr: str) -> str:
    """``expr`` (a per-GPU or per-node series, selected with ``{nodes}``) restricted to the run's nodes: read on
    the nodes the ``instance`` variable lists only, then joined on ``instance`` to those that work for the run."""
    return f"({expr.format(nodes=NODES)}) * on(instance) group_left() {RUN_NODES}"


def nodes_variable() -> db.QueryVariable:
    """``instance``: every node of the run, all selected, hidden (it narrows the GPU queries)."""
    return (query_variable("instance", "Nodes", f"label_values(verl_node_run_info{{{RUN}}}, instance)", multi=True,
                           description="Every exporter that works for the run (verl_node_run_info)", all_value=None)
            .current(VariableOption(selected=True, text="All", value="$__all"))
            .hide(VariableHide.HIDE_VARIABLE))


def by_phase(pattern: str) -> str:
    """The run's timing series matching ``verl_<pattern>`` with the phase name as label ``phase``."""
    names = "|".join(PHASES)
    regex = pattern.format(phases=f"({names})")
    return (f'label_replace({{__name__=~"verl_{regex}", {RUN}}}, "phase", "$1", "__name__", '
            f'"verl_{pattern.format(phases="(.+)")}")')


def progress_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Training progress"))
    dash.with_panel(several(["verl_critic_score_mean", "verl_critic_score_max", "verl_critic_score_min"],
                            "Score", width=12, extra="Should rise during training (guide 11.1)."))
    dash.with_panel(stat_panel(
        "Last step", "Last training step seen for the run (verl's global step).", "none", steps(NEUTRAL),
        [query(f"verl_training_last_step{{{RUN}}}", "step", instant=True)], width=4, height=8, graph=False))
    dash.with_panel(timeseries_panel(
        "Steps per minute", "Training steps read from the run's log per minute.", "suffix: steps/min",
        steps(NEUTRAL), [query(f"rate(verl_training_steps_ingested_total{{{RUN}}}[$__rate_interval]) * 60",
                               "steps/min")], width=4))
    dash.with_panel(stat_panel(
        "Time since last step",
        "Seconds since the run's last step was read. Orange past the slowest healthy step "
        "(timing_s/step healthy max), red once the run counts as stalled.", "s", since_last_step_steps(),
        [query(f"time() - verl_training_last_step_timestamp_seconds{{{RUN}}}", "since last step",
               instant=True)], width=4, height=8))


def policy_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Policy update"))
    dash.with_panel(metric_panel("verl_actor_pg_loss", "Policy loss (pg_loss)", RUN))
    aggressive = threshold("verl_actor_pg_clipfrac", "aggressive")
    too_large = threshold("verl_actor_ppo_kl", "too_large")
    dash.with_panel(metric_panel("verl_actor_pg_clipfrac", "Clip fraction (pg_clipfrac)", RUN,
                                 extra=f"Above {aggressive}: updates too aggressive (learning rate too high)."))
    dash.with_panel(metric_panel("verl_actor_ppo_kl", "Policy change (ppo_kl)", RUN,
                                 extra=f"Above {too_large}: the policy moves too far per update."))
    dash.with_panel(metric_panel("verl_actor_entropy", "Entropy", RUN,
                                 extra="Falling to about 0 quickly means the policy collapsed (explores no more)."))
    dash.with_panel(metric_panel("verl_actor_grad_norm", "Actor gradient norm", RUN, width=8,
                                 extra="Pinned at grad_clip means clipping triggers every step."))
    dash.with_panel(metric_panel("verl_actor_pg_clipfrac_lower", "Dual-clip lower clip fraction", RUN, width=8))
    dash.with_panel(several(["verl_actor_lr", "verl_critic_lr"], "Learning rates", width=8))


def critic_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Critic quality (PPO)"))
    note = "PPO only: GRPO has no critic."
    dash.with_panel(metric_panel("verl_critic_vf_loss", "Value loss (vf_loss)", RUN, extra=note))
    good, negative = (threshold("verl_critic_vf_explained_var", key) for key in ("good", "negative"))
    dash.with_panel(metric_panel("verl_critic_vf_explained_var", "Explained variance", RUN,
                                 extra=f"Above {good} is a good critic; below {negative} after warm-up it is"
                                       " not learning."))
    dash.with_panel(several(["verl_critic_vpred_mean", "verl_critic_returns_mean"], "Predicted value vs returns",
                            extra="The two lines should converge; a lasting gap means the critic underfits."))
    dash.with_panel(metric_panel("verl_critic_vf_clipfrac", "Value clip fraction", RUN, extra=note))


def performance_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Performance"))
    dash.with_panel(metric_panel("verl_perf_throughput", "Throughput", RUN, width=8))
    dash.with_panel(several(["verl_perf_mfu_actor", "verl_perf_mfu_critic"], "Model FLOPs utilisation", width=8,
                            colour_from="verl_perf_mfu_actor"))
    dash.with_panel(metric_panel("verl_timing_step_seconds", "Step time", RUN, width=8))


def rewards_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Rewards and advantages"))
    dash.with_panel(several(["verl_critic_rewards_mean", "verl_critic_rewards_max", "verl_critic_rewards_min"],
                            "Rewards"))
    dash.with_panel(metric_panel("verl_critic_advantages_mean", "Advantage mean", RUN))
    max_abs = spec("verl_critic_advantages_max").thresholds["max_abs"]
    dash.with_panel(timeseries_panel(
        "Advantage range", describe("verl_critic_advantages_max", "verl_critic_advantages_min",
                                    extra=f"Red beyond +/-{max_abs:g}: advantages are not normalised."),
        "none", steps(RED, (-max_abs, GREEN), (max_abs, RED)),
        [query(f"{name}{{{RUN}}}", spec(name).key)
         for name in ("verl_critic_advantages_max", "verl_critic_advantages_min")], width=6))
    dash.with_panel(metric_panel("verl_actor_reward_kl_penalty", "Reward KL penalty", RUN))


def lengths_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Lengths and clip ratios"))
    dash.with_panel(several(["verl_response_length_mean", "verl_response_length_max", "verl_response_length_min"],
                            "Response length"))
    dash.with_panel(several(["verl_prompt_length_mean", "verl_prompt_length_max", "verl_prompt_length_min"],
                            "Prompt length"))
    dash.with_panel(metric_panel("verl_response_length_clip_ratio", "Truncated responses", RUN,
                                 extra="High: raise max_response_length."))
    dash.with_panel(metric_panel("verl_prompt_length_clip_ratio", "Truncated prompts", RUN))


def timing_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Step timing"))
    phases = [f"verl_timing_{phase}_seconds" for phase in PHASES]
    dash.with_panel(timeseries_panel(
        "Time per phase", describe(*phases, extra="Stacked: together they make up most of timing_s/step."),
        "s", steps(NEUTRAL), [query(f"max by (phase) ({by_phase('timing_{phases}_seconds')})", "{{phase}}")],
        width=12, stacked=True))
    step_spec = spec("verl_timing_step_seconds")
    gen_share = step_spec.thresholds["gen_share"]
    dash.with_panel(timeseries_panel(
        "Share of the step per phase",
        f"Each phase's time over timing_s/step. Generation above {gen_share:.0%} of the step is the bottleneck "
        f"(raise rollout max_num_seqs, adjust tensor parallelism); actor update above "
        f"{step_spec.thresholds['update_actor_share']:.0%} is one too (guide 11.2, problem 4).",
        "percentunit", steps(GREEN, (gen_share, RED)),
        [query(f"max by (phase) ({by_phase('timing_{phases}_seconds')} / ignoring(phase) group_left() "
               f"verl_timing_step_seconds{{{RUN}}})", "{{phase}}")], width=6, max_value=1))
    per_token = [f"verl_timing_per_token_{phase}_seconds" for phase in PHASES]
    dash.with_panel(timeseries_panel(
        "Time per token", describe(*per_token), "s", steps(NEUTRAL),
        [query(f"max by (phase) ({by_phase('timing_per_token_{phases}_seconds')})", "{{phase}}")], width=6))


def validation_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Validation"))
    dash.with_panel(timeseries_panel(
        "Validation scores by data source",
        describe("verl_val_core", extra="One line per data source, variable and statistic (e.g. acc/mean@1)."),
        "none", steps(NEUTRAL),
        [query(f"verl_val_core{{{RUN}}}", "{{data_source}} {{variable}}/{{metric}}")], width=24))


def memory_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Memory"))
    memory = ["verl_perf_max_memory_allocated_bytes", "verl_perf_max_memory_reserved_bytes"]
    dash.with_panel(timeseries_panel(  # one series per role (actor, critic)
        "PyTorch peak GPU memory", describe(*memory), unit_of(memory[0]), steps(NEUTRAL),
        [query(f"{name}{{{RUN}}}", "{{role}} " + name.split("_")[-2]) for name in memory], width=8))
    near_total = spec("verl_perf_max_memory_allocated_bytes").thresholds["near_total_ratio"]
    dash.with_panel(timeseries_panel(
        "Peak memory share of GPU memory",
        describe("verl_perf_max_memory_allocated_bytes",
                 extra=f"Divided by the memory of the run's GPUs. Red above {near_total:.0%}: out of memory is "
                       "near (halve ppo_mini_batch_size, enable gradient checkpointing or dynamic batch size)."),
        "percentunit", steps(GREEN, (near_total, RED)),
        [query(f"max(verl_perf_max_memory_allocated_bytes{{{RUN}}}) / "
               f"min({run_gpus('verl_gpu_memory_total_bytes{{{nodes}}}')})", "peak allocated / GPU memory")],
        width=8, min_value=0, max_value=1))
    dash.with_panel(metric_panel("verl_perf_cpu_memory_used_bytes", "CPU memory of the trainer", RUN, width=8,
                                 legend="after the {{role}} update"))


def nodes_table() -> table.Panel:
    """One row per node of the run: its GPUs, their mean utilisation and power, the job's processes."""
    cols = [
        ("GPUs", run_gpus("count by (instance) (verl_gpu_up{{{nodes}}})"), "none"),
        ("GPU utilization", run_gpus("avg by (instance) (verl_gpu_utilization_ratio{{{nodes}}})"), "percentunit"),
        ("GPU power", run_gpus("sum by (instance) (verl_gpu_power_watts{{{nodes}}})"), "watt"),
        ("Job processes", run_gpus("sum by (instance) (verl_job_processes{{{nodes}}})") + f" or 0 * {RUN_NODES}",
         "none"),
    ]
    ref_ids = [chr(ord("A") + index) for index in range(len(cols))]
    job = f"max by (instance, job_id, user, partition) (verl_job_info{{{RUN}}})"  # the scheduler's job, per node
    job_ref = chr(ord("A") + len(cols))
    panel = (table.Panel().title("Nodes of this run").datasource(DATASOURCE).unit("none")
             .description("Every exporter that works for the run: the head node, which reads the logs, and the "
                          "worker nodes, which name the run with --project/--experiment or find its job "
                          "themselves (--slurm) (verl_node_run_info). "
                          "Job processes: those the exporter watches (--job.match, or the Slurm job's with "
                          "--slurm), 0 where it watches none. Job, User and Partition: the Slurm job that runs "
                          "the run on that node (verl_job_info), empty where no scheduler names one.")
             .thresholds(thresholds(steps(NEUTRAL))).span(24).height(6)
             .targets([query(expr, ref_id=ref_id, instant=True, table=True)
                       for ref_id, (_, expr, _) in zip(ref_ids, cols)]
                      + [query(job, ref_id=job_ref, instant=True, table=True)])
             .with_transformation(DataTransformerConfig(id_val="merge", options={}))
             .with_transformation(DataTransformerConfig(id_val="organize", options={
                 "excludeByName": {"Time": True, f"Value #{job_ref}": True},
                 "indexByName": {"instance": 0, **{f"Value #{ref_id}": 1 + i for i, ref_id in enumerate(ref_ids)},
                                 "job_id": len(cols) + 1, "user": len(cols) + 2, "partition": len(cols) + 3},
                 "renameByName": {**{f"Value #{ref_id}": header for ref_id, (header, _, _) in zip(ref_ids, cols)},
                                  "job_id": "Job", "user": "User", "partition": "Partition"},
             })))
    for header, _, unit in cols:
        panel = panel.override_by_name(header, [DynamicConfigValue("unit", unit)])
    return panel


def spread_panel() -> timeseries.Panel:
    """Each node's mean GPU utilisation against the run's median GPU: what VerlGpuStraggler compares."""
    ratio = nodes.THRESHOLDS["straggler_ratio"]
    window = nodes.STRAGGLER_WINDOW
    line = f"{ratio:g} x median (straggler line)"
    return timeseries_panel(
        "GPU spread across nodes",
        f"Each node's mean GPU utilisation over {window} against the median of the run's GPUs over all its "
        f"nodes (recording rules). VerlGpuStraggler fires for a GPU under {ratio:g} times the median (the dashed "
        f"line) for 10 minutes while the median is above {nodes.THRESHOLDS['straggler_min_median']:g} and the "
        "run steps: a node far under the median is the slow one; the GPU utilization panel shows its GPUs. "
        "A node that works for two runs at once counts only where its exporter knows each job's GPUs "
        "(--slurm: verl_job_gpu_info); elsewhere its GPUs cannot be told apart and it is left out.",
        "percentunit", steps(NEUTRAL),
        [query(f"{nodes.RUN_NODE_BUSY}{{{RUN}}}", "{{instance}}"),
         query(f"{nodes.RUN_MEDIAN_BUSY}{{{RUN}}}", "run median"),
         query(f"{ratio:g} * {nodes.RUN_MEDIAN_BUSY}{{{RUN}}}", line)],
        min_value=0, max_value=1, show_thresholds=False,
    ).override_by_name(line, [DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})])


def gpus_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("GPUs of this run"))
    dash.with_panel(nodes_table())
    dash.with_panel(spread_panel())
    join = "Every node of the run (joined on instance through verl_node_run_info)."
    dash.with_panel(timeseries_panel(
        "GPU utilization", f"Share of time a kernel ran on each GPU (NVML). {join}", "percentunit",
        steps(ORANGE, (GPU_BUSY_RATIO, GREEN)), [query(run_gpus("verl_gpu_utilization_ratio{{{nodes}}}"), GPU_LEGEND)],
        min_value=0, max_value=1))
    near_total = spec("verl_perf_max_memory_allocated_bytes").thresholds["near_total_ratio"]
    dash.with_panel(timeseries_panel(
        "GPU memory used", f"GPU memory in use over total, per GPU (NVML). {join}", "percentunit",
        steps(GREEN, (near_total, RED)),
        [query(run_gpus("verl_gpu_memory_used_bytes{{{nodes}}} / verl_gpu_memory_total_bytes{{{nodes}}}"), GPU_LEGEND)],
        min_value=0, max_value=1))
    dash.with_panel(timeseries_panel(
        "GPU temperature", f"GPU core temperature. {join}", "celsius",
        steps(GREEN, (GPU_HOT_CELSIUS, ORANGE), (GPU_CRITICAL_CELSIUS, RED)),
        [query(run_gpus("verl_gpu_temperature_celsius{{{nodes}}}"), GPU_LEGEND)]))
    dash.with_panel(timeseries_panel(
        "GPU power", f"GPU power draw. {join}", "watt", steps(NEUTRAL),
        [query(run_gpus("verl_gpu_power_watts{{{nodes}}}"), GPU_LEGEND)]))


def build() -> dict:
    """The run detail dashboard as Grafana JSON."""
    dash = new_dashboard(UID, TITLE, "One verl run: the guide's recommended panels, then the details.",
                         [datasource_variable(), *run_variables(multi=False), nodes_variable(),
                          *v1.gate_variables()], RUN)
    for row in (progress_row, policy_row, critic_row, performance_row, rewards_row, lengths_row, timing_row,
                rollout.rollout_row, validation_row, memory_row, gpus_row, v1.gated_rows):
        row(dash)
    return to_json(dash)
