"""Where the files the package ships live: alert and recording rules, the Alertmanager config and
templates, the Grafana dashboards and the runbook, all under ``verl_exporter/data/``.

They are generated (``python -m verl_exporter.alerting``, ``python -m verl_dashboards``) and
installed with the package, so a wheel finds them wherever it is installed. A leaf module: it
imports nothing of the package.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

RULE_GLOB = "verl-*.rules.yml"
RECORDING_RULES = "recording-rules.yml"


def data_dir() -> Path:
    """``verl_exporter/data/``: every shipped file is under it."""
    return Path(str(files("verl_exporter").joinpath("data")))


def rules_dir() -> Path:
    """The folder of the alert and recording rule files."""
    return data_dir() / "rules"


def alert_rule_files() -> list[Path]:
    """The alert rule files (``verl-*.rules.yml``), sorted by name."""
    return sorted(rules_dir().glob(RULE_GLOB))


def recording_rules_file() -> Path:
    """The recording rules the dashboards and some alerts read."""
    return rules_dir() / RECORDING_RULES


def rule_files() -> list[Path]:
    """Every shipped rule file: the alert rules, then the recording rules."""
    recording = recording_rules_file()
    return alert_rule_files() + ([recording] if recording.is_file() else [])


def alertmanager_config() -> Path:
    """The Alertmanager configuration (routes by severity to PagerDuty and Slack)."""
    return data_dir() / "alertmanager" / "alertmanager.yml"


def alertmanager_templates() -> Path:
    """The folder of the Alertmanager notification templates (``*.tmpl``)."""
    return data_dir() / "alertmanager" / "templates"


def dashboards_dir() -> Path:
    """The folder of the Grafana dashboards (``*.json``)."""
    return data_dir() / "dashboards"


def runbook() -> Path:
    """RUNBOOK.md: one section per alert; every alert's ``runbook_url`` points into it."""
    return data_dir() / "RUNBOOK.md"
