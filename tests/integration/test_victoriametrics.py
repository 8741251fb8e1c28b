"""The scale-out backend for real: exporters -> vmagent -> VictoriaMetrics <- vmalert -> Alertmanager.

Debian's victoria-metrics package. Two exporters follow simulated runs, one step every 0.2 s:
``demo/lr-too-high`` (8 fake GPUs), and ``demo/healthy`` with ``demo/stall`` (20 steps, then the
job hangs) on the other (2 fake GPUs). vmagent scrapes both every second as job "verl" and
remote-writes into a single-node VictoriaMetrics; vmalert evaluates the shipped alert and recording
rules against it (durations divided by 300 as in the alerting end-to-end test: one 0.2 s step
stands for a 60 s verl step) and notifies a real Alertmanager running the shipped alertmanager.yml,
whose Slack and PagerDuty notifications a local receiver records. Every fleet-dashboard query is
answered by VictoriaMetrics, the way Grafana asks Prometheus.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.parse

import pytest
import yaml

from servers import REPO, start_alertmanager, start_exporter, wait_until
from verl_exporter import simulate
from victoriametrics import start_victoria_metrics, start_vmagent, start_vmalert, vmagent_check, vmalert_check

sys.path.insert(0, str(REPO / "tests" / "dashboards"))
from dashboard_models import panels, substitute  # noqa: E402
from test_dashboards_queries import DASHBOARDS, fill_variables, run_query  # noqa: E402

from stand_in_receiver import Receiver  # noqa: E402
from verl_exporter.shipped import rule_files  # noqa: E402
from verl_mixin import local  # noqa: E402

STEP_SECONDS = 0.2
TIME_SCALE = STEP_SECONDS / 60
TIMEOUT = 60
SHIPPED_RULES = rule_files()
FLEET = "fleet-overview.json"


class Stack:
    def __init__(self, tmp_path):
        self.servers = []
        self.stop = threading.Event()
        self.receiver = Receiver().__enter__()
        try:
            self._start(tmp_path)
        except BaseException:
            self.close()
            raise

    def _start(self, tmp_path):
        stalled_run = tmp_path / "stall" / "demo" / "stall.jsonl"
        self.writer = threading.Thread(target=simulate.write_run, args=(stalled_run, "stall"), daemon=True,
                                       kwargs={"interval": STEP_SECONDS, "noise": False, "stop_event": self.stop})
        self.writer.start()
        exporters = [self._add(start_exporter(
                         tmp_path, "--simulate", scenario, "--simulate.interval", str(STEP_SECONDS),
                         "--simulate.dir", str(tmp_path / scenario), "--gpu.fake", f"healthy:{gpus}",
                         "--no-collector.host", *extra))
                     for scenario, gpus, extra in (("lr-too-high", 8, ()),
                                                   ("healthy", 2, ("--source", str(stalled_run))))]
        self.vm = self._add(start_victoria_metrics(tmp_path))
        self.vmagent = self._add(start_vmagent(tmp_path, [f"127.0.0.1:{e.port}" for e in exporters],
                                               f"{self.vm.url}/api/v1/write"))
        am_config = tmp_path / "alertmanager.yml"
        am_config.write_text(yaml.safe_dump(local.alertmanager_config(self.receiver.url, tmp_path / "secrets")))
        self.alertmanager = self._add(start_alertmanager(tmp_path, am_config))
        rules = local.write_rules(tmp_path / "rules", time_scale=TIME_SCALE, min_range=3)
        self.vmalert = self._add(start_vmalert(tmp_path, rules, self.vm, self.alertmanager))

    def _add(self, server):
        self.servers.append(server)
        return server

    def query(self, expr: str) -> list[dict]:
        status, body = self.vm.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", body[:500]
        return data["data"]["result"]

    def am_alerts(self, experiment: str) -> list[dict]:
        status, body = self.alertmanager.get("/api/v2/alerts?" + urllib.parse.urlencode(
            {"filter": f'experiment="{experiment}"'}))
        assert status == 200, body
        return json.loads(body)

    def close(self):
        self.stop.set()
        for server in reversed(self.servers):
            server.stop()
        self.receiver.__exit__()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("victoriametrics"))
    yield stack
    stack.close()


def lr_alert_at_alertmanager(stack) -> dict:
    alerts = wait_until(lambda: [a for a in stack.am_alerts("lr-too-high")
                                 if a["labels"]["alertname"] == "VerlLearningRateTooHigh"],
                        timeout=TIMEOUT, message="VerlLearningRateTooHigh at Alertmanager")
    return alerts[0]


def test_shipped_rule_files_pass_vmalert_validation():
    result = vmalert_check(SHIPPED_RULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_vmalert_validation_rejects_a_broken_rule(tmp_path):
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(yaml.safe_dump({"groups": [{"name": "broken", "rules": [
        {"alert": "Broken", "expr": "rate(verl_training_steps_ingested_total[5m]", "labels": {"severity": "info"}}]}]}))
    result = vmalert_check([*SHIPPED_RULES, broken])
    assert result.returncode != 0
    assert "broken.rules.yml" in result.stdout + result.stderr


def test_vmagent_takes_the_shipped_scrape_config_when_told_to_ignore_prometheus_only_fields():
    shipped = REPO / "prometheus" / "prometheus.yml"
    strict = vmagent_check(shipped)
    assert strict.returncode != 0
    for field in ("rule_files", "alerting", "refresh_interval"):  # as docs/configuration.md says
        assert f"field {field} not found" in strict.stdout + strict.stderr
    lenient = vmagent_check(shipped, "-promscrape.config.strictParse=false")
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr


def test_vmalert_alert_from_victoriametrics_reaches_alertmanager_and_slack(stack):
    alert = lr_alert_at_alertmanager(stack)
    labels = alert["labels"]
    assert {k: labels[k] for k in ("project", "experiment", "job", "severity")} == {
        "project": "demo", "experiment": "lr-too-high", "job": "verl", "severity": "warning"}
    assert alert["annotations"]["runbook_url"] == "http://localhost:9945/runbook#verllearningratetoohigh"
    assert "actor/pg_clipfrac is" in alert["annotations"]["description"]
    assert "/vmalert/" in alert["generatorURL"]  # sent by vmalert, not by a Prometheus

    def slack_text():
        return next((a["text"] for p in stack.receiver.received("/slack/alerts") for a in p["attachments"]
                     if "VerlLearningRateTooHigh" in a["text"] and "demo/lr-too-high" in a["title"]), None)

    text = wait_until(slack_text, timeout=TIMEOUT, message="the Slack message for demo/lr-too-high")
    assert "Fix: Halve `actor_rollout_ref.actor.optim.lr`" in text


def test_every_shipped_rule_evaluates_on_victoriametrics_without_error(stack):
    shipped = sum(len(group["rules"]) for path in SHIPPED_RULES for group in yaml.safe_load(path.read_text())["groups"])

    def evaluated():
        groups = json.loads(stack.vmalert.get("/api/v1/rules")[1])["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return rules if all(rule["lastEvaluation"] > "2000" for rule in rules) else None

    rules = wait_until(evaluated, timeout=TIMEOUT, message="every rule evaluated once")
    lr_alert_at_alertmanager(stack)  # and again, with the runs' data in place
    rules = evaluated()
    assert len(rules) == shipped
    assert [(r["name"], r["lastError"]) for r in rules if r["lastError"] or r["health"] != "ok"] == []


def test_stalled_run_pages_pagerduty_through_vmalert(stack):
    # VerlTrainingStalled compares timestamp() of the last step's sample with its value: MetricsQL's
    # timestamp() must return the sample's time, as PromQL's does, for the page to come.
    pages = wait_until(lambda: [p for p in stack.receiver.received("/pagerduty") if "demo/stall" in json.dumps(p)],
                       timeout=TIMEOUT, message="the PagerDuty page for the stalled run")
    details = pages[0]["payload"]
    assert details["severity"] == "critical"
    assert details["summary"].startswith("demo/stall: VerlTrainingStalled")
    assert all("demo/stall" in json.dumps(p) for p in stack.receiver.received("/pagerduty"))


def test_healthy_run_raises_no_alert(stack):
    lr_alert_at_alertmanager(stack)  # the pipeline alerts; silence below is not for lack of time
    wait_until(lambda: stack.query('verl_training_last_step{experiment="healthy"} >= 60'), timeout=TIMEOUT,
               message="the healthy run past 60 steps in VictoriaMetrics")
    assert stack.am_alerts("healthy") == []
    assert stack.query('ALERTS{experiment="healthy"}') == []


def test_recording_rules_are_written_back_to_victoriametrics(stack):
    expected = {"running": 2, "stalled": 1, "finished": 0}
    wait_until(lambda: {r["metric"]["state"]: float(r["value"][1])
                        for r in stack.query("state:verl_training_runs:count")} == expected,
               timeout=TIMEOUT, message=f"runs per state {expected}")
    def per_run_utilization():
        result = stack.query("project_experiment:verl_gpu_utilization_ratio:avg")
        return result if {r["metric"]["experiment"] for r in result} == {"healthy", "lr-too-high", "stall"} else None

    utilization = wait_until(per_run_utilization, timeout=TIMEOUT, message="per-run GPU utilisation of the three runs")
    assert all(0.8 <= float(r["value"][1]) <= 1 for r in utilization)


def fleet_queries() -> list:
    dashboard = DASHBOARDS[FLEET]
    found = [(panel["title"], target) for panel in panels(dashboard) for target in panel["targets"]]
    found += [("annotation " + a["name"], {"expr": a["expr"]})
              for a in dashboard.get("annotations", {}).get("list", []) if a.get("expr")]
    return [pytest.param(title, target, id=f"{title}:{target.get('refId', 'A')}") for title, target in found]


@pytest.fixture(scope="module")
def fleet_values(stack):
    lr_alert_at_alertmanager(stack)  # ALERTS has a firing series of the run
    # Range queries end at a multiple of their step: give the series a few samples before asking.
    wait_until(lambda: stack.query('count_over_time(ALERTS{alertstate="firing", experiment="lr-too-high"}[1m]) >= 5'),
               timeout=TIMEOUT, message="five samples of vmalert's ALERTS series in VictoriaMetrics")
    wait_until(lambda: stack.query("count_over_time(verl_gpu_ecc_errors_total[1m]) >= 4"), timeout=TIMEOUT,
               message="four scrapes of the exporters in VictoriaMetrics")
    # The goodput row adds up recorded rates a minute apart: a minute's mark with them recorded.
    wait_until(lambda: stack.query("sum_over_time((fleet:verl_gpu_waste:ratio_rate5m"
                                   " * sum(bucket:verl_run_gpu_seconds:rate5m))[5m:60s])"), timeout=90,
               message="a minute's mark with the fleet's goodput ledger and waste recorded")
    return fill_variables(stack.vm, DASHBOARDS[FLEET], pick_all=True)


@pytest.mark.parametrize("title, target", fleet_queries())
def test_fleet_dashboard_query_is_answered_by_victoriametrics(stack, fleet_values, title, target):
    expr = substitute(target["expr"], fleet_values)
    result = run_query(stack.vm, expr, instant=target.get("instant", False) and not target.get("range", False))
    assert result, f"{FLEET} panel {title!r} returned nothing from VictoriaMetrics: {expr}"


def test_fleet_counts_from_victoriametrics(stack, fleet_values):
    def count(title):
        panel = next(p for p in panels(DASHBOARDS[FLEET]) if p["title"] == title)
        return float(stack.query(substitute(panel["targets"][0]["expr"], fleet_values))[0]["value"][1])

    expected = {"Runs followed": 3, "Healthy": 1, "Warning": 1, "Stalled": 1, "GPUs up": 10}
    wait_until(lambda: {title: count(title) for title in expected} == expected, timeout=TIMEOUT,
               message=f"fleet counts {expected}")
    assert stack.query('verl_actor_pg_clipfrac{project="no-such-project"}') == []
