from exposition import matching, samples
from exposition import scrape as scrape_collectors
from promtool import check_metrics
from verl_exporter import config
from verl_exporter.catalog import default_catalog
from verl_exporter.collectors.node import NodeCollector
from verl_exporter.records import Record, RunKey
from verl_exporter.store import RunStore


def node_runs(text: str) -> set[tuple[str, str]]:
    return {(dict(labels)["project"], dict(labels)["experiment"])
            for (name, labels), value in samples(text).items() if name == "verl_node_run_info" and value == 1}


def test_a_worker_serves_the_run_of_its_flags():
    text = scrape_collectors(node=NodeCollector(None, lambda: ("gsm8k", "grpo")))
    assert node_runs(text) == {("gsm8k", "grpo")}
    assert check_metrics(text) == ""


def test_without_a_named_run_or_logs_nothing_is_served():
    for named in ((None, None), ("gsm8k", None), (None, "grpo"), ("", "")):
        text = scrape_collectors(node=NodeCollector(RunStore(default_catalog()), lambda named=named: named))
        assert node_runs(text) == set()
        assert matching(text, "verl_exporter_collector_success", collector="node") == [1]


def test_the_head_serves_the_unfinished_runs_it_follows_and_the_flags():
    store = RunStore(default_catalog())
    store.ingest(Record(RunKey("gsm8k", "a"), 1, {"actor/pg_clipfrac": 0.1}, time=1.0, source="a.jsonl"))
    store.ingest(Record(RunKey("gsm8k", "b"), 1, {"actor/pg_clipfrac": 0.1}, time=1.0, source="b.jsonl",
                        finished=True))
    named = ["math", "c"]
    collector = NodeCollector(store, lambda: tuple(named))
    assert node_runs(scrape_collectors(node=collector)) == {("gsm8k", "a"), ("math", "c")}
    named[:] = ["gsm8k", "a"]  # a reload that names the followed run: one series
    assert node_runs(scrape_collectors(node=collector)) == {("gsm8k", "a")}


def test_project_and_experiment_default_to_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_EXPORTER_PROJECT", "gsm8k")
    monkeypatch.setenv("VERL_EXPORTER_EXPERIMENT", "grpo")
    settings = config.load([])
    assert (settings.project, settings.experiment) == ("gsm8k", "grpo")
    # The command line wins over the environment, and so does the config file.
    assert config.load(["--project", "math"]).project == "math"
    path = tmp_path / "exporter.yml"
    path.write_text("experiment: from-file\n")
    assert config.load(["--config.file", str(path)]).experiment == "from-file"
    monkeypatch.setenv("VERL_EXPORTER_PROJECT", "")
    assert config.load([]).project is None
    monkeypatch.delenv("VERL_EXPORTER_EXPERIMENT")
    assert config.load([]).experiment is None
