"""Every family the exporter serves itself, as data: name, type, HELP and labels.

The bottom of the package: it imports nothing of it. Collectors build their families from these
entries (``Family.new``); the catalog takes the names logged keys may not have from here
(``reserved_names``), so renaming a family here renames it everywhere, and a logged key can
never take it. Logged verl keys are not listed: the catalog names them (``catalog.yaml``).

A counter is listed by its family name (``verl_training_steps_ingested``); it is served as
``..._total``. Labels a family takes from elsewhere at run time (the run config's info labels
the catalog lists) are added with ``Family.new(extra_labels)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

Built = GaugeMetricFamily | CounterMetricFamily  # what ``Family.new`` gives: a family samples are added to
# A run's labels: its names, its owner (the user whose file or job named it) and the owner's team.
RUN = ("project", "experiment", "user", "team")
GPU = ("gpu", "uuid")
# The sample names a family ``N`` can show, in either exposition format, whatever its type.
SAMPLE_SUFFIXES = ("", "_total", "_created", "_info", "_count", "_sum", "_bucket", "_gcount", "_gsum")


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...] = ()
    optional: bool = False  # a per-run family served only where some run has a sample

    def new(self, extra_labels: tuple[str, ...] | list[str] = ()) -> Built:
        """A fresh, empty client_python family of this entry."""
        kind = CounterMetricFamily if self.type == "counter" else GaugeMetricFamily
        return kind(self.name, self.help, labels=[*self.labels, *extra_labels])

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The names its samples may have."""
        return tuple(self.name + suffix for suffix in SAMPLE_SUFFIXES)


def _gauge(name: str, help: str, labels: tuple[str, ...] = (), optional: bool = False) -> Family:
    return Family(name, "gauge", help, labels, optional)


def _counter(name: str, help: str, labels: tuple[str, ...] = (), optional: bool = False) -> Family:
    return Family(name, "counter", help, labels, optional)


def _by_key(*families: tuple[str, Family]) -> dict[str, Family]:
    return dict(families)


# The collector runner's report on each collector (node_exporter's pattern).
RUNNER = _by_key(
    ("success", _gauge("verl_exporter_collector_success",
                       "Whether the collector succeeded on this scrape (1) or failed (0).", ("collector",))),
    ("duration", _gauge("verl_exporter_collector_duration_seconds",
                        "How long the collector took on this scrape.", ("collector",))),
)

EXPORTER = _by_key(
    ("build_info", _gauge("verl_exporter_build_info", "The exporter's version and Python version; always 1.",
                          ("version", "python_version"))),
)

EVIDENCE = _by_key(
    ("captured", _gauge("verl_evidence_captured_timestamp_seconds",
                        "Unix time of the latest evidence captured of the run's stop (/debug/evidence).", RUN)),
    ("top_frame", _gauge("verl_evidence_top_frame_info",
                         "The innermost frame of the job's first thread in the run's latest evidence (py-spy), "
                         "where it hangs.", (*RUN, "frame"))),
)

NODE = _by_key(
    ("run_info", _gauge("verl_node_run_info", "The runs whose job uses this node's GPUs and host; always 1.", RUN)),
)

# The per-GPU readings: family key is the GpuReading attribute that holds the value.
GPU_READINGS = _by_key(
    ("memory_total_bytes", _gauge("verl_gpu_memory_total_bytes", "Total GPU memory.", GPU)),
    ("memory_used_bytes", _gauge("verl_gpu_memory_used_bytes", "GPU memory in use.", GPU)),
    ("memory_free_bytes", _gauge("verl_gpu_memory_free_bytes", "GPU memory free.", GPU)),
    ("memory_reserved_bytes", _gauge("verl_gpu_memory_reserved_bytes",
                                     "GPU memory the driver reserves (memory info v2).", GPU)),
    ("utilization_ratio", _gauge("verl_gpu_utilization_ratio",
                                 "Share of the last sample period a kernel ran (0-1).", GPU)),
    ("memory_utilization_ratio", _gauge(
        "verl_gpu_memory_utilization_ratio",
        "Share of the last sample period device memory was read or written (0-1); not memory used.", GPU)),
    ("temperature_celsius", _gauge("verl_gpu_temperature_celsius", "GPU core temperature.", GPU)),
    ("power_watts", _gauge("verl_gpu_power_watts", "GPU power draw.", GPU)),
    ("power_limit_watts", _gauge("verl_gpu_power_limit_watts", "Power limit the driver enforces on the GPU.", GPU)),
    ("sm_clock_hertz", _gauge("verl_gpu_sm_clock_hertz", "Current SM clock.", GPU)),
    ("memory_clock_hertz", _gauge("verl_gpu_memory_clock_hertz", "Current memory clock.", GPU)),
    ("energy_joules", _counter("verl_gpu_energy_joules", "Energy the GPU used since the driver was loaded.", GPU)),
    ("pcie_replay_errors", _counter("verl_gpu_pcie_replay_errors",
                                    "PCIe link retransmissions since the driver was loaded.", GPU)),
)

GPUS = _by_key(
    # not verl_gpu_count: promtool's linter rejects a _count suffix outside histograms/summaries
    ("gpus", _gauge("verl_gpus", "Number of GPUs the GPU library (NVML or amdsmi) sees.")),
    ("info", _gauge("verl_gpu_info", "GPU identity; always 1.",
                    (*GPU, "name", "driver_version", "cuda_driver_version", "pci_bus_id"))),
    ("up", _gauge("verl_gpu_up", "Whether the GPU answers the GPU library (1) or is lost (0).", GPU)),
    *GPU_READINGS.items(),
    ("clock_event_active", _gauge(
        "verl_gpu_clock_event_active",
        "Whether a clock event reason (throttling cause) is active (1) or not (0); reasons: gpu_idle, "
        "applications_clocks_setting, sw_power_cap, hw_slowdown, sync_boost, sw_thermal_slowdown, "
        "hw_thermal_slowdown, hw_power_brake_slowdown, display_clock_setting.", (*GPU, "reason"))),
    ("ecc_errors", _counter("verl_gpu_ecc_errors", "ECC memory errors over the GPU's lifetime (aggregate).",
                            (*GPU, "type"))),
    ("ecc_volatile_errors", _counter("verl_gpu_ecc_volatile_errors", "ECC memory errors since the driver was loaded.",
                                     (*GPU, "type"))),
    ("remapped_rows", _gauge(
        "verl_gpu_remapped_rows",
        "Memory rows remapped, by state (correctable, uncorrectable, pending, failure); failure 1: remapping failed.",
        (*GPU, "state"))),
    ("pcie_throughput", _gauge("verl_gpu_pcie_throughput_bytes_per_second",
                               "PCIe throughput over the last 20 ms sample (only when PCIe sampling is enabled).",
                               (*GPU, "direction"))),
    ("xid_errors", _counter("verl_gpu_xid_errors", "XID critical errors reported since the exporter started.",
                            (*GPU, "xid"))),
    ("process_memory", _gauge("verl_gpu_process_memory_bytes", "GPU memory used by a compute process.",
                              (*GPU, "pid"))),
)

JOB_GPUS = _by_key(
    ("memory", _gauge("verl_job_gpu_memory_bytes", "GPU memory used by the training job's processes, all GPUs.")),
    ("gpus", _gauge("verl_job_gpus", "Number of GPUs on which the training job has a process.")),
)

HOST = _by_key(
    ("cpu_utilization", _gauge("verl_host_cpu_utilization_ratio",
                               "Busy share of all CPUs since the previous scrape (0-1).")),
    ("cpu_seconds", _counter("verl_host_cpu_seconds", "CPU time spent in each mode, summed over all CPUs.",
                             ("mode",))),
    ("cpus", _gauge("verl_host_cpus", "Number of logical CPUs.")),
    ("load1", _gauge("verl_host_load1", "1-minute load average.")),
    ("load5", _gauge("verl_host_load5", "5-minute load average.")),
    ("load15", _gauge("verl_host_load15", "15-minute load average.")),
    ("memory_total", _gauge("verl_host_memory_total_bytes", "Total physical memory.")),
    ("memory_available", _gauge("verl_host_memory_available_bytes",
                                "Memory available to new processes without swapping.")),
    ("memory_used", _gauge("verl_host_memory_used_bytes",
                           "Memory in use (psutil's definition: total minus free, buffers and cache).")),
    ("swap_total", _gauge("verl_host_swap_total_bytes", "Total swap space.")),
    ("swap_used", _gauge("verl_host_swap_used_bytes", "Swap space in use.")),
)

JOB = _by_key(
    ("running", _gauge("verl_job_running", "Whether the training job has a live process (1) or not (0).")),
    ("cpu_seconds", _counter("verl_job_cpu_seconds",
                             "CPU time (user + system) of the job's live processes; drops when a process exits.")),
    ("processes", _gauge("verl_job_processes",
                         "Number of live processes of the training job (the root process and its children).")),
    ("resident_memory", _gauge("verl_job_resident_memory_bytes",
                               "Resident memory (RSS) summed over the training job's processes.")),
    ("threads", _gauge("verl_job_threads", "Threads summed over the training job's processes.")),
    ("open_fds", _gauge("verl_job_open_fds", "Open file descriptors summed over the training job's processes.")),
)

# The scheduler's job of each run (--slurm, or a Kubernetes pod's downward API); a label a scheduler
# lacks is "" (partition on Kubernetes, namespace and pod on Slurm).
JOB_INFO = _by_key(
    ("info", _gauge("verl_job_info", "The scheduler's job that writes the run (Slurm or Kubernetes); always 1.",
                    (*RUN, "scheduler", "job_id", "job_name", "partition", "namespace", "pod"))),
    ("gpu", _gauge("verl_job_gpu_info", "A GPU of this node the run's job holds (gpu: its index, from the GPUs its "
                   "processes use, else the scheduler's list); always 1.", (*RUN, "gpu"))),
    ("ended", _gauge("verl_job_ended_timestamp_seconds", "When the run's job ended, and how the scheduler "
                     "ended it (state, exit_code, reason as Slurm reports them).",
                     (*RUN, "scheduler", "job_id", "state", "exit_code", "reason"))),
)

# The statistics over a run's own steps (step_windows.py computes them), by name: what each is.
STEP_STATS = {
    "recent_min": "Lowest value of the run's last 3 steps",
    "recent_max": "Highest value of the run's last 3 steps",
    "window_median": "Median of the run's last 10 steps",
    "window_mean": "Mean of the run's last 10 steps",
    "prior_mean": "Mean of the 10 steps before the run's last 10",
    "prior_stddev": "Standard deviation of the 10 steps before the run's last 10",
    "long_mean": "Mean of the run's last 30 steps",
    "long_prior_mean": "Mean of the 30 steps before the run's last 30",
    "early_median": "Median of the run's first 10 steps",
    "best_window_mean": "Highest mean of 10 consecutive steps of the run so far",
    "run_max": "Highest value of every step of the run so far",
    "run_min": "Lowest value of every step of the run so far",
    "early_mad": "Spread of the run's first 10 steps: their median absolute deviation times 1.4826",
    "zero_streak": "How many of the run's latest steps in a row had the value 0",
    "zero_before": "How many of the run's steps before its latest streak of zeros had the value 0",
    "steps_before": "How many steps the run had before its latest streak of zeros",
}

# One run's own families, in the order they are served; the run's logged metrics follow, by name.
TRAINING_RUN = _by_key(
    ("last_step", _gauge("verl_training_last_step", "Last training step seen for the run.", RUN)),
    ("last_step_time", _gauge("verl_training_last_step_timestamp_seconds",
                              "Unix time at which the run's last step was read.", RUN)),
    ("steps", _counter("verl_training_steps_ingested", "Training steps read for the run since the exporter started.",
                       RUN)),
    ("finished", _gauge("verl_training_finished",
                        "1 once the run reached its last step or verl reported the end of training, else 0.", RUN)),
    # Only finished runs have it, so a rule's "unless finished" selects those few series, not every run's.
    ("finished_time", _gauge(
        "verl_training_finished_timestamp_seconds",
        "Unix time at which the finished run's last step was read; absent while the run has not finished.", RUN,
        optional=True)),
    ("next_validation", _gauge("verl_training_next_validation_step",
                               "The run's next step that validates, by its trainer.test_freq or its own validations; "
                               "absent where that is not known.", RUN, optional=True)),
    ("total_steps", _gauge("verl_training_total_steps",
                           "Training steps the run will take (verl's Total training steps).", RUN, optional=True)),
    ("config", _gauge("verl_run_config",
                      "The run's numeric settings from its run config; key is the dotted verl setting.",
                      (*RUN, "key"), optional=True)),
    ("nonfinite", _counter("verl_training_nonfinite_values", "NaN or Inf values logged by the run, per verl key.",
                           (*RUN, "key"))),
    ("nonfinite_step", _gauge("verl_training_nonfinite_last_step",
                              "The run's step at which a NaN or Inf of the verl key was last logged.", (*RUN, "key"),
                              optional=True)),
    ("dropped", _counter("verl_training_series_dropped",
                         "verl keys of the run not exported because the run reached its series cap (distinct keys, "
                         "counted without keeping them: estimated beyond a few thousand).", RUN)),
    ("info", _gauge("verl_training_run_info", "A followed run and the file it is read from.", (*RUN, "source"))),
    ("started_time", _gauge("verl_training_started_timestamp_seconds",
                            "Unix time at which the run's first line (its run config print or first step) was "
                            "written.", RUN)),
    ("log_errors", _counter(
        "verl_training_log_errors",
        "Errors the run's log shows, in the lines of any of its actors (kind: cuda_oom, nccl_timeout, segfault, "
        "ray_actor_died, traceback).", (*RUN, "kind"), optional=True)),
    ("log_errors_step", _gauge(
        "verl_training_log_errors_last_step",
        "The run's last step when its log last showed an error of the kind (0 before its first step).",
        (*RUN, "kind"), optional=True)),
    ("fatal_step", _gauge(
        "verl_training_fatal_error_last_step",
        "The run's step when the trainer's output ended in a fatal error of the kind (0 before its first step): "
        "hydra's error, a RayTaskError out of TaskRunner.run or main_task, or an uncaught traceback of the trainer "
        "(kind: cuda_oom, nccl, import_error, assertion, ray_actor_died, timeout, config, file_not_found, "
        "exception). Gone once the run steps again.", (*RUN, "kind"), optional=True)),
    ("checkpoint_saving", _gauge(
        "verl_checkpoint_saving",
        "1 while the run saves a checkpoint (from verl's local_global_step_folder line to the next step), else 0.",
        RUN, optional=True)),
    ("checkpoint_started", _gauge("verl_checkpoint_save_started_timestamp_seconds",
                                  "Unix time at which the run's latest checkpoint save started.", RUN, optional=True)),
    ("checkpoint_step", _gauge("verl_checkpoint_last_step", "Step of the run's latest checkpoint save that finished.",
                               RUN, optional=True)),
    ("checkpoint_seconds", _gauge(
        "verl_checkpoint_last_save_duration_seconds",
        "How long the run's latest finished checkpoint save took (verl's timing_s/save_checkpoint where it logs it).",
        RUN, optional=True)),
    # The goodput ledger (store/ledger.py), for a run whose config names its GPUs.
    ("gpus", _gauge("verl_run_gpus", "GPUs the run holds: trainer.n_gpus_per_node x trainer.nnodes of its config.",
                    RUN, optional=True)),
    ("gpu_seconds", _counter(
        "verl_run_gpu_seconds",
        "The run's GPUs times its time, by bucket: startup (to its first step's end), productive (steps without "
        "validation and checkpoint), validation, checkpoint, between_steps, stalled (gaps past what its steps make "
        "likely), and lost (counted again from the others: the work since the last checkpoint when the run failed).",
        (*RUN, "bucket"), optional=True)),
    ("at_risk", _gauge("verl_run_work_at_risk_gpu_seconds",
                       "GPU-seconds of the run's work since its last checkpoint save: what a failure now would lose.",
                       RUN, optional=True)),
    # Statistics over the run's own steps of the metrics the rules judge in steps (step_windows.py).
    *((f"steps_{stat}", _gauge(f"verl_training_{stat}", f"{text} (metric: the served name, in its base unit); "
                               "absent until the run has logged the metric at that many steps.", (*RUN, "metric"),
                               optional=True))
      for stat, text in STEP_STATS.items()),
    # Its labels besides the run's are the run config's info labels the catalog lists.
    ("config_info", _gauge("verl_run_config_info", "The run's string settings (verl's run config) as labels.", RUN,
                           optional=True)),
)

# The store's exporter-wide families, served after the runs' own.
TRAINING_STORE = _by_key(
    ("parse_errors", _counter("verl_exporter_parse_errors", "Lines that could not be parsed, per source file.",
                              ("source",))),
    ("values_dropped", _counter(
        "verl_exporter_values_dropped",
        "Logged values left out: no number (reason: not_a_number, object, list, null), a key longer than 256 "
        "characters (key_too_long), or a record naming a run that another source feeds (other_source).",
        ("source", "reason"))),
    ("source_up", _gauge(
        "verl_exporter_source_up",
        "Whether a configured path or a glob's match can be read (1) or not (0: missing, not a regular file, "
        "unreadable); the log says why. At most 1000 sources by name, the rest as source=\"other\" (0 when any "
        "of them cannot be read).", ("source",))),
    ("runs", _gauge("verl_training_runs", "Runs the exporter follows.")),
    ("runs_dropped", _counter("verl_training_runs_dropped",
                              "Records refused because the exporter reached its run cap.")),
    ("runs_expired", _counter(
        "verl_training_runs_expired",
        "Runs no longer served: finished longer than --store.retention ago, or idle longer than "
        "--store.idle-retention (reason finished or idle), or never stepped and dropped at the run cap for a run "
        "that steps (no_step).", ("reason",))),
    ("run_cap_reached", _gauge("verl_training_run_cap_reached",
                               "1 while the exporter refuses new runs for reaching --store.max-runs, else 0.")),
)

# Every table above, by the collector that serves it.
BY_COLLECTOR: dict[str, tuple[dict[str, Family], ...]] = {
    "runner": (RUNNER,),
    "exporter": (EXPORTER,),
    "evidence": (EVIDENCE,),
    "node": (NODE,),
    "gpu": (GPUS, JOB_GPUS),
    "host": (HOST, JOB),
    "job_info": (JOB_INFO,),
    "training": (TRAINING_RUN, TRAINING_STORE),
}

# Namespaces that are the exporter's own as a whole: no logged key is named into them.
OWN_PREFIXES = ("verl_gpu_", "verl_host_", "verl_job_", "verl_exporter_")


def families() -> list[Family]:
    """Every family the exporter serves itself."""
    return [family for tables in BY_COLLECTOR.values() for table in tables for family in table.values()]


@lru_cache(maxsize=1)
def reserved_names() -> frozenset[str]:
    """Every family and sample name the exporter serves itself."""
    return frozenset(name for family in families() for name in family.sample_names)
