"""Fleet overview: every run in one table, how many are healthy, warning or stalled, and the fleet's GPUs.

A run is *stalled* when its last step is older than ``STALLED_AFTER_SECONDS`` and verl has not
reported the end of training, or while the VerlTrainingStalled alert fires for it; *warning* when an
alert of severity warning or critical fires for it
(and it is not stalled); *healthy* otherwise. Each table row links to the run detail dashboard.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table
from grafana_foundation_sdk.models.dashboard import DataTransformerConfig, DynamicConfigValue

from verl_exporter.alerting import fleet

from . import run_detail
from .common import (
    DATASOURCE,
    GREEN,
    NEUTRAL,
    ORANGE,
    RED,
    RUNS,
    STALLED_AFTER_SECONDS,
    datasource_variable,
    healthy_steps,
    new_dashboard,
    query,
    run_variables,
    since_last_step_steps,
    spec,
    standing_out,
    stat_panel,
    steps,
    thresholds,
    timeseries_panel,
    to_json,
    unit_of,
)

UID = "verl-fleet"
# The nodes a fleet panel shows beside the fleet's figure: those that stand out (top-k).
OFFENDERS = 10
TITLE = "verl / Fleet overview"
BY_RUN = "project, experiment, user, team"

RUN_SET = f"group by ({BY_RUN}) (verl_training_run_info{{{RUNS}}})"
FIRING = f'group by ({BY_RUN}) (ALERTS{{alertstate="firing", severity=~"warning|critical", {RUNS}}})'
STALLED = (f"group by ({BY_RUN}) ((time() - max by ({BY_RUN}) (verl_training_last_step_timestamp_seconds{{{RUNS}}}))"
           f" > {STALLED_AFTER_SECONDS})"
           f" unless on({BY_RUN}) (max by ({BY_RUN}) (verl_training_finished{{{RUNS}}}) == 1)"
           f' or group by ({BY_RUN}) (ALERTS{{alertname="VerlTrainingStalled", alertstate="firing", {RUNS}}})')

RUN_LINK = (f"/d/{run_detail.UID}/?${{datasource:queryparam}}&var-project=${{__data.fields.project}}"
            "&var-experiment=${__data.fields.experiment}&var-user=${__data.fields.user}&${__url_time_range}")


# The scheduler's job of each run (verl_job_info, from the exporter: Slurm's job id, user and partition;
# Kubernetes' namespace and pod leave them empty): one series per run, its labels the table's cells.
# topk keeps one job where a run names two (a resumed run's old exporter still serving); a run
# without verl_job_info still has its row, with empty cells.
JOB_LABELS = ("job_id", "user", "partition")
JOB_INFO = (f"topk by ({BY_RUN}) (1, max by ({BY_RUN}, {', '.join(JOB_LABELS)}) (verl_job_info{{{RUNS}}}))"
            f" or ({RUN_SET} unless on({BY_RUN}) verl_job_info)")
# Table column headers of the job's labels.
JOB_HEADERS = {"job_id": "Job", "user": "User", "partition": "Partition"}


def latest(name: str) -> str:
    """Latest value of a training metric per run (``max`` folds duplicate scrapes of the same run)."""
    return f"max by ({BY_RUN}) ({name}{{{RUNS}}})"


# Table columns: (header, query, Grafana unit, threshold steps).
def columns() -> list[tuple[str, str, str, list]]:
    gpu_util = latest("project_experiment:verl_gpu_utilization_ratio:avg")
    alerts = (f'count by ({BY_RUN}) (ALERTS{{alertstate="firing", {RUNS}}}) and on({BY_RUN}) {RUN_SET} '
              f"or 0 * {RUN_SET}")
    return [
        ("Last step", latest("verl_training_last_step"), "none", steps(NEUTRAL)),
        ("Progress", latest("project_experiment:verl_training_progress:ratio"), "percentunit", steps(NEUTRAL)),
        ("Time left", latest("project_experiment:verl_training_time_left_seconds:estimate"), "s", steps(NEUTRAL)),
        ("Since last step", f"time() - {latest('verl_training_last_step_timestamp_seconds')}", "s",
         since_last_step_steps()),
        ("Score mean", latest("verl_critic_score_mean"), unit_of("verl_critic_score_mean"),
         healthy_steps("verl_critic_score_mean")),
        ("KL (ppo_kl)", latest("verl_actor_ppo_kl"), unit_of("verl_actor_ppo_kl"), healthy_steps("verl_actor_ppo_kl")),
        ("Clip fraction", latest("verl_actor_pg_clipfrac"), unit_of("verl_actor_pg_clipfrac"),
         healthy_steps("verl_actor_pg_clipfrac")),
        ("Throughput", latest("verl_perf_throughput"), unit_of("verl_perf_throughput"),
         healthy_steps("verl_perf_throughput")),
        ("GPUs", latest("project_experiment:verl_gpus:count"), "none", steps(NEUTRAL)),
        ("GPU utilization", gpu_util, "percentunit", steps(ORANGE, (run_detail.GPU_BUSY_RATIO, GREEN))),
        ("Alerts firing", alerts, "none", steps(GREEN, (1, RED))),
    ]


def runs_table() -> table.Panel:
    cols = columns()
    ref_ids = [chr(ord("A") + index) for index in range(len(cols))]
    job_ref = chr(ord("A") + len(cols))
    description = " ".join([
        "Every run the exporters follow, one row each; click a row to open its run detail dashboard.",
        "Colours follow the catalog's healthy ranges:",
        *(spec(name).full_help() for name in ("verl_actor_ppo_kl", "verl_actor_pg_clipfrac", "verl_perf_throughput")),
        "Progress is the last step over the run's total (verl's Total training steps); time left is the steps "
        "to go times the mean step time of the last 30 minutes (recording rules; empty while the total is unknown).",
        f"Since last step turns orange after a slow step and red after {STALLED_AFTER_SECONDS} s (stalled);",
        "GPU utilization is the mean of the GPUs of every node of the run (recording rules: the nodes that "
        "serve verl_node_run_info for it), GPUs the count of those GPUs.",
        "Job, User and Partition are the scheduler's (verl_job_info: Slurm's job id, user and partition; "
        "empty for a Kubernetes job or a run whose exporter names no job).",
    ])
    panel = (table.Panel().title("Runs").description(description).datasource(DATASOURCE).unit("none")
             .thresholds(thresholds(steps(NEUTRAL))).span(24).height(10)
             .targets([query(expr, ref_id=ref_id, instant=True, table=True)
                       for ref_id, (_, expr, _, _) in zip(ref_ids, cols)]
                      + [query(JOB_INFO, ref_id=job_ref, instant=True, table=True)])
             .data_links([db.DashboardLink("Open the run").url(RUN_LINK)])
             .sort_by([cb.TableSortByFieldState().display_name("Since last step").desc(True)])
             .with_transformation(DataTransformerConfig(id_val="merge", options={}))
             .with_transformation(DataTransformerConfig(id_val="organize", options={
                 "excludeByName": {"Time": True, f"Value #{job_ref}": True},
                 "indexByName": {"project": 0, "experiment": 1,
                                 **{label: 2 + index for index, label in enumerate(JOB_LABELS)},
                                 **{f"Value #{ref_id}": 2 + len(JOB_LABELS) + index
                                    for index, ref_id in enumerate(ref_ids)}},
                 "renameByName": {**JOB_HEADERS,
                                  **{f"Value #{ref_id}": header for ref_id, (header, _, _, _) in zip(ref_ids, cols)}},
             })))
    for header, _, unit, step_list in cols:
        panel = panel.override_by_name(header, [
            DynamicConfigValue("unit", unit),
            DynamicConfigValue("thresholds", thresholds(step_list).build()),
            DynamicConfigValue("custom.cellOptions", {"type": "color-text"}),
        ])
    return panel


def count_stats(dash: db.Dashboard) -> None:
    dash.with_panel(stat_panel(
        "Runs followed", "Runs the exporters follow (matching the project and experiment filters).", "none",
        steps(NEUTRAL), [query(f"count({RUN_SET}) or vector(0)", "runs", instant=True)]))
    dash.with_panel(stat_panel(
        "Healthy", "Runs without a firing warning or critical alert that are not stalled.", "none",
        steps(GREEN), [query(f"count({RUN_SET} unless on({BY_RUN}) {FIRING} unless on({BY_RUN}) ({STALLED}))"
                             " or vector(0)", "healthy", instant=True)]))
    dash.with_panel(stat_panel(
        "Warning", "Runs with a firing warning or critical alert (not counting stalled runs).", "none",
        steps(GREEN, (1, ORANGE)),
        [query(f"count(({RUN_SET} and on({BY_RUN}) {FIRING}) unless on({BY_RUN}) ({STALLED})) or vector(0)",
               "warning", instant=True)]))
    dash.with_panel(stat_panel(
        "Stalled", f"Runs with no new step for {STALLED_AFTER_SECONDS} s that verl has not reported finished, "
                   "or for which VerlTrainingStalled fires.",
        "none", steps(GREEN, (1, RED)), [query(f"count({STALLED}) or vector(0)", "stalled", instant=True)]))


def fleet_gpus(dash: db.Dashboard) -> None:
    """The fleet's GPUs from the per-node and per-fleet recording rules (the verl-nodes group): a panel reads
    one series for the fleet, or the ten nodes that stand out, never every GPU's raw series."""
    dash.with_row(db.Row("Fleet GPUs"))
    scope = "All GPUs the exporters see, whichever run uses them (recording rules)."
    near_total = spec("verl_perf_max_memory_allocated_bytes").thresholds["near_total_ratio"]
    fleet_busy = f"sum({fleet.FLEET_BUSY} * {fleet.FLEET_GPUS}) / sum({fleet.FLEET_GPUS})"
    fleet_memory = f"sum({fleet.FLEET_MEMORY_USED}) / sum({fleet.FLEET_MEMORY_TOTAL})"
    dash.with_panel(stat_panel("GPUs up", f"GPUs answering NVML. {scope}", "none", steps(NEUTRAL),
                               [query(f"sum({fleet.FLEET_GPUS_UP})", "GPUs up", instant=True)], width=4))
    dash.with_panel(stat_panel("GPUs lost", f"GPUs that stopped answering NVML. {scope}", "none",
                               steps(GREEN, (1, RED)),
                               [query(f"sum({fleet.FLEET_GPUS}) - sum({fleet.FLEET_GPUS_UP}) or vector(0)",
                                      "GPUs lost", instant=True)], width=4))
    dash.with_panel(stat_panel(
        "GPUs with errors", "GPUs with any ECC error, XID error or remapped row (the GPU nodes dashboard lists "
        f"them). {scope}", "none", steps(GREEN, (1, ORANGE)),
        [query(f"count(group by (job, instance, gpu) ({fleet.GPU_ECC_ERRORS} or {fleet.GPU_XID_ERRORS}"
               f" or {fleet.GPU_REMAPPED_ROWS})) or vector(0)", "GPUs with errors", instant=True)], width=4))
    dash.with_panel(stat_panel(
        "Fleet GPU utilization", f"Mean share of time a kernel ran, over all GPUs. {scope}", "percentunit",
        steps(ORANGE, (run_detail.GPU_BUSY_RATIO, GREEN)), [query(fleet_busy, "utilization", instant=True)],
        width=6))
    dash.with_panel(stat_panel(
        "Fleet GPU memory used", f"GPU memory in use over total, all GPUs. {scope}", "percentunit",
        steps(GREEN, (near_total, RED)), [query(fleet_memory, "memory used", instant=True)], width=6))
    ten = f"and the {OFFENDERS} nodes that stand out over the time range"
    dash.with_panel(timeseries_panel(
        "GPU utilization: fleet and least busy nodes",
        f"Mean GPU utilization of the fleet {ten} (the least busy on average; per-node recording rules). {scope}",
        "percentunit", steps(ORANGE, (run_detail.GPU_BUSY_RATIO, GREEN)),
        [query(standing_out("bottomk", OFFENDERS, fleet.NODE_BUSY), "{{instance}}"), query(fleet_busy, "fleet")],
        min_value=0, max_value=1))
    dash.with_panel(timeseries_panel(
        "GPU memory used: fleet and fullest nodes",
        f"GPU memory in use over total for the fleet {ten} (the fullest on average; per-node recording rules). "
        f"{scope}", "percentunit", steps(GREEN, (near_total, RED)),
        [query(standing_out("topk", OFFENDERS, fleet.NODE_MEMORY_SHARE), "{{instance}}"), query(fleet_memory, "fleet")],
        min_value=0, max_value=1))


def build() -> dict:
    """The fleet overview dashboard as Grafana JSON."""
    dash = new_dashboard(UID, TITLE, "Every verl run at a glance; click a run for its details.",
                         [datasource_variable(), *run_variables(multi=True)], RUNS)
    dash.with_row(db.Row("Runs"))
    count_stats(dash)
    dash.with_panel(runs_table())
    fleet_gpus(dash)
    return to_json(dash)
