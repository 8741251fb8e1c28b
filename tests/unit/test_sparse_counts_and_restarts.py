"""Counts verl logs only at steps where they are not 0 (the V1 replay buffer's evictions) count 0 at the
run's other steps; a restart (the config printed again after steps) starts the throughput baselines again."""

from __future__ import annotations

from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("dapo", "v1")
FILTERED = "training/filter_groups/evicted_samples"
CONFIG = {"trainer.project_name": "dapo", "trainer.experiment_name": "v1", "data.train_batch_size": 8}


def served(store: RunStore, stat: str) -> dict[str, float]:
    families = {family.name: family for family in TrainingCollector(store).collect()}
    family = families.get(f"verl_training_{stat}")
    return {sample.labels["metric"]: sample.value for sample in family.samples} if family else {}


def gauge(store: RunStore, name: str) -> float | None:
    for family in TrainingCollector(store).collect():
        if family.name == name:
            return family.samples[0].value
    return None


def test_a_step_without_an_eviction_count_counts_zero_once_the_run_logged_one():
    store = RunStore(default_catalog())
    for step in range(1, 13):  # evictions at odd steps only, as verl logs them
        values = {"timing_s/step": 30.0, **({FILTERED: 5.0} if step % 2 else {})}
        store.ingest(Record(RUN, step, values, time=60.0 * step))
    assert served(store, "recent_min")["verl_training_filter_groups_evicted_samples"] == 0.0
    assert served(store, "recent_max")["verl_timing_step_seconds"] == 30.0
    assert gauge(store, "verl_training_filter_groups_evicted_samples") == 0.0  # step 12 evicted none
    store.ingest(Record(RUN, 13, {"timing_s/step": 30.0, FILTERED: 80.0}, time=60.0 * 13))
    assert gauge(store, "verl_training_filter_groups_evicted_samples") == 80.0


def test_no_zeros_before_the_first_count_nor_over_a_count_of_the_same_step():
    store = RunStore(default_catalog())
    for step in range(1, 6):  # a run that never evicted: no series at all
        store.ingest(Record(RUN, step, {"timing_s/step": 30.0}, time=60.0 * step))
    assert "verl_training_filter_groups_evicted_samples" not in served(store, "recent_min")
    for step in range(6, 9):  # each step's count, then a second record of the step (its validation) without it
        store.ingest(Record(RUN, step, {"timing_s/step": 30.0, FILTERED: 90.0}, time=60.0 * step))
        store.ingest(Record(RUN, step, {"timing_s/testing": 100.0, "val-core/gsm8k/reward/mean@1": 0.5},
                            time=60.0 * step + 1))
    assert served(store, "recent_min")["verl_training_filter_groups_evicted_samples"] == 90.0


def steps(store: RunStore, first: int, last: int, throughput: float, start: float) -> float:
    for step in range(first, last + 1):
        start += 60.0
        store.ingest(Record(RUN, step, {"perf/throughput": throughput, "timing_s/step": 30.0}, time=start))
    return start


def test_a_restart_starts_the_throughput_baseline_again():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 0, {}, time=0.0, run_config=CONFIG))
    moment = steps(store, 1, 30, 1000.0, 0.0)
    assert served(store, "best_window_mean")["verl_perf_throughput"] == 1000.0
    store.ingest(Record(RUN, 30, {}, time=moment + 30, run_config=CONFIG))  # the job started again
    moment = steps(store, 21, 25, 400.0, moment + 60)
    assert served(store, "recent_max")["verl_perf_throughput"] == 400.0
    assert "verl_perf_throughput" not in served(store, "best_window_mean")  # 5 steps since: a new baseline fills
    assert served(store, "window_median")["verl_timing_step_seconds"] == 30.0  # other windows go on
    steps(store, 26, 45, 400.0, moment)
    assert served(store, "best_window_mean")["verl_perf_throughput"] == 400.0


def test_a_config_file_read_late_is_no_restart():
    store = RunStore(default_catalog())
    moment = steps(store, 1, 30, 1000.0, 0.0)
    store.ingest(Record(RUN, 0, {}, time=10.0, run_config=CONFIG))  # hydra's config.yaml, written at the start
    steps(store, 31, 32, 1000.0, moment)
    assert served(store, "best_window_mean")["verl_perf_throughput"] == 1000.0
    assert served(store, "prior_mean")["verl_perf_throughput"] == 1000.0
