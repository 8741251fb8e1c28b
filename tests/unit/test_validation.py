"""The run's next validation (store/validation.py), as the stall rule reads it."""

from __future__ import annotations

import pytest

from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_state import RunState
from verl_exporter.store.run_store import RunStore
from verl_exporter.store.validation import next_validation, note

RUN = RunKey("gsm8k", "validates")


def state(last: int, config: dict | None = None, seen: tuple[int, ...] = (), total: int | None = None) -> RunState:
    run = RunState(RUN, last_step=last, config=config or {}, total_steps=total)
    for step in seen:
        note(run, step)
    return run


@pytest.mark.parametrize(("last", "config", "seen", "expected"), [
    (7, {"trainer.test_freq": 8}, (), 8),  # by the config, before any validation
    (8, {"trainer.test_freq": 8}, (0, 8), 16),
    (12, {"trainer.test_freq": 10}, (9,), 19),  # verl before 0.3 validates a step early: its phase is kept
    (30, {"trainer.test_freq": -1}, (0,), None),  # never validates
    (30, {"trainer.test_freq": 0}, (), None),
    (12, {}, (0, 5, 10), 15),  # no config: every as many steps as between the last two validations
    (27, {}, (10, 20), 30),
    (30, {}, (10, 20), 40),
    (12, {}, (10,), None),  # one validation: the cadence is unknown
    (12, {}, (), None),
])
def test_the_next_validation_by_config_or_by_the_run_s_own_cadence(last, config, seen, expected):
    assert next_validation(state(last, config, seen)) == expected


@pytest.mark.parametrize(("last", "config", "seen", "expected"), [
    (434, {"trainer.test_freq": 10}, (430,), 435),  # verl validates at its last step too
    (429, {"trainer.test_freq": 10}, (420,), 430),
    (434, {}, (420, 430), 435),
    (434, {"trainer.test_freq": -1}, (), None),  # not where it never validates
    (435, {"trainer.test_freq": 10}, (430, 435), 440),  # past its length (a resumed run may go on)
])
def test_the_last_step_validates_where_it_comes_first(last, config, seen, expected):
    assert next_validation(state(last, config, seen, total=435)) == expected


def test_a_step_logged_twice_is_one_validation():
    run = state(20, {}, (0, 10, 20, 20))
    assert run.validations == (0, 10, 20)


def test_the_store_notes_validating_steps_and_the_collector_serves_the_next_one():
    store = RunStore(default_catalog())
    for step in range(0, 12):
        values = {"actor/entropy": 0.5, "timing_s/step": 60.0}
        if step % 5 == 0:  # val_before_train at 0, then every 5 steps: one logs a time, the others metrics
            values |= {"timing_s/testing": 300.0} if step == 5 else {"val-core/gsm8k/acc/mean@1": 0.4}
        store.ingest(Record(RUN, step, values, time=60.0 * step))
    families = {family.name: family for family in TrainingCollector(store).collect()}
    [sample] = families["verl_training_next_validation_step"].samples
    assert sample.value == 15
    assert sample.labels == {"project": "gsm8k", "experiment": "validates", "user": "", "team": ""}
