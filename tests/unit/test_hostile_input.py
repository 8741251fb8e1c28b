"""What a log holds never blinds /metrics, never pushes a catalog metric out, and is never dropped
without a count: lone surrogates, non-UTF-8 file names, huge steps, junk keys, values no number."""

import json
import os

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from exposition import sample_value, samples
from verl_exporter.collectors import Collector, CollectorRunner
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.sources import Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("gsm8k", "ppo")


def both_formats(**collectors) -> str:
    """The text exposition, after checking that the OpenMetrics one renders and parses too."""
    registry = CollectorRegistry()
    registry.register(CollectorRunner(collectors))
    list(parse_openmetrics(generate_openmetrics(registry).decode()))
    return generate_latest(registry).decode()


def served(*patterns) -> str:
    """What the training collector serves after one store followed ``patterns``; it did not fail."""
    store = RunStore(default_catalog())
    sources = [Source(str(pattern), store) for pattern in patterns]
    for source in sources:
        source.poll()
    text = both_formats(training=TrainingCollector(store))
    for source in sources:
        source.close()
    assert sample_value(text, "verl_exporter_collector_success", collector="training") == 1
    return text


def test_a_key_with_a_lone_surrogate_is_served_with_u_fffd(tmp_path):
    path = tmp_path / "gsm8k" / "ppo.jsonl"
    path.parent.mkdir()
    path.write_text('{"step":1,"data":{"x\\ud800":1,"actor/pg_loss":0.5}}\n'
                    '{"step":2,"data":{"val-core/\\udfff/acc/mean@1":0.25}}\n')
    text = served(path)
    run = {"project": "gsm8k", "experiment": "ppo"}
    assert sample_value(text, "verl_actor_pg_loss", **run) == 0.5
    assert sample_value(text, "verl_x", **run) == 1
    assert sample_value(text, "verl_val_core", data_source="\ufffd", **run) == 0.25


def test_a_file_name_that_is_not_utf8_is_served_escaped(tmp_path):
    root = os.fsencode(tmp_path)
    (tmp_path / "gsm8k").mkdir()
    with open(os.path.join(root, b"gsm8k", b"ppo\xff\n.jsonl"), "wb") as out:
        out.write(b'{"step":1,"data":{"actor/pg_loss":0.5}}\n{"step":"x","data":{}}\n')
    text = served(tmp_path / "gsm8k" / "*.jsonl")
    shown = str(tmp_path / "gsm8k" / "ppo\\xff\\n.jsonl")
    assert sample_value(text, "verl_actor_pg_loss", project="gsm8k", experiment="ppo\\xff\\n") == 0.5
    assert sample_value(text, "verl_training_run_info", source=shown) == 1
    assert sample_value(text, "verl_exporter_parse_errors_total", source=shown) == 1
    assert sample_value(text, "verl_exporter_source_up", source=shown) == 1


@pytest.mark.parametrize("digits", [17, 310, 1000, 4300])
@pytest.mark.parametrize("suffix", ["jsonl", "log"])
def test_a_step_beyond_2_to_the_53_is_a_parse_error(tmp_path, digits, suffix):
    path = tmp_path / "gsm8k" / f"ppo.{suffix}"
    path.parent.mkdir()
    huge = "9" * digits
    lines = ([{"step": 1, "data": {"a": 1}}, f'{{"step":{huge},"data":{{"a":2}}}}', {"step": 2, "data": {"a": 3}}]
             if suffix == "jsonl" else ["step:1 - a:1", f"step:{huge} - a:2", "step:2 - a:3"])
    path.write_text("".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines))
    text = served(path)
    run = {"project": "gsm8k", "experiment": "ppo"}
    assert sample_value(text, "verl_training_last_step", **run) == 2
    assert sample_value(text, "verl_a", **run) == 3
    assert sample_value(text, "verl_exporter_parse_errors_total", source=str(path)) == 1


class Broken(Collector):
    """A collector whose family cannot be rendered."""

    def __init__(self, label="ok", value=1.0):
        self.label, self.value = label, value

    def describe(self):
        return []

    def collect(self):
        family = GaugeMetricFamily("verl_broken", "Cannot be rendered.", labels=["x"])
        family.add_metric([self.label], self.value)
        yield family


class Fine(Collector):
    def describe(self):
        return []

    def collect(self):
        yield GaugeMetricFamily("verl_fine", "Renders.", value=1.0)


@pytest.mark.parametrize("broken", [Broken(label="x\ud800"), Broken(value=10**400), Broken(value="x")],
                         ids=["surrogate", "huge int", "text"])
def test_a_family_that_cannot_be_rendered_fails_only_its_collector(broken):
    text = both_formats(broken=broken, fine=Fine())
    assert sample_value(text, "verl_exporter_collector_success", collector="broken") == 0
    assert sample_value(text, "verl_exporter_collector_success", collector="fine") == 1
    assert sample_value(text, "verl_fine") == 1
    assert "verl_broken" not in text


def test_catalog_keys_are_served_whatever_number_of_junk_keys_came_first():
    store = RunStore(default_catalog(), max_series_per_run=2000)
    store.ingest(Record(RUN, 1, {f"junk/{i}": 1.0 for i in range(2000)}))
    store.ingest(Record(RUN, 2, {"actor/pg_loss": 0.5, "actor/entropy_loss": 0.25, "junk/0": 2.0, "junk/x": 1.0}))
    store.ingest(Record(RUN, 3, {"critic/vf_loss": 0.125, "val-core/gsm8k/acc/mean@1": 0.75, "junk/y": 1.0}))
    store.ingest(Record(RUN, 4, {f"val-core/d{i}/acc/mean@1": 1.0 for i in range(2000)}))  # the families' own places
    store.ingest(Record(RUN, 5, {"val-core/z/acc/mean@1": 1.0, "actor/ppo_kl": 0.001}))
    text = both_formats(training=TrainingCollector(store))
    run = {"project": "gsm8k", "experiment": "ppo"}
    assert sample_value(text, "verl_actor_pg_loss", **run) == 0.5
    assert sample_value(text, "verl_actor_entropy", **run) == 0.25  # an alias is a catalog key too
    assert sample_value(text, "verl_critic_vf_loss", **run) == 0.125
    assert sample_value(text, "verl_actor_ppo_kl", **run) == 0.001
    assert sample_value(text, "verl_val_core", data_source="gsm8k", **run) == 0.75
    assert sample_value(text, "verl_junk_0", **run) == 2.0
    # Outside the catalog, and in its families, the cap holds and what it drops is counted.
    assert sample_value(text, "verl_junk_x", **run) is None and sample_value(text, "verl_junk_y", **run) is None
    assert sample_value(text, "verl_val_core", data_source="d1999", **run) is None
    assert sample_value(text, "verl_val_core", data_source="z", **run) is None
    assert sample_value(text, "verl_training_series_dropped_total", **run) == 4


def test_the_cap_counts_drops_beyond_the_keys_it_remembers(monkeypatch):
    store = RunStore(default_catalog(), max_series_per_run=1)
    store.ingest(Record(RUN, 1, {"a": 1.0}))
    state = store._runs[RUN]
    state.dropped_keys = {f"k{i}" for i in range(100_000)}
    store.ingest(Record(RUN, 2, {"b": 1.0, "c": 1.0, "k1": 1.0}))
    store.ingest(Record(RUN, 3, {"b": 1.0}))
    state = store.run(RUN)
    # 100,000 keys, then b and c: a key is counted once, however often it is logged (k1, b again).
    assert len(state.dropped_keys) + state.dropped_unremembered == 100_002


JSON_VALUES = {"hex": "0x10", "word": "abc", "empty": "", "object": {"a": 1}, "list": [1, 2], "bool": True,
               "number_text": "1e-3", "int": 3}


def test_values_that_are_no_number_are_counted_by_reason(tmp_path):
    jsonl, console = tmp_path / "gsm8k" / "ppo.jsonl", tmp_path / "gsm8k" / "ppo.log"
    jsonl.parent.mkdir()
    jsonl.write_text(json.dumps({"step": 1, "data": JSON_VALUES}) + "\n"
                     + json.dumps({"step": 2, "data": {"a": [1], "b": {}}}) + "\n")
    console.write_text("step:1 - a:0x10 - b:np.float64(x) - c:0.5 - d:\n"
                       "step:2 - a:1.2.3 - b:1\n"  # numbers' characters only: converted when scraped
                       "step:3 - a:zz\n")  # nothing readable: one parse error, not a dropped value
    text = served(jsonl, console)
    dropped = {labels: value for (name, labels), value in samples(text).items()
               if name == "verl_exporter_values_dropped_total"}
    assert dropped == {
        (("reason", "not_a_number"), ("source", str(jsonl))): 3,
        (("reason", "object"), ("source", str(jsonl))): 2,
        (("reason", "list"), ("source", str(jsonl))): 2,
        (("reason", "not_a_number"), ("source", str(console))): 4,
    }
    run = {"project": "gsm8k", "experiment": "ppo"}
    assert sample_value(text, "verl_bool", **run) == 1 and sample_value(text, "verl_number_text", **run) == 0.001
    assert sample_value(text, "verl_exporter_parse_errors_total", source=str(console)) == 1
