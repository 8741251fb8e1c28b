"""The rules and dashboards avoid what Prometheus 3.0 changed (its migration guide), so that they
mean the same on 2.42 and on 3.x: no Prometheus 3 binary runs in these tests, so the constructs
are checked in the text of every rule expression and dashboard query."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from verl_exporter import shipped

RULE_FILES = shipped.rule_files()
# A range or subquery window: "[1h]", "[15m:1m]", "[$__rate_interval]".
WINDOW = re.compile(r"\[([^\]:]+)(?::[^\]]*)?\]")
DURATION = re.compile(r"^(\d+)([smhd])$")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Left-open windows drop the sample at the window's start: keep several scrapes (15s) in each.
SHORTEST_WINDOW = 5 * 60


def rule_expressions() -> list[tuple[str, str]]:
    found = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                found.append((f"{path.name}: {rule.get('alert') or rule.get('record')}", rule["expr"]))
    return found


def dashboard_queries() -> list[tuple[str, str]]:
    found = []
    for path in sorted(shipped.dashboards_dir().glob("*.json")):
        dashboard = json.loads(path.read_text())
        stack = list(dashboard.get("panels", []))
        while stack:
            panel = stack.pop()
            stack.extend(panel.get("panels", []))
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"{path.name}: {panel.get('title')}", target["expr"]))
        for variable in dashboard.get("templating", {}).get("list", []):
            query = variable.get("query")
            text = query.get("query") if isinstance(query, dict) else query
            if variable.get("type") == "query" and text:
                found.append((f"{path.name}: ${variable['name']}", text))
    return found


EXPRESSIONS = rule_expressions() + dashboard_queries()


def test_there_is_something_to_check():
    assert len(rule_expressions()) > 100
    assert len(dashboard_queries()) > 100


@pytest.mark.parametrize("where, expr", EXPRESSIONS, ids=[where for where, _ in EXPRESSIONS])
def test_expression_means_the_same_on_prometheus_3(where, expr):
    # Removed (renamed and put behind a feature flag).
    assert not re.search(r"\b(holt_winters|double_exponential_smoothing)\s*\(", expr)
    # `le` and `quantile` values are normalised to floats ("1" becomes "1.0"): no matcher on them.
    assert not re.search(r"\b(le|quantile)\s*(=~|!~|!=|=)\s*\"", expr)
    # Names stay classic: no quoted UTF-8 metric or label names, which 2.42 cannot parse.
    assert not re.search(r"\{\s*\"", expr) and not re.search(r",\s*\"[^\"]*\"\s*(=~|!~|!=|=)", expr)
    for window in WINDOW.findall(expr):
        if window.startswith("$"):
            continue  # Grafana's $__rate_interval and $__range: several scrapes by construction
        match = DURATION.match(window)
        assert match, f"{where}: window {window!r}"
        assert int(match.group(1)) * SECONDS[match.group(2)] >= SHORTEST_WINDOW, f"{where}: [{window}]"


def test_the_checks_catch_what_prometheus_3_changed():
    offenders = ['holt_winters(x[1h], 0.5, 0.5)', 'x{le="1"}', 'rate(x[1m])', '{"vllm.requests"}',
                 'x{job="a", "host.name"="b"}']
    for expr in offenders:
        with pytest.raises(AssertionError):
            test_expression_means_the_same_on_prometheus_3("example", expr)
