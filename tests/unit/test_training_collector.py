import math
import re

import yaml
from prometheus_client import CollectorRegistry, generate_latest

from exposition import samples
from exposition import scrape as scrape_collectors
from owner import ME
from promtool import check_metrics
from verl_exporter import shipped
from verl_exporter.collectors import Collector, CollectorRunner
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("gsm8k", "ppo-qwen")


def scrape(store) -> str:
    return scrape_collectors(training=TrainingCollector(store))


def test_training_metrics_carry_the_run_labels_and_the_guide_help():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 3, {"actor/pg_clipfrac": 0.12, "val-core/openai/gsm8k/acc/mean@1": 0.7},
                        time=1700000000.0, source="/runs/gsm8k/ppo-qwen.jsonl"))
    text = scrape(store)
    values = samples(text)
    run = (("experiment", "ppo-qwen"), ("project", "gsm8k"))
    assert values[("verl_actor_pg_clipfrac", run)] == 0.12
    assert values[("verl_val_core", (("data_source", "openai/gsm8k"), ("experiment", "ppo-qwen"),
                                     ("metric", "mean@1"), ("project", "gsm8k"), ("variable", "acc")))] == 0.7
    assert values[("verl_training_last_step", run)] == 3
    assert values[("verl_training_last_step_timestamp_seconds", run)] == 1700000000.0
    assert values[("verl_training_steps_ingested_total", run)] == 1
    assert values[("verl_training_finished", run)] == 0
    assert values[("verl_training_run_info", run + (("source", "/runs/gsm8k/ppo-qwen.jsonl"),))] == 1
    assert values[("verl_exporter_collector_success", (("collector", "training"),))] == 1
    assert "# HELP verl_actor_pg_clipfrac verl actor/pg_clipfrac: Fraction of samples" in text
    assert "Healthy 0.05 to 0.3" in text


def test_nan_is_served_and_counted():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 1, {"actor/pg_loss": math.nan, "actor/grad_norm": -math.inf}))
    values = samples(scrape(store))
    run = (("experiment", "ppo-qwen"), ("project", "gsm8k"))
    assert math.isnan(values[("verl_actor_pg_loss", run)])
    assert values[("verl_actor_grad_norm", run)] == -math.inf
    nonfinite = (("experiment", "ppo-qwen"), ("key", "actor/pg_loss"), ("project", "gsm8k"))
    assert values[("verl_training_nonfinite_values_total", nonfinite)] == 1


def test_parse_errors_and_dropped_series_are_exported():
    store = RunStore(default_catalog(), max_series_per_run=1)
    store.ingest(Record(RUN, 1, {"a": 1.0, "b": 2.0}))
    store.parse_error("/logs/x.log", "bad")
    values = samples(scrape(store))
    assert values[("verl_exporter_parse_errors_total", (("source", "/logs/x.log"),))] == 1
    assert values[("verl_training_series_dropped_total", (("experiment", "ppo-qwen"), ("project", "gsm8k")))] == 1


def test_output_with_many_runs_and_every_catalog_metric_is_promtool_clean():
    catalog = default_catalog()
    store = RunStore(catalog)
    keys = [key for spec in catalog.metrics for key in (spec.key,) + spec.aliases]
    keys += ["val-core/openai/gsm8k/reward/mean@1", "val-aux/openai/gsm8k/reward/std@1",
             "val/test_score/openai/gsm8k", "episode/success_rate_alfworld", "critic/lr(1e-4)", "custom/thing-x"]
    for index in range(3):
        store.ingest(Record(RunKey("proj", f"exp-{index}"), index, {key: 0.5 for key in keys}, time=1.0))
    store.parse_error("/logs/x.log", "bad")
    assert check_metrics(scrape(store)) == ""


def test_promtool_check_catches_a_bad_name():
    # The lint used above must be able to fail.
    assert check_metrics("# HELP foo_ms x\n# TYPE foo_ms counter\nfoo_ms 1\n") != ""


def test_a_failing_collector_does_not_fail_the_scrape():
    class Broken(Collector):
        def describe(self):
            return []

        def collect(self):
            raise RuntimeError("boom")

    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 1, {"actor/pg_loss": 0.1}))
    registry = CollectorRegistry()
    registry.register(CollectorRunner({"training": TrainingCollector(store), "broken": Broken()}))
    values = samples(generate_latest(registry).decode())
    assert values[("verl_exporter_collector_success", (("collector", "broken"),))] == 0
    assert values[("verl_exporter_collector_success", (("collector", "training"),))] == 1
    assert values[("verl_actor_pg_loss", (("experiment", "ppo-qwen"), ("project", "gsm8k")))] == 0.1


def test_orjson_null_in_a_filelogger_file_is_served_as_nan_and_counted(tmp_path):
    # verl 0.8+ writes NaN and Inf as null: the non-finite alert must still see them.
    from verl_exporter.sources import Source

    path = tmp_path / "gsm8k" / "ppo-qwen.jsonl"
    path.parent.mkdir()
    path.write_text('{"step": 1, "data": {"actor/grad_norm": 0.5, "actor/pg_loss": 0.01}}\n'
                    '{"step": 2, "data": {"actor/grad_norm": null, "actor/pg_loss": 0.02}}\n')
    store = RunStore(default_catalog())
    assert Source(str(path), store).poll() == 2
    values = samples(scrape(store))
    run = (("experiment", "ppo-qwen"), ("project", "gsm8k"), ("user", ME))
    assert math.isnan(values[("verl_actor_grad_norm", run)])
    assert values[("verl_training_nonfinite_values_total",
                   (("experiment", "ppo-qwen"), ("key", "actor/grad_norm"), ("project", "gsm8k"), ("user", ME)))] == 1
    assert values[("verl_training_nonfinite_last_step",
                   (("experiment", "ppo-qwen"), ("key", "actor/grad_norm"), ("project", "gsm8k"), ("user", ME)))] == 2
    # ... and VerlTrainingNonFinite selects that series.
    rules = yaml.safe_load((shipped.rules_dir() / "verl-operations.rules.yml").read_text())
    expr = next(rule["expr"] for group in rules["groups"] for rule in group["rules"]
                if rule.get("alert") == "VerlTrainingNonFinite")
    selector = re.search(r'verl_training_nonfinite_last_step\{key=~"([^"]+)"\}', expr).group(1)
    assert re.fullmatch(selector, "actor/grad_norm")
