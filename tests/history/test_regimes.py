"""The same verdict in any regime a healthy run can be in: every real run of both folders that logged
steps, and the failures users reported rebuilt from them, rewritten into each regime of
``tests/regimes.py`` (sparse rewards, small batches, long validations, zero-gradient steps, a resume at
step 101, progress bars over the step lines) and replayed against the shipped rules at the tempos of
``test_tempo_runs``.

In every regime and at every tempo:
- a healthy run raises no warning or critical alert, and at most one info; a short one no critical;
- a failing run's diagnosis fires within ``GRACE`` steps of its onset (``onset`` in
  tests/history/real_runs*.yml; a rebuilt failure's first changed step), where the regime leaves the
  onset in the run (``EXCUSED`` says where it cannot and why);
- no alert re-fires within ``REFIRE`` steps of its last episode.

``make test`` replays each run in each regime at one tempo, the three tempos taken in turn over the runs
(and the long validations, whose cost is in wall time, at every tempo); a run with progress bars must read
exactly as the run without them. ``VERL_REGIMES_FULL=1`` replays
every run in every regime at every tempo, and ``VERL_REGIMES_REPORT=PATH`` writes the table of what fired
and when (docs/precision.md quotes it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_tempo_runs import GRACE, TEMPOS, Episode, assert_once, failure_name, first_firing, replay_at

import replay_pool
from real_runs import FOLDER_OF, REAL_RUNS, VERDICTS, log_files
from regimes import TRANSFORMS, read_run, resume_point, write_run, write_transformed
from reported_failures import FAILURES, write_failure

FULL = os.environ.get("VERL_REGIMES_FULL") == "1"
REPORT = os.environ.get("VERL_REGIMES_REPORT")
EVERY_TEMPO = {"long-validation"}  # regimes whose effect is in wall time: replayed at every tempo
# Regimes replayed: a run with progress bars over its step lines must read exactly as the run without them
# (test_a_run_with_progress_bars_...), so its replays are the plain run's; the full matrix replays them too.
REPLAYED = [name for name in TRANSFORMS if FULL or name != "progress-bars"]
# (regime, alert) -> why the regime takes the failure's onset out of the run: its recall is measured, not held.
EXCUSED = {
    ("sparse", "VerlNoLearningSignal"): "where 70% of steps carry no signal anyway, losing it for good shows only "
    "after a streak as unlikely as no_signal_chance at that share (about 24 steps), not 5",
    ("zero-gradient", "VerlNoLearningSignal"): "with 38% of steps at no signal, a streak must reach about 10 steps",
}


def _real_cases() -> dict[str, tuple[str, str]]:
    """Name -> (verdict key, log file) of the real runs that logged steps."""
    found = {}
    for run in sorted(VERDICTS):
        entry = VERDICTS[run]
        if entry.get("pending") or entry["verdict"] == "no-steps" or not (FOLDER_OF[run] / run).is_dir():
            continue
        files = log_files(run)
        if files:
            found[run] = (run, files[0])
    return found


def _keys(names: list[str]) -> list[tuple[str, str, str]]:
    tempos = sorted(TEMPOS)
    keys = []
    for index, name in enumerate(names):
        for turn, transform in enumerate(REPLAYED):
            if FULL or transform in EVERY_TEMPO:
                keys += [(name, transform, tempo) for tempo in tempos]
            else:
                keys.append((name, transform, tempos[(index + turn) % len(tempos)]))
    return keys


def _sources(root: Path) -> dict[str, str]:
    """Name -> log file of every real run that logged steps and of every rebuilt failure (written under ``root``)."""
    sources = {name: file for name, (_, file) in _real_cases().items()}
    for failure in FAILURES:
        if (REAL_RUNS / failure.base).is_dir():
            log = root / "failures" / failure_name(failure).replace(":", "-").replace("#", "").replace(",", "")
            if not log.is_file():
                log.parent.mkdir(parents=True, exist_ok=True)
                write_failure(failure, log)
            sources[failure_name(failure)] = str(log)
    return sources


def background_replays(root: Path) -> dict[tuple[str, str, str], tuple]:
    """Each run in each regime at its tempos, for ``replay_pool`` to run beside the session's other tests."""
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        pytest.skip("prometheus and promtool are needed (make test installs them)")
    sources = _sources(root)
    if not sources:
        pytest.skip("no real-run logs beside the checkout")
    planned = {}
    for index, (name, transform, tempo) in enumerate(_keys(sorted(sources))):
        log = root / f"{index}-{transform}" / "console.log"
        log.parent.mkdir()
        write_transformed(name, transform, sources[name], log)
        planned[name, transform, tempo] = (episodes_at, ((str(log),), TEMPOS[tempo], str(log.parent)))
    return planned


def episodes_at(files: tuple[str, ...], tempo: float, workdir: str) -> list[Episode]:
    return replay_at(files, tempo, workdir).episodes


@pytest.fixture(scope="module")
def regimes(tmp_path_factory) -> dict[tuple[str, str, str], list[Episode]]:
    results = replay_pool.results(__name__)
    if REPORT:
        Path(REPORT).write_text(json.dumps(
            [{"run": name, "regime": transform, "tempo": tempo,
              "episodes": [[e.alert, e.severity, e.first, e.last] for e in episodes]}
             for (name, transform, tempo), episodes in results.items()], indent=1), encoding="utf-8")
    sources = _sources(tmp_path_factory.mktemp("regimes"))
    results["resume points"] = {name: resume_point(read_run(file)) for name, file in sources.items()}  # type: ignore
    return results


def _replays_of(regimes: dict, name: str, transform: str) -> list[tuple[str, list[Episode]]]:
    found = [(key[2], episodes) for key, episodes in regimes.items()
             if isinstance(key, tuple) and key[:2] == (name, transform)]
    if not found:
        pytest.skip(f"{name} is not beside the checkout")
    return found


def _onset_in_run(regimes: dict, name: str, transform: str, onset: int) -> bool:
    """Whether the regime leaves a failure's onset in the run: a resumed copy starts after it when the
    onset falls before its resume point and the run's early steps (its baseline) are gone."""
    return transform != "resumed" or onset > regimes["resume points"][name] + 10


REAL = sorted(run for run in VERDICTS if not VERDICTS[run].get("pending") and VERDICTS[run]["verdict"] != "no-steps")


@pytest.mark.parametrize("transform", REPLAYED)
@pytest.mark.parametrize("run", REAL)
def test_a_real_run_gets_its_verdict_in_every_regime(regimes, run, transform):
    entry = VERDICTS[run]
    for tempo, episodes in _replays_of(regimes, run, transform):
        where = f"{run} as {transform} at {tempo} steps"
        loud = {episode.alert for episode in episodes if episode.severity in ("warning", "critical")}
        if entry["verdict"] == "healthy":
            assert loud == set(), f"healthy {where} raised {sorted(loud)}"
            infos = {episode.alert for episode in episodes if episode.severity == "info"}
            assert len(infos) <= 1, f"healthy {where} raised infos {sorted(infos)}"
        if entry["verdict"] == "short":
            assert {e.alert for e in episodes if e.severity == "critical"} == set(), where
        assert set(entry.get("silent", [])) & {episode.alert for episode in episodes} == set(), where
        for alert, onset in (entry.get("onset") or {}).items():
            if (transform, alert) in EXCUSED or not _onset_in_run(regimes, run, transform, onset["step"]):
                continue
            fired = first_firing(episodes, alert)
            assert fired is not None, f"{where}: {alert} never fired (onset at step {onset['step']})"
            assert fired <= onset["step"] + GRACE, (
                f"{where}: {alert} first fired at step {fired}, onset {onset['step']} ({onset['values']})")
        assert_once(episodes, run, f"{tempo} as {transform}")


@pytest.mark.parametrize("transform", REPLAYED)
@pytest.mark.parametrize("failure", FAILURES, ids=lambda failure: failure.issue.split(":")[0])
def test_a_reported_failure_is_named_within_a_few_steps_in_every_regime(regimes, failure, transform):
    for tempo, episodes in _replays_of(regimes, failure_name(failure), transform):
        where = f"{failure.issue} as {transform} at {tempo} steps"
        for alert in failure.fires:
            name = failure_name(failure)
            if (transform, alert) in EXCUSED or not _onset_in_run(regimes, name, transform, failure.at):
                continue
            fired = first_firing(episodes, alert)
            assert fired is not None, f"{where}: {alert} never fired"
            assert fired <= failure.at + GRACE, f"{where}: {alert} first fired at step {fired}, onset {failure.at}"
        assert_once(episodes, failure_name(failure), f"{tempo} as {transform}")


@pytest.mark.parametrize("run", REAL)
def test_a_run_with_progress_bars_over_its_step_lines_reads_the_same_steps_and_values(run, tmp_path):
    """Every segment of a line is read: the run written with tqdm bars after its step text on the same
    line (and before it on every third) reads exactly as the run written without them."""
    if not (FOLDER_OF[run] / run).is_dir() or not log_files(run):
        pytest.skip(f"{run} is not beside the checkout")
    plain, barred = tmp_path / "plain.log", tmp_path / "bars.log"
    write_run(read_run(log_files(run)[0]), plain)
    write_transformed(run, "progress-bars", log_files(run)[0], barred)
    expected, found = read_run(str(plain)), read_run(str(barred))
    assert sum(b"\r" in line for line in barred.read_bytes().split(b"\n")) == len(expected.steps) > 0
    assert repr(found.steps) == repr(expected.steps)  # NaN as logged
    assert found.times == expected.times and found.config == expected.config and found.events == expected.events


def test_a_rescaled_run_scores_ten_times_higher_and_keeps_what_is_not_in_its_reward_unit(tmp_path):
    """The rescaled regime multiplies what is in the rewards' unit (10 times; the critic's loss, a squared
    error, 100 times) and leaves the rest (advantages, entropy, lengths, times) as logged."""
    run = next((name for name in REAL if VERDICTS[name]["verdict"] == "healthy" and (FOLDER_OF[name] / name).is_dir()
                and log_files(name) and "critic/vf_loss" in read_run(log_files(name)[0]).steps[-1][1]), None)
    if run is None:
        pytest.skip("no healthy PPO run beside the checkout")
    out = tmp_path / "rescaled.log"
    write_transformed(run, "rescaled", log_files(run)[0], out)
    before, after = read_run(log_files(run)[0]), read_run(str(out))
    assert [step for step, _ in after.steps] == [step for step, _ in before.steps] and after.times == before.times
    (_, old), (_, new) = before.steps[-1], after.steps[-1]
    for key, factor in (("critic/score/mean", 10), ("critic/returns/mean", 10), ("critic/vpred_mean", 10),
                        ("critic/vf_loss", 100), ("critic/advantages/mean", 1), ("actor/pg_loss", 1),
                        ("response_length/mean", 1)):
        assert new[key] == pytest.approx(old[key] * factor, rel=1e-3, abs=1e-9), key
    assert sorted(new) == sorted(old)
