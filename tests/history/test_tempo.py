"""The same run at another speed (``--tempo``), and a replay that scales with steps, not seconds."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_runs import REAL_RUNS, log_files, require_real_runs
from servers import require_binary
from verl_exporter.history import backfill, replay
from verl_exporter.history.alert_rules import AlertRule, evaluate
from verl_exporter.history.tempo import median_step_seconds, retime
from verl_exporter.history.timeline import read_file


def console_log(tmp_path: Path, steps: int, seconds: float) -> Path:
    path = tmp_path / "run.log"
    path.write_text("".join(f"2026-01-01 00:{(k * int(seconds)) // 60:02d}:{(k * int(seconds)) % 60:02d} "
                            f"step:{k} - actor/entropy:0.5 - timing_s/step:{seconds} - timing_s/gen:{seconds / 2}"
                            f" - perf/throughput:1000\n" for k in range(1, steps + 1)))
    return path


def test_retime_scales_every_gap_and_logged_duration_alike(tmp_path):
    timeline = read_file(str(console_log(tmp_path, 10, 20.0)))
    before = [step.time for step in timeline.steps]
    factor = retime([timeline], 2400.0)
    assert factor == pytest.approx(120.0)
    assert median_step_seconds([timeline]) == pytest.approx(2400.0)
    assert [step.time - timeline.steps[0].time for step in timeline.steps] == \
        pytest.approx([(t - before[0]) * 120 for t in before])
    values = timeline.steps[3].records[0].values
    assert float(values["timing_s/step"]) == pytest.approx(2400.0)
    assert float(values["timing_s/gen"]) == pytest.approx(1200.0)
    assert float(values["perf/throughput"]) == pytest.approx(1000 / 120)
    assert float(values["actor/entropy"]) == 0.5


def test_replay_samples_slow_runs_per_step_not_every_15_seconds(tmp_path):
    history = backfill.build([str(console_log(tmp_path, 40, 20.0))], tempo=2400.0)
    interval = replay.evaluation_interval(history, 15.0)
    assert interval == 600.0  # 4 per median step
    assert (history.end - history.start) / interval <= replay.MAX_EVALUATIONS
    assert replay.evaluation_interval(backfill.build([str(console_log(tmp_path, 40, 20.0))]), 15.0) == 15.0


def slow_history(tmp_path: Path) -> tuple[backfill.History, Path, int]:
    """40 steps of 40 minutes (about 27 hours), written as OpenMetrics: the history, its file, its samples."""
    history = backfill.build([str(console_log(tmp_path, 40, 20.0))], tempo=2400.0)
    whole = tmp_path / "whole.om"
    with whole.open("w") as out:
        written = backfill.write_openmetrics(history, out, interval=600.0)
    return history, whole, written


def test_a_split_openmetrics_file_holds_every_sample_once_with_its_family(tmp_path):
    _, whole, written = slow_history(tmp_path)
    parts = backfill.split_by_block(whole)
    assert len(parts) > 1
    samples = [line for part in parts for line in part.read_text().splitlines() if not line.startswith("#")]
    assert len(samples) == written
    for part in parts:
        lines = part.read_text().splitlines()
        assert lines[-1] == "# EOF"
        typed = {line.split()[2] for line in lines if line.startswith("# TYPE")}
        assert {line.split("{")[0].split(" ")[0] for line in lines if not line.startswith("#")} <= \
            {name + suffix for name in typed for suffix in ("", "_total")}
    blocks = tmp_path / "blocks"
    backfill.create_blocks(whole, blocks, require_binary("promtool"))
    assert len([p for p in blocks.iterdir() if p.is_dir()]) >= len(parts)


def test_a_history_written_straight_into_block_parts_is_the_split_of_its_whole_text(tmp_path):
    """``BlockParts`` writes each block window's file as ``split_by_block`` cuts it from the whole text,
    byte for byte; ``write_blocks`` leaves no part behind and promtool gets every sample."""
    history, whole, written = slow_history(tmp_path)
    split = tmp_path / "split"
    split.mkdir()
    cut = backfill.split_by_block(whole.rename(split / "whole.om"))
    direct = tmp_path / "direct"
    direct.mkdir()
    parts = backfill.BlockParts(direct, backfill.BLOCK_MILLISECONDS)
    assert backfill.write_openmetrics(history, parts, interval=600.0) == written
    assert len(parts.written()) == len(cut) > 1
    assert [part.read_text() for part in parts.written()] == [part.read_text() for part in cut]
    work = tmp_path / "work"
    work.mkdir()
    assert backfill.write_blocks(history, work, tmp_path / "blocks", require_binary("promtool"),
                                 interval=600.0) == written
    assert list(work.iterdir()) == []  # no part left
    assert sum(block_samples(tmp_path / "blocks")) == written


def test_a_replay_reads_its_rule_files_again_when_they_change(tmp_path):
    """The prepared rules are kept per rule files and interval, and read again when a file changes."""
    rules = tmp_path / "rules.yml"
    rules.write_text("groups:\n- name: g\n  rules:\n  - alert: VerlA\n    expr: verl_a > 1\n")
    first = replay.prepared_rules([rules], 15.0)[0]
    assert [rule.expr.strip() for rule in first] == ["verl_a > 1"]
    first.clear()  # a caller's list is its own
    assert len(replay.prepared_rules([rules], 15.0)[0]) == 1
    rules.write_text("groups:\n- name: g\n  rules:\n  - alert: VerlA\n    expr: verl_a > 2\n"
                     "  - alert: VerlB\n    expr: verl_b > 2\n")
    assert [rule.expr.strip() for rule in replay.prepared_rules([rules], 15.0)[0]] == ["verl_a > 2", "verl_b > 2"]
    assert replay.prepared_rules([rules], 60.0)[0][0].interval == 60.0


def block_samples(blocks: Path) -> list[int]:
    """Each block's sample count, as ``promtool tsdb list`` reads it."""
    listed = subprocess.run([require_binary("promtool"), "tsdb", "list", str(blocks)], capture_output=True,
                            text=True, check=True).stdout.splitlines()[1:]
    return [int(line.split()[4]) for line in listed if line.strip()]


def test_a_replay_writes_a_slow_history_in_a_few_wide_blocks_holding_every_sample(tmp_path):
    history, whole, _ = slow_history(tmp_path)
    block = backfill.block_for(history.start, history.end)
    assert block == 18 * 3600 * 1000  # the shortest range holding 27 hours in at most 4 blocks
    assert backfill.block_for(0, 3600) == backfill.BLOCK_MILLISECONDS
    backfill.create_blocks(whole, tmp_path / "narrow", require_binary("promtool"))
    backfill.create_blocks(whole, tmp_path / "wide", require_binary("promtool"), block)
    narrow, wide = block_samples(tmp_path / "narrow"), block_samples(tmp_path / "wide")
    assert len(wide) <= 4 < len(narrow)
    assert sum(wide) == sum(narrow) > 0


def test_an_alert_that_reads_its_own_alerts_stays_firing_on_its_looser_condition():
    rule = AlertRule("VerlX", "x", 60.0)
    key = (("project", "p"),)
    times = [60.0 * k for k in range(10)]
    starting = {key: {times[2]: 1.0, times[3]: 1.0}}  # each of the last 3 steps beyond: fires
    staying = {key: {t: 1.0 for t in times[2:7]} | {times[8]: 1.0}}  # about half of the last 10: stays
    (history,) = evaluate(rule, starting, times, staying)
    firing = [period for period in history.periods if period.state == "firing"]
    assert [(p.start, p.end) for p in firing] == [(times[2], times[6])]  # not back at times[8]: it ended


def test_a_slow_first_step_is_not_a_stall_at_any_tempo(tmp_path):
    """The run's first step takes 40 minutes of a 40-minute tempo: no critical page at step 0."""
    require_real_runs()
    run = "opd-grpo-qwen3-4b-collapse-1token"
    if not (REAL_RUNS / run).is_dir():
        pytest.skip(f"{run} is not in the real-runs folder")
    history = backfill.build(log_files(run), tempo=2400.0)
    alerts, _ = replay.replay(history, replay.shipped_rules(), tmp_path, interval=15.0,
                              prometheus=require_binary("prometheus"), promtool=require_binary("promtool"))
    assert not [a for a in alerts if a.fired and a.rule.name == "VerlTrainingStalled"]


def test_replay_removes_its_folder_and_stops_prometheus_on_sigterm(tmp_path):
    require_real_runs()
    run = "verl-data-ppo-qwen0.5b-resp512"
    if not (REAL_RUNS / run).is_dir():
        pytest.skip(f"{run} is not in the real-runs folder")
    env_tmp = tmp_path / "tmp"
    env_tmp.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "verl_exporter", "replay", *log_files(run), "--tempo", "40m"],
                               env={"TMPDIR": str(env_tmp), "PATH": "/usr/bin:/bin:/usr/sbin"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(env_tmp.glob("verl-replay-*/prometheus-*.log")):
        time.sleep(0.1)
    assert any(env_tmp.glob("verl-replay-*")), "replay never started Prometheus"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert list(env_tmp.iterdir()) == []
    assert subprocess.run(["pgrep", "-f", f"storage.tsdb.path={env_tmp}"], capture_output=True).returncode == 1
