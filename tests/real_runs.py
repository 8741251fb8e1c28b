"""The logs of other people's real verl runs (``../shared/real-runs/<run>/`` and the second batch,
mostly verl's forks, in ``../shared/real-runs-2/``; never copied here) and their replay against the
shipped rules.

Tests that read them skip, with the reason, where a folder is absent. ``VERL_REAL_RUNS`` and
``VERL_REAL_RUNS_2`` name other folders of the same layout. The verdicts are
``tests/history/real_runs.yml`` (first batch) and ``real_runs_2.yml`` (second).
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
REAL_RUNS_2 = Path(os.environ.get("VERL_REAL_RUNS_2", REPO.parent / "shared" / "real-runs-2"))
FOLDERS = {REAL_RUNS: "real_runs.yml", REAL_RUNS_2: "real_runs_2.yml"}
VERDICTS_OF = {folder: yaml.safe_load((REPO / "tests" / "history" / name).read_text(encoding="utf-8"))
               for folder, name in FOLDERS.items()}
VERDICTS = {run: entry for verdicts in VERDICTS_OF.values() for run, entry in verdicts.items()}
FOLDER_OF = {run: folder for folder, verdicts in VERDICTS_OF.items() for run in verdicts}
LOG_NAMES = ("console.log", "console.stderr.log", "metrics.jsonl")  # a job's stdout, its stderr, its JSON lines


def available_runs(folder: Path = REAL_RUNS) -> list[str]:
    """The runs of ``folder``, by name; [] where it is absent."""
    if not folder.is_dir():
        return []
    return sorted(path.name for path in folder.iterdir() if (path / "SOURCE.md").is_file())


def require_real_runs(folder: Path = REAL_RUNS) -> None:
    if not folder.is_dir():
        pytest.skip(f"no real-run logs at {folder} (set VERL_REAL_RUNS or VERL_REAL_RUNS_2 to a folder of them)")


def require_run(run: str) -> Path:
    """The folder of ``run``; skips, saying why, where it is absent or its verdict says it cannot be read yet."""
    folder = FOLDER_OF[run]
    require_real_runs(folder)
    if not (folder / run).is_dir():
        pytest.skip(f"{run} is not in {folder}")
    if VERDICTS[run].get("pending"):
        pytest.skip(f"{run}: {VERDICTS[run]['pending']}")
    return folder


def log_files(run: str) -> list[str]:
    folder = FOLDER_OF.get(run, REAL_RUNS)
    return [str(folder / run / name) for name in LOG_NAMES if (folder / run / name).is_file()]


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
