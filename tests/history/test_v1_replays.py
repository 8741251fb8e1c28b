"""The V1 trainer's alerts fire on failing runs, within a few steps of the failure, and stay silent on healthy
ones, at one step a minute and at one step every 10 minutes.

The runs are verl 0.9.1's V1 fixtures made 60 steps long (tests/v1_runs.py), with a failure injected from step
``ONSET``; every run of a tempo is replayed in one Prometheus (each is a run of its own name). And a healthy
real run resumed under verl 0.9 (a second config print, throughput x 0.4, validation x 0.8) does not read as
a throughput drop, while the same drop without the restart does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from real_runs import Replayed, log_files, replay_files, require_run
from regimes import Run, read_run, resume_point, write_run
from v1_runs import ONSET, changed, level, sometimes, tiled, write

V1_ALERTS = {"VerlGroupsWithoutSignal", "VerlRolloutFailuresEvicted", "VerlTrainerStarved", "VerlRolloutIdle",
             "VerlRolloutTrajectoriesStale", "VerlSpeculativeAcceptanceDropped", "VerlMoeImbalanceSpike"}
# What the fixtures' own values make every tiled run fire. Their tiny random models: rollout engine and trainer
# disagree at every step (as in tests/history/test_replay_fixtures.py); a quarter of the responses hit the
# 512-token cap at every step (response_length/clip_ratio 0.25: from step 10); with lr 1e-6 the policy never
# moves (actor/ppo_kl -8e-6 at every step, several updates a rollout: from step 20). 6 steps showed only the first.
FIXTURE_ALERTS = {"VerlRolloutProbsDiffHigh", "VerlRolloutActorProbsUncorrelated", "VerlResponsesOftenTruncated",
                  "VerlPolicyFrozen"}
GRACE = 5  # steps from the onset to the first firing
TEMPOS = {"1m": 60.0, "10m": 600.0}  # seconds a step
STALENESS = "training/off_policy/trajectory_staleness_worst/max"
SWITCH_IDLE = "separate_async/switch/idle"
TRAINER_IDLE = "fully_async/trainer/idle_ratio"
ROLLOUTER_IDLE = "fully_async/rollouter/idle_ratio"

# The V1 keys the fixtures lack (or log as constants), at healthy levels; the threshold the runs set.
LEVELS = {
    "sync": {},
    "colocate_async": {
        "rollout/spec_accept_rate": level(0.7, 0.03, "spec"),
        "rollout/moe/max_vio/max": level(0.3, 0.05, "moe"),
        "training/rollout_failure/evicted_samples": sometimes(1.0, 0.15, "failures"),  # now and then one
    },
    "separate_async": {
        TRAINER_IDLE: level(0.12, 0.07, "trainer-idle"),
        ROLLOUTER_IDLE: level(0.12, 0.07, "rollouter-idle"),
        SWITCH_IDLE: sometimes(1.0, 0.2, "switch-idle", otherwise=0.0),  # waits now and then
    },
}
CONFIG = {"colocate_async": {"trainer.v1.sampler.max_off_policy_threshold": 4}}


@dataclass
class Case:
    """A healthy tiled run of ``mode`` with ``keys`` changed from step ``start``; the V1 alerts it must fire,
    each with the steps it may take after ``start``."""

    mode: str
    keys: dict = field(default_factory=dict)
    start: int = ONSET
    config: dict = field(default_factory=dict)
    fires: dict[str, int] = field(default_factory=dict)


CASES = {
    "sync-healthy": Case("sync"),
    "colocate-healthy": Case("colocate_async"),
    "separate-healthy": Case("separate_async"),
    "colocate-failing": Case("colocate_async", {
        "training/filter_groups/evicted_samples": lambda step: 74.0 + step % 7,  # 9 x 8 = 72 or more
        "training/rollout_failure/evicted_samples": lambda step: 1.0 + step % 3,
        STALENESS: lambda step: 5.0 + step % 2,  # past the run's own threshold, 4
        "rollout/spec_accept_rate": level(0.25, 0.02, "spec-dropped"),
        "rollout/moe/max_vio/max": level(2.0, 0.1, "moe-spike"),
    }, fires={"VerlGroupsWithoutSignal": GRACE, "VerlRolloutFailuresEvicted": GRACE,
              "VerlRolloutTrajectoriesStale": GRACE, "VerlSpeculativeAcceptanceDropped": GRACE,
              "VerlMoeImbalanceSpike": GRACE}),
    # Staleness past verl's default bound (8) where the run's config sets none: nothing is too stale.
    "colocate-unbounded": Case("colocate_async", {STALENESS: lambda step: 9.0 + step % 2},
                               config={"trainer.v1.sampler.max_off_policy_threshold": None}),
    # Idle at 8 of the last 10 steps: the rule cannot see it before the 8th idle step.
    "separate-starved": Case("separate_async", {SWITCH_IDLE: lambda step: 1.0}, fires={"VerlTrainerStarved": 7}),
    "separate-trainer-idle": Case("separate_async", {TRAINER_IDLE: level(0.75, 0.1, "trainer-idle-high")},
                                  fires={"VerlTrainerStarved": GRACE}),
    "separate-rollouter-idle": Case("separate_async", {ROLLOUTER_IDLE: level(0.75, 0.1, "rollouter-idle-high")},
                                    fires={"VerlRolloutIdle": GRACE}),
    # Idle from the first step: the run's configured balance, no failure.
    "separate-balanced": Case("separate_async", {
        TRAINER_IDLE: level(0.6, 0.05, "trainer-balanced"), ROLLOUTER_IDLE: level(0.6, 0.05, "rollouter-balanced"),
        SWITCH_IDLE: lambda step: 1.0}, start=1),
}


def build(name: str, seconds: float) -> Run:
    case = CASES[name]
    healthy = changed(tiled(case.mode, name, seconds=seconds), LEVELS[case.mode], config=CONFIG.get(case.mode))
    return changed(healthy, case.keys, start=case.start, config=case.config)


def first_firings(replayed: Replayed) -> dict[str | None, dict[str, int | None]]:
    """Experiment -> alert -> the run's step when it first fired (None: an alert of no run)."""
    found: dict[str | None, dict[str, int | None]] = {}
    for alert in replayed.alerts:
        run = alert.run
        for period in alert.periods:
            if period.state == "firing":
                step = replayed.history.step_at(run, period.start) if run else None
                alerts = found.setdefault(run.experiment if run else None, {})
                before = alerts.get(alert.rule.name)
                alerts[alert.rule.name] = step if before is None or step is None else min(before, step)
    return found


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    """Tempo -> every case's first firings, from one replay of all the cases (made when first asked)."""
    done: dict[str, dict] = {}

    def at(tempo: str) -> dict[str | None, dict[str, int | None]]:
        if tempo not in done:
            folder = tmp_path_factory.mktemp(f"v1-{tempo}")
            files = [write(build(name, TEMPOS[tempo]), folder / "logs") for name in CASES]
            (folder / "work").mkdir()
            done[tempo] = first_firings(replay_files(files, folder / "work"))
        return done[tempo]
    return at


@pytest.mark.parametrize("tempo", TEMPOS)
@pytest.mark.parametrize("name", CASES)
def test_v1_alerts_fire_on_their_failure_within_its_grace_and_nowhere_else(replays, name, tempo):
    case = CASES[name]
    fired = replays(tempo).get(name, {})
    assert V1_ALERTS & set(fired) == set(case.fires), f"{name} at {tempo} a step fired {fired}"
    for alert, grace in case.fires.items():
        step = fired[alert]
        assert step is not None and case.start <= step <= case.start + grace, (
            f"{name} at {tempo} a step: {alert} first fired at step {step}, its failure began at step {case.start}")


@pytest.mark.parametrize("tempo", TEMPOS)
@pytest.mark.parametrize("name", CASES)
def test_a_tiled_run_fires_no_other_alert_than_its_fixture(replays, name, tempo):
    """Besides its V1 alerts, a run fires what its fixture does, and nothing else."""
    fired = set(replays(tempo).get(name, {})) - V1_ALERTS
    assert fired == FIXTURE_ALERTS, f"{name} at {tempo} a step"


def test_ten_times_slower_steps_give_every_run_the_same_alerts_at_the_same_steps(replays):
    assert replays("10m") == replays("1m")


def test_an_alert_of_no_run_fires_at_neither_tempo(replays):
    assert all(None not in replays(tempo) for tempo in TEMPOS)


# The upgrade to 0.9: separate_async's throughput is per GPU of trainer and rollout (verl PR #7049), and V1
# validation counts failed sessions as 0. A healthy run with perf/throughput at every step, resumed at its
# middle step under the new release, then reads lower on both.
UPGRADED = "verl-data-grpo-qwen2-7b-fsdp2"
THROUGHPUT_FACTOR = 0.4
VALIDATION_FACTOR = 0.8
RESTART_SECONDS = 300.0  # the job's restart: scheduling, loading the checkpoint


def upgraded(run: Run, start: int, experiment: str) -> Run:
    """``run``, named ``experiment``, with throughput and validation scores lower from step ``start`` on."""
    steps = []
    for step, values in run.steps:
        if step >= start:
            values = {key: value * (THROUGHPUT_FACTOR if key == "perf/throughput" else
                                    VALIDATION_FACTOR if key.startswith("val-core/") else 1.0)
                      for key, value in values.items()}
        steps.append((step, values))
    return run.but(steps=steps, config={**run.config, "trainer.experiment_name": experiment})


def write_restarted(run: Run, start: int, path: Path) -> None:
    """``run`` as one console log of a job restarted at step ``start``: the first job's config print and steps,
    then, ``RESTART_SECONDS`` later, the second's (it prints its config again at its start)."""
    restart = run.times[start]
    parts = (run.but(steps=[(s, v) for s, v in run.steps if s < start], finished=False,
                     events=[(t, line) for t, line in run.events if t < restart]),
             run.but(steps=[(s, v) for s, v in run.steps if s >= start],
                     times={s: t + RESTART_SECONDS for s, t in run.times.items() if s >= start},
                     events=[(t + RESTART_SECONDS, line) for t, line in run.events if t >= restart]))
    text = ""
    for part in parts:
        write_run(part, path)
        text += path.read_text(encoding="utf-8")
    path.write_text(text, encoding="utf-8")


def test_a_run_resumed_under_0_9_is_no_throughput_drop_but_the_same_drop_unrestarted_is(tmp_path):
    require_run(UPGRADED)
    run = read_run(log_files(UPGRADED)[0])
    start = resume_point(run)
    resumed, continued = tmp_path / "resumed" / "console.log", tmp_path / "continued" / "console.log"
    resumed.parent.mkdir()
    continued.parent.mkdir()
    write_restarted(upgraded(run, start, "resumed"), start, resumed)
    write_run(upgraded(run, start, "continued"), continued)
    (tmp_path / "work").mkdir()
    fired = first_firings(replay_files([str(resumed), str(continued)], tmp_path / "work"))
    assert not {"VerlThroughputDropped", "VerlActorMfuLow"} & set(fired.get("resumed", {})), fired.get("resumed")
    assert "VerlThroughputDropped" in fired.get("continued", {}), fired.get("continued")
