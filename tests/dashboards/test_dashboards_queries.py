"""Every dashboard query returns data from the real exporter through a real Prometheus.

One exporter follows a simulated PPO run with 8 fake GPUs (the ``hot`` fake: GPU 0 runs hot with ECC
and XID errors and a remapped-row failure, so the panels of the GPUs that have any show one); its config
names the run's GPUs, so the exporter serves its goodput ledger. Debian's Prometheus scrapes it every
second and evaluates two test alerts that fire at once (so ``ALERTS`` has firing series labelled with
the run, as the shipped alerts have; the second is named as a training diagnosis, so the goodput rules
see the run diagnosed). Variables are filled the way Grafana fills them: each variable's own query runs
first and its first value is used; the GPU-hour price text box is set (``PRICE``), so the costs are shown.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse

import pytest
import yaml
from dashboard_models import (
    fixed_value,
    gated,
    label_values_query,
    load_dashboards,
    may_be_empty,
    panels,
    substitute,
    variable_query,
    variable_value,
    variables,
)

from metrics_server import MetricsServer
from owner import ME
from servers import prom_query, start_exporter, start_prometheus, wait_until
from verl_exporter import shipped
from verl_mixin.dashboards import fleet

DASHBOARDS = load_dashboards()
# A training diagnosis (one of the alerts run:verl_training_diagnosed:firing reads), for the goodput row.
DIAGNOSIS = re.search(r'alertname=~"(\w+)', next(
    rule["expr"] for group in yaml.safe_load(shipped.recording_rules_file().read_text())["groups"]
    for rule in group["rules"] if rule.get("record") == "run:verl_training_diagnosed:firing")).group(1)
TEST_ALERT_RULES = f"""
groups:
  - name: dashboard-test
    rules:
      - alert: VerlDashboardTestAlert
        expr: verl_training_last_step >= 0
        labels: {{severity: warning}}
        annotations: {{summary: "Always firing, so that the ALERTS queries of the dashboards have data"}}
      - alert: {DIAGNOSIS}
        expr: verl_training_last_step >= 0
        labels: {{severity: warning}}
        annotations: {{summary: "A diagnosis of the run, always firing: its productive time is waste"}}
"""
PRICE = "2.5"  # the fleet overview's GPU-hour price, as an operator would type it
# Every bucket of the goodput ledger (verl_exporter.store.ledger.BUCKETS).
BUCKETS = {"startup", "productive", "validation", "checkpoint", "between_steps", "stalled", "lost"}

ROLLOUT_LABELS = {"project": "demo", "experiment": "healthy", "engine": "vllm"}
# The scheduler's job of the run, as the exporter serves it for a Slurm job: under the run's labels, its
# owner (the user of the simulated run's files) included; labels a scheduler or owner lacks are empty, so
# Prometheus stores them not at all.
TEAM = "research"  # the run's owner's team (--owner.teams)
JOB_INFO = ('verl_job_info{project="demo", experiment="healthy", user="%s", team="research", scheduler="slurm", '
            'job_id="4242", job_name="grpo-gsm8k", partition="gpu", namespace="", pod=""} 1\n' % ME)
# A vLLM server's metrics (its own names), with a counter that moves between scrapes.
VLLM_METRICS = lambda: (  # noqa: E731
    'vllm:num_requests_running{model_name="qwen"} 12\n'
    'vllm:num_requests_waiting{model_name="qwen"} 3\n'
    'vllm:kv_cache_usage_perc{model_name="qwen"} 0.42\n'
    f'vllm:generation_tokens_total{{model_name="qwen"}} {time.time() * 100:.0f}\n'
    f'vllm:num_preemptions_total{{model_name="qwen"}} {time.time():.0f}\n')


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard-queries")
    rules = tmp / "dashboard-test-alerts.yml"
    rules.write_text(TEST_ALERT_RULES)
    recording = shipped.recording_rules_file()  # the fleet table's progress and time left
    rollout = MetricsServer(VLLM_METRICS)
    scheduler = MetricsServer(JOB_INFO)
    teams = tmp / "teams.yml"
    teams.write_text(f"{TEAM}: [{ME}]\n")
    with rollout, scheduler, start_exporter(tmp, "--simulate", "healthy", "--simulate.interval", "0.2",
                                            "--simulate.dir", str(tmp / "runs"), "--gpu.fake", "hot:8",
                                            "--owner.teams", str(teams)) as exporter:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [rules.name, recording.name],
            "scrape_configs": [
                {"job_name": "verl", "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]},
                # The run's vLLM server, labelled as the rollout job's file_sd targets are.
                {"job_name": "rollout", "static_configs": [{"targets": [rollout.target], "labels": ROLLOUT_LABELS}]},
                # verl_job_info of the run, until the exporter's own scheduler collector serves it.
                {"job_name": "scheduler", "static_configs": [{"targets": [scheduler.target]}]},
            ],
        }
        with start_prometheus(tmp, config, rule_files=[rules, recording]) as prom:
            # Enough scrapes for rate() over $__rate_interval, a validation step, and the test alert firing.
            wait_until(lambda: prom_query(prom, "count_over_time(verl_gpu_ecc_errors_total[1m]) >= 4"),
                       timeout=40, message="four scrapes of the exporter")
            wait_until(lambda: prom_query(prom, "verl_val_core"), timeout=30, message="a validation step")
            wait_until(lambda: prom_query(prom, 'ALERTS{alertstate="firing"}'), timeout=30,
                       message="the test alert firing")
            wait_until(lambda: prom_query(prom, "project_experiment:verl_rollout_generation_tokens:rate5m"),
                       timeout=30, message="the rollout server's figures")
            wait_until(lambda: prom_query(prom, "verl_job_info"), timeout=30, message="the run's scheduler job")
            # GPU-hours add up recorded rates a minute apart: a minute mark passed since the run was diagnosed.
            wait_until(lambda: prom_query(prom, "sum_over_time((rate(verl_run_gpu_seconds_total"
                                                '{bucket="productive"}[1m]) and on(project, experiment, user, team)'
                                                " run:verl_training_diagnosed:firing)[5m:60s])"),
                       timeout=90, message="a minute's mark with the run's ledger and its diagnosis recorded")
            yield prom


def api(prom, path: str, **params) -> list:
    status, body = prom.get(f"{path}?{urllib.parse.urlencode(params, doseq=True)}")
    data = json.loads(body)
    if status != 200 or data.get("status") != "success":
        raise AssertionError(f"{path} {params} failed: {status} {body[:500]}")
    return data["data"]


def run_query(prom, expr: str, *, instant: bool) -> list:
    """The result of ``expr`` as Grafana asks for it: instant, or a range over the last minute."""
    if instant:
        return api(prom, "/api/v1/query", query=expr)["result"]
    end = time.time()
    return api(prom, "/api/v1/query_range", query=expr, start=end - 60, end=end, step=2)["result"]


def fill_variables(prom, dashboard: dict, *, pick_all: bool) -> dict[str, str]:
    """Each query variable's values from Prometheus, in dashboard order, as Grafana picks them: the first
    value, or "All" where the variable offers it and ``pick_all`` asks for it or it is the variable's default;
    a text box its default, but the GPU-hour price ``PRICE``."""
    values: dict[str, str] = {}
    for variable in variables(dashboard):
        if variable["type"] == "datasource":
            values[variable["name"]] = "prometheus"
            continue
        if fixed_value(variable) is not None:
            values[variable["name"]] = PRICE if variable["name"] == "gpu_hour_price" else str(fixed_value(variable))
            continue
        selector, label = label_values_query(substitute(variable_query(variable), values))
        found = api(prom, f"/api/v1/label/{label}/values", **{"match[]": selector})
        assert found or may_be_empty(variable), \
            f"variable {variable['name']!r} ({variable_query(variable)}) has no values"
        values[variable["name"]] = variable_value(variable, found, pick_all=pick_all)
    return values


@pytest.fixture(scope="module")
def variable_values(prometheus):
    """Variable values per dashboard, as picked one by one ("first") or with "All" selected ("all")."""
    return {(name, mode): fill_variables(prometheus, dashboard, pick_all=mode == "all")
            for name, dashboard in DASHBOARDS.items() for mode in ("first", "all")}


def all_queries() -> list:
    """(dashboard, variable mode, panel title, target) for every query; "all" only where "All" exists. Not
    those of a gated row: the simulated run logs no V1 or async metrics (test_run_detail_v1_rows.py)."""
    params = []
    for filename, dashboard in DASHBOARDS.items():
        found = [(panel["title"], target) for panel in panels(dashboard) if not gated(dashboard, panel)
                 for target in panel["targets"]]
        found += [("annotation " + a["name"], {"expr": a["expr"]})
                  for a in dashboard.get("annotations", {}).get("list", []) if a.get("expr")]
        modes = ["first"] + (["all"] if any(v.get("includeAll") for v in variables(dashboard)) else [])
        for mode in modes:
            params += [pytest.param(filename, mode, title, target,
                                    id=f"{filename[:-5]}:{mode}:{title}:{target.get('refId', 'A')}")
                       for title, target in found]
    return params


def test_every_variable_has_values(variable_values):
    assert variable_values["run-detail.json", "first"]["project"] == "demo"
    assert variable_values["run-detail.json", "first"]["experiment"] == "healthy"
    assert variable_values["gpu-nodes.json", "first"]["gpu"] == "0"
    assert variable_values["gpu-nodes.json", "all"]["gpu"] == ".*"


@pytest.mark.parametrize("filename, mode, title, target", all_queries())
def test_query_returns_data(prometheus, variable_values, filename, mode, title, target):
    expr = substitute(target["expr"], variable_values[filename, mode])
    result = run_query(prometheus, expr, instant=target.get("instant", False) and not target.get("range", False))
    assert result, f"{filename} panel {title!r} returned nothing: {expr}"


def test_a_wrong_or_empty_query_fails(prometheus, variable_values):
    values = variable_values["run-detail.json", "first"]
    assert run_query(prometheus, substitute('verl_actor_pg_clipfrack{project="$project"}', values), instant=False) == []
    assert run_query(prometheus, 'verl_actor_pg_clipfrac{project="no-such-project"}', instant=True) == []
    with pytest.raises(AssertionError, match="bad_data"):
        run_query(prometheus, "rate(verl_actor_pg_clipfrac{", instant=True)
    with pytest.raises(KeyError, match="no value"):
        substitute('verl_gpu_up{instance=~"$node"}', values)


def _instant(prom, dashboard: str, title: str, values: dict) -> list:
    panel = next(p for p in panels(DASHBOARDS[dashboard]) if p["title"] == title)
    return [series for target in panel["targets"]
            for series in prom_query(prom, substitute(target["expr"], values))]


def test_fleet_counts_and_table_rows(prometheus, variable_values):
    values = variable_values["fleet-overview.json", "all"]
    counts = {title: float(_instant(prometheus, "fleet-overview.json", title, values)[0]["value"][1])
              for title in ("Runs followed", "Healthy", "Warning", "Stalled")}
    # One run, with the (always firing) warning test alert.
    assert counts == {"Runs followed": 1, "Healthy": 0, "Warning": 1, "Stalled": 0}
    # Table queries merge on the run's labels (project, experiment, user, team):
    # each must return exactly those labels, one row per run; the scheduler's job adds its job id and
    # partition as cells, beside the run's user.
    table = next(p for p in panels(DASHBOARDS["fleet-overview.json"]) if p["type"] == "table")
    *figures, job = table["targets"]
    for target in figures:
        result = prom_query(prometheus, substitute(target["expr"], values))
        assert [sorted(r["metric"]) for r in result] == [["experiment", "project", "team", "user"]], target["expr"]
        assert [(r["metric"]["user"], r["metric"]["team"]) for r in result] == [(ME, TEAM)], target["expr"]
    result = prom_query(prometheus, substitute(job["expr"], values))
    assert [r["metric"] for r in result] == [{"project": "demo", "experiment": "healthy", "job_id": "4242",
                                              "user": ME, "team": TEAM, "partition": "gpu"}]
    renamed = next(t for t in table["transformations"] if t["id"] == "organize")["options"]["renameByName"]
    assert {renamed[label] for label in ("job_id", "user", "partition")} == {"Job", "User", "Partition"}


def test_fleet_table_keeps_a_run_without_a_scheduler_job(prometheus, variable_values):
    """A run whose exporter serves no verl_job_info (no scheduler found) keeps its row, with empty cells."""
    values = variable_values["fleet-overview.json", "all"]
    table = next(p for p in panels(DASHBOARDS["fleet-overview.json"]) if p["type"] == "table")
    expr = re.sub(r"verl_job_info(\{)?", lambda m: 'verl_job_info{job_id="none"' + (", " if m.group(1) else "}"),
                  substitute(table["targets"][-1]["expr"], values))
    assert [r["metric"] for r in prom_query(prometheus, expr)] == [{"project": "demo", "experiment": "healthy",
                                                                     "user": ME, "team": TEAM}]


def test_run_gpu_panels_join_the_runs_eight_gpus(prometheus, variable_values):
    values = variable_values["run-detail.json", "first"]
    series = _instant(prometheus, "run-detail.json", "GPU utilization", values)
    assert sorted(int(s["metric"]["gpu"]) for s in series) == list(range(8))
    spread = _instant(prometheus, "run-detail.json", "GPU spread across nodes", values)
    nodes = [s for s in spread if "instance" in s["metric"]]
    assert len(nodes) == 1 and len(spread) == 3  # the one node, the run's median and the straggler line
    assert float(nodes[0]["value"][1]) > 0.5  # the fake GPUs are busy
    share = _instant(prometheus, "run-detail.json", "Share of the step per phase", values)
    assert {s["metric"]["phase"] for s in share} == {"gen", "ref", "values", "adv", "update_critic", "update_actor"}
    assert all(0 < float(s["value"][1]) < 1 for s in share)


def _panel(title: str) -> dict:
    return next(p for p in panels(DASHBOARDS["fleet-overview.json"]) if p["title"] == title)


def _result(prom, panel: dict, ref_id: str, values: dict) -> list:
    target = next(t for t in panel["targets"] if t["refId"] == ref_id)
    return prom_query(prom, substitute(target["expr"], values))


def _value(series: dict) -> float:
    return float(series["value"][1])


def test_goodput_row_answers_from_the_runs_ledger(prometheus, variable_values):
    """The simulated run's ledger (8 GPUs) and its diagnosis reach every goodput panel: the buckets, the fleet's
    waste (all of it: the run is diagnosed from the start), the run's and its owner's waste with its
    largest part, its work at risk, and the costs at the price typed."""
    values = variable_values["fleet-overview.json", "all"]
    run = {"project": "demo", "experiment": "healthy", "user": ME, "team": TEAM}
    bars = _result(prometheus, _panel("GPU-hours by bucket today"), "A", values)
    assert {s["metric"]["bucket"] for s in bars} == BUCKETS
    assert sum(_value(s) for s in bars if s["metric"]["bucket"] != "lost") > 0
    goodput = _result(prometheus, _panel("Fleet goodput"), "A", values)
    assert len(goodput) == 1 and 0 <= _value(goodput[0]) < 1  # its productive time, after a diagnosis, is waste
    waste_today = _panel("Waste today")
    hours, cost = (_result(prometheus, waste_today, ref_id, values) for ref_id in ("A", "B"))
    assert _value(hours[0]) > 0 and _value(cost[0]) == pytest.approx(_value(hours[0]) * float(PRICE), rel=0.05)
    table = _panel("Runs with the most waste")
    waste, cost, largest = (_result(prometheus, table, ref_id, values) for ref_id in ("A", "B", "C"))
    assert [s["metric"] for s in waste] == [run] and _value(waste[0]) > 0
    assert _value(cost[0]) == pytest.approx(_value(waste[0]) * float(PRICE), rel=0.05)
    assert len(largest) == 1 and largest[0]["metric"]["bucket"] in BUCKETS | {"after_diagnosis"}
    parts = prom_query(prometheus, substitute(fleet.waste_parts(fleet.BY_RUN), values))
    assert {s["metric"]["bucket"] for s in parts} == {"stalled", "lost", "after_diagnosis"}
    assert _value(next(s for s in parts if s["metric"]["bucket"] == "after_diagnosis")) > 0
    assert _value(waste[0]) * 3600 == pytest.approx(sum(_value(s) for s in parts), rel=0.05)
    owners = _result(prometheus, _panel("Owners with the most waste"), "A", values)
    assert [s["metric"] for s in owners] == [{"user": ME, "team": TEAM}]
    assert _value(owners[0]) == pytest.approx(_value(waste[0]), rel=0.05)
    at_risk = _result(prometheus, _panel("Work at risk"), "A", values)
    assert [s["metric"] for s in at_risk] == [run] and _value(at_risk[0]) > 0


def test_goodput_costs_are_left_out_without_a_price(prometheus, variable_values):
    values = {**variable_values["fleet-overview.json", "all"], "gpu_hour_price": "0"}
    costs = [(panel["title"], target) for panel in panels(DASHBOARDS["fleet-overview.json"])
             for target in panel["targets"] if "$gpu_hour_price" in target["expr"]]
    assert len(costs) == 4
    for title, target in costs:
        assert prom_query(prometheus, substitute(target["expr"], values)) == [], title
