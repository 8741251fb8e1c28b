"""Every real run of ../shared/real-runs replays to what its verdict (real_runs.yml) says: healthy runs
raise no warning or critical alert at any point and at most one info alert; failing runs raise the
alerts of the failure their author reported; runs that never stepped raise just what their log's
errors say."""

from __future__ import annotations

from pathlib import Path

import pytest

import replay_pool
from real_runs import (
    FOLDER_OF,
    FOLDERS,
    GPUS,
    VERDICTS,
    VERDICTS_OF,
    Replayed,
    available_runs,
    log_files,
    replay_files,
    require_run,
)
from servers import require_binary
from verl_exporter.history import goodput

VERDICT_KINDS = {"healthy", "failing", "degraded", "short", "no-steps"}


@pytest.mark.parametrize("folder", sorted(FOLDERS), ids=lambda folder: folder.name)
def test_every_real_run_has_a_verdict(folder):
    if not folder.is_dir():
        pytest.skip(f"no real-run logs at {folder}")
    runs = set(available_runs(folder))
    assert runs, f"{folder} holds no run"
    assert runs - set(VERDICTS_OF[folder]) == set(), f"runs without a verdict in tests/history/{FOLDERS[folder]}"
    for name, entry in VERDICTS.items():
        assert entry["verdict"] in VERDICT_KINDS, name
        assert entry.get("why"), f"{name}: say why"
        if entry["verdict"] in ("failing", "degraded"):
            assert entry.get("fires"), f"{name}: a failing run names the alerts it must raise"


def assert_ledger(run: str, expected: dict, replayed) -> None:
    """The run's goodput ledger against what its log shows (``ledger`` of its verdict): GPU-hours of each
    bucket named, and the diagnosis its time after a diagnosis is attributed to, from which step at most."""
    if not expected:
        return
    (ledger,) = goodput.ledgers(replayed.history, replayed.alerts)
    hours = {**{bucket: seconds / 3600 for bucket, seconds in ledger.buckets.items()},
             "after_diagnosis": ledger.after_diagnosis / 3600}
    for bucket, (low, high) in (expected.get("hours") or {}).items():
        assert low <= hours[bucket] <= high, f"{run}: {bucket} {hours[bucket]:.3f} GPU-hours, not {low} to {high}"
    if "diagnosis" in expected:
        assert ledger.diagnosis == expected["diagnosis"]["alert"], ledger.diagnosis
        assert ledger.diagnosis_step is not None and ledger.diagnosis_step <= expected["diagnosis"]["by_step"]


def background_replays(root: Path) -> dict[str, tuple]:
    """Every real run beside the checkout, for ``replay_pool`` to replay beside the session's other tests."""
    require_binary("prometheus"), require_binary("promtool")
    planned = {}
    for run in sorted(VERDICTS):
        if FOLDER_OF[run].is_dir() and (FOLDER_OF[run] / run).is_dir() and not VERDICTS[run].get("pending"):
            (root / run).mkdir()
            planned[run] = (replay_files, (log_files(run), root / run, GPUS.get(run, 0.0)))
    return planned


@pytest.fixture(scope="module")
def replays() -> dict[str, Replayed]:
    return replay_pool.results(__name__)


@pytest.mark.parametrize("run", sorted(VERDICTS))
def test_real_run_replays_to_its_verdict(replays, run):
    require_run(run)
    entry = VERDICTS[run]
    replayed = replays[run]
    fired = replayed.fired
    assert_ledger(run, entry.get("ledger") or {}, replayed)
    if entry["verdict"] == "no-steps":
        steps = [step for clock in replayed.history.steps.values() for _, step in clock]
        assert max(steps, default=0) <= 0, f"a run that never stepped logged steps {steps}"
        assert set(fired) == set(entry.get("fires", [])), fired
    if "run" in entry:
        assert [f"{key.project}/{key.experiment}" for key in replayed.history.steps] == [entry["run"]]
    assert set(entry.get("silent", [])) & set(fired) == set(), f"must stay silent: {entry.get('silent')}"
    if entry["verdict"] == "healthy":
        loud = {name: level for name, level in fired.items() if level in ("warning", "critical")}
        assert loud == {}, f"a healthy run raised {loud}"
        assert len(replayed.by_severity("info")) <= 1, f"more than one info alert: {sorted(fired)}"
    elif entry["verdict"] == "short":
        assert replayed.by_severity("critical") == set(), fired
    elif entry["verdict"] != "no-steps":
        missing = set(entry["fires"]) - set(fired)
        assert missing == set(), f"{run} did not raise {sorted(missing)} (fired: {sorted(fired)})"
