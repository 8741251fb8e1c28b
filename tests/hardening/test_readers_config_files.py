"""Config files and prints cost a bounded parse, once per change, off the ingest path: a large or
slow config file never delays the steps of other sources, a config file is parsed again only
when it changes, and a config print with more items than any real one is refused before parsing."""

from __future__ import annotations

import threading
import time

from owner import ME
from verl_exporter.sources import Ingestor, Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore

CONFIG = "trainer:\n  project_name: p\n  experiment_name: e\n  total_training_steps: 10\n"


def _log(tmp_path):
    path = tmp_path / "q" / "other.log"
    path.parent.mkdir()
    path.write_text("step:1 - actor/pg_loss:0.1\n")
    return path


def test_a_dense_config_file_does_not_hold_up_the_ingest_thread(tmp_path):
    dense = tmp_path / "config.yaml"
    dense.write_text(CONFIG + "x: [" + "1," * 125_000 + "1]\n")  # 256 KiB of items
    store = RunStore(default_catalog())
    ingestor = Ingestor([Source(str(dense), store), Source(str(_log(tmp_path)), store)])
    started = time.monotonic()
    ingestor.poll_all()
    assert time.monotonic() - started < 1.5
    assert store.run(RunKey("q", "other", ME)).last_step == 1


def test_a_slow_config_file_is_read_on_its_own_thread(tmp_path):
    from verl_exporter.sources.config_files import ConfigReader, read_config_file

    release = threading.Event()

    def slow(path):
        release.wait(10)
        return read_config_file(path)

    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    store = RunStore(default_catalog())
    source = Source(str(config), store, config_reader=ConfigReader(slow))
    other = Source(str(_log(tmp_path)), store)
    started = time.monotonic()
    source.poll()
    other.poll()
    assert time.monotonic() - started < 1.0
    assert store.run(RunKey("q", "other", ME)).last_step == 1 and not source.caught_up
    release.set()
    source.settle()
    assert store.run(RunKey("p", "e", ME)).total_steps == 10


def test_a_config_file_is_parsed_once_per_change(tmp_path):
    from verl_exporter.sources.config_files import ConfigReader, read_config_file

    reads = []

    def counted(path):
        reads.append(path)
        return read_config_file(path)

    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    store = RunStore(default_catalog())
    source = Source(str(config), store, config_reader=ConfigReader(counted))
    for _ in range(5):
        source.settle()
    assert len(reads) == 1
    with config.open("a") as handle:
        for i in range(20):  # many appends between two polls: one parse
            handle.write(f"k{i}: {i}\n")
            handle.flush()
    for _ in range(3):
        source.settle()
    assert len(reads) == 2 and store.run(RunKey("p", "e", ME)).total_steps == 10


def test_a_config_print_with_more_items_than_any_real_one_is_refused_before_parsing(tmp_path):
    prefix = "(TaskRunner pid=1) "
    rows = []
    for run in range(7):  # 1.9 MB: seven prints of 250 kB
        rows.append(prefix + "{'trainer': {'project_name': 'p', 'experiment_name': 'e%d'}," % run)
        rows += [prefix + f" 'x{i}': {{" + ", ".join(f"'k{j}': {j}" for j in range(20)) + "}," for i in range(1000)]
        rows.append(prefix + " 'end': 0}")
    log = tmp_path / "p" / "run.log"
    log.parent.mkdir()
    log.write_text("\n".join(rows) + "\n")
    store = RunStore(default_catalog())
    started = time.monotonic()
    Source(str(log), store).poll()
    assert time.monotonic() - started < 3.0
    assert store.snapshot().parse_errors == {str(log): 7}


def test_a_config_read_that_ends_while_settling_is_never_missed(tmp_path):
    """The reader's result may land between the source's checks of its outbox and of the reader:
    settle still ingests it (the reader is asked first, then the outbox)."""
    from collections import deque

    from verl_exporter.sources.config_files import ConfigReader, read_config_file

    class FinishesWhenAsked(ConfigReader):
        """Holds each read until ``pending`` is asked, then hands it over and says it is done."""

        def __init__(self):
            super().__init__(read_config_file)
            self.held: list[tuple[deque, str]] = []

        def submit(self, outbox, path):
            self.held.append((outbox, path))

        def pending(self, outbox):
            for box, path in self.held:
                box.append((path, self.read(path)))
            self.held.clear()
            return False

    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    store = RunStore(default_catalog())
    source = Source(str(config), store, config_reader=FinishesWhenAsked())
    source.settle(timeout=5)
    assert store.run(RunKey("p", "e", ME)).total_steps == 10
