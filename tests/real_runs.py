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
# GPUs of the runs whose log names none (no config print), from their SOURCE.md: for their goodput ledger.
GPUS = {**{run: 4.0 for run in ("opd-grpo-qwen2.5-3b-kl-reward-180steps", "opd-grpo-qwen2.5-3b-kl0.001-healthy-52steps",
                               "opd-grpo-qwen2.5-3b-kl0.05-collapse", "opd-grpo-qwen2.5-3b-nokl-entropy-blowup",
                               "opd-grpo-qwen2.5-3b-nokl-length-growth", "opd-grpo-qwen3-4b-collapse-1token",
                               "opd-grpo-qwen2.5-3b-kl0.001-49steps-improving",
                               "opd-grpo-qwen2.5-3b-nokl-160steps-length-growth-val-up",
                               "opd-grpo-qwen2.5-3b-resp16k-oom-step1", "opd-grpo-qwen2.5-3b-teacher-kl-40steps-flat",
                               "opd-sft-qwen2.5-3b-multiturn-372steps-complete")},
        **{run: 1.0 for run in ("ragen-grpo-sokoban-qwen0.5b-entropy-blowup-collapse",
                               "ragen-ppo-frozenlake-clip0.4-collapse-nan-gradnorm",
                               "ragen-ppo-frozenlake-oom-step1-only-in-stderr",
                               "ragen-ppo-frozenlake-qwen0.5b-healthy-200steps")},
        "mi300-grpo-deepseek7b": 8.0}


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


def replay_files(files: list[str], workdir: Path, gpus: float = 0.0) -> Replayed:
    """Backfill ``files`` and evaluate the shipped rules over them with a real Prometheus (``gpus``: of a
    run whose log names none, for its ledger)."""
    history = backfill.build(files, gpus=gpus)
    alerts, _ = replay.replay(history, replay.shipped_rules(), workdir, interval=backfill.SCRAPE_INTERVAL,
                              prometheus=require_binary("prometheus"), promtool=require_binary("promtool"))
    fired = {alert.rule.name: alert.severity for alert in alerts if alert.fired}
    return Replayed(fired, alerts, history)
