"""The monitoring mixin (mixin/mixin.libsonnet), evaluated by Debian's jsonnet: with its default _config it
gives exactly the shipped rules and dashboards; its _config's bases reach every alert's links."""

from __future__ import annotations

import json
import subprocess

import pytest

from servers import REPO, require_binary
from verl_exporter import shipped
from verl_mixin import jsonnet, kubernetes


def evaluate(snippet: str) -> object:
    done = subprocess.run([require_binary("jsonnet"), "-J", str(REPO), "-e", snippet], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


MIXIN = '(import "mixin/mixin.libsonnet")'


def test_the_mixin_gives_the_shipped_alerts_recording_rules_and_dashboards():
    alerting, recording = jsonnet.shipped_groups()
    assert evaluate(f"{MIXIN}.prometheusAlerts") == {"groups": alerting}
    assert evaluate(f"{MIXIN}.prometheusRules") == {"groups": recording}
    names = {group["name"] for group in alerting + recording}
    assert {"verl-actor", "verl-step-statistics", "verl-fleet", "verl-goodput-alerts"} <= names
    assert len(names) == len(alerting) + len(recording)  # every group once, in one of the two
    dashboards = evaluate(f"{MIXIN}.grafanaDashboards")
    shipped_dashboards = {path.name: json.loads(path.read_text()) for path in shipped.dashboards_dir().glob("*.json")}
    assert dashboards == shipped_dashboards and len(dashboards) == 3


def test_the_mixins_config_sets_every_alerts_runbook_and_dashboard_links():
    config = "{ _config+:: { runbookURL: 'https://wiki.example/verl', grafanaURL: 'https://grafana.example' } }"
    alerting = evaluate(f"({MIXIN} + {config}).prometheusAlerts")["groups"]
    expected = [group for group in kubernetes.rule_groups("https://wiki.example/verl", "https://grafana.example")
                if any("alert" in rule for rule in group["rules"])]
    assert alerting == expected
    links = {rule["annotations"]["dashboard_url"] for group in alerting for rule in group["rules"]}
    assert len(links) == 1 and "https://grafana.example/d/verl-run/run-detail?" in links.pop()


def test_the_generated_parts_are_up_to_date():
    for path, text in jsonnet.parts().items():
        assert (REPO / path).read_text(encoding="utf-8") == text, f"{path} is stale: run make generate"


def test_a_broken_part_fails_to_evaluate(tmp_path):
    """The test above can fail: a part that jsonnet cannot read is an error, not an empty mixin."""
    (tmp_path / "mixin.libsonnet").write_text("(import 'config.libsonnet') + { prometheusAlerts+:: { groups+: [ } }")
    (tmp_path / "config.libsonnet").write_text((REPO / "mixin" / "config.libsonnet").read_text())
    done = subprocess.run([require_binary("jsonnet"), str(tmp_path / "mixin.libsonnet")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "STATIC ERROR" in done.stderr


@pytest.mark.parametrize("field", ["runbookURL", "grafanaURL"])
def test_the_config_documents_each_field(field):
    assert f"{field}:" in (REPO / "mixin" / "config.libsonnet").read_text()
