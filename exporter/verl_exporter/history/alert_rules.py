"""The rules a replay evaluates: read from rule files, the recorded series the alerts read inlined
or read fresh, and Prometheus' alert state machine applied to each evaluation's result
(``evaluate``; rules/alerting.go): pending, firing once ``for`` has elapsed, resolved, ``keep_firing_for``.
``replay.py`` runs the queries against a real Prometheus."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from verl_exporter import shipped
from verl_exporter.config.durations import parse_duration
from verl_exporter.config.yaml_files import load_shipped
from verl_exporter.store.records import RunKey

EVALUATION_INTERVAL = 15.0  # prometheus/prometheus.yml
# A rule that reads its own ALERTS series (hysteresis: it stays firing on a looser condition) is run
# twice: with its ALERTS term matching no series (what starts the alert) and every run (what keeps it).
OWN_ALERTS = re.compile(r'ALERTS\{alertname="(\w+)", alertstate="firing"\}')
NO_RUN = "(verl_training_last_step < -Inf)"
EVERY_RUN = "verl_training_last_step"


def shipped_rules() -> list[Path]:
    """The alert and recording rules the package ships (alerts/rules/)."""
    return shipped.rule_files()


@dataclass
class AlertRule:
    name: str
    expr: str
    interval: float
    hold: float = 0.0
    keep_firing: float = 0.0
    labels: dict = field(default_factory=dict)
    summary: str = ""


@dataclass
class Period:
    state: str  # pending or firing
    start: float
    end: float


@dataclass
class AlertHistory:
    """One alert (rule and label set) over the replayed range."""

    rule: AlertRule
    labels: dict
    periods: list[Period] = field(default_factory=list)

    @property
    def fired(self) -> bool:
        return any(period.state == "firing" for period in self.periods)

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "")

    @property
    def run(self) -> RunKey | None:
        if "project" in self.labels and "experiment" in self.labels:
            return RunKey(self.labels["project"], self.labels["experiment"], self.labels.get("user", ""))
        return None


def load_rules(paths: list[Path], default_interval: float = EVALUATION_INTERVAL) -> tuple[list[AlertRule], list[dict]]:
    """The alerting rules of ``paths``, and the groups of the recording rules they read."""
    alerts, recording = [], []
    for path in paths:
        data = load_shipped(Path(path).read_text(encoding="utf-8")) or {}
        for group in data.get("groups") or []:
            interval = parse_duration(group.get("interval")) or default_interval
            records = [entry for entry in group.get("rules") or [] if "record" in entry]
            if records:
                recording.append({"name": group["name"], "interval": f"{interval:g}s", "rules": records})
            for entry in group.get("rules") or []:
                if "alert" in entry:
                    alerts.append(AlertRule(
                        entry["alert"], entry["expr"], interval, parse_duration(entry.get("for")),
                        parse_duration(entry.get("keep_firing_for")), dict(entry.get("labels") or {}),
                        (entry.get("annotations") or {}).get("summary", "")))
    return alerts, _read_by(alerts, recording)


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NAME_MATCHER = re.compile(r'__name__\s*(=~|=)\s*"((?:[^"\\]|\\.)*)"')


def referenced(exprs: list[str]) -> Callable[[str], bool]:
    """Whether a series name can matter to ``exprs``: a word of them, or matched by one of their
    ``__name__`` matchers. Only such series are backfilled: the others cannot change a result."""
    words = {word for expr in exprs for word in _NAME.findall(expr)}
    patterns = [re.compile(value if op == "=~" else re.escape(value))
                for expr in exprs for op, value in _NAME_MATCHER.findall(expr)]
    return lambda name: name in words or any(pattern.fullmatch(name) for pattern in patterns)


def _reads(name: str, text: str) -> int:
    """How many times ``text`` reads the series ``name`` (as a whole name)."""
    return len(re.findall(rf"(?<![\w:]){re.escape(name)}(?![\w:])", text))


def _read_by(alerts: list[AlertRule], groups: list[dict]) -> list[dict]:
    """The recording rules the alerts read (the others cannot change what the alerts do)."""
    exprs = "\n".join(rule.expr for rule in alerts)
    needed = []
    for group in groups:
        rules = [entry for entry in group["rules"] if _reads(entry["record"], exprs)]
        if rules:
            needed.append(group | {"rules": rules})
    return needed


def read_fresh(expr: str, groups: list[dict]) -> str:
    """``expr`` reading each recorded series as ``last_over_time(name[interval])``: the sample of its
    group's latest evaluation only. Live, a series a rule stops producing is marked stale and gone at
    once; backfilled blocks hold no staleness markers, so without this its last sample would linger
    for the 5 minute lookback."""
    for group in groups:
        for name in {entry["record"] for entry in group["rules"]}:
            pattern = rf"(?<![\w:]){re.escape(name)}(\{{[^}}]*\}})?(?![\w:])(?!\s*\[)"
            expr = re.sub(pattern, functools.partial(_last_over_time, group["interval"]), expr)
    return expr


def _last_over_time(interval: str, match: re.Match[str]) -> str:
    return f"last_over_time({match.group(0)}[{interval}])"


def evaluate(rule: AlertRule, samples: dict[tuple, dict[float, float]], times: list[float],
             staying: dict[tuple, dict[float, float]] | None = None) -> list[AlertHistory]:
    """Prometheus' alert state machine over evaluation ``times``; ``samples``: label set -> {time: value}.
    ``staying``: for a rule that reads its own ALERTS, its result with that term true for every run: a
    label set there counts at an evaluation when it was firing at the evaluation before."""
    histories: dict[tuple, AlertHistory] = {}
    active: dict[tuple, dict] = {}  # label set -> since, fired (time or None), seen, cleared
    last = times[0] if times else 0.0
    for moment in times:
        present = [key for key, points in samples.items() if moment in points]
        if staying:
            present += [key for key, points in staying.items() if moment in points and key not in present
                        and key in active and active[key]["fired"] is not None and active[key]["seen"] == last]
        for key in present:
            alert = active.setdefault(key, {"since": moment, "fired": None, "pending_end": moment})
            alert["seen"], alert["cleared"] = moment, None
        for key, alert in list(active.items()):
            if alert["seen"] != moment:  # keep_firing_for counts from the first evaluation without it
                alert["cleared"] = alert["cleared"] if alert["cleared"] is not None else moment
                if not (alert["fired"] is not None and moment - alert["cleared"] < rule.keep_firing):
                    _close(histories, rule, key, alert, last)
                    del active[key]
                continue
            if alert["fired"] is None:
                if moment - alert["since"] >= rule.hold:
                    alert["fired"] = moment
                else:
                    alert["pending_end"] = moment
        last = moment
    for key, alert in active.items():
        _close(histories, rule, key, alert, last)
    return list(histories.values())


def _close(histories: dict, rule: AlertRule, key: tuple, alert: dict, end: float) -> None:
    """Add one activation of an alert: pending from ``since``, firing from ``fired`` to ``end``."""
    history = histories.setdefault(key, AlertHistory(rule, dict(key) | rule.labels))
    fired = alert["fired"]
    if fired is None or fired > alert["since"]:
        history.periods.append(Period("pending", alert["since"], end if fired is None else alert["pending_end"]))
    if fired is not None:
        history.periods.append(Period("firing", fired, end))


_LABEL_DROP = re.compile(r'max without\(metric\) \((verl_training_[a-z_]+)\{metric="([A-Za-z0-9_]+)"\}\)')


def label_drops(groups: list[dict]) -> tuple[dict[tuple[str, str], str], list[dict]]:
    """The recording rules that only drop the ``metric`` label of one step statistic (the recorded step
    statistics: one series per run, so ``max`` keeps it as it is), as (series name, metric) -> recorded
    name, and the groups without them. A replay writes their series beside the ones they copy, with the
    same samples, so the alerts read them plainly, as a live Prometheus does, at no query's cost."""
    drops: dict[tuple[str, str], str] = {}
    kept = []
    for group in groups:
        rules = []
        for entry in group["rules"]:
            match = _LABEL_DROP.fullmatch(entry["expr"].strip())
            if match and not entry.get("labels"):
                drops[match.group(1), match.group(2)] = entry["record"]
            else:
                rules.append(entry)
        if rules:
            kept.append({**group, "rules": rules})
    return drops, kept


# A recorded series that the alerts read more than once, whose rule reads more series than this, is recorded
# by the replay, not inlined: a figure that several alerts read (the run's score range, a floored spread)
# costs once recorded, and again at each read, at every evaluation, inlined.
INLINED_MAX_SELECTORS = 2
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
# A series name: a word with an underscore or colon (label names of by/on lists have none in these rules)
# that is no function, no label matcher's name.
_SELECTOR = re.compile(r"(?<![\w:])[a-zA-Z_:][a-zA-Z0-9_:]*[_:][a-zA-Z0-9_:]*(?![\w:])(?!\s*[(=!~])")


def selectors(expr: str) -> int:
    """How many series selectors ``expr`` holds (each occurrence)."""
    return len(_SELECTOR.findall(_QUOTED.sub('""', expr)))


def inline(alerts: list[AlertRule], groups: list[dict]) -> tuple[list[AlertRule], list[dict]]:
    """The alerts with each recorded series they read plainly (no matchers, no range, no added labels)
    replaced by its rule's expression, evaluated at the same time: the same result without a
    second backfill (a rule of more than ``INLINED_MAX_SELECTORS`` selectors only where it is read once).
    The recording rules still read otherwise are returned."""
    everything = "\n".join(rule.expr for rule in alerts)
    simple = {entry["record"]: entry["expr"].strip() for group in groups for entry in group["rules"]
              if not entry.get("labels")
              and (selectors(entry["expr"]) <= INLINED_MAX_SELECTORS or _reads(entry["record"], everything) <= 1)}
    counts: dict[str, int] = {}
    for entry in (entry for group in groups for entry in group["rules"]):
        counts[entry["record"]] = counts.get(entry["record"], 0) + 1
    simple = {name: expr for name, expr in simple.items() if counts[name] == 1}

    def replaced(expr: str) -> str:
        for name, body in simple.items():
            expr = re.sub(rf"(?<![\w:]){re.escape(name)}(?![\w:{{\[])(?!\s*\[)", f"({body})".replace("\\", "\\\\"),
                          expr)
        return expr

    alerts = [dataclasses.replace(rule, expr=replaced(rule.expr)) for rule in alerts]
    return alerts, _read_by(alerts, groups)


def answerable_groups(groups: list[dict], present: Callable[[str], bool]) -> list[dict]:
    """The recording rules that can record anything: a rule that reads no series of the history
    (the GPU and fleet rules in a replay of logs) and no constant records nothing."""
    kept = []
    for group in groups:
        rules = [entry for entry in group["rules"]
                 if "vector(" in entry["expr"] or any(present(word) for word in _NAME.findall(entry["expr"]))]
        if rules:
            kept.append(group | {"rules": rules})
    return kept
