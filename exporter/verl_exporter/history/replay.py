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
   (rules/alerting.go) is applied to the result (``alert_rules.evaluate``): a label set that
   appears becomes pending at that evaluation; it fires at the first
   evaluation at least ``for`` after it became active (at once when ``for`` is 0); it resolves at
   the first evaluation where it is absent (a pending alert is dropped), unless ``keep_firing_for``
   keeps it firing; the alert's labels are the series' without ``__name__``, plus the rule's.
   Evaluations cover the whole history, as if Prometheus had been running since the run started.
   The alerts read recorded series as ``last_over_time(name[interval])``: see ``read_fresh``.

Each alert is printed with the steps (the run's ``verl_training_last_step`` at those times) from
which to which it was pending and firing, and its summary; then each run's goodput ledger
(``goodput``: its GPU-hours by bucket, and those after a diagnosis). Exit status 1 when a critical alert
would have fired, else 0; 2 on errors.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import math
import shutil
import signal
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import yaml
from prometheus_client.utils import floatToGoString

from verl_exporter.config.durations import parse_duration
from verl_exporter.store.records import RunKey

from . import goodput
from .alert_rules import (
    EVERY_RUN,
    NO_RUN,
    OWN_ALERTS,
    AlertHistory,
    AlertRule,
    Period,
    answerable_groups,
    evaluate,
    inline,
    label_drops,
    load_rules,
    read_fresh,
    referenced,
    shipped_rules,
)
from .backfill import (
    History,
    add_source_arguments,
    block_for,
    build_from_args,
    create_blocks,
    escape,
    iso,
    write_blocks,
)
from .prometheus import Prometheus

QUERIES_AT_ONCE = 4
# Replay scales with steps, not seconds: samples and evaluations about this many per median step,
# but never more than MAX_EVALUATIONS over the whole history (a 1,000-step run of 40-minute steps spans
# a month: every 15 s would be 180,000 evaluations of every rule; a step is still seen by several).
EVALUATIONS_PER_STEP = 4
MAX_EVALUATIONS = 5_000
def evaluation_interval(history: History, interval: float) -> float:
    """The replay's sample and evaluation interval: ``interval``, or longer for slow runs and long histories."""
    median = history.median_step() or 0.0
    span = max(0.0, history.end - history.start)
    return float(math.ceil(max(interval, median / EVALUATIONS_PER_STEP, span / MAX_EVALUATIONS)))


def replay(history: History, rule_files: list[Path], workdir: Path, *, interval: float,
           prometheus: str, promtool: str) -> tuple[list[AlertHistory], int]:
    """Every alert's history over ``history``, and the number of alerting rules evaluated."""
    interval = evaluation_interval(history, interval)
    alerts, recording, drops, read = prepared_rules(rule_files, interval)
    data = workdir / "data"
    copies = {source: name for source, name in drops.items() if read(name)}
    start, end = round(history.start, 3), round(history.end, 3)
    block = block_for(start, end)  # the raw and the recorded series' blocks alike
    write_blocks(history, workdir, data, promtool, block, interval=interval, keep=read, copies=copies)
    # Every served series has a sample at every scrape until it ends (backfill): a lookback of two scrapes
    # ends it there, as a live Prometheus's staleness marker does.
    server = Prometheus(workdir, data, prometheus, lookback=2 * interval)
    try:
        server.start()
        answerable = answerable_groups(recording, lambda name: name in history.families)
        if answerable:
            _record(server, answerable, workdir, start, end, promtool, block)
        def history_of(rule: AlertRule) -> list[AlertHistory]:
            times = evaluation_times(start, end, rule.interval)
            if not OWN_ALERTS.search(rule.expr):
                return evaluate(rule, server.query_range(rule.expr, times[0], end, rule.interval), times)
            starting = server.query_range(OWN_ALERTS.sub(NO_RUN, rule.expr), times[0], end, rule.interval)
            staying = server.query_range(OWN_ALERTS.sub(EVERY_RUN, rule.expr), times[0], end, rule.interval)
            return evaluate(rule, starting, times, staying)

        with ThreadPoolExecutor(QUERIES_AT_ONCE) as pool:  # Prometheus runs queries side by side
            results = [alert for history in pool.map(history_of, alerts) for alert in history]
    finally:
        server.stop()
    return results, len(alerts)


def prepared_rules(rule_files: list[Path], interval: float) -> tuple[list[AlertRule], list[dict],
                                                                     dict[tuple[str, str], str], Callable[[str], bool]]:
    """The alerts as a replay at ``interval`` evaluates them, the recording rules it evaluates, the
    recorded series written beside the series they copy (``label_drops``) and whether a series name
    is read: worked out once per rule files (by path, size and modification time) and interval."""
    stamps = tuple((str(path), *_stamp(Path(path))) for path in rule_files)
    alerts, recording, drops, read = _prepared(stamps, interval)
    return list(alerts), copy.deepcopy(recording), dict(drops), read


def _stamp(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_size, status.st_mtime_ns


@functools.lru_cache(maxsize=16)
def _prepared(stamps: tuple[tuple[str, int, int], ...], interval: float) -> tuple:
    alerts, recording = load_rules([Path(path) for path, _, _ in stamps], interval)
    alerts = [dataclasses.replace(rule, interval=max(rule.interval, interval)) for rule in alerts]
    for group in recording:
        group["interval"] = f"{max(parse_duration(group['interval']), interval):g}s"
    drops, recording = label_drops(recording)
    alerts, recording = inline(alerts, recording)
    alerts = [dataclasses.replace(rule, expr=read_fresh(rule.expr, recording)) for rule in alerts]
    exprs = [rule.expr for rule in alerts] + [entry["expr"] for group in recording for entry in group["rules"]]
    return tuple(alerts), recording, drops, functools.lru_cache(maxsize=None)(referenced(exprs))


def evaluation_times(start: float, end: float, interval: float) -> list[float]:
    """Every ``interval`` over the history, the last evaluation at its last sample."""
    count = int((end - start) // interval)
    return [round(end - k * interval, 3) for k in range(count, -1, -1)]


def _record(server: Prometheus, groups: list[dict], workdir: Path, start: float, end: float, promtool: str,
            block: int) -> None:
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
    create_blocks(openmetrics, server.data, promtool, block)
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
    print()
    print(goodput.report(goodput.ledgers(history, alerts)))
    return 1 if any(alert.fired and alert.severity == "critical" for alert in alerts) else 0
