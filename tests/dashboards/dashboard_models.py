"""The committed Grafana dashboards, for the dashboard tests."""

from __future__ import annotations

import json
from pathlib import Path

from verl_exporter import shipped
from verl_mixin.dashboards.model import (
    fixed_value,
    gated,
    gated_rows,
    label_values_query,
    may_be_empty,
    panels,
    substitute,
    variable_query,
    variable_value,
    variables,
)
from verl_mixin.dashboards.model import targets as _targets

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS_DIR = shipped.dashboards_dir()

__all__ = ["REPO", "DASHBOARDS_DIR", "load_dashboards", "panels", "targets", "variables", "variable_query",
           "substitute", "label_values_query", "variable_value", "may_be_empty", "gated", "gated_rows", "fixed_value"]


def load_dashboards() -> dict[str, dict]:
    """Committed dashboards by file name."""
    return {path.name: json.loads(path.read_text(encoding="utf-8"))
            for path in sorted(DASHBOARDS_DIR.glob("*.json"))}


def targets(dashboard: dict) -> list[tuple[str, dict]]:
    """(panel title, target) for every query of every panel."""
    return [(panel["title"], target) for panel, target in _targets(dashboard)]
