"""Checkpoint saves: verl's local_global_step_folder line read from the console, the store's save
state, the families the training collector serves, and when a replay times the save."""

import os

from prometheus_client import CollectorRegistry, generate_latest
from record_keeper import RecordKeeper

from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.history.timeline import read_file
from verl_exporter.sources import Source
from verl_exporter.sources.checkpoint import parse_checkpoint_start
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("gsm8k", "grpo")
FOLDER = "local_global_step_folder: checkpoints/gsm8k/grpo/global_step_{}"


def test_the_saved_step_is_read_from_verl_s_line_under_any_prefix():
    assert parse_checkpoint_start("(TaskRunner pid=2664304) " + FOLDER.format(20)) == 20
    assert parse_checkpoint_start("\x1b[36m(main_task pid=8)\x1b[0m local_global_step_folder: /a b/global_step_7") == 7
    assert parse_checkpoint_start("local_global_step_folder: checkpoints/x") is None
    assert parse_checkpoint_start("local_global_step_folder: x/global_step_" + "9" * 400) is None
    assert parse_checkpoint_start("step:3 - actor/pg_loss:0.1") is None


def _served(store):
    registry = CollectorRegistry()
    registry.register(TrainingCollector(store))
    lines = generate_latest(registry).decode().splitlines()
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in lines
            if line.startswith("verl_checkpoint_")}


def test_a_save_runs_from_its_line_to_the_next_step_and_takes_verl_s_own_duration():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 19, {"timing_s/step": 150.0}, time=1000.0))
    assert _served(store) == {}, "no checkpoint families before a run saves"
    store.ingest(Record(RUN, 19, {}, time=1100.0, checkpoint_step=20))
    assert _served(store) == {"verl_checkpoint_saving": 1.0, "verl_checkpoint_save_started_timestamp_seconds": 1100.0}
    snapshot = store.snapshot()
    assert snapshot.runs[0].last_step == 19 and snapshot.runs[0].last_step_time == 1000.0, "a save is no step"
    store.ingest(Record(RUN, 20, {"timing_s/save_checkpoint": "2345.3", "timing_s/step": 2546.0}, time=3500.0))
    assert _served(store) == {"verl_checkpoint_saving": 0.0, "verl_checkpoint_save_started_timestamp_seconds": 1100.0,
                              "verl_checkpoint_last_step": 20.0, "verl_checkpoint_last_save_duration_seconds": 2345.3}


def test_a_save_without_verl_s_duration_lasts_until_the_next_step_and_the_end_of_training_ends_one():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 4, {"actor/pg_loss": 0.1}, time=10.0))
    store.ingest(Record(RUN, 4, {}, time=20.0, checkpoint_step=5))
    store.ingest(Record(RUN, 4, {"val-core/x/acc/mean@1": 0.5}, time=30.0))  # more of step 4: still saving
    assert _served(store)["verl_checkpoint_saving"] == 1.0
    store.ingest(Record(RUN, 5, {"actor/pg_loss": 0.1}, time=80.0))
    assert _served(store)["verl_checkpoint_last_save_duration_seconds"] == 60.0
    store.ingest(Record(RUN, 5, {}, time=90.0, checkpoint_step=5))
    store.ingest(Record(RUN, 5, {}, time=95.0, finished=True))
    served = _served(store)
    assert served["verl_checkpoint_saving"] == 0.0 and served["verl_checkpoint_last_save_duration_seconds"] == 5.0


def test_a_console_source_hands_the_save_over_as_a_record(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("(TaskRunner pid=1) step:19 - actor/pg_loss:0.1\n(TaskRunner pid=1) " + FOLDER.format(20) + "\n"
                   "(TaskRunner pid=1) step:20 - actor/pg_loss:0.2 - timing_s/save_checkpoint:30.0\n")
    keep = RecordKeeper()
    Source(str(log), keep, project="gsm8k", experiment="grpo").poll()
    assert [(record.step, record.checkpoint_step) for record in keep.records] == [(19, None), (19, 20), (20, None)]


def test_replay_times_a_save_by_verl_s_duration_before_the_saved_step(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("step:1 - timing_s/step:100\nstep:2 - timing_s/step:100\n" + FOLDER.format(3) + "\n"
                   "step:3 - timing_s/step:2500 - timing_s/save_checkpoint:2300\nstep:4 - timing_s/step:100\n")
    os.utime(log, (100000.0, 100000.0))
    entries = read_file(str(log)).steps
    assert [(entry.step, entry.event) for entry in entries] == [(1, False), (2, False), (2, True), (3, False),
                                                                     (4, False)]
    times = [entry.time for entry in entries]
    assert times[4] == 100000.0 and times[3] == 99900.0 and times[1] == 97400.0, "the save is no step of its own"
    assert times[2] == 99900.0 - 2300.0


def test_replay_puts_a_save_of_unknown_length_just_after_the_step_before(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("step:1 - timing_s/step:100\n" + FOLDER.format(2) + "\nstep:2 - timing_s/step:900\n")
    os.utime(log, (50000.0, 50000.0))
    first, save, second = read_file(str(log)).steps
    assert second.time == 50000.0 and first.time == 49100.0 and save.time == 49100.001
