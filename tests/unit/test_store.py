import math
import threading

from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("gsm8k", "ppo-qwen")


def make_store(**kwargs):
    return RunStore(default_catalog(), **kwargs)


def series(store, run=RUN):
    return {name + str(labels): value for (name, labels), (_, value) in store.run(run).series.items()}


def test_latest_value_wins_and_units_are_converted():
    store = make_store()
    store.ingest(Record(RUN, 1, {"actor/pg_clipfrac": 0.1, "timing_per_token_ms/gen": 40.0}, time=100.0))
    store.ingest(Record(RUN, 2, {"actor/pg_clipfrac": 0.2, "perf/max_memory_allocated_gb": 45.5}, time=160.0))
    values = series(store)
    assert values["verl_actor_pg_clipfrac()"] == 0.2
    assert math.isclose(values["verl_timing_per_token_gen_seconds()"], 0.040)
    assert values["verl_perf_max_memory_allocated_bytes('actor',)"] == 45.5 * 2**30
    state = store.run(RUN)
    assert (state.last_step, state.last_step_time, state.steps_ingested) == (2, 160.0, 2)


def test_several_lines_at_one_step_count_as_one_step():
    store = make_store()
    store.ingest(Record(RUN, 10, {"actor/pg_loss": -0.001}, time=1.0))
    store.ingest(Record(RUN, 10, {"val-core/openai/gsm8k/acc/mean@1": 0.7}, time=2.0))
    state = store.run(RUN)
    assert state.steps_ingested == 1
    assert len(state.series) == 2


def test_old_and_new_spellings_are_one_series():
    store = make_store()
    store.ingest(Record(RUN, 1, {"actor/entropy_loss": 0.5}))
    store.ingest(Record(RUN, 2, {"actor/entropy": 0.4}))
    assert series(store) == {"verl_actor_entropy()": 0.4}


def test_nonfinite_values_are_kept_and_counted():
    store = make_store()
    store.ingest(Record(RUN, 1, {"actor/pg_loss": math.nan, "critic/vf_loss": math.inf}))
    store.ingest(Record(RUN, 2, {"actor/pg_loss": math.nan}))
    state = store.run(RUN)
    assert state.nonfinite == {"actor/pg_loss": 2, "critic/vf_loss": 1}
    assert math.isnan(series(store)["verl_actor_pg_loss()"])


def test_series_cap_counts_what_it_drops_and_keeps_updating_existing_series():
    store = make_store(max_series_per_run=2)
    store.ingest(Record(RUN, 1, {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}))
    store.ingest(Record(RUN, 2, {"a": 5.0, "c": 6.0}))
    state = store.run(RUN)
    assert len(state.series) == 2
    assert state.dropped_keys == {"c", "d"}
    assert series(store)["verl_a()"] == 5.0


def test_run_cap_refuses_new_runs_and_counts_them():
    store = make_store(max_runs=1)
    store.ingest(Record(RUN, 1, {"a": 1.0}))
    store.ingest(Record(RunKey("p", "other"), 1, {"a": 1.0}))
    snapshot = store.snapshot()
    assert [state.run for state in snapshot.runs] == [RUN]
    assert snapshot.runs_dropped == 1


def test_finished_marker_and_resume():
    store = make_store()
    store.ingest(Record(RUN, 5, {"a": 1.0}, time=10.0))
    store.ingest(Record(RUN, 5, finished=True, time=20.0))
    state = store.run(RUN)
    assert state.finished and state.last_step == 5 and state.last_step_time == 10.0
    store.ingest(Record(RUN, 6, {"a": 2.0}, time=30.0))  # resumed from a checkpoint
    assert not store.run(RUN).finished


def test_parse_errors_are_counted_per_source_with_a_cap():
    store = make_store(max_error_sources=2)
    for source in ["a.log", "a.log", "b.log", "c.log", "d.log"]:
        store.parse_error(source, "bad line")
    assert store.snapshot().parse_errors == {"a.log": 2, "b.log": 1, "other": 2}


def test_snapshot_is_a_copy():
    store = make_store()
    store.ingest(Record(RUN, 1, {"a": 1.0}))
    snapshot = store.snapshot()
    store.ingest(Record(RUN, 2, {"a": 2.0, "b": 1.0}))
    assert len(snapshot.runs[0].series) == 1 and snapshot.runs[0].last_step == 1


def test_concurrent_ingest_and_snapshot_lose_nothing():
    store = make_store()
    runs = [RunKey("p", f"e{i}") for i in range(4)]

    def writer(run):
        for step in range(500):
            store.ingest(Record(run, step, {"actor/pg_loss": float(step), f"k{step % 50}": 1.0}))

    threads = [threading.Thread(target=writer, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        store.snapshot()
    for run in runs:
        state = store.run(run)
        assert state.steps_ingested == 500 and state.last_step == 499
        assert len(state.series) == 51


def test_values_read_as_text_are_converted_once_and_bad_ones_counted():
    store = make_store()
    store.ingest(Record(RUN, 1, {"actor/pg_loss": "-0.005", "timing_s/gen": "21.47", "a": "1-2", "b": "1e999"},
                        source="/logs/run.log"))
    snapshot = store.snapshot()
    values = series(store)
    assert values["verl_actor_pg_loss()"] == -0.005 and values["verl_timing_gen_seconds()"] == 21.47
    assert values["verl_b()"] == math.inf and "verl_a()" not in values
    assert snapshot.values_dropped == {("/logs/run.log", "not_a_number"): 1} and not snapshot.parse_errors
    assert snapshot.runs[0].nonfinite == {"b": 1}
    store.snapshot()  # converted once: no second count
    assert store.snapshot().values_dropped == {("/logs/run.log", "not_a_number"): 1}
    assert store.snapshot().runs[0].nonfinite == {"b": 1}


def test_two_spellings_in_one_run_the_latest_logged_wins():
    store = make_store()
    store.ingest(Record(RUN, 1, {"actor/entropy": 0.4}))
    store.ingest(Record(RUN, 2, {"actor/entropy_loss": 0.5}))
    assert series(store) == {"verl_actor_entropy()": 0.5}


def test_two_spellings_logged_side_by_side_are_two_metrics():
    # verl 0.8 logs actor/entropy_loss (the update's entropy) beside actor/entropy when entropy is computed.
    for values in ({"actor/entropy": 0.4, "actor/entropy_loss": 0.45},
                   {"actor/entropy_loss": 0.45, "actor/entropy": 0.4}):
        store = make_store()
        store.ingest(Record(RUN, 1, {"actor/entropy": 0.3}))
        store.ingest(Record(RUN, 2, values))
        assert series(store) == {"verl_actor_entropy()": 0.4, "verl_actor_entropy_loss()": 0.45}
        help_text = store.run(RUN).series[("verl_actor_entropy_loss", ())][0].spec.full_help()
        assert help_text.startswith("verl actor/entropy_loss: ") and "beside actor/entropy" in help_text
    store = make_store()
    store.ingest(Record(RUN, 1, {"actor/entropy_loss": 0.45, "actor/entropy": 0.4}))  # from the first record on
    assert series(store) == {"verl_actor_entropy()": 0.4, "verl_actor_entropy_loss()": 0.45}


def test_a_run_resumed_on_a_newer_release_serves_the_newer_spelling():
    store = make_store()
    store.ingest(Record(RUN, 2, {"perf/max_memory_allocated_gb": 30.0, "actor/pg_loss": 0.1}))
    for step in range(34, 37):
        store.ingest(Record(RUN, step, {"actor/perf/max_memory_allocated_gb": float(step), "actor/pg_loss": 0.2}))
        store.ingest(Record(RUN, step, {"val-core/gsm8k/acc/mean@1": 0.5}))  # a line with neither spelling
        assert series(store)["verl_perf_max_memory_allocated_bytes('actor',)"] == step * 2**30
    store.ingest(Record(RUN, 40, {"perf/max_memory_allocated_gb": 41.0}))  # and back again
    assert series(store)["verl_perf_max_memory_allocated_bytes('actor',)"] == 41 * 2**30


def test_actor_and_critic_memory_stay_apart():
    store = make_store()
    store.ingest(Record(RUN, 1, {"actor/perf/max_memory_allocated_gb": 40.0,
                                 "critic/perf/max_memory_allocated_gb": 20.0}))
    assert {key: value / 2**30 for key, value in series(store).items()} == {
        "verl_perf_max_memory_allocated_bytes('actor',)": 40.0, "verl_perf_max_memory_allocated_bytes('critic',)": 20.0}


def test_a_run_resumed_in_a_new_log_passes_to_it_once_the_old_log_fell_silent():
    store = RunStore(default_catalog())
    run = RunKey("gsm8k", "ppo")
    store.ingest(Record(run, 10, {"actor/pg_loss": 0.1}, 1000.0, source="/logs/job-1.log"))
    # Another file naming the run while its log is live is refused ...
    store.ingest(Record(run, 99, {"actor/pg_loss": 9.0}, 1100.0, source="/logs/other.log"))
    assert store.run(run).last_step == 10
    # ... the job's own log goes on, and once it is silent for five minutes a resumed job's log takes over.
    store.ingest(Record(run, 11, {"actor/pg_loss": 0.2}, 1200.0, source="/logs/job-1.log"))
    store.ingest(Record(run, 9, {"actor/pg_loss": 0.3}, 1200.0 + 299, source="/logs/job-2.log"))
    assert store.run(run).last_step == 11
    store.ingest(Record(run, 9, {"actor/pg_loss": 0.3}, 1200.0 + 300, source="/logs/job-2.log"))
    state = store.run(run)
    assert state.last_step == 9 and state.values["actor/pg_loss"] == 0.3
    store.ingest(Record(run, 12, {"actor/pg_loss": 5.0}, 1600.0, source="/logs/job-1.log"))
    assert store.run(run).last_step == 9  # the old log is no longer the run's
