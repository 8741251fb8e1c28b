"""Retention: finished and idle runs leave the store (counted), the run cap frees up, reaching it is logged once."""

import logging

from exposition import sample_value, scrape
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

HOUR = 3600.0


class Clock:
    def __init__(self, now=10 * HOUR):
        self.now = now

    def __call__(self):
        return self.now


def make_store(clock, **kwargs):
    return RunStore(default_catalog(), clock=clock, **kwargs)


def step(store, name, step_, time, **kwargs):
    store.ingest(Record(RunKey("p", name), step_, {} if kwargs else {"actor/pg_loss": 0.1}, time, **kwargs))


def runs(store):
    return sorted(state.run.experiment for state in store.snapshot().runs)


def test_a_finished_run_is_dropped_once_retention_has_passed():
    clock = Clock()
    store = make_store(clock, retention=HOUR)
    step(store, "done", 5, clock.now)
    step(store, "done", 5, clock.now, finished=True)
    step(store, "going", 5, clock.now)
    clock.now += HOUR - 1
    assert runs(store) == ["done", "going"]
    clock.now += 2
    snapshot = store.snapshot()
    assert [state.run.experiment for state in snapshot.runs] == ["going"]  # not finished: kept
    assert snapshot.runs_expired == {"finished": 1}


def test_an_idle_run_is_dropped_and_a_new_step_brings_it_back():
    clock = Clock()
    store = make_store(clock, idle_retention=HOUR)
    step(store, "quiet", 1, clock.now)
    clock.now += HOUR + 1
    step(store, "busy", 1, clock.now)
    assert runs(store) == ["busy"]
    step(store, "quiet", 2, clock.now)
    assert runs(store) == ["busy", "quiet"]
    assert store.snapshot().runs_expired == {"idle": 1}


def test_a_backlog_older_than_the_idle_retention_creates_no_run():
    clock = Clock()
    store = make_store(clock, idle_retention=HOUR)
    step(store, "old", 1, clock.now - 2 * HOUR)
    assert runs(store) == [] and store.snapshot().runs_dropped == 0


def test_no_retention_keeps_everything():
    clock = Clock()
    store = make_store(clock)
    step(store, "done", 1, 0.0)
    step(store, "done", 1, 0.0, finished=True)
    assert runs(store) == ["done"]


def test_the_run_cap_frees_up_through_retention_and_is_logged_once(caplog):
    clock = Clock()
    store = make_store(clock, max_runs=2, retention=HOUR)
    step(store, "a", 1, clock.now)
    step(store, "b", 1, clock.now)
    with caplog.at_level(logging.WARNING, logger="verl_exporter.store.run_store"):
        step(store, "c", 1, clock.now)
        step(store, "d", 1, clock.now)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "cap of 2 runs" in caplog.records[0].message
    snapshot = store.snapshot()
    assert snapshot.run_cap_reached and snapshot.runs_dropped == 2 and runs(store) == ["a", "b"]
    step(store, "a", 1, clock.now, finished=True)
    clock.now += HOUR + 1
    step(store, "c", 2, clock.now)
    snapshot = store.snapshot()
    assert runs(store) == ["b", "c"] and not snapshot.run_cap_reached
    assert snapshot.runs_expired == {"finished": 1}


def test_retention_and_the_cap_are_served():
    clock = Clock()
    store = make_store(clock, max_runs=1, retention=HOUR)
    step(store, "a", 1, clock.now)
    step(store, "a", 1, clock.now, finished=True)
    step(store, "b", 1, clock.now)
    text = scrape(training=TrainingCollector(store))
    assert sample_value(text, "verl_training_run_cap_reached") == 1
    assert sample_value(text, "verl_training_runs_expired_total", reason="finished") == 0
    clock.now += 2 * HOUR
    text = scrape(training=TrainingCollector(store))
    assert sample_value(text, "verl_training_runs_expired_total", reason="finished") == 1
    assert sample_value(text, "verl_training_runs") == 0
    assert sample_value(text, "verl_training_run_cap_reached") == 0


def test_an_old_config_file_neither_makes_a_run_idle_nor_is_refused():
    clock = Clock()
    store = make_store(clock, idle_retention=HOUR)
    store.ingest(Record(RunKey("p", "configured"), 0, {}, clock.now - 5 * HOUR,
                        run_config={"trainer": {"total_epochs": 2}}))
    assert runs(store) == ["configured"]  # no step yet: nothing to be idle from
    step(store, "configured", 1, clock.now)
    clock.now += HOUR - 1
    assert runs(store) == ["configured"]


class CountingDict(dict):
    """The store's run table, counting the sweeps that walk it."""

    walks = 0

    def items(self):
        CountingDict.walks += 1
        return super().items()


def test_a_quiet_store_skips_the_sweep_until_a_run_can_go_and_drops_it_on_time():
    clock = Clock()
    store = make_store(clock, retention=HOUR, idle_retention=10 * HOUR)
    step(store, "done", 5, clock.now)
    step(store, "done", 5, clock.now, finished=True)
    step(store, "going", 5, clock.now)
    store._runs = CountingDict(store._runs)
    store.unfinished_runs()
    CountingDict.walks = 0
    for _ in range(3):  # nothing changed, and no run can go before an hour: no sweep walks the runs
        clock.now += 60
        store.unfinished_runs()
    assert CountingDict.walks == 3  # the unfinished runs' own listing only
    clock.now += HOUR - 3 * 60 + 1  # past the finished run's retention: swept, dropped on time
    assert store.unfinished_runs() == [RunKey("p", "going")]
    assert runs(store) == ["going"] and store.snapshot().runs_expired == {"finished": 1}


def test_a_run_that_finishes_after_a_sweep_is_swept_again():
    clock = Clock()
    store = make_store(clock, retention=HOUR, idle_retention=10 * HOUR)
    step(store, "late", 5, clock.now)
    assert runs(store) == ["late"]  # swept: nothing can go for an hour
    step(store, "late", 5, clock.now, finished=True)  # the store changed: the next call sweeps
    clock.now += HOUR + 1
    assert runs(store) == []


def test_a_changed_retention_sweeps_again():
    clock = Clock()
    store = make_store(clock, retention=10 * HOUR)
    step(store, "done", 5, clock.now, finished=True)
    clock.now += 2 * HOUR
    assert runs(store) == ["done"]
    store.retention = HOUR
    assert runs(store) == []


def test_the_unfinished_runs_stop_at_a_limit():
    store = make_store(Clock())
    for name in "abcde":
        step(store, name, 1, 10 * HOUR)
    assert len(store.unfinished_runs()) == 5
    assert len(store.unfinished_runs(limit=3)) == 3
    assert store.unfinished_runs(limit=0) == []
