"""The shipped alertmanager.yml and its templates, checked with Debian's amtool."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from servers import require_binary
from verl_exporter import shipped
from verl_exporter.store.catalog import default_catalog
from verl_mixin import local, render

CONFIG = shipped.alertmanager_config()
TEMPLATES = shipped.alertmanager_templates() / "verl.tmpl"


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("amtool"), *args], capture_output=True, text=True, timeout=60)


def test_amtool_check_config_passes():
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 inhibit rules" in result.stdout and "3 receivers" in result.stdout and "1 templates" in result.stdout


def test_amtool_check_config_fails_on_a_route_to_a_missing_receiver(tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    config["route"]["routes"][0]["receiver"] = "pagerduty-typo"
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(config))
    (tmp_path / "templates").mkdir()
    result = amtool("check-config", str(broken))
    assert result.returncode != 0
    assert "pagerduty-typo" in result.stdout + result.stderr


@pytest.mark.parametrize("labels, receiver", [
    (["severity=critical", "alertname=VerlTrainingStalled", "project=gsm8k", "experiment=ppo"], "pagerduty"),
    (["severity=critical", "alertname=VerlGpuLost", "instance=node1:9945"], "pagerduty"),
    (["severity=warning", "alertname=VerlLearningRateTooHigh", "project=gsm8k", "experiment=ppo"], "slack-alerts"),
    (["severity=info", "alertname=VerlStepSlow", "project=gsm8k", "experiment=ppo"], "slack-low-priority"),
    (["alertname=SomethingElse"], "slack-alerts"),
], ids=["critical-run", "critical-gpu", "warning", "info", "no-severity"])
def test_routes_by_severity(labels, receiver):
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receiver}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_the_on_call_route_lists_exactly_the_infrastructure_alerts():
    """Who acts on each alert (``Group.audience``) decides its route: the on-call's route names every
    alert of audience "oncall" and no other."""
    config = yaml.safe_load(CONFIG.read_text())
    match = re.fullmatch(r'alertname=~"([^"]+)"', config["route"]["routes"][0]["matchers"][0])
    assert match is not None
    oncall = {name for name, audience in render.audiences().items() if audience == "oncall"}
    assert set(match.group(1).split("|")) == oncall
    assert {"VerlGpuLost", "VerlExporterDown", "VerlTrainingStalled", "VerlTrainingJobCrashed"} <= oncall
    assert not {"VerlEntropyCollapsing", "VerlNoLearningSignal", "VerlTrainingNonFinite",
                "VerlResponsesTruncated"} & oncall


def with_teams(tmp_path: Path) -> Path:
    """The shipped config with a routing table of two teams, as an operator fills it in."""
    config = yaml.safe_load(CONFIG.read_text())
    config["route"]["routes"][-1:-1] = [{"matchers": [f'team="{team}"'], "receiver": team} for team in ("a", "b")]
    config["receivers"] += [{"name": team, "webhook_configs": [{"url": f"http://127.0.0.1:9/{team}"}]}
                            for team in ("a", "b")]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    (tmp_path / "templates").mkdir()
    return path


@pytest.mark.parametrize("labels, receiver", [
    (["severity=warning", "alertname=VerlEntropyCollapsing", "team=a"], "a"),
    (["severity=critical", "alertname=VerlTrainingNonFinite", "team=b"], "b"),
    (["severity=critical", "alertname=VerlTrainingStalled", "team=a"], "pagerduty"),
    (["severity=warning", "alertname=VerlGpuHot", "instance=node1:9945"], "slack-alerts"),
    (["severity=warning", "alertname=VerlEntropyCollapsing", "team=c"], "slack-alerts"),
    (["severity=critical", "alertname=VerlTrainingNonFinite"], "pagerduty"),
], ids=["team-a", "team-b", "infrastructure-of-a-team", "gpu", "team-not-in-the-table", "no-team"])
def test_training_alerts_go_to_the_runs_team_and_infrastructure_to_the_on_call(tmp_path, labels, receiver):
    config = with_teams(tmp_path)
    result = amtool("config", "routes", "test", f"--config.file={config}", f"--verify.receivers={receiver}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr


def test_routes_test_notices_a_wrong_receiver():
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}", "--verify.receivers=slack-alerts",
                    "severity=critical")
    assert result.returncode != 0


def test_grouping_inhibition_and_secrets():
    config = yaml.safe_load(CONFIG.read_text())
    assert config["route"]["group_by"] == ["project", "experiment", "user", "instance"]
    names = {alert.name for alert in render.alerts()}
    referenced = set()
    for rule in config["inhibit_rules"]:
        assert rule["equal"] == ["project", "experiment", "user", "instance"]
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            match = re.fullmatch(r'alertname=~?"([^"]+)"', matcher)
            if match:
                referenced |= set(match.group(1).split("|"))
    assert referenced and referenced <= names, referenced - names
    assert {'severity="critical"'} == set(config["inhibit_rules"][0]["source_matchers"])
    text = CONFIG.read_text()
    assert "routing_key_file:" in text and "api_url_file:" in text
    assert not re.search(r"^\s*(routing_key|service_key|api_url):", text, re.M), "secrets belong in files"


def render_template(tmp_path: Path, text: str, data: dict) -> str:
    data_file = tmp_path / "data.json"
    data_file.write_text(json.dumps(data))
    result = amtool("template", "render", f"--template.glob={TEMPLATES}", f"--template.text={text}",
                    f"--template.data={data_file}")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def alert(name: str, status: str = "firing", **labels) -> dict:
    rule = next(a for a in render.alerts() if a.name == name)
    return {
        "status": status,
        "labels": {"alertname": name, "severity": rule.severity, **labels},
        "annotations": {"summary": render.filled(rule.summary, default_catalog()),
                        "description": f"Run gsm8k/ppo: {name} is 0.85",
                        "fix": render.filled(rule.fix, default_catalog()), "runbook_url": f"https://runbook#{name.lower()}"},
        "startsAt": "2025-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": name,
    }


def data(*alerts: dict, **common) -> dict:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return {"receiver": "slack-alerts", "status": status, "alerts": list(alerts), "groupLabels": {},
            "commonLabels": common, "commonAnnotations": {}, "externalURL": "http://alertmanager:9093"}


def test_messages_show_run_value_summary_fix_and_runbook(tmp_path):
    run = {"project": "gsm8k", "experiment": "ppo", "instance": "node1:9945"}
    group = data(alert("VerlLearningRateTooHigh", **run), alert("VerlStepSlow", status="resolved", **run), **run)
    title = render_template(tmp_path, '{{ template "verl.title" . }}', group)
    assert title.strip() == "[FIRING:1] gsm8k/ppo: VerlLearningRateTooHigh, VerlStepSlow"
    text = render_template(tmp_path, '{{ template "verl.text" . }}', group)
    firing, resolved = text.split("*VerlStepSlow*")
    assert "*VerlLearningRateTooHigh* (warning): The learning rate is too high" in firing
    assert "Run gsm8k/ppo: VerlLearningRateTooHigh is 0.85" in firing
    assert "Fix: Halve `actor_rollout_ref.actor.optim.lr`" in firing
    assert "Runbook: https://runbook#verllearningratetoohigh" in firing
    assert resolved.startswith(" (info, resolved)")
    summary = render_template(tmp_path, '{{ template "verl.pagerduty.summary" . }}', group)
    assert summary.strip().startswith("gsm8k/ppo: VerlLearningRateTooHigh - The learning rate is too high")
    assert "VerlStepSlow" not in summary


def test_alerts_sharing_a_name_are_named_once(tmp_path):
    run = {"project": "gsm8k", "experiment": "ppo"}
    group = data(alert("VerlTrainingNonFinite", key="actor/pg_loss", **run),
                 alert("VerlTrainingNonFinite", key="actor/grad_norm", **run),
                 alertname="VerlTrainingNonFinite", severity="critical", **run)
    title = render_template(tmp_path, '{{ template "verl.title" . }}', group)
    assert title.strip() == "[FIRING:2] gsm8k/ppo: VerlTrainingNonFinite"
    summary = render_template(tmp_path, '{{ template "verl.pagerduty.summary" . }}', group)
    assert summary.strip() == "gsm8k/ppo: VerlTrainingNonFinite - A loss or gradient norm of the run is NaN or Inf."
    text = render_template(tmp_path, '{{ template "verl.text" . }}', group)
    assert text.count("*VerlTrainingNonFinite* (critical)") == 2


def test_gpu_alerts_name_the_host_and_colours_follow_severity(tmp_path):
    gpu = data(alert("VerlGpuLost", gpu="3", instance="node7:9945"), severity="critical", instance="node7:9945")
    assert render_template(tmp_path, '{{ template "verl.run" . }}', gpu).strip() == "node7:9945"
    assert render_template(tmp_path, '{{ template "verl.slack.color" . }}', gpu).strip() == "danger"
    resolved = data(alert("VerlGpuLost", status="resolved"), severity="critical")
    assert render_template(tmp_path, '{{ template "verl.slack.color" . }}', resolved).strip() == "good"


def test_local_config_keeps_the_routing_and_replaces_only_addresses_and_secrets(tmp_path):
    config = local.alertmanager_config("http://127.0.0.1:1234", tmp_path)
    shipped = yaml.safe_load(CONFIG.read_text())
    assert config["inhibit_rules"] == shipped["inhibit_rules"]
    routes = [route.get("matchers") for route in shipped["route"]["routes"]]
    assert [route.get("matchers") for route in config["route"]["routes"]] == routes
    assert (tmp_path / "pagerduty-routing-key").read_text().strip() == local.DUMMY_ROUTING_KEY
    assert (tmp_path / "slack-low-priority-webhook-url").read_text().strip() == "http://127.0.0.1:1234/slack/low-priority"
    path = tmp_path / "am.yml"
    path.write_text(yaml.safe_dump(config))
    result = amtool("check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
