"""The committed dashboards are what the code generates, pass the lint rules and agree with the catalog."""

from __future__ import annotations

import copy
import json
import re

import pytest
from dashboard_lint import (
    lint,
    lint_set,
    panel_rule,
    rate_interval_rule,
    scale_rule,
    selector_rule,
    variables_defined_rule,
)
from dashboard_models import DASHBOARDS_DIR, REPO, load_dashboards, panels, targets

import verl_mixin.dashboards
from verl_exporter.store.catalog import default_catalog
from verl_mixin.dashboards import __main__ as generate
from verl_mixin.dashboards.common import healthy_steps, render

EXPECTED_UIDS = {"fleet-overview.json": "verl-fleet", "run-detail.json": "verl-run", "gpu-nodes.json": "verl-gpu"}
DASHBOARDS = load_dashboards()


def test_committed_json_is_what_the_code_generates():
    assert sorted(DASHBOARDS) == sorted(verl_mixin.dashboards.BUILDERS)
    for filename, model in verl_mixin.dashboards.build_all().items():
        committed = (DASHBOARDS_DIR / filename).read_text(encoding="utf-8")
        assert committed == render(model), f"{filename} is stale: run `python -m verl_mixin.dashboards`"


def test_check_mode_reports_a_stale_or_missing_file(tmp_path, capsys):
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.main(["--check", "--out", str(tmp_path)]) == 0
    path = tmp_path / "run-detail.json"
    model = json.loads(path.read_text())
    model["panels"][1]["title"] = "edited by hand"
    path.write_text(json.dumps(model))
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1
    assert "run-detail.json" in capsys.readouterr().err
    (tmp_path / "gpu-nodes.json").unlink()
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1


def test_uids_are_stable():
    assert {name: d["uid"] for name, d in DASHBOARDS.items()} == EXPECTED_UIDS


@pytest.mark.parametrize("filename", sorted(EXPECTED_UIDS))
def test_dashboard_passes_the_lint_rules(filename):
    assert lint(DASHBOARDS[filename]) == []


def test_no_uid_or_title_is_repeated_across_dashboards():
    assert lint_set(DASHBOARDS) == []
    twins = {"a": DASHBOARDS["run-detail.json"], "b": DASHBOARDS["run-detail.json"]}
    assert len(lint_set(twins)) == 2


def _first_panel_with(dashboard: dict, pattern: str) -> dict:
    for panel in panels(dashboard):
        if any(re.search(pattern, t.get("expr", "")) for t in panel.get("targets", [])):
            return panel
    raise AssertionError(f"no panel matches {pattern}")


def test_lint_catches_a_fixed_rate_window():
    broken = copy.deepcopy(DASHBOARDS["run-detail.json"])
    target = _first_panel_with(broken, r"\$__rate_interval")["targets"][0]
    target["expr"] = target["expr"].replace("$__rate_interval", "5m")
    assert any("not $__rate_interval" in p for p in rate_interval_rule(broken))
    target["expr"] = "sum(rate(verl_gpu_energy_joules_total{gpu='0'}[1m]))"
    assert rate_interval_rule(broken)


def test_lint_catches_a_panel_that_reads_every_gpu_of_the_fleet():
    for filename in ("fleet-overview.json", "gpu-nodes.json", "run-detail.json"):
        assert scale_rule(DASHBOARDS[filename]) == []
    broken = copy.deepcopy(DASHBOARDS["fleet-overview.json"])
    target = _first_panel_with(broken, r"job:verl_gpus_up:sum")["targets"][0]
    target["expr"] = "sum(verl_gpu_up)"
    assert any("reads verl_gpu_up of every node" in p for p in scale_rule(broken))
    gpu = copy.deepcopy(DASHBOARDS["gpu-nodes.json"])
    node = next(v for v in gpu["templating"]["list"] if v["name"] == "instance")
    node.update(includeAll=True, allValue=".*")
    assert any("offers All" in p for p in scale_rule(gpu))
    run = copy.deepcopy(DASHBOARDS["run-detail.json"])
    selected = 'verl_gpu_power_watts{instance=~"$instance"}'
    target = next(t for t in _first_panel_with(run, re.escape(selected))["targets"] if selected in t["expr"])
    target["expr"] = target["expr"].replace(selected, "verl_gpu_power_watts")
    assert scale_rule(run)


def test_lint_catches_missing_unit_description_and_thresholds():
    broken = copy.deepcopy(DASHBOARDS["gpu-nodes.json"])
    panel = panels(broken)[0]
    panel["description"] = ""
    del panel["fieldConfig"]["defaults"]["unit"]
    panel["fieldConfig"]["defaults"]["thresholds"]["steps"] = []
    problems = panel_rule(broken)
    assert len(problems) == 3, problems


def test_lint_catches_hard_coded_job_or_instance_and_undefined_variables():
    broken = copy.deepcopy(DASHBOARDS["fleet-overview.json"])
    target = _first_panel_with(broken, "verl_gpu_utilization_ratio")["targets"][0]
    target["expr"] = 'avg(verl_gpu_utilization_ratio{job="verl", instance=~"$node"})'
    assert len(selector_rule(broken)) == 2
    problems = variables_defined_rule(broken)
    assert len(problems) == 1 and "undefined variable $node" in problems[0]


def test_lint_catches_an_editable_dashboard_without_datasource_variable():
    broken = copy.deepcopy(DASHBOARDS["fleet-overview.json"])
    broken["editable"] = True
    broken["templating"]["list"] = [v for v in broken["templating"]["list"] if v["name"] != "datasource"]
    problems = lint(broken)
    assert any("editable" in p for p in problems)
    assert any("datasource variable" in p for p in problems)


def test_thresholds_follow_the_catalogs_healthy_ranges():
    """A panel showing one catalogued metric is coloured from that metric's healthy range."""
    catalog = default_catalog()
    checked = set()
    for dashboard in DASHBOARDS.values():
        for panel in panels(dashboard):
            names = {m for t in panel.get("targets", []) for m in re.findall(r"\bverl_\w+", t["expr"])}
            if len(names) != 1 or len(panel["targets"]) != 1:
                continue
            name = names.pop()
            try:
                spec = catalog.by_name(name)
            except KeyError:
                continue
            if not spec.healthy:
                continue
            expected = [{"color": s.color, "value": s.value} for s in healthy_steps(name)]
            assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"] == expected, panel["title"]
            checked.add(name)
    assert {"verl_actor_pg_clipfrac", "verl_actor_ppo_kl", "verl_actor_entropy", "verl_critic_vf_explained_var",
            "verl_perf_throughput", "verl_timing_step_seconds"} <= checked


def test_fleet_table_columns_are_coloured_from_the_catalog():
    table = next(p for p in panels(DASHBOARDS["fleet-overview.json"]) if p["type"] == "table")
    overrides = {o["matcher"]["options"]: {prop["id"]: prop["value"] for prop in o["properties"]}
                 for o in table["fieldConfig"]["overrides"]}
    for header, name in (("KL (ppo_kl)", "verl_actor_ppo_kl"), ("Clip fraction", "verl_actor_pg_clipfrac"),
                         ("Throughput", "verl_perf_throughput")):
        low, high = (default_catalog().by_name(name).healthy.get(k) for k in ("min", "max"))
        values = [s["value"] for s in overrides[header]["thresholds"]["steps"]]
        assert values == [None] + [v for v in (low, high) if v is not None], header
    assert "var-project=${__data.fields.project}" in table["fieldConfig"]["defaults"]["links"][0]["url"]


def test_run_detail_has_the_guides_panels_and_alert_annotations():
    run = DASHBOARDS["run-detail.json"]
    exprs = " ".join(t["expr"] for _, t in targets(run))
    for name in ("verl_critic_score_mean", "verl_actor_pg_loss", "verl_actor_pg_clipfrac", "verl_actor_ppo_kl",
                 "verl_actor_entropy", "verl_critic_vf_loss", "verl_critic_vf_explained_var",
                 "verl_critic_vpred_mean", "verl_critic_returns_mean", "verl_perf_throughput", "verl_perf_mfu_actor",
                 "verl_timing_step_seconds", "verl_val_core", "verl_perf_max_memory_allocated_bytes",
                 "verl_gpu_utilization_ratio"):
        assert name in exprs, name
    rows = [p["title"] for p in run["panels"] if p["type"] == "row"]
    assert rows[:4] == ["Training progress", "Policy update", "Critic quality (PPO)", "Performance"]
    annotation = run["annotations"]["list"][0]
    assert annotation["expr"].startswith('ALERTS{alertstate="firing"') and annotation["titleFormat"]


def test_docs_state_each_dashboards_uid_and_panel_count():
    docs = (REPO / "docs" / "dashboards.md").read_text(encoding="utf-8")
    for filename, dashboard in DASHBOARDS.items():
        row = f"| {dashboard['title']} | `{dashboard['uid']}` | `{filename}` | {len(panels(dashboard))} panels |"
        assert row in docs, f"docs/dashboards.md should have the row: {row}"
