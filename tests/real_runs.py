"""The logs of other people's real verl runs (``../shared/real-runs/<run>/``, never copied here) and
their replay against the shipped rules.

Tests that read them skip, with the reason, where the folder is absent. ``VERL_REAL_RUNS`` names
another folder of the same layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from servers import REPO, require_binary
from verl_exporter.history import backfill, replay

REAL_RUNS = Path(os.environ.get("VERL_REAL_RUNS", REPO.parent / "shared" / "real-runs"))
VERDICTS = yaml.safe_load((REPO / "tests" / "history" / "real_runs.yml").read_text(encoding="utf-8"))
LOG_NAMES = ("console.log", "metrics.jsonl")


def available_runs() -> list[str]:
    """The runs of the folder, by name; [] where it is absent."""
    if not REAL_RUNS.is_dir():
        return []
    return sorted(path.name for path in REAL_RUNS.iterdir() if (path / "SOURCE.md").is_file())


def require_real_runs() -> None:
    if not REAL_RUNS.is_dir():
        pytest.skip(f"no real-run logs at {REAL_RUNS} (set VERL_REAL_RUNS to a folder of them)")


def log_files(run: str) -> list[str]:
    return [str(REAL_RUNS / run / name) for name in LOG_NAMES if (REAL_RUNS / run / name).is_file()]


@dataclass
class Replayed:
    """What a replay fired: alert name -> severity; and the alerts themselves."""

    fired: dict[str, str]
    alerts: list[replay.AlertHistory]
    history: backfill.History

    def by_severity(self, severity: str) -> set[str]:
        return {name for name, level in self.fired.items() if level == severity}


def replay_files(files: list[str], workdir: Path) -> Replayed:
    """Backfill ``files`` and evaluate the shipped rules over them with a real Prometheus."""
    history = backfill.build(files)
    alerts, _ = replay.replay(history, replay.shipped_rules(), workdir, interval=backfill.SCRAPE_INTERVAL,
                              prometheus=require_binary("prometheus"), promtool=require_binary("promtool"))
    fired = {alert.rule.name: alert.severity for alert in alerts if alert.fired}
    return Replayed(fired, alerts, history)
