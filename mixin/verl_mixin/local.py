"""The shipped rules and Alertmanager config, adapted to run on loopback (end-to-end tests, demo).

Only addresses, secrets, timings and durations change: the rules are the shipped definitions
rendered with a time scale, the Alertmanager config is the shipped alertmanager.yml
(``verl_exporter.shipped``) with its secret files, PagerDuty URL and group timings replaced.
Slack and PagerDuty are reached at ``receiver_url`` + ``SLACK_PATHS`` / ``PAGERDUTY_PATH``, where
a stand-in listens (scripts/stand_in_receiver.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from verl_exporter import shipped

from . import render

DUMMY_ROUTING_KEY = "dummyroutingkey0123456789abcdef0"  # 32 characters, like a real one
PAGERDUTY_PATH = "/pagerduty/v2/enqueue"
SLACK_PATHS = {"slack-alerts": "/slack/alerts", "slack-low-priority": "/slack/low-priority"}


def write_rules(directory: Path, *, time_scale: float = 1.0, min_range: float = 0.0,
                runbook_url: str = render.DEFAULT_RUNBOOK_URL,
                dashboard_url: str = render.DEFAULT_DASHBOARD_URL) -> list[Path]:
    """The alert and recording rules, durations scaled by ``time_scale``, written to ``directory``;
    every ``runbook_url`` under ``runbook_url`` (the demo's exporter serves it), every ``dashboard_url``
    under ``dashboard_url``."""
    directory.mkdir(parents=True, exist_ok=True)
    texts = render.rule_files(time_scale=time_scale, min_range=min_range, runbook_url=runbook_url,
                              dashboard_url=dashboard_url)
    texts[render.RECORDING_RULES_FILE] = render.recording_rules(time_scale=time_scale, min_range=min_range)
    paths = []
    for name, text in texts.items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def alertmanager_config(receiver_url: str, secrets_dir: Path, *, group_wait: str = "1s",
                        group_interval: str = "2s", repeat_interval: str = "1h", source: Path | None = None) -> dict:
    """The shipped alertmanager.yml (or ``source``) sending to ``receiver_url``: dummy secrets in
    ``secrets_dir``."""
    source = source or shipped.alertmanager_config()
    config = yaml.safe_load(source.read_text(encoding="utf-8"))
    secrets_dir.mkdir(parents=True, exist_ok=True)
    config.setdefault("global", {})["pagerduty_url"] = receiver_url + PAGERDUTY_PATH
    config["templates"] = [str(shipped.alertmanager_templates() / "*.tmpl")]
    config["route"].update(group_wait=group_wait, group_interval=group_interval, repeat_interval=repeat_interval)
    routes = list(config["route"].get("routes", []))
    while routes:
        route = routes.pop()
        route.pop("repeat_interval", None)
        routes += route.get("routes", [])
    for receiver in config["receivers"]:
        for pagerduty in receiver.get("pagerduty_configs", []):
            pagerduty["routing_key_file"] = _secret(secrets_dir, "pagerduty-routing-key", DUMMY_ROUTING_KEY)
        for slack in receiver.get("slack_configs", []):
            url = receiver_url + SLACK_PATHS[receiver["name"]]
            slack["api_url_file"] = _secret(secrets_dir, f"{receiver['name']}-webhook-url", url)
    return config


def _secret(directory: Path, name: str, value: str) -> str:
    path = directory / name
    path.write_text(value + "\n", encoding="utf-8")
    return str(path)


def prometheus_config(exporter: str, alertmanager: str, rule_files: list[Path], *, interval: str = "1s") -> dict:
    """Prometheus scraping ``exporter`` (host:port) as job "verl", alerting to ``alertmanager``."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{"job_name": "verl", "scrape_timeout": interval,
                            "static_configs": [{"targets": [exporter]}]}],
    }
