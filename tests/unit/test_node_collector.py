import pytest

from exposition import matching, samples
from exposition import scrape as scrape_collectors
from owner import ME
from promtool import check_metrics
from verl_exporter.collectors.node import NodeCollector
from verl_exporter.config.options import OptionsError, load_options
from verl_exporter.schedulers import scheduler
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.owners import NO_TEAMS
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore


def node_collector(store, named, max_runs=lambda: 8) -> NodeCollector:
    """The node collector of a sidecar (no scheduler): the flags' run and the store's."""
    return NodeCollector(scheduler.local(store, NO_TEAMS, None, named, max_runs).node_runs)


def node_runs(text: str) -> set[tuple[str, str]]:
    return {(dict(labels)["project"], dict(labels)["experiment"])
            for (name, labels), value in samples(text).items() if name == "verl_node_run_info" and value == 1}


def test_a_worker_serves_the_run_of_its_flags():
    text = scrape_collectors(node=node_collector(None, lambda: ("gsm8k", "grpo")))
    assert node_runs(text) == {("gsm8k", "grpo")}
    assert check_metrics(text) == ""


def test_without_a_named_run_or_logs_nothing_is_served():
    for named in ((None, None), ("gsm8k", None), (None, "grpo"), ("", "")):
        text = scrape_collectors(node=node_collector(RunStore(default_catalog()), lambda named=named: named))
        assert node_runs(text) == set()
        assert matching(text, "verl_exporter_collector_success", collector="node") == [1]


def test_the_head_serves_the_unfinished_runs_it_follows_and_the_flags():
    store = RunStore(default_catalog())
    store.ingest(Record(RunKey("gsm8k", "a", ME), 1, {"actor/pg_clipfrac": 0.1}, time=1.0, source="a.jsonl"))
    store.ingest(Record(RunKey("gsm8k", "b"), 1, {"actor/pg_clipfrac": 0.1}, time=1.0, source="b.jsonl",
                        finished=True))
    named = ["math", "c"]
    collector = node_collector(store, lambda: tuple(named))
    assert node_runs(scrape_collectors(node=collector)) == {("gsm8k", "a"), ("math", "c")}
    named[:] = ["gsm8k", "a"]  # a reload that names the followed run: one series
    assert node_runs(scrape_collectors(node=collector)) == {("gsm8k", "a")}


def test_project_and_experiment_default_to_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_EXPORTER_PROJECT", "gsm8k")
    monkeypatch.setenv("VERL_EXPORTER_EXPERIMENT", "grpo")
    settings = load_options([])
    assert (settings.project, settings.experiment) == ("gsm8k", "grpo")
    # The command line wins over the environment, and so does the config file.
    assert load_options(["--project", "math"]).project == "math"
    path = tmp_path / "exporter.yml"
    path.write_text("experiment: from-file\n")
    assert load_options(["--config.file", str(path)]).experiment == "from-file"
    monkeypatch.setenv("VERL_EXPORTER_PROJECT", "")
    assert load_options([]).project is None
    monkeypatch.delenv("VERL_EXPORTER_EXPERIMENT")
    assert load_options([]).experiment is None


def test_an_exporter_of_a_shared_directory_is_none_of_its_runs_nodes():
    store = RunStore(default_catalog())
    for index in range(9):
        store.ingest(Record(RunKey("gsm8k", f"run-{index}"), 1, {"actor/pg_clipfrac": 0.1}, time=1.0,
                            source=f"run-{index}.jsonl"))
    limit = [9]
    collector = node_collector(store, lambda: ("math", "named"), lambda: limit[0])
    assert len(node_runs(scrape_collectors(node=collector))) == 10
    # One unfinished run more than --node.max-runs: its GPUs are no followed run's, the named run keeps them.
    limit[0] = 8
    assert node_runs(scrape_collectors(node=collector)) == {("math", "named")}
    store.ingest(Record(RunKey("gsm8k", "run-0"), 2, {"actor/pg_clipfrac": 0.1}, time=2.0, source="run-0.jsonl",
                        finished=True))
    assert len(node_runs(scrape_collectors(node=collector))) == 9  # 8 unfinished again, and the named run


def test_node_max_runs_is_a_positive_flag():
    assert load_options([]).node_max_runs == 8
    assert load_options(["--node.max-runs", "1"]).node_max_runs == 1
    with pytest.raises(OptionsError, match="node.max-runs"):
        load_options(["--node.max-runs", "0"])
