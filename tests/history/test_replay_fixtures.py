"""Real verl output (tests/fixtures/verl/<release>/<run>/) backfills to every logged step and replays
to exactly the alerts in EXPECTED (none unless listed): one Prometheus per run folder."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from servers import REPO, require_binary
from verl_exporter.history import backfill, replay

FIXTURES = REPO / "tests" / "fixtures" / "verl"
RUNS = sorted(path for path in FIXTURES.glob("*/*") if (path / "console.log").is_file())

# "<release>/<run>" -> the alerts its replay fires; a run not listed fires none. Every GRPO run logs
# actor/grad_norm as NaN at step 4 and Inf at step 5: VerlTrainingNonFinite is right to page for them.
# The fixtures' tiny random models also make 0.8 and 0.9's rollout engine and trainer disagree at every
# step (training/rollout_probs_diff_mean 0.18, their log-probabilities uncorrelated): the mismatch alerts
# are right to fire from the third step.
MISMATCH = {"VerlRolloutProbsDiffHigh", "VerlRolloutActorProbsUncorrelated"}
EXPECTED: dict[str, set[str]] = {
    f"{release}/grpo": {"VerlTrainingNonFinite"}
    for release in ("0.3.0.post1", "0.4.1", "0.5.0", "0.6.1", "0.7.0", "0.8.0", "0.9.1")
}
for release in ("0.8.0", "0.9.1"):
    for run in ("agent", "grpo", "ppo"):
        EXPECTED[f"{release}/{run}"] = EXPECTED.get(f"{release}/{run}", set()) | MISMATCH
# The V1 trainer's runs (0.9's default) are the grpo run's setup: its NaN and +Inf gradient norms.
for run in ("v1-sync", "v1-sync-resumed", "v1-colocate_async", "v1-separate_async", "v1-colocate_async-evictions"):
    EXPECTED[f"0.9.1/{run}"] = {"VerlTrainingNonFinite"} | MISMATCH
# Its stand-in rollout raises in one session of one prompt group in 4: verl's AgentLoopWorkerTQ logs
# each failure with its traceback ("Error in _run_prompt for uid=..."). Its console has no timestamps:
# its 6 steps are placed back from the files' modification time by their timing_s/step, 25 s in all, so
# the tracebacks and the run's end fall between two evaluations and VerlTrainingLogErrors (kind=traceback)
# has no evaluation in which the run steps with them. VerlRolloutFailuresEvicted wants failed groups at
# each of the last 3 steps; the fixture's failures land on only some steps.
MODIFIED = 1_780_000_000.0  # every fixture file's modification time in the replay: the same in any checkout


@pytest.mark.parametrize("run", RUNS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_fixture_replays_to_its_alerts(tmp_path, run):
    files = []
    for name in ("console.log", "metrics.jsonl"):
        if (run / name).is_file():  # copied with one modification time: the step times do not hang on a checkout
            files.append(shutil.copyfile(run / name, tmp_path / name))
            os.utime(files[-1], (MODIFIED, MODIFIED))
    history = backfill.build([str(path) for path in files])
    truth = json.loads((run / "logged.json").read_text())
    console = history.timelines[0]
    assert [step.step for step in console.steps][-1] == max(entry["step"] for entry in truth["steps"])
    if len(files) == 2 and truth.get("jsonl_steps"):
        assert {step.step for step in history.timelines[1].steps} == set(truth["jsonl_steps"])
    alerts, _ = replay.replay(history, replay.shipped_rules(), tmp_path, interval=15.0,
                              prometheus=require_binary("prometheus"), promtool=require_binary("promtool"))
    fired = {alert.rule.name for alert in alerts if alert.fired}
    assert fired == EXPECTED.get(f"{run.parent.name}/{run.name}", set())


def test_fixture_folders_have_what_the_replay_reads():
    for run in RUNS:
        assert (run / "logged.json").is_file(), f"{run} has no logged.json"
    present = {name for name in EXPECTED if (FIXTURES / name).parent.is_dir()}
    assert present <= {f"{run.parent.name}/{run.name}" for run in RUNS}, "EXPECTED names a missing run"
