"""Building blocks shared by the dashboards: datasource, variables, queries, panels, thresholds.

Descriptions, units and threshold colours of training panels come from the exporter's metric
catalog (``mixin/catalog.yaml``), so a dashboard cannot disagree with the alert rules about
what is healthy. Colours: green inside the catalog's healthy range, orange below it, red above it;
a one-sided range is red on its bad side. A metric without a healthy range is drawn in the text
colour (no judgement).
"""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import bargauge, prometheus, stat, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BarGaugeDisplayMode,
    BigValueColorMode,
    BigValueGraphMode,
    GraphThresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
    TooltipDisplayMode,
    VisibilityMode,
    VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from verl_exporter.store.catalog import MetricSpec, default_catalog

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# The SDK's string enums (enum.StrEnum) by value: their call gives the member typed as its enum, which
# mypy also sees under Python 3.10 (without StrEnum, a member written as Enum.NAME reads as a str there).
ABSOLUTE = ThresholdsMode("absolute")
LEGEND_LIST = LegendDisplayMode("list")
LEGEND_BOTTOM = LegendPlacement("bottom")
TOOLTIP_MULTI = TooltipDisplayMode("multi")
DASHED_AND_AREA = GraphThresholdsStyleMode("dashed+area")
STACKED = StackingMode("normal")
LINK_DASHBOARDS = DashboardLinkType("dashboards")
HORIZONTAL = VizOrientation("horizontal")
BASIC_BARS = BarGaugeDisplayMode("basic")
TAGS = ["verl"]
REFRESH = "30s"

# Prometheus selectors of one run (run detail: single-valued variables; its owner is part of it) and of
# the runs picked on the fleet and GPU dashboards (multi-valued variables, "All" = any value, an empty
# owner or team included).
RUN = 'project="$project", experiment="$experiment", user="$user"'
RUNS = 'team=~"$team", user=~"$user", project=~"$project", experiment=~"$experiment"'

# Catalog units -> Grafana unit ids.
UNITS = {
    "ratio": "percentunit",
    "seconds": "s",
    "bytes": "bytes",
    "tokens": "suffix: tokens",
    "tokens per second per GPU": "suffix: tokens/s/GPU",
    "": "none",
}

GREEN, ORANGE, RED, NEUTRAL = "green", "orange", "red", "text"

# Thresholds of GPU, host and job metrics, shared with the alert rules.
SYSTEM = default_catalog().system

# A run without a new step for this long counts as stalled: VerlTrainingStalled's limit for a run whose
# step time is not known yet (stalled_steps x the catalog's slowest healthy step, 5 x 120 s). Between
# the slowest healthy step and this, "time since last step" is orange.
_STEP = default_catalog().spec("timing_s/step")
STALLED_AFTER_SECONDS = int(_STEP.thresholds["stalled_steps"] * _STEP.healthy["max"])


def spec(name: str) -> MetricSpec:
    """The catalog entry exported as ``name`` (KeyError if the catalog does not list it)."""
    return default_catalog().by_name(name)


def threshold(name: str, key: str) -> str:
    """A catalogued metric's threshold ``key`` as a panel's text writes it (``0.05``): the alert's number."""
    return f"{spec(name).thresholds[key]:g}"


def unit_of(name: str) -> str:
    """Grafana unit of a catalogued metric."""
    return UNITS[spec(name).unit]


def healthy_steps(name: str) -> list[Threshold]:
    """Threshold steps of a catalogued metric, coloured from its healthy range."""
    healthy = spec(name).healthy
    low, high = healthy.get("min"), healthy.get("max")
    if low is not None and high is not None:
        return [Threshold(None, ORANGE), Threshold(low, GREEN), Threshold(high, RED)]
    if low is not None:
        return [Threshold(None, RED), Threshold(low, GREEN)]
    if high is not None:
        return [Threshold(None, GREEN), Threshold(high, RED)]
    return [Threshold(None, NEUTRAL)]


def since_last_step_steps() -> list[Threshold]:
    """Colours of "time since last step": green, orange past the slowest healthy step, red when stalled."""
    slowest_step = spec("verl_timing_step_seconds").healthy["max"]
    return steps(GREEN, (slowest_step, ORANGE), (STALLED_AFTER_SECONDS, RED))


def steps(base: str, *rest: tuple[float, str]) -> list[Threshold]:
    """Threshold steps: ``base`` colour, then (value, colour) pairs in ascending order."""
    return [Threshold(None, base)] + [Threshold(value, color) for value, color in rest]


def thresholds(step_list: list[Threshold]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(ABSOLUTE).steps(step_list)


def describe(*names: str, extra: str = "") -> str:
    """Panel description: each metric's catalog help (verl key, meaning, unit, healthy range), then ``extra``."""
    parts = [f"{spec(name).full_help()} Series: {name}." for name in names]
    if extra:
        parts.append(extra)
    return "\n\n".join(parts)


def query(expr: str, legend: str = "", *, ref_id: str | None = None, instant: bool = False,
          table: bool = False) -> prometheus.Dataquery:
    """A Prometheus query on the dashboard's ``$datasource``."""
    target = prometheus.Dataquery().expr(expr).datasource(DATASOURCE)
    if legend:
        target = target.legend_format(legend)
    if ref_id:
        target = target.ref_id(ref_id)
    if instant:
        target = target.instant()
    else:
        target = target.range()
    if table:
        target = target.format(PromQueryFormat.TABLE)
    return target


def standing_out(pick: str, count: int, series: str, within: str = "", on: str = "job, instance") -> str:
    """``series`` (one per ``on``: by default a node) of the ``count`` ranked first by ``pick`` (topk or
    bottomk) on their mean over the dashboard's time range, kept to the nodes in ``within`` at its end:
    the same ``count`` lines over the whole graph (a per-step topk would draw every one that is ever
    among them), picked once, not at every step."""
    ranked = f"avg_over_time({series}[$__range] @ end())"
    if within:
        ranked = f"{ranked} and on({on}) {within} @ end()"
    return f"{series} and on({on}) {pick}({count}, {ranked})"


# --- variables --------------------------------------------------------------------------------------

def datasource_variable() -> db.DatasourceVariable:
    return (db.DatasourceVariable("datasource").label("Data source").type("prometheus")
            .description("Prometheus that scrapes the verl exporters"))


def query_variable(name: str, label: str, expr: str, *, multi: bool, description: str,
                   all_value: str | None = ".*") -> db.QueryVariable:
    """A variable filled by ``label_values`` on ``$datasource``; multi-valued ones offer "All": any value
    (``all_value`` ".*"), or with ``all_value`` None every value the query found (Grafana's "All" of a
    variable without a custom all value)."""
    variable = (db.QueryVariable(name).label(label).description(description).query(expr)
                .datasource(DATASOURCE).refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                .sort(VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC))
    if multi:
        variable = variable.multi(True).include_all(True)
        if all_value is not None:
            variable = variable.all_value(all_value)
    return variable


def textbox_variable(name: str, label: str, default: str, description: str) -> db.TextBoxVariable:
    """A free-text variable, ``default`` until a viewer types another value (kept in the URL, not saved)."""
    return (db.TextBoxVariable(name).label(label).description(description).default_value(default)
            .current(VariableOption(selected=True, text=default, value=default)))


def run_variables(*, multi: bool) -> list[db.QueryVariable]:
    """``project`` and ``experiment`` (verl's trainer.project_name and trainer.experiment_name) and the
    run's owner, ``user``; on the dashboards of many runs (``multi``) the owner's ``team`` first."""
    if multi:
        owners = [
            query_variable("team", "Team", "label_values(verl_training_run_info, team)", multi=True,
                           description="the team of the run's owner (--owner.teams, the Slurm account, the namespace)"),
            query_variable("user", "Owner", 'label_values(verl_training_run_info{team=~"$team"}, user)', multi=True,
                           description="the user who owns the run (its log's owner, or the Slurm job's user)"),
        ]
        return [*owners,
                query_variable("project", "Project", 'label_values(verl_training_run_info{team=~"$team", '
                               'user=~"$user"}, project)', multi=True, description="verl trainer.project_name"),
                query_variable("experiment", "Experiment", 'label_values(verl_training_run_info{team=~"$team", '
                               'user=~"$user", project=~"$project"}, experiment)', multi=True,
                               description="verl trainer.experiment_name")]
    return [
        query_variable("project", "Project", "label_values(verl_training_run_info, project)", multi=False,
                       description="verl trainer.project_name"),
        query_variable("experiment", "Experiment",
                       'label_values(verl_training_run_info{project="$project"}, experiment)', multi=False,
                       description="verl trainer.experiment_name"),
        query_variable("user", "Owner",
                       'label_values(verl_training_run_info{project="$project", experiment="$experiment"}, user)',
                       multi=False, description="the user who owns the run (two users' runs of one name are two)"),
    ]


# --- panels -----------------------------------------------------------------------------------------

def timeseries_panel(title: str, description: str, unit: str, step_list: list[Threshold],
                     targets: list[prometheus.Dataquery], *, width: int = 12, height: int = 8,
                     stacked: bool = False, show_thresholds: bool = True,
                     min_value: float | None = None, max_value: float | None = None) -> timeseries.Panel:
    """A time series panel; thresholds are drawn as dashed lines over faintly coloured bands (so a line in
    the red band reads as unhealthy at a glance) unless ``show_thresholds`` is False."""
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
             .unit(unit).thresholds(thresholds(step_list)).span(width).height(height)
             .targets(targets).line_width(1).fill_opacity(10 if not stacked else 40).show_points(VisibilityMode.NEVER)
             .legend(cb.VizLegendOptions().display_mode(LEGEND_LIST)
                     .placement(LEGEND_BOTTOM).show_legend(True))
             .tooltip(cb.VizTooltipOptions().mode(TOOLTIP_MULTI)))
    if show_thresholds and len(step_list) > 1:
        panel = panel.thresholds_style(cb.GraphThresholdsStyleConfig().mode(DASHED_AND_AREA))
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(STACKED))
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def metric_panel(name: str, title: str, selector: str, *, width: int = 6, height: int = 8,
                 extra: str = "", legend: str | None = None) -> timeseries.Panel:
    """One catalogued training metric of the selected run(s), described and coloured from the catalog."""
    entry = spec(name)
    return timeseries_panel(
        title, describe(name, extra=extra), unit_of(name), healthy_steps(name),
        [query(f"{name}{{{selector}}}", legend if legend is not None else entry.key)],
        width=width, height=height)


def several(names: list[str], title: str, *, width: int = 6, extra: str = "",
            colour_from: str | None = None) -> timeseries.Panel:
    """A panel of several catalogued series of the run (same unit), legends are their verl keys."""
    step_list = healthy_steps(colour_from) if colour_from else steps(NEUTRAL)
    return timeseries_panel(title, describe(*names, extra=extra), unit_of(names[0]), step_list,
                            [query(f"{name}{{{RUN}}}", spec(name).key) for name in names], width=width)


def stat_panel(title: str, description: str, unit: str, step_list: list[Threshold],
               targets: list[prometheus.Dataquery], *, width: int = 6, height: int = 4,
               graph: bool = False) -> stat.Panel:
    """A single-value panel coloured by its thresholds."""
    return (stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
            .thresholds(thresholds(step_list)).span(width).height(height).targets(targets)
            .color_mode(BigValueColorMode.VALUE)
            .graph_mode(BigValueGraphMode.AREA if graph else BigValueGraphMode.NONE)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))


def bargauge_panel(title: str, description: str, unit: str, step_list: list[Threshold],
                   targets: list[prometheus.Dataquery], *, width: int = 8, height: int = 8) -> bargauge.Panel:
    """Horizontal bars, one per series (its latest value), coloured by the thresholds."""
    return (bargauge.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
            .thresholds(thresholds(step_list)).span(width).height(height).targets(targets).min(0)
            .orientation(HORIZONTAL).display_mode(BASIC_BARS)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))


# --- dashboards -------------------------------------------------------------------------------------

def new_dashboard(uid: str, title: str, description: str, variables: list, alerts_for: str) -> db.Dashboard:
    """A read-only dashboard (the Python code is its source) linked to the other verl dashboards, with
    ``variables`` and the firing alerts matching the selector ``alerts_for`` as annotations."""
    dash = (db.Dashboard(title).uid(uid).description(description).tags(TAGS).readonly()
            .refresh(REFRESH).time("now-3h", "now").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR)
            .link(db.DashboardLink("verl dashboards").type(LINK_DASHBOARDS).tags(TAGS)
                  .as_dropdown(True).include_vars(True).keep_time(True)))
    for variable in variables:
        dash.with_variable(variable)
    return dash.annotation(alert_annotation(alerts_for))


def alert_annotation(selector: str) -> db.AnnotationQuery:
    """Firing alerts of the selected run(s), from Prometheus' ``ALERTS`` series."""
    return (db.AnnotationQuery().name("Firing alerts").datasource(DATASOURCE).enable(True).hide(False)
            .icon_color("red").expr(f'ALERTS{{alertstate="firing", {selector}}}'))


# Options of Prometheus annotations the SDK's AnnotationQuery has no setters for.
_ANNOTATION_OPTIONS = {
    "titleFormat": "{{alertname}}",
    "textFormat": "{{alertname}} ({{severity}}) on {{project}}/{{experiment}}",
    "tagKeys": "severity,alertname",
    "step": "1m",
    "useValueForTime": False,
}


def to_json(dashboard: db.Dashboard) -> dict:
    """The dashboard as Grafana's JSON model: panels numbered in order, queries lettered A, B, ... within
    each panel (where not set), a collapsed row one grid unit high, annotation options filled in."""
    model = json.loads(json.dumps(dashboard.build(), cls=JSONEncoder))
    panel_id = 0
    shift = 0  # a collapsed row takes one grid unit: what follows it moves up by the height of its panels
    for panel in model.get("panels", []):
        for item in [panel] + panel.get("panels", []):
            panel_id += 1
            item["id"] = panel_id
            item["gridPos"]["y"] -= shift
            for index, target in enumerate(item.get("targets", [])):
                target["refId"] = target.get("refId") or chr(ord("A") + index)
        if panel.get("collapsed") and panel.get("panels"):
            shift += max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panel["panels"]) - panel["gridPos"]["y"] - 1
    for annotation in model.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            annotation.update(_ANNOTATION_OPTIONS)
    return model


def render(model: dict) -> str:
    """The JSON text written to ``grafana/dashboards/`` (stable key order, trailing newline)."""
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
