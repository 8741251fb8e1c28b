"""The datacenter view: each GPU figure recorded once per node and once for the fleet.

A panel that aggregates every GPU's raw series over its time range reads 8,000 series of 180 points
each at 1,000 nodes, and an operator waits seconds for it. The ``verl-nodes`` group reduces the GPU
figures the overviews show to one series per node (``instance:``, labels ``job, instance``) and one
for the fleet (``job:``); ``verl-gpu-errors`` reduces the GPU counters that are almost always zero
(ECC errors, XID errors, remapped rows) to the GPUs that have any (``gpu:...:nonzero``, the raw
series' labels: none at all on a healthy fleet). A panel then reads about as many series as it shows,
and each group reads every raw series it needs once per evaluation. Rules of a group run in order: the
fleet's figures read the nodes' recorded just before them in the same evaluation. The per-run GPU
figures (``nodes.py``, group ``verl-run-gpus``) add up these per-node figures over the nodes of each
run.
"""

from __future__ import annotations

# Per node (job, instance), by the aggregation and the raw series they are made of.
NODE_FIGURES = {
    ("count", "verl_gpu_up"): "instance:verl_gpus:count",
    ("sum", "verl_gpu_up"): "instance:verl_gpus_up:sum",
    ("sum", "verl_gpu_utilization_ratio"): "instance:verl_gpu_utilization_ratio:sum",
    ("count", "verl_gpu_utilization_ratio"): "instance:verl_gpu_utilization_ratio:count",
    ("sum", "verl_gpu_memory_used_bytes"): "instance:verl_gpu_memory_used_bytes:sum",
    ("sum", "verl_gpu_memory_total_bytes"): "instance:verl_gpu_memory_total_bytes:sum",
    ("sum", "verl_gpu_power_watts"): "instance:verl_gpu_power_watts:sum",
    ("max", "verl_gpu_temperature_celsius"): "instance:verl_gpu_temperature_celsius:max",
}
NODE_GPUS = NODE_FIGURES["count", "verl_gpu_up"]
NODE_GPUS_UP = NODE_FIGURES["sum", "verl_gpu_up"]
NODE_HOTTEST = NODE_FIGURES["max", "verl_gpu_temperature_celsius"]
# A node's mean GPU utilisation, and the share of its GPUs' memory in use.
NODE_BUSY = "instance:verl_gpu_utilization_ratio:avg"
NODE_MEMORY_SHARE = "instance:verl_gpu_memory_used:ratio"
# The fleet (job): sums over the nodes, and the mean utilisation over every GPU.
FLEET_GPUS = "job:verl_gpus:count"
FLEET_GPUS_UP = "job:verl_gpus_up:sum"
FLEET_BUSY = "job:verl_gpu_utilization_ratio:avg"
FLEET_MEMORY_USED = "job:verl_gpu_memory_used_bytes:sum"
FLEET_MEMORY_TOTAL = "job:verl_gpu_memory_total_bytes:sum"
FLEET_POWER = "job:verl_gpu_power_watts:sum"
# The GPUs with any (the raw series' labels, the value above 0).
GPU_ECC_ERRORS = "gpu:verl_gpu_ecc_errors:nonzero"
GPU_XID_ERRORS = "gpu:verl_gpu_xid_errors:nonzero"
GPU_REMAPPED_ROWS = "gpu:verl_gpu_remapped_rows:nonzero"


def _node_rule(key: tuple[str, str]) -> dict:
    aggregation, metric = key
    return {"record": NODE_FIGURES[key], "expr": f"{aggregation} by (job, instance) ({metric})"}


def _fleet_sum(record: str, per_node: str) -> dict:
    return {"record": record, "expr": f"sum by (job) ({per_node})"}


def recording_rules() -> list[dict]:
    """The verl-nodes and verl-gpu-errors groups."""
    busy_sum = NODE_FIGURES["sum", "verl_gpu_utilization_ratio"]
    busy_count = NODE_FIGURES["count", "verl_gpu_utilization_ratio"]
    used, total = NODE_FIGURES["sum", "verl_gpu_memory_used_bytes"], NODE_FIGURES["sum", "verl_gpu_memory_total_bytes"]
    return [
        {"name": "verl-nodes", "rules": [
            *(_node_rule(key) for key in NODE_FIGURES),
            {"record": NODE_BUSY, "expr": f"{busy_sum} / {busy_count}"},
            {"record": NODE_MEMORY_SHARE, "expr": f"{used} / {total}"},
            _fleet_sum(FLEET_GPUS, NODE_GPUS),
            _fleet_sum(FLEET_GPUS_UP, NODE_GPUS_UP),
            {"record": FLEET_BUSY, "expr": f"sum by (job) ({busy_sum}) / sum by (job) ({busy_count})"},
            _fleet_sum(FLEET_MEMORY_USED, used),
            _fleet_sum(FLEET_MEMORY_TOTAL, total),
            _fleet_sum(FLEET_POWER, NODE_FIGURES["sum", "verl_gpu_power_watts"]),
        ]},
        {"name": "verl-gpu-errors", "rules": [
            {"record": GPU_ECC_ERRORS, "expr": "verl_gpu_ecc_errors_total > 0"},
            {"record": GPU_XID_ERRORS, "expr": "verl_gpu_xid_errors_total > 0"},
            {"record": GPU_REMAPPED_ROWS, "expr": "verl_gpu_remapped_rows > 0"},
        ]},
    ]
