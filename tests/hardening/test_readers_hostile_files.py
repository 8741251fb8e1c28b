"""What a run logs, or a file dropped beside it, cannot hurt another run or the exporter: globs are
bounded (``**`` follows no directory link, one file is one source), a file whose name holds glob
characters is followed, keys are capped in length, what the series cap refuses is counted without
being kept, two keys never share a series, ``verl_exporter_source_up`` is capped, and a file
cannot name itself another run and finish it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from owner import ME
from verl_exporter.sources import Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("p", "e", ME)


def _step(step: int, data: dict) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


def test_a_double_star_glob_through_two_links_to_dot_ends_at_once(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "run.log").write_text("step:1 - actor/pg_loss:0.1\n")
    (logs / "a").symlink_to(".")
    (logs / "b").symlink_to(".")
    # In a child with a memory limit and a timeout: the old expansion never ends and grows without bound.
    code = textwrap.dedent(f"""
        import resource, time
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from verl_exporter.store.catalog import default_catalog
        from verl_exporter.sources import Source
        from verl_exporter.store.run_store import RunStore
        store = RunStore(default_catalog())
        source = Source({str(logs / '**' / '*.log')!r}, store)
        started = time.monotonic()
        source.poll()
        print(len(source.follower.status), [s.last_step for s in store.snapshot().runs], time.monotonic() - started)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the first poll of a ** glob through links to . did not end in 30 s")
    assert result.returncode == 0, result.stderr[-800:]
    sources, steps, _ = result.stdout.split(" ", 2)
    assert (sources, steps) == ("1", "[1]")


def test_a_symlink_loop_under_double_star_makes_one_file_one_source(tmp_path):
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    (logs / "sub" / "run.log").write_text("step:1 - actor/pg_loss:0.1\n")
    (logs / "sub" / "loop").symlink_to("..")
    (logs / "same.log").symlink_to(logs / "sub" / "run.log")  # a link to a file: the same file
    store = RunStore(default_catalog())
    source = Source(str(logs / "**" / "*.log"), store)
    source.poll()
    assert len(source.follower.status) == 1, sorted(source.follower.status)
    assert len(store.snapshot().sources) == 1


def test_a_file_whose_name_holds_glob_characters_is_followed(tmp_path, caplog):
    path = tmp_path / "run[1].log"
    path.write_text("step:3 - actor/pg_loss:0.1\n")
    store = RunStore(default_catalog())
    Source(str(path), store).poll()
    assert [state.last_step for state in store.snapshot().runs] == [3]
    with caplog.at_level(logging.WARNING):
        Source(str(tmp_path / "nothing-*.log"), store).poll()
    assert any("no file matches" in record.getMessage() for record in caplog.records)


def test_a_key_longer_than_the_cap_is_dropped_and_counted(tmp_path):
    path = tmp_path / "p" / "e.jsonl"
    path.parent.mkdir()
    path.write_text(_step(1, {"k" * 100_000: 1.0, "actor/pg_loss": 0.5}) + "step:2 - " + "x" * 5000 + ":1.0\n")
    store = RunStore(default_catalog())
    Source(str(path), store).poll()
    assert list(store.run(RUN).values) == ["actor/pg_loss"]
    assert store.snapshot().values_dropped == {(str(path), "key_too_long"): 1}


def test_keys_refused_by_the_series_cap_are_counted_not_kept():
    store = RunStore(default_catalog(), max_series_per_run=10)
    keys = [f"junk/{'x' * 200}/{i}" for i in range(20_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for step in (1, 2):
            store.ingest(Record(RUN, step, dict.fromkeys(keys, 1.0)))
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    state = store.run(RUN)
    counted = len(state.dropped_keys) + state.dropped_unremembered
    assert abs(counted - 19_990) < 19_990 * 0.03, counted  # each key once, however often logged
    assert retained < 1 << 20, f"{retained} bytes kept for keys that are not served"


def test_two_keys_with_one_sanitised_name_are_two_series():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 1, {"a:b": 1.0, "a/b": 2.0}))
    store.ingest(Record(RUN, 2, {"a/b": 3.0}))
    series = {key[0]: value for key, (_, value) in store.run(RUN).series.items()}
    assert series.pop("verl_a_b") == 1.0  # the first key seen keeps the name
    [(name, value)] = series.items()
    assert name.startswith("verl_a_b_") and value == 3.0


def test_source_up_is_capped(tmp_path):
    store = RunStore(default_catalog(), max_error_sources=5)
    for i in range(50):
        (tmp_path / f"{i:02}.log").write_text("")
    (tmp_path / "49.log").unlink()
    (tmp_path / "49.log").mkdir()  # one that cannot be read, beyond the cap
    Source(str(tmp_path / "*.log"), store).poll()
    sources = store.snapshot().sources
    assert len(sources) <= 6 and sources.get("other"), sources


def test_a_file_in_a_shared_folder_cannot_finish_another_run(tmp_path):
    shared = tmp_path / "shared" / "p"
    shared.mkdir(parents=True)
    (shared / "e.jsonl").write_text(_step(1, {"actor/pg_loss": 0.5}))
    store = RunStore(default_catalog())
    source = Source(str(tmp_path / "shared" / "*" / "*"), store)
    source.poll()
    (shared / "e.log").write_text("step:99 - actor/pg_loss:9.0\nFinal validation metrics: {}\n")  # p/e too
    source.poll()
    state = store.run(RUN)
    assert (state.last_step, state.finished, state.values["actor/pg_loss"]) == (1, False, 0.5)
    assert store.snapshot().values_dropped.get((str(shared / "e.log"), "other_source"))
