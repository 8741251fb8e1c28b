"""The alert and recording rules: promtool checks and unit tests, coverage of every alert, and
agreement of the rule files, the exporter's catalog and the Grafana dashboards."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

import step_series
from servers import REPO, require_binary
from verl_exporter import shipped
from verl_exporter.config.durations import parse_duration
from verl_exporter.config.yaml_files import load_shipped
from verl_exporter.store.catalog import Catalog, default_catalog
from verl_mixin import generate, model, render
from verl_mixin.departures import DEPARTURES

TESTS = Path(__file__).resolve().parent
TEST_FILES = sorted(TESTS.glob("*.test.yml"))
RULE_FILES = shipped.alert_rule_files()
RECORDING_RULES = shipped.recording_rules_file()
ANNOTATIONS = {"summary", "description", "runbook_url", "dashboard_url", "fix"}
# Alerts on a state, not a number: their description names the state from the labels instead.
STATE_ALERTS = {"VerlGpuRowRemapFailure", "VerlGpuLost", "VerlGpuThrottled", "VerlTrainingJobExited",
                "VerlExporterDown", "VerlExporterCollectorFailing", "VerlExporterSourceUnreadable"}


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def shipped_alerts() -> dict[str, dict]:
    rules = {}
    for path in RULE_FILES:
        for group in load_shipped(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:  # the alert files also hold the recording rules of the run's settings
                    rules[rule["alert"]] = rule
    return rules


def test_promtool_check_rules_and_config_pass():
    result = promtool("check", "rules", *map(str, RULE_FILES), str(RECORDING_RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    result = promtool("check", "config", "prometheus/prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(RULE_FILES) + 1} rule files found" in result.stdout  # and the recording rules


@pytest.fixture(scope="module")
def unit_test_runs(tmp_path_factory):
    """``promtool test rules`` of every test file, started together (the files are independent), each
    with the step statistics the exporter would serve of its training series (``step_series``)."""
    binary = require_binary("promtool")
    out = tmp_path_factory.mktemp("promtool-tests")
    runs = {path: subprocess.Popen([binary, "test", "rules", str(step_series.expand(path, out))], cwd=TESTS,
                                   text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for path in TEST_FILES}
    yield runs
    for process in runs.values():
        process.kill()
        process.wait()


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(unit_test_runs, test_file):
    output, _ = unit_test_runs[test_file].communicate(timeout=120)
    assert unit_test_runs[test_file].returncode == 0, output
    assert "SUCCESS" in output


@pytest.mark.parametrize("moved", [False, True], ids=["as-shipped", "threshold-moved"])
def test_promtool_unit_tests_fail_when_a_threshold_moves(tmp_path, moved):
    """The unit tests pin the thresholds: the same test, expanded as the suite expands it, passes against
    the shipped rules and fails against a rule whose 0.5 became 0.9."""
    (tmp_path / render.RULES_DIR).mkdir(parents=True)
    (tmp_path / "tests" / "alerts").mkdir(parents=True)
    for path in RULE_FILES:
        text = path.read_text()
        if moved and path.name == "verl-training.rules.yml":
            before = "(run:verl_actor_pg_clipfrac:recent_min > 0.5)"
            assert before in text
            text = text.replace(before, "(run:verl_actor_pg_clipfrac:recent_min > 0.9)")
        (tmp_path / render.RULES_DIR / path.name).write_text(text)
    tests = load_shipped((TESTS / "actor.test.yml").read_text())
    tests["tests"] = [case for case in tests["tests"] if case["name"].startswith("pg_clipfrac above 0.5")]
    assert len(tests["tests"]) == 1
    (tmp_path / "tests" / "alerts" / "actor.test.yml").write_text(yaml.safe_dump(tests))
    expanded = step_series.expand(tmp_path / "tests" / "alerts" / "actor.test.yml", tmp_path / "expanded")
    assert str(tmp_path / "expanded") in expanded.read_text()  # the copies of the moved rules, not the shipped
    result = promtool("test", "rules", str(expanded), cwd=tmp_path / "tests" / "alerts")
    assert (result.returncode != 0) == moved, result.stdout + result.stderr
    if moved:
        assert "VerlPolicyUpdateAggressive" in result.stdout + result.stderr


def test_an_expanded_test_file_keeps_the_alerts_it_checks_and_every_recording_rule(tmp_path):
    """promtool evaluates only what a test file can check: its alerts, every recording rule, and the
    step statistics of the series it gives; the rest records and fires nothing it reads."""
    expanded = step_series.expand(TESTS / "actor.test.yml", tmp_path)
    checked = {entry["alertname"] for case in load_shipped((TESTS / "actor.test.yml").read_text())["tests"]
               for entry in case["alert_rule_test"]}
    files = [Path(path) for path in load_shipped(expanded.read_text())["rule_files"]]
    kept = [rule for path in files for group in load_shipped(path.read_text())["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in kept if "alert" in rule} == checked
    training = load_shipped((shipped.rules_dir() / "verl-training.rules.yml").read_text())["groups"]
    recorded = {rule["record"] for rule in kept if "record" in rule}
    assert {rule["record"] for group in training for rule in group["rules"] if "record" in rule} <= recorded
    statistics = {name for name in recorded if name.startswith("run:") and not name.endswith(":setting")}
    assert "run:verl_actor_pg_clipfrac:recent_min" in statistics
    assert "run:verl_critic_vf_explained_var:recent_max" not in statistics  # no critic series in the actor tests


def test_a_rule_file_entry_the_expansion_cannot_point_at_its_copy_is_refused(tmp_path):
    """A comment after a rule_files entry would leave promtool the untrimmed file, or none (the path is
    relative to the test file, not to its expanded copy): the expansion says so instead."""
    folder = tmp_path / "tests" / "alerts"
    folder.mkdir(parents=True)
    text = (TESTS / "performance.test.yml").read_text()
    entry = "- ../../alerts/rules/verl-performance.rules.yml\n"
    assert entry in text
    (folder / "performance.test.yml").write_text(text.replace(entry, entry[:-1] + "  # a comment\n", 1))
    (tmp_path / "alerts").symlink_to(REPO / "alerts")
    with pytest.raises(ValueError, match="alone on its line"):
        step_series.expand(folder / "performance.test.yml", tmp_path / "expanded")


def test_every_alert_fires_with_all_annotations_and_stays_silent_somewhere():
    rules = shipped_alerts()
    fires, silent = {}, set()
    for path in TEST_FILES:
        for case in load_shipped(path.read_text()).get("tests", []):
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fires.setdefault(check["alertname"], []).extend(check["exp_alerts"])
                else:
                    silent.add(check["alertname"])
    assert set(rules) - set(fires) == set(), "alerts without a firing case"
    assert set(rules) - silent == set(), "alerts without a silent case"
    for name, expected in fires.items():
        for alert in expected:
            assert set(alert["exp_annotations"]) == set(rules[name]["annotations"]), name
            assert alert["exp_labels"]["severity"] == rules[name]["labels"]["severity"], name


def test_alerts_follow_the_mixin_conventions():
    rules = shipped_alerts()
    assert len(rules) == len(render.alerts()) >= 45
    runbook = shipped.runbook().read_text()
    headings = {line[4:].strip().lower() for line in runbook.splitlines() if line.startswith("### ")}
    for name, rule in rules.items():
        assert re.fullmatch(r"Verl[A-Z][A-Za-z0-9]+", name)
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        annotations = rule["annotations"]
        assert set(annotations) - {"evidence"} == ANNOTATIONS, name
        if "evidence" in annotations:
            assert annotations["evidence"].startswith("http://{{ $labels.instance }}/debug/evidence?"), name
        assert "{{" not in annotations["summary"], name
        assert ("$value" in annotations["description"]) != (name in STATE_ALERTS), name
        if "project" in rule["expr"] or name.startswith("VerlTraining"):
            assert any(run in annotations["description"] for run in ("$labels.project", ".Labels.project")) \
                or name in STATE_ALERTS, name
        anchor = annotations["runbook_url"].rsplit("#", 1)[1]
        assert anchor in headings, f"{name}: no runbook section #{anchor}"
    table = (REPO / "docs" / "alerts.md").read_text()
    assert all(f"[{name}]" in table for name in rules)


def test_all_guide_operations_alerts_page():
    rules = shipped_alerts()
    for name in ("VerlTrainingStalled", "VerlTrainingNonFinite", "VerlExporterDown", "VerlGpuLost",
                 "VerlGpuFatalXidError", "VerlGpuUncorrectableEccErrors", "VerlGpuRowRemapFailure"):
        assert rules[name]["labels"]["severity"] == "critical", name


# --- one place for thresholds: catalog -> rules (and dashboards) --------------------------------------

def test_generated_files_are_up_to_date():
    assert generate.stale_files() == [], "run: make generate"


def test_check_mode_reports_a_hand_edited_rule_file(tmp_path, capsys):
    for path, text in generate.outputs().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert generate.main(["--check", "--root", str(tmp_path)]) == 0
    edited = tmp_path / render.RULES_DIR / "verl-training.rules.yml"
    edited.write_text(edited.read_text().replace("> 0.5", "> 0.6", 1))
    assert generate.main(["--check", "--root", str(tmp_path)]) == 1
    assert "verl-training.rules.yml" in capsys.readouterr().err


def test_check_mode_compares_with_the_runbook_url_given(tmp_path):
    """``make generate RUNBOOK_URL=...`` writes and checks with that base; another base is stale."""
    base = "https://wiki.example/verl/RUNBOOK.md"
    assert generate.main(["--root", str(tmp_path), "--runbook-url", base]) == 0
    assert generate.main(["--check", "--root", str(tmp_path), "--runbook-url", base]) == 0
    assert generate.main(["--check", "--root", str(tmp_path)]) == 1
    text = (tmp_path / render.RULES_DIR / "verl-gpu.rules.yml").read_text()
    assert f"runbook_url: {base}#verlgpulost" in text


def test_definitions_hold_no_literal_thresholds():
    """Every number of an expression comes from a placeholder, except 0 and 1 (== 1, 1 - x, 0 * x) and the
    statistic a quantile takes (``quantile_over_time(0.5, ...)``: a median, no threshold)."""
    for group in render.GROUPS:
        for alert in group.alerts:
            expr = model.expand(alert.expr + " " + alert.stay, render.FRAGMENTS)
            text = re.sub(r"\$\{[^}]*\}|\{[^}]*\}|\[[^\]]*\]|offset \w+|quantile_over_time\(\d(?:\.\d+)?,", " ", expr)
            numbers = set(re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?(?![\w.])", text))
            assert numbers <= {"0", "1"}, f"{alert.name}: literal {numbers - {'0', '1'}} in {expr}"


def test_rules_follow_a_changed_catalog_threshold():
    catalog = default_catalog()
    spec = catalog.spec("actor/pg_clipfrac")
    changed = dataclasses.replace(spec, thresholds={**spec.thresholds, "aggressive": 0.66})
    other = Catalog([changed if s is spec else s for s in catalog.metrics], catalog.families, catalog.system,
                    catalog.settings, catalog.rules)
    groups = load_shipped(render.rule_files(other)["verl-training.rules.yml"])["groups"]
    rule = next(r for g in groups for r in g["rules"] if r.get("alert") == "VerlPolicyUpdateAggressive")
    expr = " ".join(rule["expr"].split())
    assert expr.startswith("( (run:verl_actor_pg_clipfrac:recent_min > 0.66)"
                           " or ( run:verl_actor_pg_clipfrac:window_median > 0.66 and ")
    assert "above 0.66" in rule["annotations"]["description"]


def test_unknown_placeholders_are_refused():
    catalog = default_catalog()
    assert model.fill("x > ${actor/ppo_kl:too_large}", catalog) == "x > 0.05"
    assert model.fill("x < ${actor/entropy:healthy.min}", catalog) == "x < 0.1"
    with pytest.raises(KeyError, match="no/such"):
        model.fill("${no/such:key}", catalog)
    with pytest.raises(KeyError, match="nope"):
        model.fill("${actor/ppo_kl:nope}", catalog)


def test_time_scaling_shrinks_durations_but_not_thresholds():
    expr = "avg_over_time(x[1h]) > 0.5 and y offset 1h and rate(z[5m]) and max_over_time(w[15m:1m])"
    scaled = model.scale_expr(expr, 1 / 300, 3)
    assert scaled == "avg_over_time(x[12s]) > 0.5 and y offset 12s and rate(z[3s]) and max_over_time(w[3s:1s])"
    assert model.scale_duration("10m", 1 / 300, 1) == "2s"
    assert model.scale_expr(expr, 1, 3) == expr
    with pytest.raises(ValueError):
        model.scale_duration("10 minutes", 1 / 300, 1)


def test_step_rules_see_every_step_and_the_minute_groups_wait_5_minutes():
    groups = {group["name"]: group for text in render.rule_files().values() for group in load_shipped(text)["groups"]}
    slow = {name for name, group in groups.items() if group.get("interval") == model.PER_STEP_INTERVAL}
    assert "verl-run-settings" in slow
    # A step can take 20 s: a rule that decides over the run's steps is evaluated at the global interval.
    stepping = {"verl-actor", "verl-critic", "verl-reward", "verl-lengths", "verl-diagnoses", "verl-performance",
                "verl-mismatch", "verl-anomaly"}
    assert slow.isdisjoint(stepping | {"verl-operations", "verl-gpu"})
    for name in slow:  # nothing in them pages, or fires on a single evaluation
        for entry in groups[name]["rules"]:
            assert entry.get("labels", {}).get("severity") != "critical", entry.get("alert")
            if "alert" in entry:
                assert parse_duration(entry["for"]) >= 5 * parse_duration(model.PER_STEP_INTERVAL)
    for name in stepping:  # each of the last steps, and it stays firing on its looser condition
        for entry in groups[name]["rules"]:
            if "alert" in entry and "{metric=" in entry["expr"]:
                own = f'ALERTS{{alertname="{entry["alert"]}", alertstate="firing"}}'
                assert "for" not in entry and own in entry["expr"], entry["alert"]
    # Scaled rules (the demo, the end-to-end tests) run every group at their Prometheus's interval.
    scaled = [group for text in render.rule_files(time_scale=1 / 300).values()
              for group in load_shipped(text)["groups"]]
    assert not [group["name"] for group in scaled if "interval" in group]
    alert = next(alert for group in render.GROUPS for alert in group.alerts if not alert.stay)
    with pytest.raises(ValueError, match="too short"):
        model.Group(name="verl-x", file="x.rules.yml", title="X", alerts=(dataclasses.replace(alert, for_="0s"),),
                    interval="1m")


def catalog_numbers(names: set[str]) -> set[float]:
    catalog = default_catalog()
    numbers = set()
    for name in names:
        spec = catalog.by_name(name)
        for value in list(spec.healthy.values()) + list(spec.thresholds.values()):
            numbers |= {float(value), -float(value)}
    return numbers


def dashboard_panels():
    for path in sorted(shipped.dashboards_dir().glob("*.json")):
        stack = list(json.loads(path.read_text()).get("panels", []))
        while stack:
            panel = stack.pop()
            stack.extend(panel.get("panels", []))
            yield path.name, panel


def test_dashboard_thresholds_are_catalog_numbers():
    """A panel drawing catalogued metrics colours them only at that metric's catalog numbers."""
    known = {spec.name for spec in default_catalog().metrics}
    checked = 0
    for dashboard, panel in dashboard_panels():
        exprs = " ".join(target.get("expr", "") for target in panel.get("targets", []))
        names = set(re.findall(r"verl_[a-z0-9_]+", exprs)) & known
        steps = (((panel.get("fieldConfig") or {}).get("defaults") or {}).get("thresholds") or {}).get("steps") or []
        values = {float(step["value"]) for step in steps if step.get("value") is not None}
        if names and values:
            checked += 1
            assert values <= catalog_numbers(names), f"{dashboard} / {panel.get('title')}: {values}"
    if checked == 0:
        pytest.skip("no generated dashboards in grafana/dashboards/ to compare")
    assert checked >= 5


def test_departures_from_the_guide_name_shipped_alerts_and_reach_the_runbook():
    names = {alert.name for group in render.GROUPS for alert in group.alerts}
    assert set(DEPARTURES) <= names, set(DEPARTURES) - names
    runbook = shipped.runbook().read_text()
    sections = runbook.split("\n### ")
    for name in DEPARTURES:
        section = next(text for text in sections if text.startswith(name + "\n"))
        assert "**Differs from the guide.**" in section, name


def test_each_step_statistic_an_alert_reads_is_recorded_once_and_read_raw_by_recording_rules():
    """The alerts read the step statistics as recorded series (``run:<metric>:<stat>``), each recorded
    once, by the statistics group; recording rules read the statistics themselves (one level deep)."""
    files = {path.name: load_shipped(path.read_text()) for path in shipped.rule_files()}
    (group,) = files[render.STEP_STATISTICS_FILE]["groups"]
    recorded = [entry["record"] for entry in group["rules"]]
    assert group["name"] == model.STEP_STATISTICS_GROUP and len(recorded) == len(set(recorded)) > 100
    statistic = re.compile(r"(?<![\w:])run:[A-Za-z0-9_]+:[a-z_]+(?![\w:])")
    read = {name for data in files.values() for group in data["groups"] for entry in group["rules"]
            if "alert" in entry for name in statistic.findall(entry["expr"])}
    every_record = {entry["record"] for data in files.values() for group_ in data["groups"] for entry in group_["rules"]
                    if "record" in entry}
    assert read - every_record == set(), "alerts read recorded names no rule records"
    assert set(recorded) <= read, f"recorded but read by no alert: {sorted(set(recorded) - read)}"
    for data in files.values():
        for other in data["groups"]:
            for entry in other["rules"]:
                if "record" in entry and other is not group:
                    assert not set(statistic.findall(entry["expr"])) & set(recorded), entry["record"]
    for entry in group["rules"]:  # each the run's statistic of one metric (or of its spellings)
        assert re.fullmatch(r'(max|min) without\(metric\) \(verl_training_[a-z_]+\{metric=~?"[^"]+"\}\)',
                            entry["expr"].strip()), entry
        assert entry["record"].endswith(":" + re.search(r"verl_training_([a-z_]+)\{", entry["expr"]).group(1))


def test_every_number_of_the_catalogs_rule_tables_reaches_the_rules():
    """Each number of the catalog's ``rules`` tables and ``system`` section, changed there, is what the
    rendered rules say: none is copied into the rule code."""
    catalog = default_catalog()
    sentinels: dict[tuple[str, str], str] = {}
    tables = {table: dict(values) for table, values in catalog.rules.items()}
    system = dict(catalog.system)
    for index, (table, name) in enumerate([(table, name) for table, values in tables.items() for name in values]
                                          + [("system", name) for name in system]):
        value = 7000 + index + 0.25
        (system if table == "system" else tables[table])[name] = value
        sentinels[table, name] = f"{value:g}"
    other = Catalog(catalog.metrics, catalog.families, system, catalog.settings, tables)
    text = "\n".join(render.rule_files(other).values()) + render.recording_rules(other)
    missing = sorted(f"{table}:{name}" for (table, name), sentinel in sentinels.items()
                     if not re.search(rf"(?<![\d.]){re.escape(sentinel)}(?![\d])", text))
    # Two colour the dashboards red and judge nothing (tests/dashboards/test_system_thresholds.py).
    assert missing == ["system:gpu_critical_celsius", "system:host_memory_used_critical"], missing
    assert len(sentinels) > 35
