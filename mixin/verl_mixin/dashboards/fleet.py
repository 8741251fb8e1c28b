"""Fleet overview: every run in one table, how many are healthy, warning or stalled, the fleet's GPUs and
what they did (the goodput ledger: goodput against its objective, waste by bucket, run and owner, its cost).

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

from verl_mixin import fleet, goodput

from . import run_detail
from .common import (
    DATASOURCE,
    GREEN,
    NEUTRAL,
    ORANGE,
    RED,
    RUNS,
    STALLED_AFTER_SECONDS,
    SYSTEM,
    bargauge_panel,
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
    textbox_variable,
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


def merged_table(title: str, description: str, cols: list[tuple[str, str, str, list]], labels: tuple[str, ...], *,
                 label_queries: tuple[str, ...] = (), headers: dict[str, str] | None = None, width: int = 24,
                 height: int = 10) -> table.Panel:
    """A table of one row per set of ``labels``: a column per query of ``cols`` (header, instant query, unit,
    threshold steps; merged on their labels), then the label cells of ``label_queries`` (their values
    hidden); ``headers`` renames label columns. The labels come first, in order, then the columns."""
    ref_ids = [chr(ord("A") + index) for index in range(len(cols) + len(label_queries))]
    values, hidden = ref_ids[:len(cols)], ref_ids[len(cols):]
    panel = (table.Panel().title(title).description(description).datasource(DATASOURCE).unit("none")
             .thresholds(thresholds(steps(NEUTRAL))).span(width).height(height)
             .targets([query(expr, ref_id=ref_id, instant=True, table=True)
                       for ref_id, expr in zip(ref_ids, [expr for _, expr, _, _ in cols] + list(label_queries))])
             .with_transformation(DataTransformerConfig(id_val="merge", options={}))
             .with_transformation(DataTransformerConfig(id_val="organize", options={
                 "excludeByName": {"Time": True, **{f"Value #{ref_id}": True for ref_id in hidden}},
                 "indexByName": {**{label: index for index, label in enumerate(labels)},
                                 **{f"Value #{ref_id}": len(labels) + index for index, ref_id in enumerate(values)}},
                 "renameByName": {**(headers or {}),
                                  **{f"Value #{ref_id}": header for ref_id, (header, _, _, _) in zip(values, cols)}},
             })))
    for header, _, unit, step_list in cols:
        panel = panel.override_by_name(header, [
            DynamicConfigValue("unit", unit),
            DynamicConfigValue("thresholds", thresholds(step_list).build()),
            DynamicConfigValue("custom.cellOptions", {"type": "color-text"}),
        ])
    return panel


def runs_table() -> table.Panel:
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
    return (merged_table("Runs", description, columns(), ("project", "experiment", *JOB_LABELS),
                         label_queries=(JOB_INFO,), headers=JOB_HEADERS)
            .data_links([db.DashboardLink("Open the run").url(RUN_LINK)])
            .sort_by([cb.TableSortByFieldState().display_name("Since last step").desc(True)]))


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


# --- goodput -----------------------------------------------------------------------------------------
# The runs' goodput ledgers (verl_run_gpu_seconds_total{bucket}) and the verl-goodput recording rules.

PRICE = "gpu_hour_price"
GPU_HOURS = "suffix: GPU-hours"
STEP = 60  # seconds between the values of a rate a GPU-hours figure adds up over the time range
NOT_LOST = '{bucket!="lost"}'
PRODUCTIVE = 'bucket="productive"'
WASTED = 'bucket=~"stalled|lost"'
TRAINING = '{bucket=~"productive|stalled"}'
AT_RISK = "verl_run_work_at_risk_gpu_seconds"
BUCKETS = ("Buckets (docs/metrics.md): startup (from a run's first line, or a restart, to the end of its first "
           "step), productive (its steps less their validation and checkpoint saves), validation, checkpoint, "
           "between_steps (gaps between steps), stalled (gaps past what its steps make likely), lost (its work "
           "since its last checkpoint, counted again when it fails: overlaps the others). Of the training time "
           "(productive and stalled), waste is stalled, lost, and productive time while a training diagnosis "
           "alert fires for the run (after_diagnosis); goodput the rest. The others are overhead.")
FLEET_WIDE = "The whole fleet, whatever the filters above (recording rules)."
PRICED = ("Cost is GPU-hours times the GPU-hour price typed in the variable above (any currency; no cost while "
          "it is 0); prices per GPU model or partition are for an operator's copy of the dashboard.")


def price_variable() -> db.TextBoxVariable:
    return textbox_variable(PRICE, "GPU-hour price", "0",
                            "Price of one GPU-hour, any currency: the goodput row's costs are GPU-hours times it "
                            "(none while 0)")


def gpu_hours(rate: str) -> str:
    """GPU-hours over the time range of ``rate``, a recorded rate of GPU-seconds (GPUs): its values a minute
    apart added up (missing values, when no run was followed, count as none)."""
    return f"sum_over_time(({rate})[$__range:{STEP}s]) * {STEP} / 3600"


def cost(hours: str) -> str:
    """``hours`` (GPU-hours) times the GPU-hour price; nothing while the price is 0."""
    return f"({hours}) * ${PRICE} and on() (vector(${PRICE}) > 0)"


def ledger(bucket: str) -> str:
    return f"{goodput.GPU_SECONDS}{{{bucket}, {RUNS}}}"


def waste_parts(by: str) -> str:
    """GPU-seconds of waste over the time range of the selected runs, by ``by`` and bucket: stalled, lost,
    and the productive time while a diagnosis fired for the run (bucket ``after_diagnosis``, from its rate a
    minute apart)."""
    after = (f"sum_over_time((rate({ledger(PRODUCTIVE)}[$__rate_interval]) and on({BY_RUN}) {goodput.DIAGNOSED})"
             f"[$__range:{STEP}s]) * {STEP}")
    return (f"sum by ({by}, bucket) (increase({ledger(WASTED)}[$__range])"
            f' or label_replace({after}, "bucket", "after_diagnosis", "", ""))')


def most_waste(by: str) -> list[tuple[str, str, str, list]]:
    """Columns of the ``OFFENDERS`` runs or owners (``by``) with the most waste: its GPU-hours and its cost."""
    top = f"topk({OFFENDERS}, sum by ({by}) ({waste_parts(by)})) / 3600"
    return [("Waste", top, GPU_HOURS, steps(NEUTRAL)),
            ("Cost", cost(top), "none", steps(NEUTRAL))]


def largest_part(by: str) -> str:
    """The largest part of the waste of each of the ``OFFENDERS`` runs or owners (``by``) with the most: its
    ``bucket`` label is the table's cell."""
    return (f"topk by ({by}) (1, {waste_parts(by)}) / 3600"
            f" and on({by}) topk({OFFENDERS}, sum by ({by}) ({waste_parts(by)}))")


def goodput_row(dash: db.Dashboard) -> None:
    """The fleet's goodput against its objective, its GPU time by bucket (today, and over 7 days) and what
    its waste costs, from the recording rules; then the selected runs with the most work at risk and the
    runs and owners with the most waste, from their ledgers."""
    dash.with_row(db.Row("Goodput"))
    fleet_goodput(dash)
    goodput_tables(dash)


def fleet_goodput(dash: db.Dashboard) -> None:
    objective = SYSTEM["goodput_objective"]
    dash.with_panel(timeseries_panel(
        "Fleet goodput",
        f"Share of the fleet's training time that was goodput, over the last hour and the last 6 hours (1 - "
        f"{goodput.waste('1h')}, and 6h), against the objective (the dashed line: the catalog's "
        f"system.goodput_objective, {objective:g}), which VerlFleetGoodputBurning(Fast) guard. {FLEET_WIDE} "
        f"{BUCKETS}", "percentunit", steps(RED, (objective, GREEN)),
        [query(f"1 - {goodput.waste('1h')}", "last hour"), query(f"1 - {goodput.waste('6h')}", "last 6 hours")],
        width=8, min_value=0, max_value=1))
    dash.with_panel(bargauge_panel(
        "GPU-hours by bucket today",
        f"The fleet's GPU-hours since midnight by bucket (the runs' GPUs times their time, from "
        f"{goodput.PER_FLEET}). {FLEET_WIDE} {BUCKETS}", GPU_HOURS, steps(NEUTRAL),
        [query(gpu_hours(goodput.PER_FLEET), "{{bucket}}", instant=True)]).time_from("now/d"))
    fleet_waste = f"{goodput.waste('5m')} * sum({goodput.PER_FLEET}{TRAINING})"
    dash.with_panel(stat_panel(
        "Waste today",
        f"The fleet's waste since midnight in GPU-hours (its waste ratio times its training GPUs, from "
        f"{goodput.waste('5m')}), and its cost. {PRICED} {FLEET_WIDE} {BUCKETS}", GPU_HOURS, steps(NEUTRAL),
        [query(gpu_hours(fleet_waste), "waste", instant=True),
         query(cost(gpu_hours(fleet_waste)), "cost", instant=True)], width=8, height=8)
        .time_from("now/d").override_by_query("B", [DynamicConfigValue("unit", "none")]))
    by_bucket = timeseries_panel(
        "GPUs by bucket, last 7 days",
        f"The fleet's GPUs by bucket ({goodput.PER_FLEET}), stacked: the area is GPU-hours. Lost, the GPUs "
        f"of runs training while a diagnosis fires ({goodput.AFTER_DIAGNOSIS}) and the runs' GPUs that idle "
        f"({goodput.IDLE_GPUS}: under the catalog's system.gpu_idle_utilization over 10 minutes, where their "
        f"node's exporter sees them) are lines over the stack, counted in it already. {FLEET_WIDE} {BUCKETS}",
        "suffix: GPUs", steps(NEUTRAL),
        [query(f"{goodput.PER_FLEET}{NOT_LOST}", "{{bucket}}"),
         query(f'{goodput.PER_FLEET}{{bucket="lost"}}', "lost (counted again)"),
         query(f"sum({goodput.AFTER_DIAGNOSIS}) or vector(0)", "after a diagnosis"),
         query(f"sum({goodput.IDLE_GPUS}) or vector(0)", "idle (held, unused)")],
        stacked=True, show_thresholds=False).time_from("7d")
    for ref_id in ("B", "C", "D"):
        by_bucket = by_bucket.override_by_query(ref_id, [
            DynamicConfigValue("custom.stacking", {"mode": "none", "group": "A"}),
            DynamicConfigValue("custom.fillOpacity", 0),
            DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})])
    dash.with_panel(by_bucket)


def goodput_tables(dash: db.Dashboard) -> None:
    at_risk = (f"topk({OFFENDERS}, max by ({BY_RUN}) ({AT_RISK}{{{RUNS}}})"
               f" unless on({BY_RUN}) verl_training_finished_timestamp_seconds{{{RUNS}}}) / 3600")
    bound = SYSTEM["work_at_risk_gpu_hours"]
    dash.with_panel(merged_table(
        "Work at risk",
        f"The {OFFENDERS} selected unfinished runs with the most GPU-hours of work since their last checkpoint "
        f"save ({AT_RISK}): what a crash or a preemption would make them redo, counted as lost then; orange "
        f"past {bound:g} GPU-hours, where VerlRunWorkAtRisk fires (the catalog's system.work_at_risk_gpu_hours). "
        f"{PRICED} {BUCKETS}",
        [("At risk", at_risk, GPU_HOURS, steps(NEUTRAL, (bound, ORANGE))),
         ("Cost", cost(at_risk), "none", steps(NEUTRAL))],
        ("project", "experiment", "user", "team"), width=12, height=8)
        .data_links([db.DashboardLink("Open the run").url(RUN_LINK)])
        .sort_by([cb.TableSortByFieldState().display_name("At risk").desc(True)]))
    for title, by, labels, link in (("Runs with the most waste", BY_RUN, ("project", "experiment", "user", "team"),
                                     True),
                                    ("Owners with the most waste", "user, team", ("user", "team"), False)):
        what = "selected runs" if link else "owners (user and team) of the selected runs"
        panel = (merged_table(
            title,
            f"The {OFFENDERS} {what} with the most waste over the time range, in GPU-hours: their stalled and "
            "lost time, and their productive time while a training diagnosis alert fired (after_diagnosis); "
            f"Mostly is the largest of those parts. {PRICED} {BUCKETS}", most_waste(by), (*labels, "bucket"),
            label_queries=(largest_part(by),), headers={"bucket": "Mostly"}, width=12, height=8)
            .sort_by([cb.TableSortByFieldState().display_name("Waste").desc(True)]))
        dash.with_panel(panel.data_links([db.DashboardLink("Open the run").url(RUN_LINK)]) if link else panel)


def build() -> dict:
    """The fleet overview dashboard as Grafana JSON."""
    dash = new_dashboard(UID, TITLE, "Every verl run at a glance; click a run for its details.",
                         [datasource_variable(), *run_variables(multi=True), price_variable()], RUNS)
    dash.with_row(db.Row("Runs"))
    count_stats(dash)
    dash.with_panel(runs_table())
    fleet_gpus(dash)
    goodput_row(dash)
    return to_json(dash)
