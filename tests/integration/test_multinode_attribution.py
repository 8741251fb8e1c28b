"""A run on three nodes, attributed end to end by a real Prometheus with the shipped recording rules.

The head exporter follows the run's log (a simulated healthy run, demo/healthy) with 8 fake GPUs;
two worker exporters read no logs and serve 8 fake GPUs each, one naming the run with
``--project``/``--experiment``, the other through ``VERL_EXPORTER_PROJECT``/``VERL_EXPORTER_EXPERIMENT``.
A fourth exporter works for another run (idle GPUs) and must count for that run only. Prometheus
scrapes all four as job "verl" and evaluates prometheus/recording-rules.yml.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from unittest import mock

import pytest

from owner import ME
from servers import prom_query, start_exporter, start_prometheus, wait_until
from verl_exporter import shipped

RUN = {"project": "demo", "experiment": "healthy"}
SELECTOR = 'project="demo", experiment="healthy"'
GPUS_PER_NODE = 8


def prom_query_at(prom, expr: str, at: float) -> float:
    status, body = prom.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": at}))
    assert status == 200, body
    return float(json.loads(body)["data"]["result"][0]["value"][1])


def value(prom, expr: str) -> float:
    result = prom_query(prom, expr)
    assert len(result) == 1, f"{expr}: want one series, got {result}"
    return float(result[0]["value"][1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multinode")
    gpus = ("--gpu.fake", f"healthy:{GPUS_PER_NODE}")
    with start_exporter(tmp, "--simulate", "healthy", "--simulate.interval", "0.5", "--simulate.dir",
                        str(tmp / "runs"), *gpus) as head, \
            start_exporter(tmp, "--project", "demo", "--experiment", "healthy", *gpus) as worker1, \
            mock.patch.dict(os.environ, {"VERL_EXPORTER_PROJECT": "demo", "VERL_EXPORTER_EXPERIMENT": "healthy"}), \
            start_exporter(tmp, *gpus) as worker2:
        with start_exporter(tmp, "--project", "demo", "--experiment", "other", "--gpu.fake",
                            f"idle:{GPUS_PER_NODE}") as other:
            exporters = {"head": head, "worker1": worker1, "worker2": worker2, "other": other}
            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": ["recording-rules.yml"],
                "scrape_configs": [{"job_name": "verl", "static_configs": [
                    {"targets": [f"127.0.0.1:{e.port}" for e in exporters.values()]}]}],
            }
            with start_prometheus(tmp, config, rule_files=[shipped.recording_rules_file()]) as prom:
                # Each target has its own scrape offset: wait for both runs' GPUs, so that every node
                # was scraped and the rules evaluated after it.
                wait_until(lambda: prom_query(prom, f"project_experiment:verl_gpus:count{{{SELECTOR}}} == 24")
                           and prom_query(prom, 'project_experiment:verl_gpus:count{project="demo", '
                                                f'experiment="other"}} == {GPUS_PER_NODE}'),
                           timeout=60, message="24 GPUs attributed to the run, 8 to the other run")
                yield prom, {name: f"127.0.0.1:{e.port}" for name, e in exporters.items()}


def test_every_node_serves_the_run_it_works_for(cluster):
    prom, instances = cluster
    found = {(r["metric"]["instance"], r["metric"]["project"], r["metric"]["experiment"])
             for r in prom_query(prom, "verl_node_run_info == 1")}
    assert found == {(instances["head"], "demo", "healthy"), (instances["worker1"], "demo", "healthy"),
                     (instances["worker2"], "demo", "healthy"), (instances["other"], "demo", "other")}
    # Only the head follows the log: the join through verl_training_run_info sees a third of the GPUs.
    assert value(prom, "count(verl_gpu_up * on(instance) group_left() group by (instance) "
                       f"(verl_training_run_info{{{SELECTOR}}}))") == GPUS_PER_NODE


def test_per_run_figures_cover_all_24_gpus(cluster):
    prom, _ = cluster
    assert value(prom, f"project_experiment:verl_nodes:count{{{SELECTOR}}}") == 3
    assert value(prom, f"project_experiment:verl_gpus:count{{{SELECTOR}}}") == 24
    assert value(prom, f"project_experiment:verl_gpus_up:sum{{{SELECTOR}}}") == 24
    per_gpu_total = value(prom, "max(verl_gpu_memory_total_bytes)")
    assert value(prom, f"project_experiment:verl_gpu_memory_total_bytes:sum{{{SELECTOR}}}") == 24 * per_gpu_total
    # The recorded figures equal the same aggregate over the three nodes' GPUs at the rule's own
    # timestamp (the last recorded sample's). A scrape stamped just before an evaluation but stored
    # just after it is in the direct aggregate only: the fake GPUs move by a few watts a second, so
    # 2% absorbs it, while a node left out would cost a third of a sum.
    nodes = 'instance=~"{}"'.format("|".join(i for n, i in cluster[1].items() if n != "other"))
    pairs = (("verl_gpu_utilization_ratio:avg", "avg(verl_gpu_utilization_ratio{%s})"),
             ("verl_gpu_power_watts:sum", "sum(verl_gpu_power_watts{%s})"),
             ("verl_gpu_memory_used_bytes:sum", "sum(verl_gpu_memory_used_bytes{%s})"))

    def recorded_equals_direct() -> bool:
        for recorded, direct in pairs:
            at, got = prom_query(prom, f"project_experiment:{recorded}{{{SELECTOR}}}[10s]")[0]["values"][-1]
            expected = prom_query_at(prom, direct % nodes, at)
            if float(got) != pytest.approx(expected, rel=0.02):
                return False
        return True

    wait_until(recorded_equals_direct, timeout=30, interval=0.3, message="recorded figures equal to the 24 GPUs'")
    assert value(prom, f"project_experiment:verl_gpu_utilization_ratio:avg{{{SELECTOR}}}") > 0.8


def test_another_runs_node_counts_for_that_run_only(cluster):
    prom, _ = cluster
    assert value(prom, 'project_experiment:verl_gpus:count{project="demo", experiment="other"}') == GPUS_PER_NODE
    assert value(prom, 'project_experiment:verl_gpu_utilization_ratio:avg{project="demo", experiment="other"}') == 0


def test_run_dashboard_lists_the_runs_nodes_and_their_gpus(cluster):
    prom, instances = cluster
    dashboard = json.loads((shipped.dashboards_dir() / "run-detail.json").read_text())
    panels = {p["title"]: p for p in dashboard["panels"] if "targets" in p}

    def results(title: str, ref: int = 0) -> list:
        # $instance (hidden, every node of the run) as any node: the join to verl_node_run_info keeps the run's.
        expr = (panels[title]["targets"][ref]["expr"].replace("$project", "demo").replace("$experiment", "healthy")
                .replace("$user", ME).replace("$instance", ".*"))
        return prom_query(prom, expr)

    nodes = {r["metric"]["instance"] for r in results("Nodes of this run")}
    assert nodes == {instances["head"], instances["worker1"], instances["worker2"]}
    assert len(results("GPU utilization")) == 24
