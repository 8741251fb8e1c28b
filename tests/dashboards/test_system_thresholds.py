"""GPU and host limits have one home, the catalog's ``system`` section: alerts and dashboards agree."""

import yaml
from dashboard_models import load_dashboards, panels

from verl_exporter import shipped
from verl_exporter.store.catalog import default_catalog

SYSTEM = default_catalog().system


def colour_steps(panel: dict) -> list[float]:
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return [step["value"] for step in steps if step.get("value") is not None]


def panels_querying(metric: str) -> list[dict]:
    return [panel for dashboard in load_dashboards().values() for panel in panels(dashboard)
            if any(metric in target.get("expr", "") for target in panel.get("targets", []))]


def alert_expr(name: str) -> str:
    for path in shipped.alert_rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == name:
                    return rule["expr"]
    raise KeyError(name)


def test_gpu_temperature_panels_colour_at_the_alerts_limit():
    found = panels_querying("verl_gpu_temperature_celsius")
    assert found
    for panel in found:
        assert colour_steps(panel) == [SYSTEM["gpu_hot_celsius"], SYSTEM["gpu_critical_celsius"]], panel["title"]
    assert f"> {SYSTEM['gpu_hot_celsius']}" in alert_expr("VerlGpuHot")


def test_host_memory_panel_turns_orange_where_the_alert_fires():
    found = panels_querying("verl_host_memory_available_bytes")
    assert found
    for panel in found:
        assert colour_steps(panel)[0] == 1 - SYSTEM["host_memory_available_min"], panel["title"]
    assert f"< {SYSTEM['host_memory_available_min']}" in alert_expr("VerlHostMemoryNearlyFull")
