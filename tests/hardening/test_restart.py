"""The exporter killed mid-run and started again restores every run's state from its files."""

import math
import threading

from hardening_helpers import metrics_when, samples
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from owner import ME
from servers import start_exporter
from verl_exporter import simulate
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.sources import Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore

STEPS = 30
OWNED = (("team", ""), ("user", ME))  # the labels of a run of the files' owner, of no known team
READ_TIME = "verl_training_last_step_timestamp_seconds"  # when the exporter read it: differs by design


def training_samples(text: str) -> dict:
    """Every sample of a run (labelled with ``experiment``), but the read time and the node's runs
    (``verl_node_run_info``, another collector's), keyed by name and labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "experiment" in sample.labels and sample.name not in (READ_TIME, "verl_node_run_info"):
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def expected_from_files(pattern: str) -> dict:
    """What a fresh reader of the files serves: Source, store and collector in this process."""
    store = RunStore(default_catalog())
    source = Source(pattern, store)
    while True:
        source.poll()
        if not source.behind:
            break
    source.close()
    registry = CollectorRegistry()
    registry.register(TrainingCollector(store))
    return training_samples(generate_latest(registry).decode())


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_restart_mid_run_restores_the_runs_state(tmp_path):
    runs = tmp_path / "runs"
    stop = threading.Event()
    writers = [
        threading.Thread(target=simulate.write_run, args=(runs / "gsm8k" / "nan-ppo.log", "nan"),
                         kwargs={"fmt": "console", "steps": STEPS, "interval": 0.05, "stop_event": stop}),
        threading.Thread(target=simulate.write_run, args=(runs / "math" / "grpo.jsonl", "healthy"),
                         kwargs={"fmt": "jsonl", "steps": STEPS, "interval": 0.05, "stop_event": stop,
                                 "algorithm": "grpo"}),
    ]
    pattern = str(runs / "*" / "*")
    try:
        for writer in writers:
            writer.start()
        with start_exporter(tmp_path, "--source", pattern, "--no-collector.gpu", "--no-collector.host",
                            "--source.poll-interval", "0.1") as first:
            metrics_when(first, lambda text: len(samples(text, "verl_training_last_step")) == 2
                         and min(samples(text, "verl_training_last_step")) >= 5, "both runs under way")
            first.process.kill()  # a crash, not a clean stop
            first.process.wait(10)
        for writer in writers:
            writer.join(60)
    finally:
        stop.set()
    assert not any(writer.is_alive() for writer in writers)

    with start_exporter(tmp_path, "--source", pattern, "--no-collector.gpu", "--no-collector.host",
                        "--source.poll-interval", "0.1") as second:
        text = metrics_when(second, lambda t: samples(t, "verl_training_last_step") == [STEPS, STEPS]
                            and samples(t, "verl_training_finished", experiment="nan-ppo") == [1],
                            "both runs read to their end")
    served = training_samples(text)
    expected = expected_from_files(pattern)
    assert served.keys() == expected.keys(), sorted(set(served) ^ set(expected))[:10]
    wrong = [key for key in expected if not same(served[key], expected[key])]
    assert not wrong, [(key, served[key], expected[key]) for key in wrong[:5]]
    # And the state is the run's own, not just self-consistent: the last step's values and the
    # NaN steps of the nan scenario (from step 15 on) are all there.
    last = simulate.step_values("nan", STEPS)
    assert served[("verl_critic_score_mean", (("experiment", "nan-ppo"), ("project", "gsm8k"), *OWNED))] == \
        last["critic/score/mean"]
    nan_steps = STEPS - 15 + 1
    assert served[("verl_training_nonfinite_values_total",
                   (("experiment", "nan-ppo"), ("key", "actor/pg_loss"), ("project", "gsm8k"),
                    *OWNED))] == nan_steps
    assert served[("verl_training_steps_ingested_total",
                   (("experiment", "grpo"), ("project", "math"), *OWNED))] == STEPS
