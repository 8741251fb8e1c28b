"""Source and Ingestor: files in, Records and parse errors out to the store."""

import logging
import math
import shutil
import threading
import time
from pathlib import Path

import pytest

import verl_exporter.sources as sources
from owner import ME
from verl_exporter.sources import Ingestor, RecordsOnly, Source, format_for, run_for
from verl_exporter.sources.source import WARNING_INTERVAL_S
from verl_exporter.store.records import Record, RunKey

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sources"
JSONL = FIXTURES / "verl_grpo_example_gsm8k" / "qwen2_7b_function_rm.jsonl"


class RecordingStore(RecordsOnly):
    def __init__(self):
        self.records: list[Record] = []
        self.errors: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def ingest(self, record):
        # Sources may pass numbers as their text; the real store converts them when scraped.
        record.values = {key: float(value) for key, value in record.values.items()}
        with self.lock:
            self.records.append(record)

    def parse_error(self, source, reason):
        with self.lock:
            self.errors.append((source, reason))


class FakeClock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def _append(path, text):
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_format_and_run_identity_rules():
    assert format_for("/r/p/e.jsonl") == "jsonl"
    assert format_for("/r/p/e.JSON") == "jsonl"
    assert format_for("/r/p/train.log") == "console"
    assert format_for("/r/p/e.jsonl", "console") == "console"
    # the names a path gives; its owner is the Source's to tell (the file's uid)
    assert run_for("/root/proj/exp.jsonl") == RunKey("proj", "exp")
    assert run_for("/root/proj/train.log", project="p2") == RunKey("p2", "train")
    assert run_for("/root/proj/train.log", experiment="e2") == RunKey("proj", "e2")


def test_unknown_format_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown log format 'yaml'"):
        Source(str(tmp_path / "x"), RecordingStore(), fmt="yaml")


def test_filelogger_file(tmp_path):
    run_dir = tmp_path / "verl_grpo_example_gsm8k"
    run_dir.mkdir()
    shutil.copy(JSONL, run_dir)
    store = RecordingStore()
    source = Source(str(tmp_path / "*" / "*.jsonl"), store, clock=FakeClock(1234.5))
    assert source.poll() == 6
    assert source.poll() == 0
    assert store.errors == []
    run = RunKey("verl_grpo_example_gsm8k", "qwen2_7b_function_rm", ME)
    assert {r.run for r in store.records} == {run}
    assert [r.step for r in store.records] == [1, 2, 3, 4, 5, 5]
    assert {r.time for r in store.records} == {1234.5}
    assert {r.source for r in store.records} == {str(run_dir / JSONL.name)}
    assert not any(r.finished for r in store.records)
    assert store.records[3].values["actor/grad_norm"] == math.inf


def test_flags_name_the_run(tmp_path):
    shutil.copy(JSONL, tmp_path / "metrics.jsonl")
    store = RecordingStore()
    Source(str(tmp_path / "metrics.jsonl"), store, project="proj", experiment="exp").poll()
    assert {r.run for r in store.records} == {RunKey("proj", "exp", ME)}


def test_console_log_with_finished_marker(tmp_path):
    shutil.copy(FIXTURES / "verl_console.log", tmp_path / "train.log")
    store = RecordingStore()
    assert Source(str(tmp_path / "train.log"), store).poll() == 10
    assert store.errors == []
    config, total, *steps = store.records
    assert config.run_config["actor_rollout_ref.actor.clip_ratio"] == 0.2 and total.total_steps == 105
    assert [(r.step, r.finished, r.checkpoint_step) for r in steps] == [
        (0, False, None), (1, False, None), (2, False, None), (3, False, None), (4, False, None),
        (4, False, 5), (5, False, None), (5, True, None)
    ]
    assert store.records[-1].values == {}
    assert {r.source for r in store.records} == {str(tmp_path / "train.log")}
    # named by trainer.project_name / experiment_name from the config verl prints first
    assert {r.run for r in store.records} == {RunKey("verl_grpo_example_gsm8k", "qwen2_7b_function_rm", ME)}


def test_console_run_names_flags_win_over_the_printed_config(tmp_path):
    shutil.copy(FIXTURES / "verl_console.log", tmp_path / "train.log")
    store = RecordingStore()
    Source(str(tmp_path / "train.log"), store, experiment="mine").poll()
    assert {r.run for r in store.records} == {RunKey("verl_grpo_example_gsm8k", "mine", ME)}


def test_console_run_names_only_from_config_printed_before_the_first_step(tmp_path):
    log = tmp_path / "proj" / "train.log"
    log.parent.mkdir()
    log.write_text("step:1 - a:1\n(main_task pid=1) {'trainer': {'project_name': 'late'}}\nstep:2 - a:2\n")
    store = RecordingStore()
    Source(str(log), store).poll()
    assert {r.run for r in store.records} == {RunKey("proj", "train", ME)}


def test_old_console_log_and_forced_format(tmp_path):
    shutil.copy(FIXTURES / "verl_console_old.log", tmp_path / "out.txt")
    store = RecordingStore()
    Source(str(tmp_path / "out.txt"), store, fmt="console").poll()
    assert [(r.step, r.finished) for r in store.records] == [(0, False), (1, False), (2, False), (2, True)]
    assert store.records[0].values["critic/lr(1e-4)"] == 0.1


def test_jsonl_format_forced_on_a_console_log_counts_errors(tmp_path):
    shutil.copy(FIXTURES / "verl_console_old.log", tmp_path / "out.log")
    store = RecordingStore()
    assert Source(str(tmp_path / "out.log"), store, fmt="jsonl").poll() == 0
    assert len(store.errors) == 4
    assert all(path == str(tmp_path / "out.log") and "malformed JSON" in reason for path, reason in store.errors)


def test_wrapped_step_lines_from_the_guide(tmp_path):
    shutil.copy(FIXTURES / "guide_11_4_examples.log", tmp_path / "guide.log")
    store = RecordingStore()
    Source(str(tmp_path / "guide.log"), store).poll()
    merged: dict[int, dict[str, float]] = {}
    for record in store.records:
        merged.setdefault(record.step, {}).update(record.values)
    assert sorted(merged) == [0, 5, 50]
    assert len(merged[0]) == 24
    assert merged[0]["actor/pg_loss"] == -0.005 and merged[0]["response_length/max"] == 256.0
    assert merged[5] == {
        "actor/pg_loss": 0.523, "actor/pg_clipfrac": 0.85, "actor/ppo_kl": 0.125,
        "actor/grad_norm": 1.0, "critic/score/mean": 0.003,
    }
    assert merged[50]["critic/vf_explained_var"] == -0.234 and merged[50]["critic/score/mean"] == 0.256
    assert store.errors == []


def test_continuation_only_right_after_a_step_line(tmp_path):
    log = tmp_path / "train.log"
    _append(log, "step:1 - a:1\nsome other output\n  - b:2\n")
    store = RecordingStore()
    Source(str(log), store).poll()
    assert [(r.step, r.values) for r in store.records] == [(1, {"a": 1.0})]


def test_finished_before_any_step_uses_step_zero(tmp_path):
    log = tmp_path / "train.log"
    _append(log, "Final validation metrics: {}\n")
    store = RecordingStore()
    Source(str(log), store).poll()
    assert [(r.step, r.finished, r.values) for r in store.records] == [(0, True, {})]


def test_bad_lines_are_counted_and_warned_about_with_a_rate_limit(tmp_path, caplog):
    log = tmp_path / "train.jsonl"
    _append(log, "".join("{broken\n" for _ in range(100)) + '{"step": 9, "data": {"a": 1}}\n')
    store = RecordingStore()
    clock = FakeClock()
    source = Source(str(log), store, clock=clock)
    with caplog.at_level(logging.WARNING, logger=sources.__name__):
        assert source.poll() == 1
    assert len(store.errors) == 100 and store.errors[0][0] == str(log)
    assert store.errors[0][1].startswith("malformed JSON")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and str(log) in warnings[0] and "malformed JSON" in warnings[0]

    caplog.clear()
    _append(log, "{broken\n")
    clock.now += WARNING_INTERVAL_S
    with caplog.at_level(logging.WARNING, logger=sources.__name__):
        source.poll()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "99 similar warnings suppressed" in warnings[0]


def test_oversize_line_is_a_parse_error_and_the_next_line_is_read(tmp_path):
    log = tmp_path / "train.log"
    _append(log, "step:1 - a:" + "1" * 5000 + "\nstep:2 - a:2\n")
    store = RecordingStore()
    source = Source(str(log), store, max_line_bytes=1000)
    assert source.poll() == 1
    assert [r.step for r in store.records] == [2]
    assert len(store.errors) == 1 and "1000 byte limit" in store.errors[0][1]


def test_store_failures_do_not_escape_poll(tmp_path):
    class FlakyStore(RecordingStore):
        def ingest(self, record):
            if record.step == 1:
                raise RuntimeError("full")
            super().ingest(record)

        def parse_error(self, source, reason):
            raise RuntimeError("also broken")

    log = tmp_path / "train.log"
    _append(log, "step:1 - a:1\nstep:x - a:1\nstep:2 - a:2\n")
    store = FlakyStore()
    assert Source(str(log), store).poll() == 1
    assert [r.step for r in store.records] == [2]


def test_follower_failure_does_not_escape_poll(tmp_path, monkeypatch):
    source = Source(str(tmp_path / "x.log"), RecordingStore())
    monkeypatch.setattr(source.follower, "poll", lambda: 1 / 0)
    assert source.poll() == 0


def test_ingestor_keeps_polling_other_sources_when_one_fails(tmp_path, caplog):
    class Broken:
        pattern = "broken"
        behind = caught_up = False

        def poll(self):
            raise RuntimeError("boom")

    log = tmp_path / "train.log"
    _append(log, "step:1 - a:1\n")
    store = RecordingStore()
    ingestor = Ingestor([Broken(), Source(str(log), store)])
    with caplog.at_level(logging.ERROR, logger=sources.__name__):
        assert ingestor.poll_all() == 1
        _append(log, "step:2 - a:2\n")
        assert ingestor.poll_all() == 1
    assert [r.step for r in store.records] == [1, 2]
    assert len([r for r in caplog.records if "broken" in r.getMessage()]) == 1  # logged once


def _wait_for(condition, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_ingestor_thread_follows_the_file(tmp_path):
    log = tmp_path / "train.log"
    store = RecordingStore()
    ingestor = Ingestor([Source(str(log), store)], interval=0.02)
    ingestor.start()
    try:
        assert ingestor.running
        _append(log, "step:1 - a:1\n")
        assert _wait_for(lambda: len(store.records) == 1)
        _append(log, "step:2 - a:2\n")
        assert _wait_for(lambda: len(store.records) == 2)
    finally:
        ingestor.stop()
    assert not ingestor.running


def test_ingestor_does_not_wait_while_a_source_is_behind():
    class Backlog:
        pattern = "backlog"
        caught_up = False

        def __init__(self):
            self.polls = 0

        @property
        def behind(self):
            return self.polls < 5

        def poll(self):
            self.polls += 1
            return 0

    backlog = Backlog()
    ingestor = Ingestor([backlog], interval=3600)
    ingestor.start()
    try:
        assert _wait_for(lambda: backlog.polls >= 5)
        time.sleep(0.05)
        assert backlog.polls == 5  # caught up: now it waits the full interval
    finally:
        ingestor.stop()


def test_a_backlog_is_dated_by_the_file_not_by_the_restart(tmp_path):
    import os

    from verl_exporter.sources import Source as RealSource
    from verl_exporter.store.catalog import default_catalog
    from verl_exporter.store.run_store import RunStore

    path = tmp_path / "proj" / "exp.jsonl"
    path.parent.mkdir()
    path.write_text('{"step": 7, "data": {"actor/pg_loss": 0.1}}\n')
    os.utime(path, (1_700_000_000, 1_700_000_000))
    store = RunStore(default_catalog())
    RealSource(str(path), store, clock=lambda: 1_800_000_000.0).poll()
    state = store.snapshot().runs[0]
    assert (state.last_step, state.last_step_time) == (7, 1_700_000_000)
