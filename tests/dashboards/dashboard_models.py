"""The committed Grafana dashboards, for the dashboard tests (puts ``grafana/`` on the import path)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from verl_exporter import shipped

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "grafana"
DASHBOARDS_DIR = shipped.dashboards_dir()
if str(GRAFANA) not in sys.path:
    sys.path.insert(0, str(GRAFANA))

from verl_dashboards.model import (  # noqa: E402  (needs grafana/ on the path)
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
from verl_dashboards.model import targets as _targets  # noqa: E402

__all__ = ["REPO", "DASHBOARDS_DIR", "load_dashboards", "panels", "targets", "variables", "variable_query",
           "substitute", "label_values_query", "variable_value", "may_be_empty", "gated", "gated_rows", "fixed_value"]


def load_dashboards() -> dict[str, dict]:
    """Committed dashboards by file name."""
    return {path.name: json.loads(path.read_text(encoding="utf-8"))
            for path in sorted(DASHBOARDS_DIR.glob("*.json"))}


def targets(dashboard: dict) -> list[tuple[str, dict]]:
    """(panel title, target) for every query of every panel."""
    return [(panel["title"], target) for panel, target in _targets(dashboard)]
