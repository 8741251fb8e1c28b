"""Where the files the project ships live: alert and recording rules, the Alertmanager config and
templates, and the runbook under ``alerts/``; the Grafana dashboards under ``grafana/dashboards/``; the
catalog in the mixin (``mixin/catalog.yaml``).

The rules and dashboards are generated from the mixin (``python -m verl_mixin``, ``python -m
verl_mixin.dashboards``) and kept in one copy in the checkout. The wheel's build copies them into the package
(``verl_exporter/_files/``, see ``setup.py``), so an installed exporter finds them wherever it is
installed; a checkout or an editable install reads the checkout's own. A leaf module: it imports
nothing of the package.
"""

from __future__ import annotations

from pathlib import Path

RULE_GLOB = "verl-*.rules.yml"
RECORDING_RULES = "recording-rules.yml"
PACKAGED = Path(__file__).resolve().parent / "_files"  # what the wheel's build copied in
CHECKOUT = Path(__file__).resolve().parents[2]  # exporter/verl_exporter/ -> the checkout's root


def _root() -> Path:
    return PACKAGED if PACKAGED.is_dir() else CHECKOUT


def alerts_dir() -> Path:
    """``alerts/``: the rules, the Alertmanager config and templates, the runbook."""
    return _root() / "alerts"


def rules_dir() -> Path:
    """The folder of the alert and recording rule files."""
    return alerts_dir() / "rules"


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
    return alerts_dir() / "alertmanager" / "alertmanager.yml"


def alertmanager_templates() -> Path:
    """The folder of the Alertmanager notification templates (``*.tmpl``)."""
    return alerts_dir() / "alertmanager" / "templates"


def dashboards_dir() -> Path:
    """The folder of the Grafana dashboards (``*.json``)."""
    return (PACKAGED / "dashboards") if PACKAGED.is_dir() else CHECKOUT / "grafana" / "dashboards"


def catalog() -> Path:
    """catalog.yaml: every metric of the guide (its verl keys, name, unit, help) and every threshold of the
    rules and dashboards; kept in the mixin (``mixin/catalog.yaml``), read by the exporter at run time."""
    return (PACKAGED / "catalog.yaml") if PACKAGED.is_dir() else CHECKOUT / "mixin" / "catalog.yaml"


def runbook() -> Path:
    """RUNBOOK.md: one section per alert; every alert's ``runbook_url`` points into it."""
    return alerts_dir() / "RUNBOOK.md"
