"""Alert and rule-group definitions, placeholders and duration scaling.

Alerts and groups are built with named fields only (``Alert(name=..., severity=..., expr=...,
for_=..., summary=..., description=..., meaning=..., fix=...)``).

Placeholders: every substitution into an expression or a text is written ``${...}``, one syntax,
filled in by ``fill`` when the rules are rendered (no f-strings or ``str.format`` in the definitions):

- ``${verl/key:threshold}``: a threshold of the exporter's catalog (``${actor/ppo_kl:too_large}``),
  or its healthy range (``${actor/entropy:healthy.min}``);
- ``${table:name}``: a number of another table (``${system:gpu_hot_celsius}``, ``${setting:KEY}``
  for verl's default of a setting, ``${anomaly:...}``, ``${mismatch:...}``, ``${rollout:...}``);
- ``${NAME}``: a text fragment, the upper-case text constant ``NAME`` of this module or of a
  definitions module (``${RUN}``, ``${PERCENT}``, ``${NUMBER}``), itself filled in the same way.

Helpers that take arguments build their text with ``sub`` (``sub("rate(${series}[5m])",
series=...)``), which fills the ``${name}`` of its arguments and leaves the others for ``fill``.
Durations are Prometheus's, read and written by ``verl_exporter.config.durations``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import ModuleType

from verl_exporter.config.durations import format_duration, parse_duration
from verl_exporter.store.catalog import Catalog
from verl_exporter.store.step_windows import WATCHED

SEVERITIES = ("critical", "warning", "info")
AUDIENCES = ("team", "oncall")

# How a run, a GPU and a target are named in descriptions.
RUN = "{{ $labels.project }}/{{ $labels.experiment }}"
GPU = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"



def run_query(expr: str, pairs: int = 1) -> str:
    """The opening of a description's ``{{ with query }}`` on ``expr``, whose ``pairs`` of
    ``project=%q,experiment=%q,user=%q`` name the alert's run; the caller closes it with ``{{ end }}``."""
    return "{{ with printf `" + expr + "`" + " $labels.project $labels.experiment $labels.user" * pairs + " | query }}"


# Value formats for descriptions.
PERCENT = "{{ $value | humanizePercentage }}"
NUMBER = '{{ $value | printf "%.4g" }}'
DURATION = "{{ $value | humanizeDuration }}"

# Labels every training series carries, for explicit vector matching.
RUN_MATCH = "on(job, instance, project, experiment, user, team)"

_PLACEHOLDER = re.compile(r"\$\{([^}:]+):([^}]+)\}")
_FRAGMENT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# A range or subquery ("[1h]", "[15m:1m]") and an offset ("offset 1h") inside PromQL.
_RANGE = re.compile(r"\[(\d+[smhd])(?::(\d+[smhd])?)?\]")
_OFFSET = re.compile(r"\boffset (\d+[smhd])\b")


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alerting rule and what the runbook says about it.

    Every text may hold placeholders (``${verl/key:threshold}``, ``${table:name}``, ``${NAME}``: see
    the module's docstring); ``meaning`` and ``fix`` are Markdown for the runbook, ``fix`` is also the
    ``fix`` annotation shown in notifications. Built with named fields only.
    """

    name: str
    severity: str
    expr: str
    for_: str
    summary: str
    description: str
    meaning: str
    fix: str
    guide: str = ""
    held: str = ""  # how long the expression itself requires the condition (a window), before ``for_``
    # Hysteresis: once firing, the alert stays firing while ``stay`` holds (a looser condition, e.g.
    # over the last 10 steps rather than each of the last 3), so one incident is one notification.
    stay: str = ""
    evidence: bool = False  # the exporter captures evidence of this stop: link /debug/evidence
    audience: str = ""  # who acts on it where it differs from its group's (AUDIENCES)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"Verl[A-Z][A-Za-z0-9]+", self.name):
            raise ValueError(f"alert name {self.name!r} must be Verl + CamelCase")
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.name}: severity {self.severity!r} not one of {SEVERITIES}")
        if self.audience and self.audience not in AUDIENCES:
            raise ValueError(f"{self.name}: audience {self.audience!r} not one of {AUDIENCES}")
        if "{{" in self.summary:
            raise ValueError(f"{self.name}: the summary must be static")
        parse_duration(self.for_)
        if self.held:
            parse_duration(self.held)
        if self.stay and parse_duration(self.for_):
            raise ValueError(f"{self.name}: an alert with a `stay` condition fires at once (its window is in steps)")

    def wait(self) -> str:
        """How long the condition must hold before the alert fires, as the runbook says it."""
        if self.stay:
            return "the run's own steps (each of the last 3, or a trend over 10); stays firing while " \
                "about half of the last 10 steps hold"
        wait = self.for_ if parse_duration(self.for_) else "at once"
        return f"{self.held} (window in the expression), then {wait}" if self.held else wait


# Evaluation interval of the groups whose inputs change once per training step (a minute or more
# in verl runs) and whose alerts wait 5m or longer: a quarter of the evaluations of Prometheus's
# usual 15s. Groups that page, that catch a one-step spike or that feed dashboards keep the global one.
PER_STEP_INTERVAL = "1m"


@dataclass(frozen=True, kw_only=True)
class Group:
    """A rule group: ``name`` in Prometheus, the rule file it lives in, its alerts (named fields only)."""

    name: str
    file: str
    title: str
    alerts: tuple[Alert, ...] = field(default_factory=tuple)
    training: bool = False  # per-run alerts: silent once the run has finished
    # Who acts on its alerts (the shipped Alertmanager routes by it): "team", the run's owning team
    # (training quality), or "oncall", the cluster's on-call (GPUs, nodes, exporters, jobs that hang
    # or crash).
    audience: str = "team"
    interval: str = ""  # evaluation interval; "" for Prometheus's global one

    def __post_init__(self) -> None:
        if self.interval:
            shortest = min((parse_duration(alert.for_) for alert in self.alerts if not alert.stay), default=None)
            if shortest is not None and shortest < 5 * parse_duration(self.interval):
                raise ValueError(f"{self.name}: a `for` of {shortest:g}s is too short for interval {self.interval}")


# How much looser the condition an alert stays firing on (``stay``) is than the one that starts it:
# ``${hysteresis:half}`` of a z-score or of the way back to normal, twice or three times a small margin.
HYSTERESIS = {"half": 0.5, "twice": 2.0, "thrice": 3.0}

# Step statistics (step_windows.py), by the words the rules use.
HELD_STATS = {">": "recent_min", ">=": "recent_min", "<": "recent_max"}  # the condition at each of the last 3 steps


# The step statistics the rules read, each recorded once per run (group STEP_STATISTICS_GROUP) under
# the name ``run:<metric>:<stat>``: recorded name -> the expression recording it. ``steps`` and
# ``steps_of_any`` fill it as the definitions are read.
STEP_STATISTICS: dict[str, str] = {}
STEP_STATISTICS_GROUP = "verl-step-statistics"
_RECORDED_STATISTIC = re.compile(r"(?<![\w:])run:[A-Za-z0-9_]+:[a-z_]+(?![\w:])")


def steps(stat: str, metric: str) -> str:
    """The run's statistic ``stat`` (step_windows.STATS) of ``metric``, labelled as the run's
    series are (the ``metric`` label dropped, so statistics of two metrics compare directly): the
    recorded series ``run:<metric>:<stat>``."""
    return _recorded(f"run:{metric}:{stat}", raw_steps(stat, metric))


def raw_steps(stat: str, metric: str) -> str:
    """``steps`` as a recording rule reads it: the exporter's statistic itself (nothing recorded for it)."""
    _served(stat, (metric,))
    return f'max without(metric) (verl_training_{stat}{{metric="{metric}"}})'


def steps_of_any(stat: str, pattern: str, names: tuple[str, ...], aggregate: str = "max", *, name: str) -> str:
    """``steps`` of whichever of ``names`` (matched by ``pattern``) the run logs: the spellings of one
    metric, or several metrics taken together by ``aggregate`` (``min``: the least of them), recorded
    as ``run:<name>:<stat>``."""
    _served(stat, names)
    return _recorded(f"run:{name}:{stat}", f'{aggregate} without(metric) (verl_training_{stat}{{metric=~"{pattern}"}})')


# Figures of a run's step statistics that several rules read (its score range as the unit of its rewards),
# each recorded once per run by group RUN_FIGURES_GROUP: recorded name -> expression. Their rules read the
# raw statistics (one level deep), so they are as fresh as the recorded statistics.
RUN_FIGURES: dict[str, str] = {}
RUN_FIGURES_GROUP = "verl-run-figures"


def recorded(name: str, expr: str) -> str:
    """``expr`` recorded once per run as ``name`` (``run:<subject>:<what>``), by group RUN_FIGURES_GROUP."""
    return _record(RUN_FIGURES, name, expr)


def run_figures_group() -> dict:
    """The recording group of the run figures, one rule each, by name."""
    return _group(RUN_FIGURES_GROUP, RUN_FIGURES)


def _recorded(name: str, expr: str) -> str:
    return _record(STEP_STATISTICS, name, expr)


def step_statistics_group() -> dict:
    """The recording group of every step statistic a rule reads, one rule each, by name."""
    return _group(STEP_STATISTICS_GROUP, STEP_STATISTICS)


def _record(table: dict[str, str], name: str, expr: str) -> str:
    if table.setdefault(name, expr) != expr:
        raise ValueError(f"{name} is recorded as {table[name]}, not {expr}")
    return name


def _group(name: str, table: dict[str, str]) -> dict:
    rules = [{"record": record, "expr": table[record]} for record in sorted(table)]
    return {"name": name, "interval": "", "rules": rules}


def read_raw(expr: str) -> str:
    """``expr`` with each recorded step statistic replaced by the expression recording it: what a
    recording rule reads (rules that read recorded series are kept one level deep)."""
    return _RECORDED_STATISTIC.sub(lambda match: STEP_STATISTICS.get(match.group(0), match.group(0)), expr)


def _served(stat: str, names: tuple[str, ...]) -> None:
    """KeyError unless the exporter serves ``stat`` of each of ``names``."""
    for name in names:
        if stat not in WATCHED.get(name, ()):
            raise KeyError(f"step statistic {stat} of {name} is not served: add it to step_windows.WATCHED")


def held(metric: str, op: str, threshold: str) -> str:
    """``metric`` ``op`` (> or <) ``threshold`` at each of the run's last 3 steps."""
    return f"{steps(HELD_STATS[op], metric)} {op} {threshold}"


def mostly(metric: str, op: str, threshold: str) -> str:
    """``metric`` ``op`` ``threshold`` at about half of the run's last 10 steps (their median):
    the looser condition an alert stays firing on."""
    return f"{steps('window_median', metric)} {op} {threshold}"


def firing(alert: str) -> str:
    """The alert ``alert`` firing for the same run, as Prometheus' ALERTS series shows it."""
    return f'{RUN_MATCH} ALERTS{{alertname="{alert}", alertstate="firing"}}'


def scale_duration(text: str, scale: float, minimum: float) -> str:
    """``text`` times ``scale``, at least ``minimum`` seconds, in whole seconds (0 stays 0)."""
    seconds = parse_duration(text)
    if seconds == 0 or scale == 1:
        return text
    return format_duration(round(max(minimum, seconds * scale)))


def scale_expr(expr: str, scale: float, min_range: float) -> str:
    """``expr`` with every range, subquery step and offset multiplied by ``scale``."""
    if scale == 1:
        return expr

    def scaled_range(match: re.Match) -> str:
        window = scale_duration(match.group(1), scale, min_range)
        if match.group(0).find(":") < 0:
            return f"[{window}]"
        step = match.group(2)
        return f"[{window}:{scale_duration(step, scale, 1) if step else ''}]"

    expr = _RANGE.sub(scaled_range, expr)
    return _OFFSET.sub(lambda m: f"offset {scale_duration(m.group(1), scale, min_range)}", expr)


def format_number(value: float) -> str:
    """A threshold as PromQL and people write it: ``0.5``, ``120``, ``1e-06``."""
    return f"{value:g}"


def sub(template: str, **values: object) -> str:
    """``template`` with each ``${name}`` of ``values`` replaced by its text; other placeholders stay."""
    return _FRAGMENT.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


def fragments(*modules: ModuleType) -> dict[str, str]:
    """The text fragments ``${NAME}`` of ``modules``: their upper-case module-level text constants.
    A name means one text: the same name with two texts is refused."""
    found: dict[str, str] = {}
    for module in modules:
        for name, value in vars(module).items():
            if not (isinstance(value, str) and re.fullmatch(r"[A-Z][A-Z0-9_]*", name)):
                continue
            if found.setdefault(name, value) != value:
                raise ValueError(f"fragment ${{{name}}}: {module.__name__} gives it another text")
    return found


def expand(text: str, fragments: dict[str, str]) -> str:
    """``text`` with every ``${NAME}`` fragment replaced, fragments within fragments too."""
    for _ in range(16):
        expanded = _FRAGMENT.sub(lambda m: _fragment(m, fragments), text)
        if expanded == text:
            return text
        text = expanded
    raise ValueError(f"fragments nested too deep (a cycle?) in {text[:80]!r}")


def _fragment(match: re.Match, fragments: dict[str, str]) -> str:
    if match.group(1) not in fragments:
        raise KeyError(f"placeholder {match.group(0)}: no text fragment {match.group(1)!r}")
    return fragments[match.group(1)]


def fill(text: str, catalog: Catalog, extra: dict[str, dict] | None = None,
         fragments: dict[str, str] | None = None) -> str:
    """``text`` with its placeholders filled (see the module's docstring): fragments ``${NAME}``
    first, then each ``${verl/key:name}`` with the catalog's threshold (or ``healthy.min|max``).

    ``extra`` holds thresholds that are not verl metrics: ``${system:gpu_hot_celsius}`` reads
    ``extra["system"]["gpu_hot_celsius"]``.
    """
    text = expand(text, fragments or {})

    def value(match: re.Match) -> str:
        key, name = match.group(1), match.group(2)
        if extra and key in extra:
            if name not in extra[key]:
                raise KeyError(f"placeholder {match.group(0)}: no threshold {name!r} for {key!r}")
            return format_number(extra[key][name])
        try:
            spec = catalog.spec(key)
        except KeyError:
            raise KeyError(f"placeholder {match.group(0)}: {key!r} is not in the catalog") from None
        table, _, field_name = name.rpartition(".")
        source = spec.healthy if table == "healthy" else spec.thresholds
        if table not in ("", "healthy") or field_name not in source:
            raise KeyError(f"placeholder {match.group(0)}: the catalog has no {name!r} for {key!r}")
        return format_number(source[field_name])

    return _PLACEHOLDER.sub(value, text)


def new_or_increased(selector: str, window: str) -> str:
    """Counter ``selector`` rose within ``window``, or appeared (above 0) within it."""
    return sub("increase(${selector}[${window}]) > 0 or (${selector} > 0 unless ${selector} offset ${window})",
               selector=selector, window=window)
