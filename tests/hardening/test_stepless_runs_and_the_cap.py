"""Runs that never stepped (a log of nothing but config prints) cannot hold every place under
--store.max-runs: a run that steps takes the place of the oldest of them, counted as
verl_training_runs_expired_total{reason="no_step"}; runs that step are never dropped for it."""

from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore


def _config(name: str, moment: float) -> Record:
    return Record(RunKey("shared", name), 0, {}, moment, run_config={"trainer.project_name": "shared"})


def test_a_run_that_steps_takes_the_place_of_the_oldest_stepless_run():
    store = RunStore(default_catalog(), max_runs=3)
    for index in range(3):
        store.ingest(_config(f"print{index}", 10.0 + index))
    store.ingest(_config("print3", 20.0))  # another config print: refused, as before
    store.ingest(Record(RunKey("team", "real"), 1, {"actor/pg_loss": 0.1}, 30.0))
    snapshot = store.snapshot()
    assert sorted(state.run.experiment for state in snapshot.runs) == ["print1", "print2", "real"]
    assert snapshot.runs_expired == {"no_step": 1}
    assert snapshot.runs_dropped == 1


def test_runs_that_step_are_never_dropped_for_another():
    store = RunStore(default_catalog(), max_runs=2)
    for name in ("a", "b"):
        store.ingest(Record(RunKey("team", name), 1, {"actor/pg_loss": 0.1}, 1.0))
    store.ingest(Record(RunKey("team", "c"), 1, {"actor/pg_loss": 0.1}, 2.0))
    snapshot = store.snapshot()
    assert sorted(state.run.experiment for state in snapshot.runs) == ["a", "b"]
    assert snapshot.runs_expired == {} and snapshot.runs_dropped == 1
