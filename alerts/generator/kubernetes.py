"""prometheus/kubernetes/prometheusrule.yml: the alert and recording rules as one Prometheus Operator
``PrometheusRule``, its ``spec.groups`` the groups of alerts/*.rules.yml (by file name) and then of
prometheus/recording-rules.yml, rendered from the same definitions as those files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from . import render

PROMETHEUS_RULE_FILE = Path("prometheus/kubernetes/prometheusrule.yml")
NAME = "verl-exporter"
COMMENT = (
    "# The rules of alerts/*.rules.yml and prometheus/recording-rules.yml for the Prometheus Operator.\n"
    "# The Prometheus resource must select it: match its ruleSelector (e.g. add the `release` label of\n"
    "# kube-prometheus-stack) and its ruleNamespaceSelector.   kubectl apply -f prometheusrule.yml\n"
)


def rule_groups() -> list[dict]:
    """The rule groups, in the order a PrometheusRule lists them."""
    files = render.rule_files()
    groups = [group for name in sorted(files) for group in yaml.safe_load(files[name])["groups"]]
    return groups + yaml.safe_load(render.recording_rules())["groups"]


def prometheus_rule() -> str:
    """The PrometheusRule manifest's text."""
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
        "spec": {"groups": rule_groups()},
    }
    return COMMENT + render.dump(manifest)


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the PrometheusRule, as alerts/generate.py does its files."""
    parser = argparse.ArgumentParser(prog="generate.py")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--root", type=Path, default=render.REPO)
    args = parser.parse_args(argv)
    target = args.root / PROMETHEUS_RULE_FILE
    text = prometheus_rule()
    if args.check:
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            print(f"out of date: {PROMETHEUS_RULE_FILE} (run python alerts/generate.py)", file=sys.stderr)
            return 1
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    print(f"wrote {PROMETHEUS_RULE_FILE}")
    return 0
