"""``verl-exporter replay``: which alerts would have fired over a run's history, and when.

How the rules are evaluated, and why so:

1. The logs are backfilled (``backfill``) into TSDB blocks in a temporary folder, and a real
   Prometheus (the one on PATH) is started on a free loopback port over them.
2. The recording rules that the alerts read are evaluated the way a rule group does, as a range
   query stepping at the group's interval over the whole history (what ``promtool tsdb
   create-blocks-from rules`` does too, but on the same evaluation times as the alerts below, so
   every recorded sample is where an alert evaluation looks for it), written back as blocks, and
   Prometheus is restarted over them. A recording rule that reads another recording rule sees
   nothing of it (keep such rules one level deep, as promtool requires).
3. Alerting rules cannot be backfilled: promtool ignores them (2.42: "Alerting rules are not
   evaluated"), so it cannot honour ``for``, and Prometheus' rule manager only evaluates at the
   present time. So each alert's expression is run as a range query over the whole history with
   the step set to the group's evaluation interval (the last evaluation at the last sample), which
   is exactly an instant query at each evaluation time, and Prometheus' alert state machine
   (rules/alerting.go) is applied to the result here: a label set that appears becomes pending at
   that evaluation; it fires at the first
   evaluation at least ``for`` after it became active (at once when ``for`` is 0); it resolves at
   the first evaluation where it is absent (a pending alert is dropped), unless ``keep_firing_for``
   keeps it firing; the alert's labels are the series' without ``__name__``, plus the rule's.
   Evaluations cover the whole history, as if Prometheus had been running since the run started.
   The alerts read recorded series as ``last_over_time(name[interval])``: see ``read_fresh``.

Each alert is printed with the steps (the run's ``verl_training_last_step`` at those times) from
which to which it was pending and firing, and its summary. Exit status 1 when a critical alert
would have fired, else 0; 2 on errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import shutil
import signal
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml
from prometheus_client.utils import floatToGoString

from verl_exporter import shipped
from verl_exporter.config.durations import parse_duration
from verl_exporter.store.records import RunKey

from .backfill import (
    History,
    add_source_arguments,
    block_for,
    build_from_args,
    create_blocks,
    escape,
    iso,
    write_openmetrics,
)
from .prometheus import Prometheus

EVALUATION_INTERVAL = 15.0  # prometheus/prometheus.yml
QUERIES_AT_ONCE = 4
# Replay scales with steps, not seconds: samples and evaluations about this many per median step,
# but never more than MAX_EVALUATIONS over the whole history (a 1,000-step run of 40-minute steps spans
# a month: every 15 s would be 180,000 evaluations of every rule; a step is still seen by several).
EVALUATIONS_PER_STEP = 4
MAX_EVALUATIONS = 5_000
# A rule that reads its own ALERTS series (hysteresis: it stays firing on a looser condition) is run
# twice: with its ALERTS term matching no series (what starts the alert) and every run (what keeps it).
_OWN_ALERTS = re.compile(r'ALERTS\{alertname="(\w+)", alertstate="firing"\}')
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
            return RunKey(self.labels["project"], self.labels["experiment"])
        return None


def load_rules(paths: list[Path], default_interval: float = EVALUATION_INTERVAL) -> tuple[list[AlertRule], list[dict]]:
    """The alerting rules of ``paths``, and the groups of the recording rules they read."""
    alerts, recording = [], []
    for path in paths:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
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


def _read_by(alerts: list[AlertRule], groups: list[dict]) -> list[dict]:
    """The recording rules the alerts read (the others cannot change what the alerts do)."""
    exprs = "\n".join(rule.expr for rule in alerts)
    needed = []
    for group in groups:
        rules = [entry for entry in group["rules"]
                 if re.search(rf"(?<![\w:]){re.escape(entry['record'])}(?![\w:])", exprs)]
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


def evaluation_interval(history: History, interval: float) -> float:
    """The replay's sample and evaluation interval: ``interval``, or longer for slow runs and long histories."""
    median = history.median_step() or 0.0
    span = max(0.0, history.end - history.start)
    return float(math.ceil(max(interval, median / EVALUATIONS_PER_STEP, span / MAX_EVALUATIONS)))


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


def replay(history: History, rule_files: list[Path], workdir: Path, *, interval: float,
           prometheus: str, promtool: str) -> tuple[list[AlertHistory], int]:
    """Every alert's history over ``history``, and the number of alerting rules evaluated."""
    interval = evaluation_interval(history, interval)
    alerts, recording = load_rules(rule_files, interval)
    alerts = [dataclasses.replace(rule, interval=max(rule.interval, interval)) for rule in alerts]
    for group in recording:
        group["interval"] = f"{max(parse_duration(group['interval']), interval):g}s"
    alerts, recording = inline(alerts, recording)
    alerts = [dataclasses.replace(rule, expr=read_fresh(rule.expr, recording)) for rule in alerts]
    data = workdir / "data"
    openmetrics = workdir / "backfill.om"
    exprs = [rule.expr for rule in alerts] + [entry["expr"] for group in recording for entry in group["rules"]]
    with openmetrics.open("w", encoding="utf-8") as out:
        write_openmetrics(history, out, interval=interval, keep=referenced(exprs))
    start, end = round(history.start, 3), round(history.end, 3)
    create_blocks(openmetrics, data, promtool, block_for(start, end))
    server = Prometheus(workdir, data, prometheus, lookback=max(300.0, 2 * interval))
    try:
        server.start()
        answerable = _answerable(recording, lambda name: name in history.families)
        if answerable:
            _record(server, answerable, workdir, start, end, promtool)
        def history_of(rule: AlertRule) -> list[AlertHistory]:
            times = evaluation_times(start, end, rule.interval)
            if not _OWN_ALERTS.search(rule.expr):
                return evaluate(rule, server.query_range(rule.expr, times[0], end, rule.interval), times)
            starting = server.query_range(_OWN_ALERTS.sub(NO_RUN, rule.expr), times[0], end, rule.interval)
            staying = server.query_range(_OWN_ALERTS.sub(EVERY_RUN, rule.expr), times[0], end, rule.interval)
            return evaluate(rule, starting, times, staying)

        with ThreadPoolExecutor(QUERIES_AT_ONCE) as pool:  # Prometheus runs queries side by side
            results = [alert for history in pool.map(history_of, alerts) for alert in history]
    finally:
        server.stop()
    return results, len(alerts)


def evaluation_times(start: float, end: float, interval: float) -> list[float]:
    """Every ``interval`` over the history, the last evaluation at its last sample."""
    count = int((end - start) // interval)
    return [round(end - k * interval, 3) for k in range(count, -1, -1)]


def inline(alerts: list[AlertRule], groups: list[dict]) -> tuple[list[AlertRule], list[dict]]:
    """The alerts with each recorded series they read plainly (no matchers, no range, no added labels)
    replaced by its rule's expression, evaluated at the same time: the same result without a
    second backfill. The recording rules still read otherwise are returned."""
    simple = {entry["record"]: entry["expr"].strip() for group in groups for entry in group["rules"]
              if not entry.get("labels")}
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


def _answerable(groups: list[dict], present: Callable[[str], bool]) -> list[dict]:
    """The recording rules that can record anything: a rule that reads no series of the history
    (the GPU and fleet rules in a replay of logs) and no constant records nothing."""
    kept = []
    for group in groups:
        rules = [entry for entry in group["rules"]
                 if "vector(" in entry["expr"] or any(present(word) for word in _NAME.findall(entry["expr"]))]
        if rules:
            kept.append(group | {"rules": rules})
    return kept


def _record(server: Prometheus, groups: list[dict], workdir: Path, start: float, end: float, promtool: str) -> None:
    """Evaluate the recording rules at their groups' evaluation times, load the results as blocks
    and restart Prometheus over them."""
    openmetrics = workdir / "recorded.om"
    families: dict[str, list[str]] = {}
    for group in groups:
        interval = parse_duration(group["interval"])
        times = evaluation_times(start, end, interval)
        with ThreadPoolExecutor(QUERIES_AT_ONCE) as pool:
            answers = list(pool.map(lambda entry, first=times[0], step=interval:
                                    server.query_range(entry["expr"], first, end, step), group["rules"]))
        for entry, answer in zip(group["rules"], answers):
            extra = tuple((str(k), str(v)) for k, v in (entry.get("labels") or {}).items())
            lines = families.setdefault(entry["record"], [])
            for key, points in answer.items():
                labels = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(dict(key + extra).items()))
                lines += [f"{entry['record']}{{{labels}}} {floatToGoString(value)} {moment:.3f}\n"
                          for moment, value in sorted(points.items())]
    with openmetrics.open("w", encoding="utf-8") as out:
        for name, lines in families.items():
            if lines:
                out.write(f"# TYPE {name} gauge\n")
                out.writelines(lines)
        out.write("# EOF\n")
    server.stop()
    create_blocks(openmetrics, server.data, promtool, block_for(start, end))
    server.start()


def report(history: History, alerts: list[AlertHistory], rules: int) -> str:
    """The printed result: per alert, the steps and times it was pending and firing."""
    steps = sum(not step.event for timeline in history.timelines for step in timeline.steps)
    lines = [f"replayed {len(history.runs)} run(s), {steps} steps, {iso(history.start)} to {iso(history.end)}, "
             f"against {rules} alerting rules"]
    for alert in sorted(alerts, key=lambda a: (a.periods[0].start, a.rule.name)):
        run = alert.run
        shown = ("severity", "job", "instance") + (("project", "experiment") if run else ())
        where = " ".join(([f"{run.project}/{run.experiment}"] if run else [])
                         + [f"{k}={v}" for k, v in sorted(alert.labels.items()) if k not in shown])
        lines.append(f"\n{alert.rule.name} ({alert.severity}) {where}\n  {alert.rule.summary}")
        for period in alert.periods:
            lines.append(f"  {period.state:8s} {_steps(history, run, period)}  "
                         f"({iso(period.start)} to {iso(period.end)})")
    fired = [alert for alert in alerts if alert.fired]
    critical = [alert for alert in fired if alert.severity == "critical"]
    lines.append(f"\n{len(fired)} alert(s) would have fired ({len(critical)} critical), "
                 f"{len(alerts) - len(fired)} only pending." if alerts else "\nno alert would have fired.")
    return "\n".join(lines)


def _steps(history: History, run: RunKey | None, period: Period) -> str:
    if run is None and len(history.runs) == 1:
        run = next(iter(history.runs))
    if run is None:
        return ""
    first, last = history.step_at(run, period.start), history.step_at(run, period.end)
    if last is None:
        return "before the first step"
    return f"{'before the first step' if first is None else f'step {first}'} to {last}"


def _stop(signum: int, frame: object) -> None:
    """SIGTERM: unwind, so that Prometheus is stopped and the temporary folder removed."""
    raise SystemExit(128 + signum)


DESCRIPTION = ("Evaluate alert rules over a run's history with a real Prometheus: which would have fired, when.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``verl-exporter replay``."""
    add_source_arguments(parser)
    parser.add_argument("--rules", nargs="+", type=Path, metavar="FILE",
                        help="rule files, after the sources (default: the shipped verl-*.rules.yml and "
                             "recording-rules.yml); evaluated every --scrape-interval unless a "
                             "group sets its interval")
    parser.add_argument("--prometheus", default=shutil.which("prometheus"),
                        help="prometheus binary (default: from PATH)")
    parser.add_argument("--promtool", default=shutil.which("promtool"),
                        help="promtool binary (default: from PATH)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="work in DIR (new or empty) and keep it (blocks, logs)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    signal.signal(signal.SIGTERM, _stop)
    rules = args.rules or shipped_rules()
    if not rules:
        parser.error("no rule files found: give --rules")
    if not args.prometheus or not args.promtool:
        parser.error("prometheus and promtool must be on PATH (or give --prometheus and --promtool)")
    try:
        history = build_from_args(args)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            if any(args.keep.iterdir()):
                raise ValueError(f"--keep {args.keep}: not empty")
            alerts, count = replay(history, rules, args.keep, interval=args.scrape_interval,
                                   prometheus=args.prometheus, promtool=args.promtool)
        else:
            with tempfile.TemporaryDirectory(prefix="verl-replay-") as workdir:
                alerts, count = replay(history, rules, Path(workdir), interval=args.scrape_interval,
                                       prometheus=args.prometheus, promtool=args.promtool)
    except (OSError, ValueError, RuntimeError, yaml.YAMLError) as exc:
        print(f"verl-exporter replay: error: {exc}", file=sys.stderr)
        return 2
    print(report(history, alerts, count))
    return 1 if any(alert.fired and alert.severity == "critical" for alert in alerts) else 0
