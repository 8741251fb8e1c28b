"""The chat receivers the shipped alertmanager.yml has commented out: WeCom, Discord, Telegram, and webhooks
to the Feishu/Lark and DingTalk adapters.

Marker scheme: an option is one receiver written between the lines ``# receiver-option: NAME`` and
``# end-receiver-option: NAME`` (NAME is also the receiver's name), every line in between commented out
by a "# " at the markers' indentation (a bare "#" for an empty line). Enabling the option removes that
"# " from each line between the markers; the markers stay comments, and a line written "# # ..." stays a
comment. ``uncomment`` below does what a user (or an editor's toggle-comment) does.

Each option, uncommented, passes ``amtool check-config``; and the real Alertmanager, with the option as
its only receiver and the option's URL pointed at the stand-in receiver on 127.0.0.1, sends an alert
posted to its API as that receiver's request, quoting the alert's name, summary, fix and runbook.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from alerting_stack import ChatReceiver
from servers import require_binary, start_alertmanager, wait_until
from verl_exporter import shipped
from verl_exporter.store.catalog import default_catalog
from verl_mixin import local, render

CONFIG = shipped.alertmanager_config()
SHIPPED_RECEIVERS = ["pagerduty", "slack-alerts", "slack-low-priority"]
# option -> (its configs' key, the field holding the URL the test points at the stand-in, the
#            integration name in Alertmanager's metrics)
OPTIONS = {
    "wecom": ("wechat_configs", "api_url", "wechat"),
    "discord": ("discord_configs", "webhook_url", "discord"),
    "telegram": ("telegram_configs", "api_url", "telegram"),
    "feishu": ("webhook_configs", "url", "webhook"),
    "dingtalk": ("webhook_configs", "url", "webhook"),
}
START = re.compile(r"^(?P<indent> *)# receiver-option: (?P<name>\S+)$")
MARKER = re.compile(r"^\s*#\s*(end-)?receiver-option:")  # a marker line, not prose that names one

ALERT = "VerlLearningRateTooHigh"
RUN = {"project": "e2e", "experiment": "receivers", "instance": "127.0.0.1:9945"}
RUNBOOK = "https://runbook.example/RUNBOOK.md#verllearningratetoohigh"
TITLE = f"[FIRING:1] e2e/receivers: {ALERT}"


def option_blocks(text: str) -> dict[str, tuple[int, int, str]]:
    """Each option's (start marker line, end marker line, indentation), 0-based line numbers."""
    lines = text.splitlines()
    blocks, i = {}, 0
    while i < len(lines):
        match = START.match(lines[i])
        if match:
            name, indent = match["name"], match["indent"]
            assert name not in blocks, f"option {name} appears twice"
            end_marker = f"{indent}# end-receiver-option: {name}"
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == end_marker), None)
            assert end is not None, f"option {name} (line {i + 1}) has no {end_marker.strip()!r}"
            inner = [j + 1 for j in range(i + 1, end) if MARKER.search(lines[j])]
            assert not inner, f"option {name}: marker inside the block at lines {inner}"
            blocks[name] = (i, end, indent)
            i = end
        else:
            assert not MARKER.search(lines[i]), f"line {i + 1}: marker outside a block: {lines[i]!r}"
        i += 1
    return blocks


def uncomment(text: str, *names: str) -> str:
    """``text`` with the options ``names`` enabled."""
    lines = text.splitlines()
    blocks = option_blocks(text)
    for name in names:
        start, end, indent = blocks[name]
        for j in range(start + 1, end):
            line = lines[j]
            if line == indent + "#":
                lines[j] = ""
            else:
                assert line.startswith(indent + "# "), \
                    f"option {name}, line {j + 1}: not commented out by '# ' at the markers' indentation: {line!r}"
                lines[j] = indent + line[len(indent) + 2:]
    return "\n".join(lines) + "\n"


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("amtool"), *args], capture_output=True, text=True, timeout=60)


def check_config(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    """amtool check-config on ``text`` as written, beside the shipped templates (templates/*.tmpl)."""
    path = tmp_path / "alertmanager.yml"
    path.write_text(text, encoding="utf-8")
    if not (tmp_path / "templates").exists():
        os.symlink(shipped.alertmanager_templates(), tmp_path / "templates")
    return amtool("check-config", str(path))


def test_the_shipped_config_offers_each_option_and_enables_none():
    text = CONFIG.read_text(encoding="utf-8")
    assert set(option_blocks(text)) == set(OPTIONS)
    assert [r["name"] for r in yaml.safe_load(text)["receivers"]] == SHIPPED_RECEIVERS


@pytest.mark.parametrize("name", OPTIONS)
def test_each_option_uncommented_passes_amtool(tmp_path, name):
    text = uncomment(CONFIG.read_text(encoding="utf-8"), name)
    receivers = yaml.safe_load(text)["receivers"]
    assert [r["name"] for r in receivers] == SHIPPED_RECEIVERS + [name]
    key = OPTIONS[name][0]
    assert set(receivers[-1]) == {"name", key}, receivers[-1]
    result = check_config(tmp_path, text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 receivers" in result.stdout and "1 templates" in result.stdout


def test_all_options_together_pass_amtool(tmp_path):
    text = uncomment(CONFIG.read_text(encoding="utf-8"), *OPTIONS)
    result = check_config(tmp_path, text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 receivers" in result.stdout


def test_options_reuse_the_templates_and_ship_no_secret():
    config = yaml.safe_load(uncomment(CONFIG.read_text(encoding="utf-8"), *OPTIONS))
    receivers = {r["name"]: r for r in config["receivers"]}
    wecom = receivers["wecom"]["wechat_configs"][0]
    discord = receivers["discord"]["discord_configs"][0]
    telegram = receivers["telegram"]["telegram_configs"][0]
    assert wecom["message"] == telegram["message"] == '{{ template "verl.message" . }}'
    assert (discord["title"], discord["message"]) == ('{{ template "verl.title" . }}', '{{ template "verl.text" . }}')
    # The secrets Alertmanager 0.25 reads only inline are placeholders; the adapters' URLs hold none.
    for secret in (wecom["api_secret"], wecom["corp_id"], discord["webhook_url"], telegram["bot_token"]):
        assert "REPLACE_WITH_" in secret
    for name in ("feishu", "dingtalk"):
        url = urllib.parse.urlsplit(receivers[name]["webhook_configs"][0]["url"])
        assert url.scheme == "http" and not re.search(r"token|secret|key|hook/", url.path + url.query), url


def test_verl_message_is_the_title_then_the_slack_text(tmp_path):
    data = {"receiver": "wecom", "status": "firing", "alerts": [{**alert_data(), "status": "firing"}],
            "groupLabels": {}, "commonLabels": {"alertname": ALERT, "severity": "warning", **RUN},
            "commonAnnotations": {}, "externalURL": "http://alertmanager:9093"}
    (tmp_path / "data.json").write_text(json.dumps(data))
    templates = f"--template.glob={shipped.alertmanager_templates() / '*.tmpl'}"
    rendered = {}
    for name in ("verl.message", "verl.title", "verl.text"):
        result = amtool("template", "render", templates, f"--template.text={{{{ template \"{name}\" . }}}}",
                        f"--template.data={tmp_path / 'data.json'}")
        assert result.returncode == 0, result.stdout + result.stderr
        rendered[name] = result.stdout
    assert rendered["verl.message"].startswith(TITLE + "\n\n*VerlLearningRateTooHigh* (warning)")
    assert rendered["verl.message"].strip() == (rendered["verl.title"].strip() + "\n\n" + rendered["verl.text"]).strip()


def alert_data() -> dict:
    rule = next(a for a in render.alerts() if a.name == ALERT)
    return {"labels": {"alertname": ALERT, "severity": rule.severity, **RUN},
            "annotations": {"summary": render.filled(rule.summary, default_catalog()),
                            "fix": render.filled(rule.fix, default_catalog()), "runbook_url": RUNBOOK,
                            "description": f"Run e2e/receivers: {ALERT} is 0.85"},
            "startsAt": datetime.now(timezone.utc).isoformat(), "generatorURL": "http://prometheus:9090/graph"}


def at_stand_in(url: str, stand_in: str) -> str:
    """``url`` with its scheme and host those of the stand-in receiver; path and query kept."""
    parts, host = urllib.parse.urlsplit(url), urllib.parse.urlsplit(stand_in)
    return urllib.parse.urlunsplit((host.scheme, host.netloc, parts.path, parts.query, ""))


def notify_attempts(alertmanager, integration: str) -> tuple[float, float]:
    """Alertmanager's (finished, failed) attempts so far to notify through ``integration``. (Its
    notifications_failed_total counts only notifications whose every retry failed.)"""
    status, body = alertmanager.get("/metrics")
    assert status == 200

    def total(metric):
        series = rf'^{metric}\{{[^}}]*integration="{integration}"[^}}]*\}} (\S+)$'
        return sum(float(value) for value in re.findall(series, body, re.M))

    return (total("alertmanager_notification_latency_seconds_count"),
            total("alertmanager_notification_requests_failed_total"))


@pytest.fixture
def enabled(tmp_path, monkeypatch, request):
    """(option, stand-in receiver, Alertmanager): the shipped config with the option uncommented and
    made the only receiver of every route, its URL at the stand-in; secrets, templates and timings as
    the end-to-end stack has them (verl_mixin/local.py)."""
    name = request.param
    receiver = ChatReceiver().__enter__()
    uncommented = tmp_path / "uncommented.yml"
    uncommented.write_text(uncomment(CONFIG.read_text(encoding="utf-8"), name), encoding="utf-8")
    config = local.alertmanager_config(receiver.url, tmp_path / "secrets", source=uncommented)
    config["route"]["receiver"] = name
    routes = list(config["route"]["routes"])
    while routes:  # the on-call's routes by severity, and the catch-all's
        route = routes.pop()
        route["receiver"] = name
        routes += route.get("routes", [])
    key, field, _ = OPTIONS[name]
    option = next(r for r in config["receivers"] if r["name"] == name)[key][0]
    option[field] = at_stand_in(option[field], receiver.url)
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    alertmanager = start_alertmanager(tmp_path, path)
    yield name, receiver, alertmanager
    alertmanager.stop()
    receiver.__exit__()


def post_alert(alertmanager) -> None:
    request = urllib.request.Request(alertmanager.url + "/api/v2/alerts", data=json.dumps([alert_data()]).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def assert_quotes_the_alert(text: str) -> None:
    rule = next(a for a in render.alerts() if a.name == ALERT)
    assert TITLE in text
    assert f"*{ALERT}* (warning): {render.filled(rule.summary, default_catalog())}" in text
    assert f"Run e2e/receivers: {ALERT} is 0.85" in text
    assert "Fix: Halve `actor_rollout_ref.actor.optim.lr`" in text
    assert f"Runbook: {RUNBOOK}" in text


def received(receiver, prefix: str) -> list[dict]:
    return wait_until(lambda: receiver.received(prefix), timeout=20, message=f"a request on {prefix}")


@pytest.mark.parametrize("enabled", list(OPTIONS), indirect=True)
def test_alertmanager_sends_the_alert_in_the_receivers_shape(enabled):
    name, receiver, alertmanager = enabled
    post_alert(alertmanager)
    if name == "wecom":
        token = received(receiver, "/cgi-bin/gettoken")[0]
        assert token == {"corpid": "REPLACE_WITH_CORP_ID", "corpsecret": "REPLACE_WITH_APP_SECRET"}
        message = received(receiver, f"/cgi-bin/message/send?access_token={ChatReceiver.ACCESS_TOKEN}")[0]
        assert message["msgtype"] == "text" and message["touser"] == "@all"
        assert message["agentid"] == "REPLACE_WITH_AGENT_ID"
        assert_quotes_the_alert(message["text"]["content"])
    elif name == "discord":
        message = received(receiver, "/api/webhooks/REPLACE_WITH_WEBHOOK_ID/REPLACE_WITH_WEBHOOK_TOKEN")[0]
        embed = message["embeds"][0]
        assert embed["title"] == TITLE
        assert_quotes_the_alert(embed["title"] + "\n" + embed["description"])
    elif name == "telegram":
        message = received(receiver, "/botREPLACE_WITH_BOT_TOKEN/sendMessage")[0]
        assert str(message["chat_id"]) == "-1001234567890"
        assert not message.get("parse_mode"), message  # plain text
        assert_quotes_the_alert(message["text"])
    else:  # the adapters get Alertmanager's webhook JSON on the path they serve
        prefix = {"feishu": "/prometheusalert?type=fs&tpl=prometheus-fs", "dingtalk": "/dingtalk/verl/send"}[name]
        message = received(receiver, prefix)[0]
        assert message["receiver"] == name and message["status"] == "firing" and message["version"] == "4"
        [alert] = message["alerts"]
        assert alert["labels"]["alertname"] == ALERT and alert["labels"]["experiment"] == "receivers"
        assert alert["annotations"] == alert_data()["annotations"]
    # Alertmanager took the stand-in's answer for a sent notification: no attempt failed.
    integration = OPTIONS[name][2]
    wait_until(lambda: notify_attempts(alertmanager, integration)[0] >= 1, timeout=10,
               message=f"Alertmanager to finish notifying through {integration}")
    assert notify_attempts(alertmanager, integration)[1] == 0, alertmanager.log()
