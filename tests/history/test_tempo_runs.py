"""The same diagnosis at the same step on any hardware, once: every real run of both folders that
logged steps, and the failures users reported rebuilt from them, replayed with their step times scaled so
that the median step takes 30 s (a 0.5B model), 5 minutes (7B GRPO) and 40 minutes (70B, long agent rollouts).

At every tempo:
- a healthy run raises no warning or critical alert; a short one no critical;
- a run's goodput ledger adds up to its GPUs times its lifetime;
- a failing run's diagnosis fires within ``GRACE`` steps of the step where the run's own values show
  the failure (``onset`` in tests/history/real_runs*.yml; a rebuilt failure's first changed step);
- no alert re-fires within ``REFIRE`` steps of its last episode (one incident, one notification).

The replays run once for the session, in the background (``replay_pool``), while other tests run.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

import replay_pool
from real_runs import FOLDER_OF, GPUS, REAL_RUNS, VERDICTS, log_files
from reported_failures import FAILURES, Failure, write_failure
from verl_exporter.history import backfill, goodput, replay

TEMPOS = {"30s": 30.0, "5m": 300.0, "40m": 2400.0}
GRACE = 5  # steps from the onset to the first firing
REFIRE = 10  # steps an alert stays quiet after an episode before it may fire again


@dataclass(frozen=True)
class Episode:
    alert: str
    severity: str
    labels: tuple
    first: int | None  # the run's step when it began firing
    last: int | None  # ... and when it ended


@dataclass(frozen=True)
class Ledger:
    """A run's goodput ledger at its end, and the times it must add up between."""

    run: str
    gpus: float
    lifetime: float  # GPU-seconds of the buckets that do not overlap
    last_step_span: float  # from the history's first line to the run's last step, in seconds
    span: float  # from the history's first line to its last


@dataclass(frozen=True)
class Replay:
    episodes: list[Episode]
    ledgers: list[Ledger]


def replay_at(files: tuple[str, ...], tempo: float, workdir: str, gpus: float = 0.0) -> Replay:
    """The firing episodes and goodput ledgers of ``files`` replayed at ``tempo`` (seconds per median step)."""
    history = backfill.build(list(files), tempo=tempo, gpus=gpus)
    alerts, _ = replay.replay(history, replay.shipped_rules(), Path(workdir), interval=backfill.SCRAPE_INTERVAL,
                              prometheus=shutil.which("prometheus") or "prometheus",
                              promtool=shutil.which("promtool") or "promtool")
    only = next(iter(history.steps)) if len(history.steps) == 1 else None
    episodes = []
    for alert in alerts:
        run = alert.run or only
        for period in alert.periods:
            if period.state == "firing":
                first = history.step_at(run, period.start) if run else None
                last = history.step_at(run, period.end) if run else None
                episodes.append(Episode(alert.rule.name, alert.severity, tuple(sorted(alert.labels.items())),
                                        first, last))
    ledgers = [Ledger(f"{found.run.project}/{found.run.experiment}", found.gpus, found.lifetime,
                      history.steps[found.run][-1][0] - history.start if history.steps.get(found.run) else 0.0,
                      history.end - history.start)
               for found in goodput.ledgers(history, alerts)]
    return Replay(episodes, ledgers)


def cases() -> dict[str, tuple[str, ...]]:
    """Name -> log files: the real runs that can be read, then the rebuilt failures (written when asked)."""
    found = {run: tuple(log_files(run)) for run in sorted(VERDICTS)
             if not VERDICTS[run].get("pending") and (FOLDER_OF[run] / run).is_dir() and log_files(run)
             and VERDICTS[run]["verdict"] != "no-steps"}  # a run of no step has no tempo: test_real_runs reads it
    return found


def failure_name(failure: Failure) -> str:
    return "failure:" + failure.issue.split(":")[0]


def background_replays(root: Path) -> dict[tuple[str, str], tuple]:
    """Every case at every tempo, for ``replay_pool`` to run beside the session's other tests."""
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        pytest.skip("prometheus and promtool are needed (make test installs them)")
    jobs = dict(cases())
    for failure in FAILURES:
        if (REAL_RUNS / failure.base).is_dir():
            log = root / failure_name(failure).replace(":", "-").replace("#", "").replace(",", "") / "console.log"
            log.parent.mkdir(parents=True)
            write_failure(failure, log)
            jobs[failure_name(failure)] = (str(log),)
    if not jobs:
        pytest.skip("no real-run logs beside the checkout")
    bases = {failure_name(failure): failure.base for failure in FAILURES}
    planned = {}
    for index, (name, tempo) in enumerate((name, tempo) for name in jobs for tempo in TEMPOS):
        work = root / f"work-{index}"
        work.mkdir()
        planned[name, tempo] = (replay_at, (jobs[name], TEMPOS[tempo], str(work), GPUS.get(bases.get(name, name), 0.0)))
    return planned


@pytest.fixture(scope="module")
def replays() -> dict[tuple[str, str], Replay]:
    return replay_pool.results(__name__)


def replay_of(replays: dict, name: str, tempo: str) -> Replay:
    if (name, tempo) not in replays:
        pytest.skip(f"{name} is not beside the checkout")
    return replays[name, tempo]


def episodes_of(replays: dict, name: str, tempo: str) -> list[Episode]:
    return replay_of(replays, name, tempo).episodes


def assert_once(episodes: list[Episode], name: str, tempo: str) -> None:
    """No alert (rule and labels) fires again within REFIRE steps of its previous episode."""
    by_alert: dict[tuple, list[Episode]] = {}
    for episode in episodes:
        by_alert.setdefault((episode.alert, episode.labels), []).append(episode)
    for (alert, _), found in by_alert.items():
        found.sort(key=lambda episode: (episode.first or 0))
        for before, after in zip(found, found[1:]):
            if before.last is None or after.first is None:
                continue
            assert after.first - before.last > REFIRE, (
                f"{name} at {tempo} steps: {alert} fired again at step {after.first}, "
                f"{after.first - before.last} steps after its episode ended at step {before.last}")


def first_firing(episodes: list[Episode], alert: str) -> int | None:
    steps = [episode.first for episode in episodes if episode.alert == alert and episode.first is not None]
    return min(steps, default=None)


REAL = sorted(run for run in VERDICTS if not VERDICTS[run].get("pending") and VERDICTS[run]["verdict"] != "no-steps")


@pytest.mark.parametrize("tempo", sorted(TEMPOS))
@pytest.mark.parametrize("run", REAL)
def test_a_real_run_gets_its_verdict_at_any_tempo(replays, run, tempo):
    episodes = episodes_of(replays, run, tempo)
    entry = VERDICTS[run]
    loud = {episode.alert for episode in episodes if episode.severity in ("warning", "critical")}
    if entry["verdict"] == "healthy":
        assert loud == set(), f"healthy {run} at {tempo} steps raised {sorted(loud)}"
    if entry["verdict"] == "short":
        assert {e.alert for e in episodes if e.severity == "critical"} == set()
    assert set(entry.get("silent", [])) & {episode.alert for episode in episodes} == set()
    for alert, onset in (entry.get("onset") or {}).items():
        fired = first_firing(episodes, alert)
        assert fired is not None, f"{run} at {tempo} steps: {alert} never fired (onset at step {onset['step']})"
        assert fired <= onset["step"] + GRACE, (
            f"{run} at {tempo} steps: {alert} first fired at step {fired}, onset {onset['step']} ({onset['values']})")
    for alert in set(entry.get("fires", [])) - set(entry.get("onset") or {}):
        assert any(episode.alert == alert for episode in episodes), f"{run} at {tempo} steps: {alert} never fired"
    assert_once(episodes, run, tempo)


@pytest.mark.parametrize("tempo", sorted(TEMPOS))
@pytest.mark.parametrize("failure", FAILURES, ids=lambda failure: failure.issue.split(":")[0])
def test_a_reported_failure_is_named_within_a_few_steps_at_any_tempo(replays, failure, tempo):
    episodes = episodes_of(replays, failure_name(failure), tempo)
    for alert in failure.fires:
        fired = first_firing(episodes, alert)
        assert fired is not None, f"{failure.issue} at {tempo} steps: {alert} never fired"
        assert fired <= failure.at + GRACE, (
            f"{failure.issue} at {tempo} steps: {alert} first fired at step {fired}, onset {failure.at}")
    assert_once(episodes, failure_name(failure), tempo)


@pytest.mark.parametrize("tempo", sorted(TEMPOS))
@pytest.mark.parametrize("name", REAL + [failure_name(failure) for failure in FAILURES])
def test_a_runs_ledger_adds_up_to_its_gpus_times_its_lifetime_at_any_tempo(replays, name, tempo):
    """Its buckets but lost add up to its GPUs times its lifetime: from its first line to its last step at
    least (a log ends in its last step or after it), to the history's end at most."""
    for ledger in replay_of(replays, name, tempo).ledgers:
        low, high = ledger.gpus * ledger.last_step_span, ledger.gpus * ledger.span
        assert low * (1 - 1e-9) - 1e-6 <= ledger.lifetime <= high * (1 + 1e-9) + 1e-6, (
            f"{name} at {tempo} steps, {ledger.run} on {ledger.gpus:g} GPUs: {ledger.lifetime:.1f} GPU-seconds, "
            f"not within {low:.1f} to {high:.1f}")


def test_the_real_runs_have_ledgers(replays):
    """Every real run whose SOURCE.md names its GPUs (GPUS) has a ledger, and most others from their config
    print: the adding-up test above checks ledgers, not their absence."""
    replayed = {name for name, tempo in replays if tempo == "5m" and name in REAL}
    if not replayed:
        pytest.skip("no real-run logs beside the checkout")
    named = {name for name in replayed if replays[name, "5m"].ledgers}
    assert replayed & set(GPUS) <= named, sorted(replayed & set(GPUS) - named)
    assert len(named) >= 20, sorted(named)
