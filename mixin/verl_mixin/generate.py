"""Write every generated file of the alerts, or with ``--check``, name those that are out of date.

    python -m verl_mixin [--check] [--runbook-url URL] [--dashboard-url URL] [--root DIR]

writes, under the checkout (``--root``): the alert and recording rules and RUNBOOK.md into
``alerts/``, docs/alerts.md and
prometheus/kubernetes/prometheusrule.yml. ``make generate RUNBOOK_URL=...`` passes ``--runbook-url``,
the base of every ``runbook_url`` (default: the exporter's ``/runbook``), and ``DASHBOARD_URL=...``
passes ``--dashboard-url``, the Grafana of every ``dashboard_url`` (default: the compose stack's);
``--check`` compares with the same bases.

``verl-exporter rules --runbook-url URL --out DIR`` (``rules_main``) writes the same rule files, the
PrometheusRule and RUNBOOK.md into DIR, from an installed package, without a checkout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_exporter.store.catalog import Catalog, default_catalog

from . import jsonnet, kubernetes, render


def outputs(catalog: Catalog | None = None, runbook_url: str = render.DEFAULT_RUNBOOK_URL,
            dashboard_url: str = render.DEFAULT_DASHBOARD_URL) -> dict[Path, str]:
    """Every generated file (path relative to the checkout's root) and its content."""
    catalog = catalog or default_catalog()
    files = {render.RULES_DIR / name: text for name, text
             in render.rule_files(catalog, runbook_url=runbook_url, dashboard_url=dashboard_url).items()}
    files[render.RULES_DIR / render.RECORDING_RULES_FILE] = render.recording_rules(catalog)
    files[render.RUNBOOK_FILE] = render.runbook(catalog)
    files[Path("docs/alerts.md")] = render.table(catalog)
    files[kubernetes.PROMETHEUS_RULE_FILE] = kubernetes.prometheus_rule(runbook_url, dashboard_url)
    files.update(jsonnet.parts())  # the mixin's: its bases are its _config's, whatever these are
    return files


def stale_files(root: Path = render.REPO, catalog: Catalog | None = None,
                runbook_url: str = render.DEFAULT_RUNBOOK_URL,
                dashboard_url: str = render.DEFAULT_DASHBOARD_URL) -> list[Path]:
    """Generated files under ``root`` that differ from what the definitions give."""
    return [path for path, text in outputs(catalog, runbook_url, dashboard_url).items()
            if not (root / path).is_file() or (root / path).read_text(encoding="utf-8") != text]


def _write(files: dict[Path, str], root: Path) -> None:
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_mixin", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    parser.add_argument("--runbook-url", default=render.DEFAULT_RUNBOOK_URL, metavar="URL",
                        help="base of every alert's runbook_url, before #anchor (default: %(default)s)")
    parser.add_argument("--dashboard-url", default=render.DEFAULT_DASHBOARD_URL, metavar="URL",
                        help="Grafana of every alert's dashboard_url (default: %(default)s)")
    parser.add_argument("--root", type=Path, default=render.REPO, help="checkout root to write under")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.root, runbook_url=args.runbook_url, dashboard_url=args.dashboard_url)
        for path in stale:
            print(f"out of date: {path} (run make generate)", file=sys.stderr)
        return 1 if stale else 0
    _write(outputs(runbook_url=args.runbook_url, dashboard_url=args.dashboard_url), args.root)
    return 0


DESCRIPTION = ("Write the alert and recording rules (and a Prometheus Operator PrometheusRule, and "
                    "RUNBOOK.md) with every runbook_url under URL, for a runbook hosted there.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``verl-exporter rules``."""
    parser.add_argument("--runbook-url", default=render.DEFAULT_RUNBOOK_URL, metavar="URL",
                        help="base of every alert's runbook_url, before #anchor (default: %(default)s, "
                             "the exporter's own /runbook)")
    parser.add_argument("--dashboard-url", default=render.DEFAULT_DASHBOARD_URL, metavar="URL",
                        help="Grafana of every alert's dashboard_url (default: %(default)s)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write the files into")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``verl-exporter rules``: the shipped rules rendered with another runbook base, into a folder."""
    catalog = default_catalog()
    files = {Path(name): text for name, text
             in render.rule_files(catalog, runbook_url=args.runbook_url, dashboard_url=args.dashboard_url).items()}
    files[Path(render.RECORDING_RULES_FILE)] = render.recording_rules(catalog)
    files[Path(kubernetes.PROMETHEUS_RULE_FILE.name)] = kubernetes.prometheus_rule(args.runbook_url,
                                                                                   args.dashboard_url)
    files[Path(render.RUNBOOK_FILE.name)] = render.runbook(catalog)
    _write(files, args.out)
    return 0
