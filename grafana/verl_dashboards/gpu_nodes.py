"""GPU nodes: per-GPU memory, utilization, temperature, power, clocks, throttle reasons, ECC and XID
errors and per-process memory, plus the host, for the nodes of the selected runs.

The ``instance`` variable lists the exporters that follow the selected runs (GPU series carry no run
labels: one exporter is the sidecar of one job); ``gpu`` narrows to some GPUs of those nodes.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from .common import (
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
    stat_panel,
    steps,
    timeseries_panel,
    to_json,
)
from .run_detail import GPU_BUSY_RATIO, GPU_CRITICAL_CELSIUS, GPU_HOT_CELSIUS, GPU_LEGEND

UID = "verl-gpu"
TITLE = "verl / GPU nodes"
SEL = 'instance=~"$instance", gpu=~"$gpu"'
NODE = 'instance=~"$instance"'
NVML = "Read from NVML at scrape time."


def gpu_panel(title: str, description: str, unit: str, step_list: list, metric: str, *,
              legend: str = GPU_LEGEND, width: int = 12, **kwargs):
    """A time series of one per-GPU expression; ``{sel}`` in ``metric`` is the instance/gpu selector."""
    return timeseries_panel(title, f"{description} {NVML}", unit, step_list,
                            [query(metric.format(sel=SEL), legend)], width=width, **kwargs)


def variables() -> list:
    return [
        datasource_variable(),
        *run_variables(multi=True),
        query_variable("instance", "Node", f"label_values(verl_node_run_info{{{RUNS}}}, instance)", multi=True,
                       description="Exporters (one per node of a training job) working for the selected runs"),
        query_variable("gpu", "GPU", f"label_values(verl_gpu_info{{{NODE}}}, gpu)", multi=True,
                       description="GPU index on the node"),
    ]


def overview_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Overview"))
    near_total = spec("verl_perf_max_memory_allocated_bytes").thresholds["near_total_ratio"]
    for title, description, unit, step_list, expr in (
        ("GPUs up", "GPUs answering NVML.", "none", steps(NEUTRAL), f"sum(verl_gpu_up{{{SEL}}})"),
        ("GPUs lost", "GPUs that stopped answering NVML (fell off the bus, XID 79).", "none",
         steps(GREEN, (1, RED)), f"count(verl_gpu_up{{{SEL}}} == 0) or vector(0)"),
        ("Mean utilization", "Mean share of time a kernel ran.", "percentunit",
         steps(ORANGE, (GPU_BUSY_RATIO, GREEN)), f"avg(verl_gpu_utilization_ratio{{{SEL}}})"),
        ("Memory in use", "GPU memory in use over total.", "percentunit", steps(GREEN, (near_total, RED)),
         f"sum(verl_gpu_memory_used_bytes{{{SEL}}}) / sum(verl_gpu_memory_total_bytes{{{SEL}}})"),
        ("Hottest GPU", "Highest GPU core temperature.", "celsius",
         steps(GREEN, (GPU_HOT_CELSIUS, ORANGE), (GPU_CRITICAL_CELSIUS, RED)),
         f"max(verl_gpu_temperature_celsius{{{SEL}}})"),
        ("Power draw", "Power drawn by the selected GPUs together.", "watt", steps(NEUTRAL),
         f"sum(verl_gpu_power_watts{{{SEL}}})"),
    ):
        dash.with_panel(stat_panel(title, f"{description} {NVML}", unit, step_list,
                                   [query(expr, title, instant=True)], width=4, graph=True))


def memory_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Memory"))
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
    dash.with_row(db.Row("Utilization"))
    dash.with_panel(gpu_panel("GPU utilization", "Share of the sample period a kernel ran on the GPU.",
                              "percentunit", steps(ORANGE, (GPU_BUSY_RATIO, GREEN)),
                              "verl_gpu_utilization_ratio{{{sel}}}", min_value=0, max_value=1))
    dash.with_panel(gpu_panel("Memory bandwidth utilization",
                              "Share of the sample period device memory was read or written (not memory used).",
                              "percentunit", steps(NEUTRAL), "verl_gpu_memory_utilization_ratio{{{sel}}}",
                              min_value=0, max_value=1))


def thermals_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Temperature, power and clocks"))
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
    dash.with_row(db.Row("Throttling and errors"))
    dash.with_panel(timeseries_panel(
        "Clock event reasons (GPUs affected)",
        "Number of GPUs whose clocks are held down, per reason (thermal or power slowdown, power cap, idle). "
        f"Anything but gpu_idle on a busy GPU costs throughput. {NVML}",
        "none", steps(GREEN, (1, ORANGE)),
        [query(f"sum by (reason) (verl_gpu_clock_event_active{{{SEL}}})", "{{reason}}")], width=12))
    dash.with_panel(timeseries_panel(
        "ECC errors", "New ECC memory errors per GPU and type (aggregate counter); any uncorrected error "
        f"needs a GPU reset or replacement. {NVML}", "none", steps(GREEN, (1, RED)),
        [query(f"sum by (instance, gpu, type) (increase(verl_gpu_ecc_errors_total{{{SEL}}}[$__rate_interval]))",
               GPU_LEGEND + " {{type}}")], width=6))
    dash.with_panel(timeseries_panel(
        "XID errors", "New XID critical errors per GPU (0 where none occurred); XID 79 means the GPU fell off "
        f"the bus, 48 a double-bit ECC error. {NVML}", "none", steps(GREEN, (1, RED)),
        [query(f"sum by (instance, gpu) (increase(verl_gpu_xid_errors_total{{{SEL}}}[$__rate_interval])) "
               f"or sum by (instance, gpu) (0 * verl_gpu_up{{{SEL}}})", GPU_LEGEND)], width=6))
    dash.with_panel(gpu_panel("Remapped rows", "Memory rows remapped per state; a 'failure' means the GPU "
                              "has run out of spare rows and needs replacing.", "none", steps(GREEN, (1, ORANGE)),
                              "verl_gpu_remapped_rows{{{sel}}}", legend=GPU_LEGEND + " {{state}}"))
    dash.with_panel(gpu_panel("PCIe replays", "PCIe link-level retransmissions per second; a steady rate "
                              "points at a bad link or riser.", "ops", steps(GREEN, (1, ORANGE)),
                              "rate(verl_gpu_pcie_replay_errors_total{{{sel}}}[$__rate_interval])"))


def processes_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Processes and host"))
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
    dash = new_dashboard(UID, TITLE, "The GPUs and hosts of verl training jobs, one line per GPU.",
                         variables(), NODE)
    for row in (overview_row, memory_row, utilization_row, thermals_row, errors_row, processes_row):
        row(dash)
    return to_json(dash)
