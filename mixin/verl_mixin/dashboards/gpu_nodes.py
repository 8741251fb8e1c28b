"""GPU nodes: the nodes of the selected runs at a glance, then one node's GPUs in detail.

The overview reads what is cheap at any fleet size: the per-run recording rules
(``project_experiment:verl_gpu_*``), the per-node ones (``instance:verl_gpu_*``) for the ten nodes
that stand out, and the GPUs that have any ECC error, XID error or remapped row
(``gpu:verl_gpu_*:nonzero``; almost always none). The detail rows below are one node's GPUs
(``instance``, a single choice that defaults to the first node of the selected runs, narrowed with
``gpu``): memory, utilization, temperature, power, clocks, throttle reasons, errors, processes and
the host. GPU series carry no run labels: one exporter is the sidecar of one job, and
``verl_node_run_info`` names the runs each node works for.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.models.dashboard import DataTransformerConfig

from verl_mixin import fleet

from .common import (
    DATASOURCE,
    GREEN,
    NEUTRAL,
    ORANGE,
    RED,
    RUNS,
    SYSTEM,
    datasource_variable,
    new_dashboard,
    query,
    query_variable,
    run_variables,
    spec,
    standing_out,
    stat_panel,
    steps,
    thresholds,
    timeseries_panel,
    to_json,
)
from .run_detail import GPU_BUSY_RATIO, GPU_CRITICAL_CELSIUS, GPU_HOT_CELSIUS, GPU_LEGEND

UID = "verl-gpu"
TITLE = "verl / GPU nodes"
NODE = 'instance="$instance"'
SEL = 'instance="$instance", gpu=~"$gpu"'
NVML = "Read from NVML at scrape time."
# The nodes of the selected runs (one series per run of a node).
RUN_NODE_INFO = f"verl_node_run_info{{{RUNS}}}"
# The ten nodes that stand out.
OFFENDERS = 10


def of_runs(per_node: str) -> str:
    """A per-node (or per-GPU) series kept for the nodes of the selected runs."""
    return f"{per_node} and on(job, instance) {RUN_NODE_INFO}"


def per_run(name: str) -> str:
    """A per-run recording rule of the selected runs."""
    return f"{name}{{{RUNS}}}"


def gpu_panel(title: str, description: str, unit: str, step_list: list, metric: str, *,
              legend: str = GPU_LEGEND, width: int = 12, min_value: float | None = None,
              max_value: float | None = None) -> timeseries.Panel:
    """A time series of one per-GPU expression of the node; ``{sel}`` in ``metric`` is its selector."""
    return timeseries_panel(title, f"{description} {NVML}", unit, step_list,
                            [query(metric.format(sel=SEL), legend)], width=width, min_value=min_value,
                            max_value=max_value)


def variables() -> list:
    return [
        datasource_variable(),
        *run_variables(multi=True),
        query_variable("instance", "Node", f"label_values(verl_node_run_info{{{RUNS}}}, instance)", multi=False,
                       description="The node whose GPUs the rows below show: one exporter, the sidecar of a node "
                                   "of a training job working for one of the selected runs"),
        query_variable("gpu", "GPU", f"label_values(verl_gpu_info{{{NODE}}}, gpu)", multi=True,
                       description="GPU index on the node"),
    ]


def overview_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Nodes of the selected runs"))
    scope = "Over every node of the selected runs (per-run recording rules)."
    near_total = spec("verl_perf_max_memory_allocated_bytes").thresholds["near_total_ratio"]
    gpus = per_run("project_experiment:verl_gpus:count")
    for title, description, unit, step_list, expr in (
        ("GPUs up", "GPUs answering NVML.", "none", steps(NEUTRAL),
         f"sum({per_run('project_experiment:verl_gpus_up:sum')})"),
        ("GPUs lost", "GPUs that stopped answering NVML (fell off the bus, XID 79).", "none",
         steps(GREEN, (1, RED)),
         f"sum({gpus}) - sum({per_run('project_experiment:verl_gpus_up:sum')}) or vector(0)"),
        ("Mean utilization", "Mean share of time a kernel ran.", "percentunit",
         steps(ORANGE, (GPU_BUSY_RATIO, GREEN)),
         f"sum({per_run('project_experiment:verl_gpu_utilization_ratio:avg')} * {gpus}) / sum({gpus})"),
        ("Memory in use", "GPU memory in use over total.", "percentunit", steps(GREEN, (near_total, RED)),
         f"sum({per_run('project_experiment:verl_gpu_memory_used_bytes:sum')})"
         f" / sum({per_run('project_experiment:verl_gpu_memory_total_bytes:sum')})"),
        ("Hottest GPU", "Highest GPU core temperature (per-node recording rules).", "celsius",
         steps(GREEN, (GPU_HOT_CELSIUS, ORANGE), (GPU_CRITICAL_CELSIUS, RED)),
         f"max({of_runs(fleet.NODE_HOTTEST)})"),
        ("Power draw", "Power drawn by the GPUs together.", "watt", steps(NEUTRAL),
         f"sum({per_run('project_experiment:verl_gpu_power_watts:sum')})"),
    ):
        extra = "" if "recording rules" in description else f" {scope}"
        dash.with_panel(stat_panel(title, f"{description}{extra} {NVML}", unit, step_list,
                                   [query(expr, title, instant=True)], width=4))
    ten = (f"The {OFFENDERS} nodes of the selected runs that stand out over the time range (per-node "
                    "recording rules); pick one as Node to see its GPUs, and their throttle reasons, below.")
    dash.with_panel(timeseries_panel(
        "Least busy nodes", f"Mean GPU utilization of a node (the least busy on average). {ten}", "percentunit",
        steps(ORANGE, (GPU_BUSY_RATIO, GREEN)),
        [query(standing_out("bottomk", OFFENDERS, fleet.NODE_BUSY, RUN_NODE_INFO), "{{instance}}")], width=8,
        min_value=0, max_value=1))
    dash.with_panel(timeseries_panel(
        "Fullest GPU memory", f"GPU memory in use over total, per node (the fullest on average). {ten}", "percentunit",
        steps(GREEN, (near_total, RED)),
        [query(standing_out("topk", OFFENDERS, fleet.NODE_MEMORY_SHARE, RUN_NODE_INFO), "{{instance}}")], width=8,
        min_value=0, max_value=1))
    dash.with_panel(timeseries_panel(
        "Hottest nodes", f"Temperature of a node's hottest GPU (the hottest on average). {ten}", "celsius",
        steps(GREEN, (GPU_HOT_CELSIUS, ORANGE), (GPU_CRITICAL_CELSIUS, RED)),
        [query(standing_out("topk", OFFENDERS, fleet.NODE_HOTTEST, RUN_NODE_INFO), "{{instance}}")], width=8))
    errors_any(dash)


def errors_table(title: str, description: str, name: str, labels: tuple[str, ...]) -> table.Panel:
    """GPUs of the selected runs' nodes whose counter ``name`` (a ``gpu:...:nonzero`` rule) is above 0."""
    columns = ("instance", "gpu", *labels, "uuid")
    return (table.Panel().title(title).description(f"{description} {NVML}").datasource(DATASOURCE).unit("none")
            .thresholds(thresholds(steps(GREEN, (1, RED)))).span(8).height(6)
            .targets([query(of_runs(name), instant=True, table=True)])
            .with_transformation(DataTransformerConfig(id_val="organize", options={
                "excludeByName": {"Time": True, "job": True, "__name__": True},
                "indexByName": {column: index for index, column in enumerate((*columns, "Value"))},
                "renameByName": {"instance": "Node", "gpu": "GPU", "Value": "Count"},
            })))


def errors_any(dash: db.Dashboard) -> None:
    """Which GPUs have any ECC error, XID error or remapped row (recording rules; usually none)."""
    which = "Only the GPUs that have any (recording rules): on a healthy fleet this table is empty."
    dash.with_panel(errors_table(
        "GPUs with ECC errors", f"ECC memory errors since the driver loaded, per GPU and type (aggregate "
        f"counter); any uncorrected error needs a GPU reset or replacement. {which}",
        fleet.GPU_ECC_ERRORS, ("type",)))
    dash.with_panel(errors_table(
        "GPUs with XID errors", "XID critical errors per GPU and code since the exporter started; XID 79 means "
        f"the GPU fell off the bus, 48 a double-bit ECC error. {which}", fleet.GPU_XID_ERRORS, ("xid",)))
    dash.with_panel(errors_table(
        "GPUs with remapped rows", "Memory rows remapped per state; a 'failure' means the GPU has run out of "
        f"spare rows and needs replacing, 'pending' waits for a GPU reset. {which}",
        fleet.GPU_REMAPPED_ROWS, ("state",)))


def memory_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Node $instance: memory"))
    near_total = spec("verl_perf_max_memory_allocated_bytes").thresholds["near_total_ratio"]
    dash.with_panel(gpu_panel(
        "Memory used", "GPU memory in use over total. Red above the catalog's near-out-of-memory share.",
        "percentunit", steps(GREEN, (near_total, RED)),
        "verl_gpu_memory_used_bytes{{{sel}}} / verl_gpu_memory_total_bytes{{{sel}}}", width=8,
        min_value=0, max_value=1))
    dash.with_panel(gpu_panel("Memory used (bytes)", "GPU memory in use.", "bytes", steps(NEUTRAL),
                              "verl_gpu_memory_used_bytes{{{sel}}}", width=8))
    dash.with_panel(gpu_panel("Memory reserved by the driver", "Memory the driver keeps for itself "
                              "(NVML memory info v2; absent on old drivers).", "bytes", steps(NEUTRAL),
                              "verl_gpu_memory_reserved_bytes{{{sel}}}", width=8))


def utilization_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Node $instance: utilization"))
    dash.with_panel(gpu_panel("GPU utilization", "Share of the sample period a kernel ran on the GPU.",
                              "percentunit", steps(ORANGE, (GPU_BUSY_RATIO, GREEN)),
                              "verl_gpu_utilization_ratio{{{sel}}}", min_value=0, max_value=1))
    dash.with_panel(gpu_panel("Memory bandwidth utilization",
                              "Share of the sample period device memory was read or written (not memory used).",
                              "percentunit", steps(NEUTRAL), "verl_gpu_memory_utilization_ratio{{{sel}}}",
                              min_value=0, max_value=1))


def thermals_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Node $instance: temperature, power and clocks"))
    dash.with_panel(gpu_panel("Temperature", f"GPU core temperature; orange from {GPU_HOT_CELSIUS} °C (VerlGpuHot), "
                                             f"red from {GPU_CRITICAL_CELSIUS} °C.", "celsius",
                              steps(GREEN, (GPU_HOT_CELSIUS, ORANGE), (GPU_CRITICAL_CELSIUS, RED)),
                              "verl_gpu_temperature_celsius{{{sel}}}", width=6))
    dash.with_panel(timeseries_panel(
        "Power and limit", f"Power draw (solid) and the power limit the driver enforces. {NVML}", "watt",
        steps(NEUTRAL), [query(f"verl_gpu_power_watts{{{SEL}}}", GPU_LEGEND),
                         query(f"max by (instance) (verl_gpu_power_limit_watts{{{SEL}}})", "{{instance}} limit")],
        width=6))
    dash.with_panel(gpu_panel("SM clock", "Current streaming-multiprocessor clock.", "hertz", steps(NEUTRAL),
                              "verl_gpu_sm_clock_hertz{{{sel}}}", width=6))
    dash.with_panel(gpu_panel("Memory clock", "Current memory clock.", "hertz", steps(NEUTRAL),
                              "verl_gpu_memory_clock_hertz{{{sel}}}", width=6))


def errors_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Node $instance: throttling and errors"))
    dash.with_panel(timeseries_panel(
        "Clock event reasons (GPUs affected)",
        "Number of the node's GPUs whose clocks are held down, per reason (thermal or power slowdown, power "
        f"cap, idle). Anything but gpu_idle on a busy GPU costs throughput. {NVML}",
        "none", steps(GREEN, (1, ORANGE)),
        [query(f"sum by (reason) (verl_gpu_clock_event_active{{{SEL}}})", "{{reason}}")], width=8))
    which = "Only the GPUs that have any: empty on a healthy node."
    dash.with_panel(timeseries_panel(
        "ECC errors (GPUs with any)", "ECC memory errors since the driver loaded, per GPU and type (aggregate "
        f"counter); any uncorrected error needs a GPU reset or replacement. {which} {NVML}", "none",
        steps(GREEN, (1, RED)),
        [query(f"sum by (instance, gpu, type) (verl_gpu_ecc_errors_total{{{SEL}}}) > 0", GPU_LEGEND + " {{type}}")],
        width=4))
    dash.with_panel(timeseries_panel(
        "XID errors (GPUs with any)", "XID critical errors per GPU and code since the exporter started; XID 79 "
        f"means the GPU fell off the bus, 48 a double-bit ECC error. {which} {NVML}", "none", steps(GREEN, (1, RED)),
        [query(f"sum by (instance, gpu, xid) (verl_gpu_xid_errors_total{{{SEL}}}) > 0", GPU_LEGEND + " XID {{xid}}")],
        width=4))
    dash.with_panel(gpu_panel("Remapped rows (GPUs with any)", "Memory rows remapped per state; a 'failure' means "
                              f"the GPU has run out of spare rows and needs replacing. {which}", "none",
                              steps(GREEN, (1, ORANGE)), "verl_gpu_remapped_rows{{{sel}}} > 0",
                              legend=GPU_LEGEND + " {{state}}", width=4))
    dash.with_panel(gpu_panel("PCIe replays", "PCIe link-level retransmissions per second; a steady rate "
                              "points at a bad link or riser.", "ops", steps(GREEN, (1, ORANGE)),
                              "rate(verl_gpu_pcie_replay_errors_total{{{sel}}}[$__rate_interval])", width=4))


def processes_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Node $instance: processes and host"))
    dash.with_panel(gpu_panel("GPU memory per process", "GPU memory used by each compute process.", "bytes",
                              steps(NEUTRAL), "verl_gpu_process_memory_bytes{{{sel}}}",
                              legend=GPU_LEGEND + " pid {{pid}}", width=24))
    dash.with_panel(timeseries_panel(
        "Host CPU utilization", "Share of CPU time spent busy, all CPUs of the node (psutil).", "percentunit",
        steps(NEUTRAL), [query(f"verl_host_cpu_utilization_ratio{{{NODE}}}", "{{instance}}")],
        min_value=0, max_value=1))
    dash.with_panel(timeseries_panel(
        "Host memory used", "Share of host memory not available to new allocations (1 - available / total, "
        "psutil); orange where VerlHostMemoryNearlyFull fires, red when little is left for the data loader "
        "and Ray's object store.", "percentunit",
        steps(GREEN, (1 - SYSTEM["host_memory_available_min"], ORANGE), (SYSTEM["host_memory_used_critical"], RED)),
        [query(f"1 - verl_host_memory_available_bytes{{{NODE}}} / verl_host_memory_total_bytes{{{NODE}}}",
               "{{instance}}")],
        min_value=0, max_value=1))


def build() -> dict:
    """The GPU nodes dashboard as Grafana JSON."""
    dash = new_dashboard(UID, TITLE, "The GPUs and hosts of verl training jobs: the nodes of the selected runs, "
                         "then one node's GPUs.", variables(), NODE)
    for row in (overview_row, memory_row, utilization_row, thermals_row, errors_row, processes_row):
        row(dash)
    return to_json(dash)
