"""prometheus/kubernetes/prometheusrule.yml: the alert and recording rules as one Prometheus Operator
``PrometheusRule``, its ``spec.groups`` the groups of the shipped verl-*.rules.yml (by file name) and
then of recording-rules.yml, rendered from the same definitions as those files.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from . import render

PROMETHEUS_RULE_FILE = Path("prometheus/kubernetes/prometheusrule.yml")
NAME = "verl-exporter"
COMMENT = (
    "# The rules of alerts/rules/*.yml (alert and recording rules) for the Prometheus Operator.\n"
    "# The Prometheus resource must select it: match its ruleSelector (e.g. add the `release` label of\n"
    "# kube-prometheus-stack) and its ruleNamespaceSelector.   kubectl apply -f prometheusrule.yml\n"
)


def rule_groups(runbook_url: str = render.DEFAULT_RUNBOOK_URL,
                dashboard_url: str = render.DEFAULT_DASHBOARD_URL) -> list[dict]:
    """The rule groups, in the order a PrometheusRule lists them."""
    files = render.rule_files(runbook_url=runbook_url, dashboard_url=dashboard_url)
    groups = [group for name in sorted(files) for group in yaml.safe_load(files[name])["groups"]]
    return groups + yaml.safe_load(render.recording_rules())["groups"]


def prometheus_rule(runbook_url: str = render.DEFAULT_RUNBOOK_URL,
                    dashboard_url: str = render.DEFAULT_DASHBOARD_URL) -> str:
    """The PrometheusRule manifest's text; each alert's ``runbook_url`` is ``runbook_url#anchor``, its
    ``dashboard_url`` under ``dashboard_url``."""
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
        "spec": {"groups": rule_groups(runbook_url, dashboard_url)},
    }
    return COMMENT + render.dump(manifest)
