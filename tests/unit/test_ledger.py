"""The goodput ledger: a run's GPU-seconds by bucket, adding up to its GPUs times its lifetime."""

from __future__ import annotations

import pytest

from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.ledger import Ledger
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

GPUS = 8.0
RUN = RunKey("gsm8k", "ledger")
CONFIG = {"trainer.project_name": "gsm8k", "trainer.experiment_name": "ledger", "trainer.n_gpus_per_node": 4,
          "trainer.nnodes": 2}


def ledger_of(*steps: tuple[float, dict], start: float = 0.0) -> Ledger:
    ledger = Ledger(gpus=GPUS)
    ledger.start(start)
    for moment, values in steps:
        ledger.step(moment, values)
    return ledger


def hours(ledger: Ledger) -> dict[str, float]:
    return {bucket: seconds / GPUS for bucket, seconds in ledger.seconds.items() if seconds}


def test_each_second_of_a_run_goes_to_one_bucket():
    ledger = ledger_of(
        (100.0, {"timing_s/step": 60.0}),  # the first step: start-up, with the 40 s before it
        (160.0, {"timing_s/step": 60.0}),
        (250.0, {"timing_s/step": 80.0, "timing_s/testing": 30.0}),  # 10 s between the steps
        (320.0, {"timing_s/step": 70.0, "timing_s/save_checkpoint": 20.0}),
        (380.0, {"timing_s/step": 60.0}),
    )
    ledger.end(400.0, failed=False)  # the final validation and save after the last step
    assert hours(ledger) == {"startup": 100.0, "productive": 60.0 + 50.0 + 50.0 + 60.0, "validation": 30.0,
                             "checkpoint": 20.0, "between_steps": 10.0 + 20.0}
    assert ledger.lifetime() == pytest.approx(400.0 * GPUS)


def test_a_failure_loses_the_work_since_the_last_save_and_the_step_that_failed():
    ledger = ledger_of((60.0, {"timing_s/step": 60.0}), (120.0, {"timing_s/step": 60.0}),
                       (180.0, {"timing_s/step": 60.0, "timing_s/save_checkpoint": 10.0}),
                       (240.0, {"timing_s/step": 60.0}), (300.0, {"timing_s/step": 60.0}))
    assert ledger.at_risk == 120.0 * GPUS
    ledger.end(330.0, failed=True)  # 30 s into the step that failed
    assert ledger.seconds["lost"] == 150.0 * GPUS
    assert ledger.lifetime() == pytest.approx(330.0 * GPUS)  # lost is counted again, not in the lifetime
    assert ledger.at_risk == 0.0


def test_a_hung_run_counts_its_stall_while_it_hangs_and_never_takes_it_back():
    ledger = ledger_of(*[(60.0 * k, {"timing_s/step": 60.0}) for k in range(1, 6)])
    assert ledger.stall_bound() == 180.0  # 3 median steps
    assert not ledger.tick(300.0 + 180.0)
    assert ledger.tick(300.0 + 600.0) and ledger.seconds["stalled"] == 420.0 * GPUS
    assert not ledger.tick(300.0 + 590.0)  # time seen once is not counted twice
    assert not ledger.tick(300.0 + 3600.0, busy=True)  # saving a checkpoint: the step will tell
    ledger.step(300.0 + 700.0, {"timing_s/step": 60.0})  # it steps again
    assert ledger.seconds["stalled"] == 640.0 * GPUS and ledger.lifetime() == pytest.approx(1000.0 * GPUS)


def test_a_run_waiting_for_its_first_step_counts_start_up():
    ledger = Ledger(gpus=GPUS)
    ledger.start(0.0)
    assert ledger.tick(600.0) and ledger.seconds["startup"] == 600.0 * GPUS
    ledger.end(900.0, failed=True)  # an OOM before step 1: nothing to lose but the start-up itself
    assert hours(ledger) == {"startup": 900.0}


def test_a_restart_starts_a_new_attempt_and_the_old_one_lost_its_unsaved_work():
    ledger = ledger_of((60.0, {"timing_s/step": 60.0}), (120.0, {"timing_s/step": 60.0}))
    ledger.start(5000.0)  # the job came back: the first attempt died unseen after step 2
    assert ledger.seconds["lost"] == 120.0 * GPUS
    ledger.step(5100.0, {"timing_s/step": 60.0})
    assert ledger.seconds["startup"] == (60.0 + 100.0) * GPUS  # the first steps of both attempts
    assert ledger.lifetime() == pytest.approx((120.0 + 100.0) * GPUS)  # not the hours between the attempts


def test_a_step_logged_after_the_end_of_training_goes_on_from_the_end():
    ledger = ledger_of((60.0, {"timing_s/step": 60.0}), (120.0, {"timing_s/step": 60.0}))
    ledger.end(150.0, failed=False)  # "Final validation metrics", then one more step line of the same job
    ledger.step(200.0, {"timing_s/step": 30.0})
    assert ledger.lifetime() == pytest.approx(200.0 * GPUS) and ledger.seconds["between_steps"] == 50.0 * GPUS


def test_a_step_counts_no_more_than_the_time_since_the_last_one():
    ledger = ledger_of((60.0, {"timing_s/step": 60.0}), (61.0, {"timing_s/step": 300.0}))  # a backlog read at once
    assert ledger.lifetime() == pytest.approx(61.0 * GPUS)


def test_no_gpus_known_nothing_counted():
    ledger = Ledger()
    ledger.start(0.0)
    ledger.step(60.0, {"timing_s/step": 60.0})
    assert ledger.lifetime() == 0.0 and not ledger.tick(1e6)


def served(store: RunStore) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for family in TrainingCollector(store).collect():
        for sample in family.samples:
            if family.name.startswith("verl_run_") and family.name != "verl_run_config":
                out.setdefault(sample.name, {})[sample.labels.get("bucket", "")] = sample.value
    return out


def test_the_store_serves_the_ledger_of_a_run_whose_config_names_its_gpus():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 0, {}, time=0.0, run_config=CONFIG))
    for step in range(1, 4):
        store.ingest(Record(RUN, step, {"timing_s/step": "60"}, time=60.0 * step))
    store.ingest(Record(RUN, 3, {}, time=200.0, fatal="cuda_oom", line="torch.OutOfMemoryError"))
    families = served(store)
    assert families["verl_run_gpus"] == {"": GPUS}
    assert families["verl_run_gpu_seconds_total"] == {
        "startup": 60.0 * GPUS, "productive": (120.0 + 20.0) * GPUS, "validation": 0.0, "checkpoint": 0.0,
        "between_steps": 0.0, "stalled": 0.0, "lost": 200.0 * GPUS}
    assert families["verl_run_work_at_risk_gpu_seconds"] == {"": 0.0}


def test_the_store_ticks_a_hung_run_and_serves_its_stall():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 0, {}, time=0.0, run_config=CONFIG))
    for step in range(1, 6):
        store.ingest(Record(RUN, step, {"timing_s/step": 60.0}, time=60.0 * step))
    store.tick(300.0 + 3600.0)
    assert served(store)["verl_run_gpu_seconds_total"]["stalled"] == (3600.0 - 180.0) * GPUS


def test_a_save_whose_timed_step_line_was_lost_is_checkpoint_time_not_a_stall():
    """A 40-minute save began at 330 s; the line of its step, which timed it, never came: the next step's
    line (60 s) ends at 2,820 s. From the save's start to that step's start is the save's; the 30 s of the
    step before it are time between steps, within the stall bound."""
    ledger = ledger_of(*[(60.0 * k, {"timing_s/step": 60.0}) for k in range(1, 6)])
    ledger.step(2820.0, {"timing_s/step": 60.0}, saving_since=330.0)
    assert ledger.seconds["stalled"] == 0.0
    assert ledger.seconds["checkpoint"] == (2760.0 - 330.0) * GPUS
    assert ledger.seconds["between_steps"] == 30.0 * GPUS
    assert ledger.lifetime() == pytest.approx(2820.0 * GPUS)
    # The same gap with no save in it is a stall, as before.
    hung = ledger_of(*[(60.0 * k, {"timing_s/step": 60.0}) for k in range(1, 6)])
    hung.step(2820.0, {"timing_s/step": 60.0})
    assert hung.seconds["stalled"] == 2460.0 * GPUS and hung.seconds["checkpoint"] == 0.0


def test_the_store_counts_a_save_whose_step_line_was_lost_as_checkpoint_time():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 0, {}, time=0.0, run_config=CONFIG))
    for step in range(1, 6):
        store.ingest(Record(RUN, step, {"timing_s/step": 60.0}, time=60.0 * step))
    store.ingest(Record(RUN, 6, {}, time=330.0, checkpoint_step=6))  # the save of step 6 begins
    store.tick(330.0 + 1800.0)  # saving: no stall while it lasts
    store.ingest(Record(RUN, 7, {"timing_s/step": 60.0}, time=2820.0))  # step 6's line was lost
    buckets = served(store)["verl_run_gpu_seconds_total"]
    assert buckets["stalled"] == 0.0 and buckets["checkpoint"] == (2760.0 - 330.0) * GPUS
