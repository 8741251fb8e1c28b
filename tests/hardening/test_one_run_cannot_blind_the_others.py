"""What one run's log holds never fails another run's series: a config print whose names and model
path hold lone surrogates, a `Total training steps` of 400 digits, settings of hundreds of digits, and
any run whose families cannot be built (client_python's path and the render cache alike)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from owner import ME
from verl_exporter.collectors import run_cache
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.exposition import Exposition
from verl_exporter.sources import Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore

HOSTILE = (
    "(TaskRunner pid=1) {'trainer': {'project_name': 'team\\udce9', 'experiment_name': 'run',"
    " 'total_training_steps': " + "9" * 400 + "},\n"
    "(TaskRunner pid=1)  'actor_rollout_ref': {'model': {'path': '/models/\\udce9x'},"
    " 'actor': {'clip_ratio': " + "7" * 300 + "}}}\n"
    "(TaskRunner pid=1) Total training steps: " + "9" * 400 + "\n"
    "(TaskRunner pid=1) step:1 - actor/pg_loss:0.1\n"
)


def _store(tmp_path):
    hostile, plain = tmp_path / "hostile.log", tmp_path / "plain.log"
    hostile.write_text(HOSTILE, encoding="utf-8")
    plain.write_text("step:1 - actor/pg_loss:0.2\nstep:2 - actor/pg_loss:0.3\n", encoding="utf-8")
    store = RunStore(default_catalog())
    for path in (hostile, plain):
        Source(str(path), store).poll()
    return store, Exposition([TrainingCollector(store)])


def client_python(exposition):
    return generate_latest(exposition.registry)


def text_parts(exposition):
    return exposition.text()


@pytest.mark.parametrize("render", [client_python, text_parts])
def test_a_hostile_config_print_names_its_run_readably_and_blinds_no_other(tmp_path, render):
    _, registry = _store(tmp_path)
    text = render(registry).decode("utf-8")
    assert 'verl_training_last_step{experiment="plain",project="' in text
    assert f'verl_training_last_step{{experiment="run",project="team\ufffd",team="",user="{ME}"}} 1.0' in text
    assert "verl_training_total_steps{" not in text, "a length beyond 2^53 is no length"
    assert 'verl_exporter_parse_errors_total{source="' in text


@pytest.mark.parametrize("render", [client_python, text_parts])
def test_a_run_whose_families_cannot_be_built_is_left_out_alone(tmp_path, monkeypatch, render):
    _, registry = _store(tmp_path)
    build = TrainingCollector.run_families

    def failing(self, state, logged=True):
        if state.run.experiment == "run":
            raise OverflowError("int too large to convert to float")
        return build(self, state, logged)

    monkeypatch.setattr(TrainingCollector, "run_families", failing)
    monkeypatch.setattr(run_cache, "_WARNED_RUNS", set())
    text = render(registry).decode("utf-8")
    assert 'experiment="plain"' in text and 'experiment="run"' not in text
    assert "verl_training_runs 2.0" in text
