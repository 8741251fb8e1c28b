"""The benchmark scripts keep working: ``run.py --quick`` runs each one and writes its JSON."""

import json
import subprocess
import sys

import yaml

from servers import REPO
from verl_exporter.shipped import dashboards_dir, rule_files

BENCHMARKS = REPO / "tests" / "benchmarks"


def test_quick_benchmark_run_writes_every_result(tmp_path):
    out = tmp_path / "results"
    result = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name, measure in [("scrape", "ratio of medians (ours / node_exporter)"), ("ingest", "jsonl: throughput"),
                          ("overhead", "1 run: share of one core"), ("rules", "2 runs: rule evaluation, all groups"),
                          ("fleet", "20 runs: scrape median"),
                          ("dashboards", "prometheus every panel query: p50 / p95 / max")]:
        data = json.loads((out / f"{name}.json").read_text())
        assert data["environment"]["quick"] is True and data["environment"]["commit"]
        rows = {row["what"]: row for row in data["table"]}
        assert isinstance(rows[measure]["value"], (int, float, str)), rows[measure]
        assert measure in result.stdout
    scrape = json.loads((out / "scrape.json").read_text())["figures"]
    assert scrape["verl-exporter"]["n"] == scrape["node_exporter"]["n"] == 20
    assert scrape["verl-exporter"]["series"] > 300  # every catalog metric, 8 GPUs, host
    fleet = json.loads((out / "fleet.json").read_text())["figures"]
    assert fleet["descriptors"]["runs_served"] == 60 and fleet["backlog"]["ready_was_complete"]
    rules = json.loads((out / "rules.json").read_text())["figures"]
    assert rules["rule_files"], "no shipped rule file was found"
    assert rules["by_runs"]["2"]["series_per_run"] > 0

    dashboards = json.loads((out / "dashboards.json").read_text())["figures"]
    shipped_groups = {group["name"] for path in rule_files() for group in yaml.safe_load(path.read_text())["groups"]}
    for backend in ("prometheus", "victoriametrics"):  # every dashboard's queries, every rule group
        assert set(dashboards[backend]["dashboards"]) == {path.name for path in dashboards_dir().glob("*.json")}
        assert all(dash["n"] > 0 and dash["p50"] <= dash["p95"] <= dash["max"]
                   for dash in dashboards[backend]["dashboards"].values())
        assert set(dashboards[backend]["groups"]) == shipped_groups
    for scraped in ("all", "halved"):  # a Prometheus scraping the fleet, its own rule evaluations
        assert set(dashboards["memory"][scraped]["rule_groups"]) == shipped_groups
    assert dashboards["memory"]["halved"]["head_series"] < dashboards["memory"]["all"]["head_series"]

    compared = subprocess.run([sys.executable, str(BENCHMARKS / "compare.py"), str(out), str(out)],
                              capture_output=True, text=True, timeout=60)
    assert compared.returncode == 0 and "1.00x" in compared.stdout, compared.stdout + compared.stderr


def test_unknown_benchmark_is_refused():
    result = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--only", "nope"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown benchmark" in result.stderr
