"""Every alert's runbook_url resolves: it starts with the configured base, its anchor is a heading of
the packaged RUNBOOK.md, and the exporter serves that RUNBOOK.md at /runbook (the default base)."""

from __future__ import annotations

import base64
import re
import urllib.request

import bcrypt
import pytest

from servers import REPO, http_get, start_exporter
from verl_exporter import shipped
from verl_exporter.cli import main
from verl_exporter.config.yaml_files import load_shipped
from verl_exporter.exposition import Exposition
from verl_exporter.http.server import RUNBOOK_PATH, serve
from verl_exporter.http.web_config import WebConfig
from verl_mixin import kubernetes, render
from verl_mixin.generate import stale_files

BASE = render.DEFAULT_RUNBOOK_URL
PROMETHEUS_RULE = REPO / kubernetes.PROMETHEUS_RULE_FILE


def runbook_anchors() -> set[str]:
    """The anchors of RUNBOOK.md's headings, as GitHub and most Markdown renderers make them."""
    anchors = set()
    for line in shipped.runbook().read_text(encoding="utf-8").splitlines():
        heading = re.match(r"#+ (.+)", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def runbook_urls(groups: list[dict]) -> dict[str, str]:
    return {rule["alert"]: rule["annotations"]["runbook_url"]
            for group in groups for rule in group["rules"] if "alert" in rule}


def shipped_urls() -> dict[str, str]:
    return runbook_urls([group for path in shipped.alert_rule_files()
                         for group in load_shipped(path.read_text(encoding="utf-8"))["groups"]])


def test_the_default_base_is_the_exporters_runbook_route():
    assert BASE == f"http://localhost:9945{RUNBOOK_PATH}"


@pytest.mark.parametrize("source", ["shipped rules", "PrometheusRule"])
def test_every_runbook_url_has_the_base_and_an_anchor_of_the_runbook(source):
    if source == "shipped rules":
        urls = shipped_urls()
    else:
        urls = runbook_urls(load_shipped(PROMETHEUS_RULE.read_text(encoding="utf-8"))["spec"]["groups"])
    anchors = runbook_anchors()
    assert len(urls) == len(render.alerts())
    for name, url in urls.items():
        base, sep, anchor = url.partition("#")
        assert base == BASE and sep, f"{name}: {url}"
        assert anchor == name.lower() and anchor in anchors, f"{name}: no heading #{anchor} in RUNBOOK.md"


def test_another_base_reaches_every_rule_and_the_prometheusrule(tmp_path):
    base = "https://wiki.example/verl/RUNBOOK.md"
    groups = [group for text in render.rule_files(runbook_url=base).values()
              for group in load_shipped(text)["groups"]]
    urls = runbook_urls(groups)
    urls_k8s = runbook_urls(load_shipped(kubernetes.prometheus_rule(base))["spec"]["groups"])
    assert urls == urls_k8s
    assert all(url == f"{base}#{name.lower()}" for name, url in urls.items())
    # The committed files hold the default base; rendered with another, they are stale.
    assert stale_files(REPO) == []
    assert set(stale_files(REPO, runbook_url=base)) >= {render.RULES_DIR / "verl-gpu.rules.yml",
                                                       kubernetes.PROMETHEUS_RULE_FILE}


def test_the_rules_command_writes_the_rules_with_another_base(tmp_path, capsys):
    base = "https://wiki.example/verl/RUNBOOK.md"
    assert main(["rules", "--runbook-url", base, "--out", str(tmp_path)]) == 0
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == sorted([path.name for path in shipped.rule_files()] + ["prometheusrule.yml", "RUNBOOK.md"])
    groups = [group for path in tmp_path.glob("verl-*.rules.yml")
              for group in load_shipped(path.read_text())["groups"]]
    assert set(runbook_urls(groups).values()) == {f"{base}#{alert.name.lower()}" for alert in render.alerts()}
    assert (tmp_path / "recording-rules.yml").read_text() == shipped.recording_rules_file().read_text()
    assert (tmp_path / "RUNBOOK.md").read_text() == shipped.runbook().read_text()


def test_a_running_exporter_serves_the_runbook(tmp_path):
    with start_exporter(tmp_path, "--no-collector.host", "--no-collector.gpu", ready_path="/-/healthy") as exporter:
        status, body = exporter.get(RUNBOOK_PATH)
    assert status == 200
    assert body == shipped.runbook().read_text(encoding="utf-8")
    assert "### VerlTrainingStalled" in body


def test_the_runbook_is_markdown_behind_the_same_auth_as_metrics():
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4))
    server, _ = serve(("127.0.0.1", 0), Exposition([]), web=WebConfig(users={"prometheus": hashed}))
    url = f"http://127.0.0.1:{server.server_address[1]}{RUNBOOK_PATH}"
    try:
        assert http_get(url)[0] == 401
        password = {"Authorization": "Basic " + base64.b64encode(b"prometheus:secret").decode()}
        with urllib.request.urlopen(urllib.request.Request(url, headers=password), timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/markdown; charset=utf-8"
            assert response.read() == shipped.runbook().read_bytes()
    finally:
        server.shutdown()
        server.server_close()


def test_every_alert_links_a_shipped_dashboard_with_its_variables_filled():
    """dashboard_url: the run's dashboard where the alert names a run, the node's (and GPU's) where it
    names a node, else the fleet's; each link names a shipped dashboard's uid and only its variables."""
    dashboards = {data["uid"]: data for data in (load_shipped(path.read_text())
                                                 for path in (REPO / "grafana" / "dashboards").glob("*.json"))}
    groups = [group for path in shipped.rule_files() for group in load_shipped(path.read_text())["groups"]]
    links = {rule["annotations"]["dashboard_url"] for group in groups for rule in group["rules"] if "alert" in rule}
    assert len(links) == 1 and sum("alert" in rule for group in groups for rule in group["rules"]) >= 80
    template = links.pop()
    assert template == render.dashboard_link(render.DEFAULT_DASHBOARD_URL)
    targets = re.findall(r"http://localhost:3000/d/([\w-]+)/[\w-]+\??((?:[&?]?var-[\w]+=\{\{[^}]+\}\})*)", template)
    assert [uid for uid, _ in targets] == ["verl-run", "verl-gpu", "verl-fleet"]
    for uid, query in targets:
        variables = {entry["name"] for entry in dashboards[uid]["templating"]["list"]}
        named = set(re.findall(r"var-(\w+)=", query))
        assert named <= variables, f"{uid}: {named - variables} are no variables of the dashboard"
    assert set(re.findall(r"var-(\w+)=\{\{ \$labels\.(\w+) \| urlquery \}\}", template)) == {
        ("project", "project"), ("experiment", "experiment"), ("user", "user"), ("instance", "instance"),
        ("gpu", "gpu"), ("team", "team")}


def test_another_grafana_reaches_every_alert_and_the_prometheusrule():
    base = "https://grafana.example/"
    groups = [group for text in render.rule_files(dashboard_url=base).values()
              for group in load_shipped(text)["groups"]]
    links = {rule["annotations"]["dashboard_url"] for group in groups for rule in group["rules"] if "alert" in rule}
    assert links == {render.dashboard_link("https://grafana.example")}
    assert "localhost:3000" not in links.pop()
    assert "https://grafana.example/d/verl-run/" in kubernetes.prometheus_rule(dashboard_url=base)
    assert set(stale_files(REPO, dashboard_url=base)) >= {render.RULES_DIR / "verl-training.rules.yml"}
