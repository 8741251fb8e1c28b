"""verl_exporter_source_up: every configured path and glob match says whether it can be read, and
the log says why not, once per reason; a FIFO, a device or a directory is never read."""

import logging
import os
import threading

import pytest

from exposition import sample_value
from exposition import scrape as scrape_collectors
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.sources import RecordsOnly, Source, tail
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore


def scrape(store) -> str:
    return scrape_collectors(training=TrainingCollector(store))


def poll(source) -> None:
    """One poll, on a thread that must come back: a blocked read would hang the test instead."""
    done = threading.Thread(target=source.poll, daemon=True)
    done.start()
    done.join(60)
    assert not done.is_alive(), "poll blocked"


@pytest.fixture
def unusable(tmp_path):
    """Paths of every kind the exporter cannot read, and a good file."""
    paths = {"good": tmp_path / "good.log", "directory": tmp_path / "dir.log", "fifo": tmp_path / "fifo.log",
             "loop": tmp_path / "loop.log", "broken link": tmp_path / "broken.log", "missing": tmp_path / "missing.log"}
    paths["good"].write_text("step:1 - a:1\n")
    paths["directory"].mkdir()
    os.mkfifo(paths["fifo"])
    paths["loop"].symlink_to(paths["loop"])
    paths["broken link"].symlink_to(tmp_path / "nowhere")
    return paths


REASONS = {"good": None, "directory": "is a directory, not a regular file", "fifo": "is a FIFO, not a regular file",
           "loop": "cannot read it: Too many levels of symbolic links", "broken link": "is a broken symbolic link",
           "missing": "does not exist", "device": "is a character device, not a regular file"}


def test_each_configured_path_says_whether_it_can_be_read(unusable, caplog):
    store = RunStore(default_catalog())
    paths = dict(unusable, device="/dev/null")
    sources = [Source(str(path), store) for path in paths.values()]
    with caplog.at_level(logging.INFO):
        for source in sources:
            poll(source)
            poll(source)
    text = scrape(store)
    for kind, path in paths.items():
        assert sample_value(text, "verl_exporter_source_up", source=str(path)) == (0 if REASONS[kind] else 1), kind
        if REASONS[kind]:
            assert caplog.text.count(f"cannot follow {path}: {REASONS[kind]}") == 1, kind
    assert sample_value(text, "verl_training_last_step", experiment="good") == 1


def test_a_glob_reports_its_matches_and_forgets_those_that_go(unusable):
    store = RunStore(default_catalog())
    source = Source(str(unusable["good"].parent / "*.log"), store)
    poll(source)
    text = scrape(store)
    for kind, path in unusable.items():
        expected = None if kind == "missing" else (0 if REASONS[kind] else 1)
        assert sample_value(text, "verl_exporter_source_up", source=str(path)) == expected, kind
    unusable["directory"].rmdir()
    poll(source)
    assert sample_value(scrape(store), "verl_exporter_source_up", source=str(unusable["directory"])) is None


def test_the_reason_is_logged_again_only_when_it_changes(tmp_path, caplog, monkeypatch):
    path = tmp_path / "run.log"
    store = RunStore(default_catalog())
    source = Source(str(path), store)
    real_open = os.open

    def denied(name, *args, **kwargs):
        if os.fspath(name) == str(path):
            raise PermissionError(13, "Permission denied")
        return real_open(name, *args, **kwargs)

    with caplog.at_level(logging.INFO):
        poll(source)
        poll(source)  # missing: said once
        path.write_text("step:1 - a:1\n")
        monkeypatch.setattr(tail.os, "open", denied)
        poll(source)
        poll(source)  # unreadable: said once
        assert sample_value(scrape(store), "verl_exporter_source_up", source=str(path)) == 0
        monkeypatch.setattr(tail.os, "open", real_open)
        poll(source)
        poll(source)
    assert sample_value(scrape(store), "verl_exporter_source_up", source=str(path)) == 1
    assert sample_value(scrape(store), "verl_training_last_step", experiment="run") == 1
    messages = [record.getMessage() for record in caplog.records if str(path) in record.getMessage()]
    assert messages == [f"cannot follow {path}: does not exist",
                        f"cannot follow {path}: cannot read it: Permission denied",
                        f"{path} can be read again"]


def test_a_closed_source_is_forgotten(unusable):
    store = RunStore(default_catalog())
    source = Source(str(unusable["good"].parent / "*.log"), store)
    kept = Source(str(unusable["missing"]), store)
    poll(source)
    poll(kept)
    source.close()
    text = scrape(store)
    assert [path for path in map(str, unusable.values())
            if sample_value(text, "verl_exporter_source_up", source=path) is not None] == [str(unusable["missing"])]


def test_a_file_that_becomes_a_fifo_is_not_read(tmp_path):
    path = tmp_path / "run.log"
    path.write_text("step:1 - a:1\n")
    store = RunStore(default_catalog())
    source = Source(str(path), store)
    poll(source)
    path.unlink()
    os.mkfifo(path)
    writer = os.open(path, os.O_RDWR)  # a writer that never closes: a blocking read would never return
    try:
        poll(source)
        poll(source)
    finally:
        os.close(writer)
    text = scrape(store)
    assert sample_value(text, "verl_exporter_source_up", source=str(path)) == 0
    assert sample_value(text, "verl_training_last_step", experiment="run") == 1


def test_a_store_that_takes_only_records_still_works(tmp_path):
    class Minimal(RecordsOnly):
        def __init__(self):
            self.records = []

        def ingest(self, record):
            self.records.append(record)

        def parse_error(self, source, reason):
            pass

    (tmp_path / "run.jsonl").write_text('{"step": 1, "data": {"a": "0x10", "b": 1}}\n')
    store = Minimal()
    source = Source(str(tmp_path / "*.jsonl"), store)
    source.poll()
    assert [record.values for record in store.records] == [{"b": 1.0}]
