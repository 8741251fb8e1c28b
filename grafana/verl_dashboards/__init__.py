"""verl-exporter's Grafana dashboards as code (grafana-foundation-sdk); ``python -m verl_dashboards`` writes them."""

from __future__ import annotations

from pathlib import Path

from . import fleet, gpu_nodes, run_detail

# grafana/dashboards/ (verl_exporter.shipped.dashboards_dir() in this checkout).
DASHBOARDS_DIR = Path(__file__).resolve().parents[1] / "dashboards"

# File name in DASHBOARDS_DIR -> builder.
BUILDERS = {
    "fleet-overview.json": fleet.build,
    "run-detail.json": run_detail.build,
    "gpu-nodes.json": gpu_nodes.build,
}


def build_all() -> dict[str, dict]:
    """Every dashboard's Grafana JSON model, by file name."""
    return {filename: build() for filename, build in BUILDERS.items()}
