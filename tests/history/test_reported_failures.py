"""Failures that users reported in verl's issues, rebuilt from a real healthy log: its steps up to a
point, then the values the reporter pasted. Each replays to the alert that names the failure, and
that alert carries the guide's advice (its ``fix`` annotation)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from real_runs import REAL_RUNS, log_files, replay_files, require_real_runs
from reported_failures import FAILURES, Failure, write_failure
from verl_exporter.history import replay
from verl_exporter.history.timeline import read_file


def _annotations() -> dict[str, dict]:
    found = {}
    for path in replay.shipped_rules():
        for group in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("groups") or []:
            for rule in group.get("rules") or []:
                if "alert" in rule:
                    found[rule["alert"]] = rule.get("annotations") or {}
    return found


@pytest.mark.parametrize("failure", FAILURES, ids=lambda failure: failure.issue.split(":")[0])
def test_reported_failure_raises_its_alert(tmp_path, failure):
    require_real_runs()
    if not (REAL_RUNS / failure.base).is_dir():
        pytest.skip(f"{failure.base} is not in the real-runs folder")
    log = tmp_path / "console.log"
    write_failure(failure, log)
    (tmp_path / "work").mkdir()
    replayed = replay_files([str(log)], tmp_path / "work")
    missing = failure.fires - set(replayed.fired)
    assert missing == set(), f"{failure.issue}: {sorted(missing)} did not fire (fired: {sorted(replayed.fired)})"
    annotations = _annotations()
    for name in failure.fires:
        assert annotations[name].get("fix"), f"{name} carries no advice"
    if failure.nonfinite_key:
        keys = {alert.labels.get("key", "") for alert in replayed.alerts
                if alert.fired and alert.rule.name == "VerlTrainingNonFinite"}
        assert any(key.startswith(failure.nonfinite_key) for key in keys), keys


def test_a_failure_log_keeps_the_base_run_healthy_before_it():
    """The rebuilt log is the base run's own steps until the failure (so the test reads a real run)."""
    require_real_runs()
    failure = FAILURES[3]
    if not (REAL_RUNS / failure.base).is_dir():
        pytest.skip(f"{failure.base} is not in the real-runs folder")
    healthy = Failure(failure.issue, failure.base, last=failure.last, at=failure.last + 1, values=failure.values,
                      fires=set())
    path = REAL_RUNS.parent / "never-written"
    assert not path.exists()
    from tempfile import TemporaryDirectory
    with TemporaryDirectory() as folder:
        log = Path(folder) / "console.log"
        write_failure(healthy, log)
        steps = read_file(str(log)).steps
        base = [step for step in read_file(log_files(failure.base)[0]).steps if 0 < step.step <= failure.last]
        assert [step.step for step in steps] == [step.step for step in base]
        (Path(folder) / "work").mkdir()
        assert "VerlNoLearningSignal" not in replay_files([str(log)], Path(folder) / "work").fired
