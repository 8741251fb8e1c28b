"""A replayed run's goodput ledger: its GPU-seconds by bucket (``store.ledger``), as the exporter
served them at the run's end, and those it spent after a diagnosis: while any of its diagnoses fired
(``verl_mixin.render.diagnoses``: collapse, no signal, NaN), until it recovered or ended, attributed to the
one that fired first.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from verl_exporter.store.ledger import BUCKETS, OVERLAPPING
from verl_exporter.store.records import RunKey

from .alert_rules import AlertHistory
from .backfill import History

FAMILY = "verl_run_gpu_seconds_total"


@dataclass
class RunLedger:
    """One run's ledger at its end, in GPU-seconds."""

    run: RunKey
    gpus: float
    buckets: dict[str, float] = field(default_factory=dict)
    diagnosis: str = ""  # the alert that named what went wrong first
    diagnosis_step: int | None = None
    after_diagnosis: float = 0.0

    @property
    def lifetime(self) -> float:
        return sum(seconds for bucket, seconds in self.buckets.items() if bucket not in OVERLAPPING)

    @property
    def goodput(self) -> float:
        """Productive GPU-seconds that were neither lost nor spent after a diagnosis."""
        return max(0.0, self.buckets.get("productive", 0.0) - self.buckets.get("lost", 0.0) - self.after_diagnosis)


def _diagnoses() -> frozenset[str]:
    from verl_mixin.render import diagnoses

    return frozenset(diagnoses())


def _at(points: list[tuple[float, float]], moment: float) -> float:
    """A step function's value at ``moment`` (0 before its first point)."""
    index = bisect.bisect_right(points, (moment, float("inf")))
    return points[index - 1][1] if index else 0.0


def ledgers(history: History, alerts: Sequence[AlertHistory] = ()) -> list[RunLedger]:
    """Each run's ledger, with the GPU-seconds it spent after a diagnosis among ``alerts``."""
    found: dict[RunKey, RunLedger] = {}
    timelines: dict[RunKey, dict[str, list[tuple[float, float]]]] = {}
    for (_, name, labels), changes in history.series.items():
        if name not in (FAMILY, "verl_run_gpus"):
            continue
        points = [(moment, value) for moment, value in changes if value is not None]
        if not points:
            continue
        label = dict(labels)
        key = RunKey(label["project"], label["experiment"], label.get("user", ""))
        entry = found.setdefault(key, RunLedger(key, 0.0, dict.fromkeys(BUCKETS, 0.0)))
        if name == "verl_run_gpus":
            entry.gpus = points[-1][1]
        else:
            entry.buckets[label["bucket"]] = points[-1][1]
            timelines.setdefault(key, {})[label["bucket"]] = points
    named = _diagnoses()
    diagnoses = [alert for alert in alerts if alert.fired and alert.rule.name in named and alert.run in timelines]
    for run in {alert.run for alert in diagnoses if alert.run is not None}:
        periods = sorted((period.start, period.end, alert.rule.name) for alert in diagnoses if alert.run == run
                         for period in alert.periods if period.state == "firing")
        ledger, spent = found[run], timelines[run]
        ledger.diagnosis, ledger.diagnosis_step = periods[0][2], history.step_at(run, periods[0][0])
        for start, end in _merged([(start, end) for start, end, _ in periods]):
            ledger.after_diagnosis += sum(_at(points, end) - _at(points, start) for bucket, points in spent.items()
                                          if bucket not in OVERLAPPING)
    return sorted(found.values(), key=lambda ledger: ledger.run)


def _merged(periods: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted periods, those that overlap merged into one."""
    merged: list[tuple[float, float]] = []
    for start, end in periods:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:.3g}" if hours >= 0.0005 else "0"


def report(ledgers_: list[RunLedger]) -> str:
    """The ledgers as ``verl-exporter replay`` prints them, in GPU-hours."""
    if not ledgers_:
        return "goodput ledger: no run's config names its GPUs (trainer.n_gpus_per_node; give --gpus)"
    lines = ["goodput ledger, GPU-hours:"]
    for ledger in ledgers_:
        total = ledger.lifetime
        share = f", goodput {ledger.goodput / total:.0%}" if total else ""
        lines.append(f"  {ledger.run.project}/{ledger.run.experiment} on {ledger.gpus:g} GPUs: "
                     f"{_hours(total)} in all{share}")
        lines.append("    " + ", ".join(f"{bucket.replace('_', ' ')} {_hours(seconds)}"
                                        for bucket, seconds in ledger.buckets.items()))
        if ledger.diagnosis:
            step = "" if ledger.diagnosis_step is None else f" from step {ledger.diagnosis_step}"
            lines.append(f"    after a diagnosis: {_hours(ledger.after_diagnosis)} ({ledger.diagnosis}{step})")
    return "\n".join(lines)
