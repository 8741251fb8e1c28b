"""Hostile log lines all the way to /metrics.

tests/unit/test_parsers_fuzz.py covers the parsers and Source alone. Here whatever a line holds
(keys of any characters and length, values like 1e999, NUL bytes, invalid UTF-8) also goes through
the store and the training collector, and the exposition must stay valid: Prometheus' own parser
(promtool) and client_python's read it, and no metric family is declared twice.
"""

import json
import math
import os
import tempfile

from hardening_helpers import metrics_when, value
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from promtool import check_metrics
from servers import start_exporter
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.schema import reserved_names
from verl_exporter.sources import Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore

# Keys that look like verl's, keys that aim at the exporter's own names, and anything at all.
verl_like_keys = st.sampled_from([
    "actor/pg_loss", "actor/entropy_loss", "timing_s/gen", "timing_per_token_ms/gen", "perf/max_memory_allocated_gb",
    "val-core/openai/gsm8k/acc/mean@1", "val-aux/a/b/c/d", "val/test_score/x", "val-core/\"q\"/v/m",
    "val-core/a\nb/v/m", "val-core/a\\b/v/m", "training/steps_ingested", "training/last_step", "training/finished",
    "training/runs", "training/run_info", "exporter/parse_errors", "gpu/utilization", "x_total", "x_created",
    "x_bucket", "x_info", "gpus", "val_core", "val-core", "val/test_score", "", "/", "___", "1abc", "UPPER/Case",
    "a" * 300, "é/ü", "a:b", "a - b",
])
keys = st.one_of(verl_like_keys, st.text(max_size=30), st.text(alphabet="/_-@.:() x\\\"\n\x00", max_size=12))
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30),
                   st.sampled_from(["1e999", "-1e999", "nan", "0.5", "x"]))


def exposition(store: RunStore) -> tuple[str, str]:
    registry = CollectorRegistry()
    registry.register(TrainingCollector(store))
    return generate_latest(registry).decode(), generate_openmetrics(registry).decode()


def assert_valid(text: str, *, only_verl: bool = True) -> None:
    """Parses; no family declared twice; no series twice; every name ours (``only_verl``)."""
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), f"families declared twice: {sorted(t for t in types if types.count(t) > 1)}"
    series = [(sample.name, tuple(sorted(sample.labels.items())))
              for family in text_string_to_metric_families(text) for sample in family.samples]
    assert len(series) == len(set(series)), f"series served twice: {[s for s in series if series.count(s) > 1][:3]}"
    assert not only_verl or all(name.startswith("verl_") for name, _ in series)


def console_line(step: int, data: dict) -> str:
    pairs = " - ".join(f"{key}:{value!r}" if not isinstance(value, str) else f"{key}:{value}"
                       for key, value in data.items())
    return f"(TaskRunner pid=1) step:{step} - {pairs}".replace("\n", " ").replace("\r", " ")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(keys, values, max_size=6), min_size=1, max_size=4), st.sampled_from(["jsonl", "log"]))
def test_any_keys_and_values_give_a_valid_exposition(lines, suffix):
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, f"run.{suffix}")
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as out:
            for step, data in enumerate(lines):
                line = json.dumps({"step": step, "data": data}) if suffix == "jsonl" else console_line(step, data)
                out.write(line + "\n")
        store = RunStore(default_catalog(), max_series_per_run=50)
        source = Source(path, store)
        source.poll()
        source.close()
    text, openmetrics = exposition(store)
    assert_valid(text)
    list(parse_openmetrics(openmetrics))  # strict: also refuses a name two families share


def test_keys_aimed_at_the_exporters_own_names_are_renamed():
    store = RunStore(default_catalog())
    from verl_exporter.store.records import Record, RunKey

    hostile = {key: 1.0 for key in ("training/steps_ingested", "training/last_step", "training/runs",
                                    "training/runs_dropped", "training/series_dropped", "training/nonfinite_values",
                                    "training/finished", "exporter/parse_errors", "gpu/utilization")}
    store.ingest(Record(RunKey("p", "e"), 1, hostile, 0.0))
    text, _ = exposition(store)
    assert_valid(text)
    served = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    own = {family.name for family in TrainingCollector(store).describe()}
    assert served & reserved_names() <= own | {name + "_total" for name in own}
    assert value(text, "verl_training_last_step", project="p", experiment="e") == 1  # the step, not the key


BAD_LINES = [
    b"\x00\x01\x02 binary \xff\xfe\xfd",                                    # arbitrary bytes
    b'{"step": 2, "data": {"actor/pg_loss": 0.' + b"1" * (10 << 20) + b"}}",  # a 10 MB line
    b'{"step": 3, "data": {"actor/pg_loss": 0.5, "k": "\xff\xfe"}}',        # invalid UTF-8 (read as U+FFFD)
    b'{"step": 4, "data": {"a\x00b": 1}}',                                  # a raw NUL inside a string
    b'{"step": 5, "data": {"actor/pg_loss": 0.',                            # truncated JSON
    b'{"step": 6, "data": {"actor/ppo_kl": 1e999}}',                        # a float too large: +inf
    b'{"step": 7, "data": {"' + b"k" * 10_000 + b'": 0.25}}',               # a 10 000-character key: dropped
    b'{"step": "8", "data": {}}',                                           # a step that is not a number
    b'[1, 2, 3]',                                                           # JSON, but not an object
]
MALFORMED = 6  # binary, 10 MB, NUL in a string, truncated, step "8", a list


def test_the_running_exporter_counts_bad_lines_and_reads_each_next_good_line(tmp_path):
    path = tmp_path / "gsm8k" / "ppo.jsonl"
    path.parent.mkdir()
    good = [b'{"step": %d, "data": {"actor/pg_clipfrac": 0.%d}}' % (100 + i, i + 1) for i in range(len(BAD_LINES))]
    path.write_bytes(b"".join(bad + b"\n" + ok + b"\n" for bad, ok in zip(BAD_LINES, good)))
    run = {"project": "gsm8k", "experiment": "ppo"}
    with start_exporter(tmp_path, "--source", str(path), "--no-collector.gpu", "--no-collector.host",
                        "--source.poll-interval", "0.1") as exporter:
        text = metrics_when(exporter, lambda t: value(t, "verl_training_last_step", **run) == 100 + len(good) - 1,
                            "the last good line")
        assert value(text, "verl_exporter_parse_errors_total", source=str(path)) == MALFORMED
        # Each good line after a bad one was read: they are the only steps besides 3, 6 and 7.
        assert value(text, "verl_training_steps_ingested_total", **run) == len(good) + 3
        assert value(text, "verl_actor_pg_clipfrac", **run) == 0.9
        assert value(text, "verl_actor_ppo_kl", **run) == math.inf
        assert value(text, "verl_training_nonfinite_values_total", key="actor/ppo_kl", **run) == 1
        assert "verl_kkkk" not in text  # keys past 256 characters are counted, not served
        assert value(text, "verl_exporter_values_dropped_total", source=str(path), reason="key_too_long") == 1
        assert exporter.get("/-/healthy")[0] == 200
        assert_valid(text, only_verl=False)
        complaints = check_metrics(text)
        assert "error while linting" not in complaints and "parse" not in complaints.lower(), complaints
    assert "skipped a line" in exporter.log()
