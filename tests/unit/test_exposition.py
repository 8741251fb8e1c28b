"""The one way to the bytes: the text parts serve what client_python's writer would, change after
change; concurrent scrapes share one rendering; a scrape of an unchanged store copies no run."""

import gzip
import math
import threading

from prometheus_client import generate_latest

from verl_exporter.collectors import CollectorRunner
from verl_exporter.collectors.node import NodeCollector
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.exposition import Exposition, Part
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_state import RunState
from verl_exporter.store.run_store import RunStore


def setup(**kwargs):
    store = RunStore(default_catalog(), **kwargs)
    return store, Exposition([CollectorRunner({"training": TrainingCollector(store)}, clock=lambda: 0.0)])


def same(exposition):
    cached = exposition.text()
    assert cached == generate_latest(exposition.registry)
    return cached


VALUES = {"actor/pg_loss": 0.1, "val-core/openai/gsm8k/acc/mean@1": 0.5, "timing_s/gen": 2.0,
          "my own key": math.nan, "perf/max_memory_allocated_gb": 40.0, "actor/grad_norm": math.inf,
          'val-core/my"odd\\source\nx/acc/mean@1': 1e22, "critic/score/mean": -0.0}


def test_the_cached_text_equals_client_pythons_through_changes():
    clock = [100.0]
    store, registry = setup(retention=10.0, clock=lambda: clock[0])
    same(registry)  # no run at all
    for index in range(6):
        store.ingest(Record(RunKey(f"p{index % 2}", f"e{index}"), 1, VALUES, 100.0))
    first = same(registry)
    assert same(registry) == first  # unchanged: served again
    store.ingest(Record(RunKey("p1", "e1"), 2, {"actor/pg_loss": 7.5, "actor/new_key": 1.0}, 100.0))
    assert b"7.5" in same(registry)
    store.ingest(Record(RunKey('q"uo\\te', "new\nline"), 1, VALUES, 100.0))
    store.ingest(Record(RunKey("p0", "e0"), 2, {}, 100.0, finished=True))
    store.ingest(Record(RunKey("p0", "e2"), 2, {}, 100.0, total_steps=50))
    store.ingest(Record(RunKey("p0", "e2"), 2, {}, 100.0, run_config={"trainer": {"total_epochs": 3}}))
    store.parse_error("x.log", "bad")
    store.source_state("x.log", None)
    same(registry)
    clock[0] += 20  # the finished run leaves
    text = same(registry)
    assert b'experiment="e0"' not in text and b'reason="finished"} 1.0' in text


def test_a_name_no_utf8_encodes_leaves_out_its_run_not_the_others():
    store, registry = setup()
    store.ingest(Record(RunKey("p", "bad\udcff"), 1, {"actor/pg_loss": 0.1}, 1.0))
    store.ingest(Record(RunKey("p", "good"), 1, {"actor/pg_loss": 0.2}, 1.0))
    text = registry.text()
    assert text == generate_latest(registry.registry)
    assert b'verl_exporter_collector_success{collector="training"} 1.0' in text
    assert b'verl_actor_pg_loss{experiment="good",project="p",team="",user=""} 0.2' in text and b"bad" not in text


def test_concurrent_scrapes_share_renderings():
    started, release = threading.Event(), threading.Event()
    renders = []

    def render(registry):
        renders.append(1)
        started.set()
        release.wait()
        return [Part(b"body %d" % len(renders))]

    ticks, ticked = [0], threading.Condition()

    def clock():  # counts arrivals (and starts of renderings)
        with ticked:
            ticks[0] += 1
            ticked.notify_all()
            return ticks[0]

    shared = Exposition([], render=render, clock=clock).text
    first = threading.Thread(target=shared)
    first.start()
    started.wait()  # one rendering in progress; eight scrapes arrive meanwhile
    bodies = []
    waiters = [threading.Thread(target=lambda: bodies.append(shared())) for _ in range(8)]
    for waiter in waiters:
        waiter.start()
    with ticked:
        ticked.wait_for(lambda: ticks[0] == 2 + 8)  # all eight have arrived and wait
    release.set()
    first.join()
    for waiter in waiters:
        waiter.join()
    assert len(bodies) == 8 and len(renders) == 2  # they arrived after the first began: one more
    assert set(bodies) == {b"body 2"}


def test_gzipped_bodies_keep_the_unchanged_members_and_decompress_to_the_text():
    store, registry = setup()
    for index in range(3):
        store.ingest(Record(RunKey("p", f"e{index}"), 1, VALUES, 100.0))
    first = registry.text(True)
    assert gzip.decompress(first) == generate_latest(registry.registry)
    store.parse_error("x.log", "bad")  # the store's families change, the runs do not
    second = registry.text(True)
    text = generate_latest(registry.registry)
    assert gzip.decompress(second) == text and b"x.log" in text
    static = [part for part in registry.parts() if part.static]
    assert static and all(part.gzipped() in second for part in static)  # reused, not compressed again


def _fleet(runs: int):
    store = RunStore(default_catalog())
    for index in range(runs):
        store.ingest(Record(RunKey(f"project{index % 7}", f"run{index}"), 3, VALUES, 100.0))
    node = NodeCollector(lambda: [])
    return store, Exposition([CollectorRunner({"training": TrainingCollector(store), "node": node})])


def test_a_scrape_of_an_unchanged_store_copies_no_run(monkeypatch):
    store, exposition = _fleet(1000)
    copies = []
    real_copy = RunState.copy

    def counted(state):
        copies.append(state.run)
        return real_copy(state)

    monkeypatch.setattr(RunState, "copy", counted)
    openmetrics = "application/openmetrics-text; version=1.0.0"
    for compressed in (False, True):  # the first scrapes build each run once per path
        exposition.encode("text/plain", None, compressed)
    exposition.encode(openmetrics)
    assert len(copies) == 2000  # the text and the client_python paths each copied each run once
    copies.clear()
    for _ in range(3):
        for accept in ("text/plain", openmetrics, "*/*"):
            for compressed in (False, True):
                exposition.encode(accept, None, compressed)
        exposition.encode("text/plain", ["verl_actor_pg_loss"])
    assert copies == []
    store.ingest(Record(RunKey("project0", "run0"), 4, {"actor/pg_loss": 2.0}, 101.0))
    body, _ = exposition.encode(openmetrics)
    assert copies == [RunKey("project0", "run0")] and b'run="run0"' not in body
    assert b'verl_actor_pg_loss{experiment="run0",project="project0",team="",user=""} 2.0' in body
    assert b'verl_actor_pg_loss{experiment="run0",project="project0",team="",user=""} 2.0' in exposition.text()
    assert len(copies) == 2


def test_every_path_serves_the_same_samples():
    store, exposition = _fleet(5)
    store.parse_error("x.log", "bad")
    text = exposition.text().decode()
    openmetrics, _ = exposition.encode("application/openmetrics-text; version=1.0.0")
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    def of(families):
        return {(sample.name, tuple(sorted(sample.labels.items())), repr(sample.value))
                for family in families for sample in family.samples
                if not sample.name.endswith("_created") and "duration" not in sample.name}

    from prometheus_client.parser import text_string_to_metric_families as text_families

    assert of(text_families(text)) == of(text_string_to_metric_families(openmetrics.decode()))


def test_family_text_writes_what_client_pythons_writer_writes():
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
    from prometheus_client.metrics_core import Metric

    from verl_exporter.exposition import _One, family_text

    families = []
    gauge = GaugeMetricFamily("verl_a", 'help with \\ and\nnewline and "quotes"', labels=["b", "a", "__c"])
    gauge.add_metric(['v"1', "x\\y\nz", "é"], math.nan)
    gauge.add_metric(["", "", ""], math.inf)
    families.append(gauge)
    counter = CounterMetricFamily("verl_b", "a counter", labels=["mode"])
    counter.add_metric(["user"], 1e22)
    counter.add_metric(["system"], -0.0, created=12.0)  # a _created sample: client_python's layout
    families.append(counter)
    stamped = GaugeMetricFamily("verl_c", "stamped")
    stamped.add_metric([], 1.0, timestamp=5.0)
    families.append(stamped)
    odd = Metric("verl.d", "odd name", "gauge")
    odd.add_sample("verl.d", {"la.bel": "x"}, 1.0)
    families += [odd, InfoMetricFamily("verl_e", "info", value={"k": "v"})]
    plain = GaugeMetricFamily("verl_f", "plain", labels=["gpu", "uuid"])
    for index in range(3):
        plain.add_metric([str(index), f"GPU-{index}"], index / 3)
    families.append(plain)
    for family in families:
        assert family_text(family) == generate_latest(_One(family)), family.name


def test_remembered_label_texts_and_values_are_written_as_client_python_writes_them():
    from prometheus_client.core import GaugeMetricFamily

    from verl_exporter.exposition import _One, family_text

    values = [0.5, 0.0, -0.0, math.nan, 0.5, -0.0, 0.0, 1, True, 1e22, math.inf, -math.inf, 2.5e-07]
    for round_ in range(3):  # the later rounds are written from what the first remembered
        gauge = GaugeMetricFamily("verl_g", "remembered", labels=["gpu", "uuid"])
        for index, value in enumerate(values):
            gauge.add_metric([str(index % 3), 'GPU-"x"\\' if index % 2 else "GPU-1"], value)
        gauge.add_metric(["9", "same labels, another order"], 7.0)
        reordered = GaugeMetricFamily("verl_h", "labels in another order", labels=["uuid", "gpu"])
        reordered.add_metric(["GPU-1", "0"], 0.5)
        for family in (gauge, reordered):
            assert family_text(family) == generate_latest(_One(family)), (round_, family.name)
