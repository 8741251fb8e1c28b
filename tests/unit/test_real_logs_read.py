"""Every real verl log in ../shared/real-runs (other people's runs, read in place, never copied here)
reads as the exporter reads it live: no parse error, no warning about the config print, and a run
that printed its config is named by the config's trainer.project_name / experiment_name."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from record_keeper import RecordCollector

from verl_exporter.sources import Source
from verl_exporter.sources.console import content

REAL_RUNS = Path(__file__).resolve().parents[2].parent / "shared" / "real-runs"
LOGS = sorted(path for path in REAL_RUNS.glob("*/*") if path.name != "SOURCE.md") if REAL_RUNS.is_dir() else []


def has_config_print(path: Path) -> bool:
    """A line whose printed text opens a dict, and verl's trainer names somewhere in the file."""
    opened = named = False
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            opened = opened or content(line).lstrip().startswith("{'")
            named = named or "'project_name': '" in line
    return opened and named


@pytest.mark.skipif(not LOGS, reason=f"the real logs are not here ({REAL_RUNS})")
@pytest.mark.parametrize("path", LOGS or [Path("none")], ids=lambda path: path.parent.name)
def test_a_real_log_reads_without_errors_and_names_its_run_from_its_config(path, caplog):
    store = RecordCollector()
    source = Source(str(path), store)
    with caplog.at_level(logging.WARNING, logger="verl_exporter"):
        for _ in range(10_000):
            source.poll()
            if source.caught_up and not source.behind:
                break
        source.close()
    assert source.caught_up
    assert store.errors == []
    assert [r.getMessage() for r in caplog.records if "config" in r.getMessage()] == []
    assert store.records
    settings = [record for record in store.records if record.run_config]
    if has_config_print(path):
        assert len(settings) == 1
        flat = settings[0].run_config
        names = (flat["trainer.project_name"], flat["trainer.experiment_name"])
        assert {(record.run.project, record.run.experiment) for record in store.records} == {names}
