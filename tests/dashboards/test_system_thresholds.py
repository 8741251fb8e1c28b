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


def test_panel_texts_quote_the_catalogs_thresholds_and_follow_a_change(monkeypatch):
    """The run dashboard's texts that name an alert's threshold take it from the catalog: changed
    there, the text follows (as the rule does: test_rules_follow_a_changed_catalog_threshold)."""
    import dataclasses

    from verl_mixin.dashboards import common, run_detail

    def descriptions() -> str:
        return "\n".join(panel.get("description", "") for panel in panels(run_detail.build()))

    assert "Above 0.5: updates too aggressive" in descriptions()
    catalog = default_catalog()
    changed = {"actor/pg_clipfrac": {"aggressive": 0.61}, "actor/ppo_kl": {"too_large": 0.07},
               "critic/vf_explained_var": {"good": 0.77, "negative": -0.1}}
    specs = {key: dataclasses.replace(catalog.spec(key), thresholds={**catalog.spec(key).thresholds, **values})
             for key, values in changed.items()}
    by_name = {spec.name: spec for spec in specs.values()}
    original = common.spec
    monkeypatch.setattr(common, "spec", lambda name: by_name.get(name) or original(name))
    text = descriptions()
    for expected in ("Above 0.61: updates too aggressive", "Above 0.07: the policy moves too far",
                     "Above 0.77 is a good critic; below -0.1 after warm-up"):
        assert expected in text
    assert "Above 0.5:" not in text and "Above 0.05:" not in text and "Above 0.7 " not in text
