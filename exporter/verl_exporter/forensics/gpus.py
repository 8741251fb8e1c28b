"""The job's GPUs at one moment, one line each, read through the exporter's GPU collector.

The collector (``collectors.gpu.GpuCollector`` over the exporter's NVML backend, or the fake one)
does the reading, with its own timeout; this module only turns its families into text. The GPUs
shown are those on which the job has a process, or every GPU where it has none (or no job is set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_exporter.collectors.gpu import GpuCollector

GIB = float(1 << 30)


def describe_gpus(collector: GpuCollector, job_pids: set[int] | None) -> str:
    """Text for the GPUs ``collector`` reads now; ``job_pids`` None when no job selector is set."""
    try:
        families, error = collector.read_now()
    except Exception as exc:  # the collector's own errors: never the capture's
        return f"GPUs could not be read: {type(exc).__name__}: {exc}\n"
    if error:
        return f"GPUs could not be read: {error}\n"
    gpus: dict[str, dict] = {}
    for family in families:
        for sample in family.samples:
            gpu = sample.labels.get("gpu")
            if gpu is not None:
                _take(gpus.setdefault(gpu, {"procs": {}, "events": [], "xids": {}}), sample)
    if not gpus:
        return "NVML sees no GPU\n"
    ordered = sorted(gpus.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0)
    mine = [(gpu, info) for gpu, info in ordered if job_pids and set(info["procs"]) & job_pids]
    if job_pids is None:
        head = f"{len(ordered)} GPUs (no --job.pid or --job.match: all shown)"
    elif mine:
        head = f"the job has processes on {len(mine)} of {len(ordered)} GPUs"
    else:
        head = f"the job has no process on any of the {len(ordered)} GPUs NVML sees (all shown)"
    lines = [head] + [_line(gpu, info, job_pids or set()) for gpu, info in (mine or ordered)]
    return "\n".join(lines) + "\n"


def _take(info: dict, sample: Any) -> None:
    name, labels, value = sample.name, sample.labels, sample.value
    if name == "verl_gpu_info":
        info["name"], info["uuid"] = labels.get("name", ""), labels.get("uuid", "")
    elif name == "verl_gpu_process_memory_bytes":
        info["procs"][int(labels["pid"])] = value
    elif name == "verl_gpu_clock_event_active":
        if value:
            info["events"].append(labels.get("reason", "?"))
    elif name == "verl_gpu_xid_errors_total":
        info["xids"][labels.get("xid", "?")] = value
    elif name == "verl_gpu_ecc_errors_total":
        if labels.get("type") == "uncorrected":
            info["ecc"] = value
    else:
        info[name] = value


def _line(gpu: str, info: dict, job_pids: set[int]) -> str:
    parts = [f"gpu {gpu} {info.get('name', '')} {info.get('uuid', '')}".rstrip()]
    if info.get("verl_gpu_up") == 0:
        return parts[0] + ": LOST (no longer answers NVML)"
    facts = []
    if "verl_gpu_utilization_ratio" in info:
        facts.append(f"utilization {info['verl_gpu_utilization_ratio']:.2f}")
    if "verl_gpu_memory_used_bytes" in info:
        total = info.get("verl_gpu_memory_total_bytes")
        facts.append(f"memory {info['verl_gpu_memory_used_bytes'] / GIB:.1f}"
                     + (f" of {total / GIB:.1f} GiB" if total else " GiB"))
    if "verl_gpu_temperature_celsius" in info:
        facts.append(f"{info['verl_gpu_temperature_celsius']:.0f} C")
    if "verl_gpu_power_watts" in info:
        facts.append(f"{info['verl_gpu_power_watts']:.0f} W")
    if info["events"]:
        facts.append("clock events " + ",".join(sorted(info["events"])))
    if info.get("ecc"):
        facts.append(f"uncorrectable ECC errors {info['ecc']:.0f}")
    for xid, count in sorted(info["xids"].items()):
        facts.append(f"XID {xid} x{count:.0f}")
    procs = [f"{pid} {used / GIB:.1f} GiB{' (job)' if pid in job_pids else ''}"
             for pid, used in sorted(info["procs"].items())]
    facts.append("processes " + (", ".join(procs) if procs else "none"))
    return parts[0] + ": " + "; ".join(facts)
