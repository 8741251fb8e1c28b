"""The run detail dashboard's rows of metrics only some runs log: verl 0.9's V1 trainer (its replay
buffer), the asynchronous trainers (separate_async, fully_async_policy) and the rollout engine's
speculative decoding and MoE routing.

Each row is repeated over a hidden variable ``has_<family>`` whose query finds a value (the run's
experiment) only where the run has a series of the family in the time range, and is collapsed. Grafana
(11.6) cannot leave such a row out: a row repeated over a variable without values is still drawn once,
as a placeholder (grafana/grafana#89559). Collapsed, that row is a title bar ending in "None" (the
variable's text), with no panel drawn or queried; for a run that logs the family, the bar names the run
and opens on its panels.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.models.dashboard import VariableHide

from .common import (
    GREEN,
    NEUTRAL,
    RED,
    RUN,
    describe,
    metric_panel,
    query,
    query_variable,
    several,
    spec,
    standing_out,
    steps,
    timeseries_panel,
)
from .model import GATE_PREFIX

TOP_LAYERS = 5  # MoE layers drawn: the most overloaded over the time range

# Why the V1 trainer's replay buffer dropped prompt groups: series -> legend.
DROPPED = {
    "verl_training_filter_groups_evicted_samples": "no signal",
    "verl_training_rollout_failure_evicted_samples": "rollout failure",
    "verl_training_off_policy_evicted_samples": "too stale",
    "verl_training_filter_groups_discarded_surplus_samples": "surplus",
}


def replay_buffer_panels() -> list[timeseries.Panel]:
    return [
        timeseries_panel(
            "Prompt groups dropped per step, by reason",
            describe(*DROPPED, extra="Stacked. verl logs a reason only at the steps that dropped groups."),
            "none", steps(NEUTRAL), [query(f"{name}{{{RUN}}}", legend) for name, legend in DROPPED.items()],
            width=12, stacked=True),
        several(["verl_training_off_policy_trajectory_staleness_mean",
                 "verl_training_off_policy_trajectory_staleness_max",
                 "verl_training_off_policy_trajectory_staleness_worst_max"], "Trajectory staleness (model versions)"),
        several(["verl_training_off_policy_trajectory_spans_mean", "verl_training_off_policy_trajectory_spans_max"],
                "Trajectory spans (model versions)"),
    ]


def separate_async_panels() -> list[timeseries.Panel]:
    return [
        metric_panel("verl_separate_async_switch_idle", "Trainer waited for prompts", RUN,
                     extra="1 at each step the trainer was starved of rollouts."),
        metric_panel("verl_separate_async_switch_wait_samples", "Prompt groups waited for", RUN),
        metric_panel("verl_separate_async_switch_threshold_ratio", "Switch threshold", RUN),
        several(["verl_timing_switch_wait_seconds", "verl_timing_switch_to_trainer_seconds",
                 "verl_timing_switch_to_rollout_seconds"], "Switch times"),
    ]


def fully_async_panels() -> list[timeseries.Panel]:
    idle = spec("verl_fully_async_trainer_idle_ratio").thresholds["too_high"]
    legends = {"verl_fully_async_trainer_idle_ratio": "trainer", "verl_fully_async_rollouter_idle_ratio": "rollouter"}
    return [
        timeseries_panel(
            "Trainer and rollouter idle",
            describe(*legends, extra=f"Red from {idle:.0%} (the catalog's idle ratio, as the alerts): one side "
                                     "waits for the other."),
            "percentunit", steps(GREEN, (idle, RED)),
            [query(f"{name}{{{RUN}}}", legend) for name, legend in legends.items()], width=12, min_value=0,
            max_value=1),
        several(["verl_fully_async_monitor_queue_mq_queue_size", "verl_fully_async_monitor_queue_pending_queue_size"],
                "Queues", width=12),
    ]


def spec_moe_panels() -> list[timeseries.Panel]:
    per_layer = f"verl_rollout_moe_max_vio{{{RUN}}}"
    return [
        metric_panel("verl_rollout_spec_accept_rate", "Speculative decoding: accept rate", RUN),
        metric_panel("verl_rollout_spec_accept_length", "Speculative decoding: accept length", RUN),
        timeseries_panel(
            "MoE expert overload, top layers",
            describe("verl_rollout_moe_max_vio",
                     extra=f"The {TOP_LAYERS} layers with the highest mean over the time range."),
            "none", steps(NEUTRAL), [query(standing_out("topk", TOP_LAYERS, per_layer, on="layer"), "layer {{layer}}")],
            width=6),
        several(["verl_rollout_moe_max_vio_max", "verl_rollout_moe_max_vio_avg"], "MoE expert overload over layers"),
    ]


# Gate variable -> (row title, names of the series of its family, the row's panels).
ROWS = {
    f"{GATE_PREFIX}replay_buffer": ("Replay buffer (V1 trainer)",
                                     "verl_training_(filter_groups|rollout_failure|off_policy)_.+",
                                     replay_buffer_panels),
    f"{GATE_PREFIX}separate_async": ("Async trainer, separate_async",
                                      "verl_separate_async_.+|verl_timing_switch_.+", separate_async_panels),
    f"{GATE_PREFIX}fully_async": ("Async trainer, fully_async", "verl_fully_async_.+", fully_async_panels),
    f"{GATE_PREFIX}spec_moe": ("Rollout engine, speculative decoding and MoE",
                               "verl_rollout_(spec_accept_rate|spec_accept_length|moe_.+)", spec_moe_panels),
}


def gate_variables() -> list[db.QueryVariable]:
    """One hidden variable per row: the run's experiment where it has a series of the row's family, else
    no value (multi-valued, so that Grafana's text for no value is "None")."""
    return [query_variable(name, title, f'label_values({{__name__=~"{names}", {RUN}}}, experiment)',
                           multi=False, description=f"set when the run logs the metrics of the row {title!r}")
            .multi(True).hide(VariableHide.HIDE_VARIABLE)
            for name, (title, names, _) in ROWS.items()]


def gated_rows(dash: db.Dashboard) -> None:
    """The collapsed rows, each repeated over its gate variable and titled with its text."""
    for name, (title, _, panels) in ROWS.items():
        row = db.Row(f"{title}: ${name}").repeat(name)
        for panel in panels():
            row = row.with_panel(panel)
        dash.with_row(row)
