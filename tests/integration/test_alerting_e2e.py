"""Alerting end to end with the real servers: exporter -> Prometheus (shipped rules) -> Alertmanager
(shipped config) -> Slack and PagerDuty payloads received on 127.0.0.1.

Three simulated runs, one step every 0.2 s, followed by one exporter with two fake GPUs:
``e2e/lr-too-high`` (the guide's learning-rate-too-high run; the test stops it mid-run, so it
stalls), ``e2e/healthy`` and ``e2e/finished`` (15 steps, then verl's end of training).

The rules are the shipped definitions rendered with every duration divided by 300, so one 0.2 s
step stands for a 60 s verl step: ``for: 10m`` becomes 2 s and ``[1h]`` 12 s (ranges at least 3 s).
Thresholds are not changed. Alertmanager runs the shipped alertmanager.yml with dummy secret files,
the PagerDuty URL pointed at the receiver and a 1 s group_wait.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import pytest

from alerting_stack import AlertingStack, local
from servers import REPO, http_get, prom_query, wait_until
from verl_exporter import simulate

STEP_SECONDS = 0.2
TIME_SCALE = STEP_SECONDS / 60
FINISHED_STEPS = 15
ALERT_TIMEOUT = 45


def run_demo(tmp_path, *args: str) -> subprocess.CompletedProcess:
    ports = ["--exporter-port", "0", "--prometheus-port", "0", "--alertmanager-port", "0", "--receiver-port", "0"]
    return subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), *ports, "--dir", str(tmp_path / "demo"),
                           *args], capture_output=True, text=True, timeout=150)


def test_demo_shows_where_alerts_fire_and_prints_the_notification(tmp_path):
    result = run_demo(tmp_path, "--scenario", "lr-too-high", "--step-seconds", "0.2", "--exit-after", "90",
                      "--until", "VerlLearningRateTooHigh")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    urls = dict(re.findall(r"^  (metrics|alerts|Alertmanager|runbook): +(http://127\.0\.0\.1:\d+/\S*)", out, re.M))
    assert set(urls) == {"metrics", "alerts", "Alertmanager", "runbook"}, out
    assert re.search(r"--- notification \d+ ---\nSlack #verl-alerts: \[FIRING:\d\] demo/lr-too-high: .*"
                     r"VerlLearningRateTooHigh", out), out
    assert "Fix: Halve `actor_rollout_ref.actor.optim.lr`" in out
    for url in urls.values():  # every server the demo started is gone
        with pytest.raises(OSError):
            http_get(url, timeout=2)


def test_demo_refuses_an_unknown_scenario(tmp_path):
    result = run_demo(tmp_path, "--scenario", "no-such-scenario")
    assert result.returncode == 2
    assert "invalid choice: 'no-such-scenario'" in result.stderr


class Stack(AlertingStack):
    def __init__(self, tmp_path):
        self.runs = tmp_path / "runs" / "e2e"
        self.stop_all = threading.Event()
        self.stop_lr_run = threading.Event()
        self.writers = [
            self._write("lr-too-high.jsonl", "lr-too-high", stop_event=self.stop_lr_run),
            self._write("healthy.jsonl", "healthy", stop_event=self.stop_all),
            self._write("finished.log", "healthy", fmt="console", steps=FINISHED_STEPS, stop_event=self.stop_all),
        ]
        super().__init__(tmp_path, [
            "--source", str(self.runs / "*.jsonl"), "--source", str(self.runs / "*.log"),
            "--gpu.fake", "healthy:2", "--no-collector.host", "--source.poll-interval", "0.1"], time_scale=TIME_SCALE)

    def _write(self, name, scenario, **kwargs):
        thread = threading.Thread(target=simulate.write_run, args=(self.runs / name, scenario),
                                  kwargs={"fmt": "jsonl", "interval": STEP_SECONDS, "noise": False, **kwargs},
                                  daemon=True)
        thread.start()
        return thread

    def notifications(self, prefix: str, experiment: str) -> list[dict]:
        """Payloads received on ``prefix`` that mention the run e2e/<experiment>."""
        return [p for p in self.receiver.received(prefix) if f"e2e/{experiment}" in json.dumps(p)]

    def run_alerts(self, experiment: str) -> list[dict]:
        return self.am_alerts(f'experiment="{experiment}"')

    def close(self):
        self.stop_all.set()
        self.stop_lr_run.set()
        super().close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("alerting"))
    yield stack
    stack.close()


def stalled_page(stack) -> dict:
    """Stop the lr-too-high run mid-run and wait for its PagerDuty page."""
    stack.stop_lr_run.set()
    pages = wait_until(lambda: [p for p in stack.notifications("/pagerduty", "lr-too-high")
                                if "VerlTrainingStalled" in json.dumps(p)],
                       timeout=ALERT_TIMEOUT, message="the PagerDuty page for the stalled run")
    return pages[0]


def test_lr_too_high_run_posts_the_diagnosis_with_its_fix_to_slack(stack):
    def diagnosis():
        for payload in stack.notifications("/slack/alerts", "lr-too-high"):
            for attachment in payload["attachments"]:
                if "VerlLearningRateTooHigh" in attachment["text"]:
                    return payload, attachment
        return None

    payload, attachment = wait_until(diagnosis, timeout=ALERT_TIMEOUT, message="the Slack message for lr-too-high")
    assert payload["channel"] == "#verl-alerts"
    assert attachment["title"].startswith("[FIRING:") and "e2e/lr-too-high" in attachment["title"]
    text = attachment["text"]
    assert "*VerlLearningRateTooHigh* (warning): The learning rate is too high" in text
    # the run, the value and the threshold, from the templated description
    assert re.search(r"Run e2e/lr-too-high: actor/pg_clipfrac is (7\d|8\d)(\.\d+)?%"
                     r" with actor/ppo_kl above 0\.05", text)
    assert "Fix: Halve `actor_rollout_ref.actor.optim.lr`" in text
    assert f"Runbook: {stack.runbook_url}#verllearningratetoohigh" in text
    status, runbook = http_get(stack.runbook_url)  # the link resolves: the exporter serves the runbook
    assert status == 200 and "### VerlLearningRateTooHigh" in runbook
    assert attachment["color"] == "warning"


def test_stalled_run_pages_pagerduty_and_mutes_its_warnings(stack):
    page = stalled_page(stack)
    assert page["event_action"] == "trigger"
    assert page["routing_key"] == local.DUMMY_ROUTING_KEY
    details = page["payload"]
    assert details["severity"] == "critical"
    assert details["summary"].startswith(
        "e2e/lr-too-high: VerlTrainingStalled - The training run has stopped making progress")
    alerts_text = details["custom_details"]["alerts"]
    assert re.search(r"Run e2e/lr-too-high: no new step for [\d.]+s, over 5 times its usual step time", alerts_text)
    assert "Fix: Look at the job's log tail" in alerts_text
    assert page["links"][0]["href"] == f"{stack.runbook_url}#verltrainingstalled"
    # A critical alert of the run inhibits its warnings; the lr diagnosis inhibits its single-metric alerts.
    def warnings_muted():
        alerts = {a["labels"]["alertname"]: a for a in stack.run_alerts("lr-too-high")}
        warnings = [a for a in alerts.values() if a["labels"]["severity"] == "warning"]
        return alerts if warnings and all(a["status"]["state"] == "suppressed" for a in warnings) else None

    alerts = wait_until(warnings_muted, timeout=20, message="the run's warnings to be inhibited")
    assert alerts["VerlTrainingStalled"]["status"]["state"] == "active"
    assert "VerlLearningRateTooHigh" in alerts
    # No page for anything but the stalled run.
    assert all("e2e/lr-too-high" in json.dumps(p) for p in stack.receiver.received("/pagerduty"))


def test_healthy_and_finished_runs_notify_nothing(stack):
    stalled_page(stack)  # the pipeline pages; silence below is not for lack of time
    wait_until(lambda: prom_query(stack.prometheus, 'verl_training_last_step{experiment="healthy"} >= 60'),
               timeout=ALERT_TIMEOUT, message="the healthy run past 60 steps")
    wait_until(lambda: prom_query(stack.prometheus, 'verl_training_finished{experiment="finished"} == 1'
                                  ' and time() - verl_training_last_step_timestamp_seconds > 8'),
               timeout=ALERT_TIMEOUT, message="the finished run 8 s past its end")
    fired = prom_query(stack.prometheus,
                       'count_over_time(ALERTS{experiment=~"healthy|finished", alertstate="firing"}[5m])')
    assert fired == [], [r["metric"] for r in fired]
    for experiment in ("healthy", "finished"):
        assert stack.notifications("/", experiment) == []
        assert stack.run_alerts(experiment) == []


def test_fleet_recording_rules_count_runs_per_state(stack):
    stalled_page(stack)
    expected = {"running": 1, "stalled": 1, "finished": 1}
    wait_until(lambda: {x["metric"]["state"]: float(x["value"][1])
                        for x in prom_query(stack.prometheus, "state:verl_training_runs:count")} == expected,
               timeout=ALERT_TIMEOUT, message=f"runs per state {expected}")
    rate = prom_query(stack.prometheus, 'project_experiment:verl_training_steps_ingested:rate5m{experiment="healthy"}')
    assert float(rate[0]["value"][1]) > 0
    utilization = prom_query(stack.prometheus, "project_experiment:verl_gpu_utilization_ratio:avg")
    assert {r["metric"]["experiment"] for r in utilization} == {"healthy", "lr-too-high"}
    assert all(0.8 <= float(r["value"][1]) <= 1 for r in utilization)
