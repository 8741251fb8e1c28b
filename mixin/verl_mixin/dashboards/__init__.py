"""verl-exporter's Grafana dashboards as code (grafana-foundation-sdk); ``python -m verl_mixin.dashboards``
writes them."""

from __future__ import annotations

from verl_exporter import shipped

from . import fleet, gpu_nodes, run_detail

# grafana/dashboards/ of the checkout, where the generated dashboards are kept.
DASHBOARDS_DIR = shipped.CHECKOUT / "grafana" / "dashboards"

# File name in DASHBOARDS_DIR -> builder.
BUILDERS = {
    "fleet-overview.json": fleet.build,
    "run-detail.json": run_detail.build,
    "gpu-nodes.json": gpu_nodes.build,
}


def build_all() -> dict[str, dict]:
    """Every dashboard's Grafana JSON model, by file name."""
    return {filename: build() for filename, build in BUILDERS.items()}
