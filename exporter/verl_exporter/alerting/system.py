"""Performance, operations and GPU/host alerts, and the fleet recording rules.

GPU and host thresholds are not verl metrics: they are the catalog's ``system`` section.
"""

from __future__ import annotations

from . import nodes
from .model import DURATION, GPU, NUMBER, PERCENT, PER_STEP_INTERVAL, RUN, RUN_MATCH, Alert, Group

# The Prometheus job that scrapes the exporters (prometheus/prometheus.yml).
EXPORTER_JOB = "verl"

# XIDs that mean the GPU or its memory failed: the job cannot continue on this GPU.
# 48 double-bit ECC, 61/62 internal micro-controller, 63/64 row remapping, 74 NVLink, 79 fallen off
# the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP, 140 ECC unrecovered.
FATAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)
THROTTLE_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown", "hw_slowdown")

# Seconds the run had gone without a step at the last scrape, for runs that have not finished, while
# more than `stalled_steps` times the usual step time (the catalog's slowest healthy step when it is
# unknown). Measured at the scrape (timestamp()), not at evaluation, so the scrape interval adds nothing.
# How long the run's checkpoint save has been running, for runs saving one now.
SAVING_FOR = (
    "((timestamp(verl_checkpoint_saving) - verl_checkpoint_save_started_timestamp_seconds)"
    " and verl_checkpoint_saving == 1)"
)
STALLED = (
    "(timestamp(verl_training_last_step_timestamp_seconds) - verl_training_last_step_timestamp_seconds)"
    f" > {RUN_MATCH} (${{timing_s/step:stalled_steps}} * ("
    "avg_over_time(verl_timing_step_seconds[1h])"
    f" or {RUN_MATCH} (0 * verl_training_last_step_timestamp_seconds + ${{timing_s/step:too_slow}})))"
    f" unless {RUN_MATCH} verl_training_finished_timestamp_seconds"
    f" unless {RUN_MATCH} {SAVING_FOR} < ${{system:checkpoint_save_ceiling_seconds}}"
)

# The guide's problem 4, slow training, told against the run's own earlier steps: the median step of
# the last 30 minutes over twice the median of the 6 hours before.
STEP_SLOWER = (
    "quantile_over_time(0.5, verl_timing_step_seconds[30m])"
    " > ${timing_s/step:slowdown_ratio} * quantile_over_time(0.5, verl_timing_step_seconds[6h] offset 30m)"
    f" and {RUN_MATCH} changes(verl_training_last_step[6h] offset 30m) >= ${{timing_s/step:baseline_steps}}"
)

_XID_FATAL = "|".join(str(x) for x in FATAL_XIDS)
# The run's throughput averaged over 30 minutes (VerlThroughputDropped compares it with its best).
THROUGHPUT_30M = "avg_over_time(verl_perf_throughput[30m])"
UNFINISHED = f"unless {RUN_MATCH} verl_training_finished_timestamp_seconds"
# The run's GPUs over all its nodes (the fleet recording rules), where Prometheus has them.
RUN_GPUS = ("{{ with printf `project_experiment:verl_gpu_utilization_ratio:avg{project=%q,experiment=%q}`"
            " $labels.project $labels.experiment | query }} Its GPUs, over all its nodes, are"
            " {{ . | first | value | humanizePercentage }} busy.{{ end }}")
# The runs a node works for (verl_node_run_info), where its exporter names any.
NODE_RUNS = ("{{ with printf `verl_node_run_info{instance=%q}` $labels.instance | query }} (working for"
             "{{ range . }} {{ .Labels.project }}/{{ .Labels.experiment }}{{ end }}){{ end }}")
JOB_GONE = "and on(job, instance) verl_job_running == 0"
JOB_FIX = ("Read the end of the job's log for the exception or OOM; `dmesg` for the OOM killer; restart from "
           "the last checkpoint (`trainer.resume_mode=auto`).")


# Where the job hangs, from the exporter's evidence of the stop (py-spy's top frame), where it has one.
HANGS_IN = ("{{ with printf `verl_evidence_top_frame_info{project=%q,experiment=%q}` $labels.project"
            " $labels.experiment | query }} The job hangs in {{ . | first | label \"frame\" }}.{{ end }}")


def _new_or_increased(selector: str, window: str) -> str:
    """Counter ``selector`` rose within ``window``, or appeared (above 0) within it."""
    return f"increase({selector}[{window}]) > 0 or ({selector} > 0 unless {selector} offset {window})"


PERFORMANCE = Group("verl-performance", "verl-performance.rules.yml", "Performance", (
    Alert(
        "VerlGenerationBottleneck", "info",
        f"verl_timing_gen_seconds / verl_timing_step_seconds > ${{timing_s/step:gen_share}} and {STEP_SLOWER}",
        "30m",
        "Steps got twice as slow, and generation takes more than half of each.",
        f"Run {RUN}: the steps take twice as long as earlier in the run, and generation (timing_s/gen) "
        f"takes {PERCENT} of the step time.",
        "When `timing_s/gen` exceeds half of `timing_s/step`, rollout generation is the bottleneck (the "
        "guide's problem 4). In most healthy RL runs generation is more than half of the step by design, so "
        "the rule speaks only when the steps also became twice as slow as earlier in the run (as "
        "VerlStepSlow): then it says which phase to look at.",
        "Raise `actor_rollout_ref.rollout.max_num_seqs` (more concurrent sequences in vLLM/SGLang), adjust "
        "`actor_rollout_ref.rollout.tensor_model_parallel_size`, raise "
        "`actor_rollout_ref.rollout.gpu_memory_utilization`.",
        "11.2",
    ),
    Alert(
        "VerlActorUpdateBottleneck", "info",
        "verl_timing_update_actor_seconds / verl_timing_step_seconds > ${timing_s/step:update_actor_share}"
        f" and {STEP_SLOWER}", "30m",
        "Steps got twice as slow, and actor updates take more than 40% of each.",
        f"Run {RUN}: the steps take twice as long as earlier in the run, and the actor update "
        f"(timing_s/update_actor) takes {PERCENT} of the step time.",
        "When `timing_s/update_actor` exceeds 40% of `timing_s/step`, training the actor is the bottleneck "
        "(the guide's problem 4). Healthy 7B runs on FSDP and Megatron spend 40-60% of a step there by "
        "design, so the rule speaks only when the steps also became twice as slow as earlier in the run.",
        "Tune `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` (or `use_dynamic_bsz`), enable "
        "`actor_rollout_ref.actor.use_torch_compile`.",
        "11.2",
    ),
    Alert(
        "VerlThroughputDropped", "warning",
        f"{THROUGHPUT_30M} < ${{perf/throughput:drop_ratio}} * max_over_time({THROUGHPUT_30M}[6h:5m])", "15m",
        "Training throughput fell to half of the run's own earlier throughput.",
        f"Run {RUN}: perf/throughput averaged {NUMBER} tokens/s per GPU over 30 minutes, below "
        "${perf/throughput:drop_ratio} of the run's best 30-minute average of the last 6 hours.",
        "`perf/throughput` is tokens processed per second per GPU. What is normal depends on the model "
        "size, the GPUs and the batch and sequence lengths (the guide's 50 tokens/s/GPU is for a 7B "
        "model), so the rule compares the run with itself: its 30-minute average against its best "
        "30-minute average of the last 6 hours.",
        "Find the slow phase in `timing_s/*` (generation, actor update) and follow its alert; check MFU and "
        "that GPUs are not throttled.",
        "11.2",
    ),
    Alert(
        "VerlActorMfuLow", "info",
        "quantile_over_time(0.5, verl_perf_mfu_actor[30m])"
        " < ${perf/mfu/actor:drop_ratio} * quantile_over_time(0.9, verl_perf_mfu_actor[6h])"
        f" and {RUN_MATCH} changes(verl_training_last_step[30m]) >= ${{perf/mfu/actor:min_steps}}", "30m",
        "Actor model FLOPs utilisation fell to half of the run's own.",
        f"Run {RUN}: perf/mfu/actor has a median of {PERCENT} over 30 minutes, under "
        "${perf/mfu/actor:drop_ratio} of its usual high (90th percentile) of the last 6 hours.",
        "MFU is achieved FLOPs over the hardware peak. The guide's bands (above 40% excellent, below 20% "
        "poor) are for dense training on NVIDIA GPUs; real healthy runs log from 7% to 79% (RL steps with short "
        "sequences, AMD GPUs whose peak verl does not know, older releases that count FLOPs differently), "
        "so the rule compares the run with itself: a drop to half means the actor update became slower "
        "for the same work (throttled or shared GPUs, a memory-bound micro batch, offloading).",
        "Raise micro batch sizes, use `use_dynamic_bsz` and sequence packing (`use_remove_padding`), "
        "avoid needless gradient checkpointing or offloading.",
        "7.4",
    ),
    Alert(
        "VerlStepSlow", "info",
        STEP_SLOWER, "30m",
        "Training steps take twice as long as earlier in the run.",
        f"Run {RUN}: the median step of the last 30 minutes takes {DURATION} (timing_s/step), over "
        "${timing_s/step:slowdown_ratio} times the median of the 6 hours before.",
        "The guide treats a step time above 120 s as slow training, but a step's time follows the model "
        "size, `data.train_batch_size` x `actor_rollout_ref.rollout.n` and the response length: healthy "
        "7B runs take 150-400 s a step, agent runs up to 1,000 s. So the rule compares the run with its "
        "own earlier steps, by medians (a checkpoint save or a validation makes one step long, and "
        "counts for nothing): twice as slow means longer responses (see `response_length/mean`), a slower "
        "phase or slower hardware.",
        "See which `timing_s/*` phase dominates (VerlGenerationBottleneck, VerlActorUpdateBottleneck) and "
        "tune that phase.",
        "11.2",
    ),
    Alert(
        "VerlGpuMemoryNearlyFull", "warning",
        "verl_perf_max_memory_allocated_bytes / on(job, instance) group_left()"
        " max by (job, instance) (verl_gpu_memory_total_bytes)"
        " > ${perf/max_memory_allocated_gb:near_total_ratio}", "5m",
        "Peak GPU memory allocated is close to the GPU's total.",
        f"Run {RUN}: the {{{{ $labels.role }}}}'s peak allocated memory is {PERCENT} of the GPU's memory: "
        "close to CUDA out of memory.",
        "When the actor's or the critic's peak allocated memory (`actor/perf/max_memory_allocated_gb`, "
        "`critic/perf/...`; before verl 0.8 the actor's `perf/max_memory_allocated_gb`) approaches the GPU's "
        "total memory, the next longer batch can fail with CUDA out of memory.",
        "Halve `actor_rollout_ref.actor.ppo_mini_batch_size`, enable "
        "`actor_rollout_ref.model.enable_gradient_checkpointing`, or use `use_dynamic_bsz` with a smaller "
        "`ppo_max_token_len_per_gpu` (e.g. 16384 -> 8192).",
        "11.2",
    ),
), training=True, interval=PER_STEP_INTERVAL)

OPERATIONS = Group("verl-operations", "verl-operations.rules.yml", "Operations", (
    Alert(
        "VerlTrainingStalled", "critical",
        f"{STALLED} unless on(job, instance) verl_job_running == 0", "10m",
        "The training run has stopped making progress.",
        f"Run {RUN}: no new step for {DURATION}, over ${{timing_s/step:stalled_steps}} times its usual step "
        "time, and the run has not finished." + RUN_GPUS + HANGS_IN,
        "No new step has been read for several times the run's usual step time (plus the `for` "
        "duration), the run has not finished (reached its last step, or verl printed its end of "
        "training), it is not saving a checkpoint (verl's `local_global_step_folder:` line until the "
        "next step; a save counts for at most ${system:checkpoint_save_ceiling_seconds} s, and a slow one "
        "raises VerlCheckpointSaveSlow) and, where the exporter knows the job "
        "(`--job.pid`/`--job.match`), the job's processes are still alive: the job hangs "
        "(NCCL, a dead Ray worker, a stuck rollout) while holding its GPUs.",
        "Look at the job's log tail and `py-spy dump` of the trainer; check Ray (`ray status`) and the GPU "
        "alerts on the same hosts; restart from the last checkpoint (`trainer.resume_mode=auto`).",
        "8.1",
        evidence=True,
    ),
    Alert(
        "VerlCheckpointSaveSlow", "warning",
        f"{SAVING_FOR} > {RUN_MATCH} clamp_min(${{system:checkpoint_save_slow_ratio}}"
        " * verl_checkpoint_last_save_duration_seconds, ${system:checkpoint_save_slow_seconds})"
        f" or ({SAVING_FOR} > ${{system:checkpoint_save_slow_seconds}}"
        f" unless {RUN_MATCH} verl_checkpoint_last_save_duration_seconds)", "5m",
        "A checkpoint save runs far longer than the run's saves before.",
        f"Run {RUN}: a checkpoint save has run for {DURATION}, over an hour and over "
        "${system:checkpoint_save_slow_ratio} times the run's previous save.",
        "verl prints `local_global_step_folder: .../global_step_N` when it starts saving step N's "
        "checkpoint and logs step N's metrics when the save is done. Saves of a 7B model take minutes to "
        "40 minutes (the verl team's GRPO baseline saves for 40 minutes every 20 steps); one that runs past "
        "an hour and three times the run's previous save is stuck on its storage (a full or slow shared "
        "file system, an object store that throttles) or on a rank that died while saving. The GPUs are "
        "idle meanwhile. VerlTrainingStalled stays silent while a save runs, for up to "
        "${system:checkpoint_save_ceiling_seconds} s.",
        "Check the checkpoint folder (`trainer.default_local_dir`): free space, write speed, files still "
        "growing; look for a rank that exited in the job's log; save less often (`trainer.save_freq`) or to "
        "faster local storage and copy asynchronously.",
        evidence=True,
    ),
    Alert(
        "VerlTrainingJobCrashed", "critical",
        f"((verl_training_last_step < {RUN_MATCH} verl_training_total_steps) {UNFINISHED}) {JOB_GONE}", "2m",
        "The training job exited before its last step.",
        f"Run {RUN}: the training job has no live process, and the run stopped at step {{{{ $value }}}} of "
        "{{ with printf `verl_training_total_steps{project=%q,experiment=%q}` $labels.project "
        "$labels.experiment | query }}{{ . | first | value }}{{ end }}: it crashed or was stopped.",
        "The exporter watches the job's processes (`--job.pid`/`--job.match`); none is left, and the run "
        "had not reached its last step (verl's `Total training steps`). The job crashed (OOM killer, "
        "exception, node failure) or was stopped by hand. A job that exits at its last step is finished "
        "and raises nothing.",
        JOB_FIX,
        "8.1",
        evidence=True,
    ),
    Alert(
        "VerlTrainingJobExited", "warning",
        f"((verl_training_last_step unless {RUN_MATCH} verl_training_total_steps) {UNFINISHED}) {JOB_GONE}", "2m",
        "The training job's processes are gone and its run's length is unknown.",
        f"Run {RUN}: the training job watched by {{{{ $labels.instance }}}} has no live process, the run did not "
        "report the end of training and its total of steps is unknown: it crashed, was stopped, or ended.",
        "As VerlTrainingJobCrashed, for a run whose length the exporter does not know (a JSONL-only run "
        "without `--run.config` or a config with `trainer.total_training_steps`): whether it ended "
        "cannot be told, so this is a warning, not a page.",
        JOB_FIX + " Give the exporter the run's config (`--run.config`) to tell an end from a crash.",
        "8.1",
    ),
    Alert(
        "VerlTrainingNonFinite", "critical",
        _new_or_increased('verl_training_nonfinite_values_total{key=~".*(loss|grad_norm).*"}', "15m"), "0m",
        "A loss or gradient norm of the run is NaN or Inf.",
        f"Run {RUN}: {{{{ $labels.key }}}} was NaN or Inf ({NUMBER} new values in 15 minutes).",
        "A NaN or Inf loss or gradient norm means the weights are or will be corrupted; training cannot "
        "recover by itself.",
        "Stop the run and restart from the last good checkpoint with a lower "
        "`actor_rollout_ref.actor.optim.lr`; check the data for empty or extreme samples and the rewards "
        "for NaN; keep `grad_clip` on.",
        "1.7",
    ),
    Alert(
        "VerlTrainingOutOfMemory", "critical",
        _new_or_increased('verl_training_log_errors_total{kind="cuda_oom"}', "15m"), "0m",
        "The run's log shows a CUDA out-of-memory error.",
        f"Run {RUN}: its log shows {NUMBER} new CUDA (or HIP) out-of-memory errors in 15 minutes; the job "
        "has crashed or is about to, often before its first step.",
        "A worker printed `torch.OutOfMemoryError: CUDA out of memory` (HIP on AMD GPUs): the actor update, "
        "the reference or critic forward, or the rollout engine asked for more GPU memory than was left. "
        "verl's workers then die and the trainer exits or hangs; runs that never logged a step page here "
        "first. The error line is in the exporter's evidence of the run.",
        "Halve `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` (or `ppo_max_token_len_per_gpu` with "
        "`use_dynamic_bsz`), enable `actor_rollout_ref.model.enable_gradient_checkpointing`, lower "
        "`actor_rollout_ref.rollout.gpu_memory_utilization` (the engine's share), or offload parameters "
        "(`actor_rollout_ref.actor.fsdp_config.param_offload`).",
        "11.2",
        evidence=True,
    ),
    Alert(
        "VerlTrainingLogErrors", "warning",
        "(" + _new_or_increased('verl_training_log_errors_total{kind!="cuda_oom"}', "15m") + ")"
        f" and {RUN_MATCH} (verl_training_last_step offset 15m) {UNFINISHED}", "0m",
        "The log of a running run shows errors (NCCL timeout, segfault, dead Ray actor, traceback).",
        f"Run {RUN}: its log shows {NUMBER} new {{{{ $labels.kind }}}} errors in 15 minutes, while the run "
        "is stepping.",
        "A worker or the trainer of a run that has been stepping printed an error: `nccl_timeout` (a "
        "collective timed out: a rank hangs or died), `segfault`, `ray_actor_died` (a worker is gone) or "
        "`traceback` (an exception; Ray prints handled ones too, so a few can be harmless). Errors before "
        "the first step are left out: Ray prints caught exceptions while it starts. The lines are in the "
        "exporter's evidence of the run.",
        "Read the error lines and the lines before them (`/debug/evidence` of the exporter, or the log); "
        "for NCCL timeouts and dead actors check the other nodes' GPUs and `ray status`; for tracebacks "
        "in a reward function fix the function.",
        evidence=True,
    ),
    Alert(
        "VerlTrainingNoFirstStep", "critical",
        "(timestamp(verl_training_started_timestamp_seconds) - verl_training_started_timestamp_seconds)"
        " > ${system:no_first_step_seconds}"
        f" unless {RUN_MATCH} verl_training_last_step_timestamp_seconds {UNFINISHED}"
        f" and on(job, instance) verl_job_running == 1", "5m",
        "The job runs, but its run has logged no step an hour after it started.",
        f"Run {RUN}: the run started {DURATION} ago (its config print) and has logged no step, while the "
        "training job's processes are alive: it hangs before its first step." + HANGS_IN,
        "verl printed the run's config (or its first line) more than an hour ago and no training step "
        "since, while the job's processes (`--job.pid`/`--job.match`) are alive. The first step includes "
        "loading the model and starting the rollout engine, which take minutes, not an hour: the job "
        "hangs (a worker stuck in NCCL initialisation, a rollout engine that never came up, a compile "
        "that never ends). The stall rule needs a step to measure, so this is its rule for the first one.",
        "Take a `py-spy dump` of the trainer and the workers (the exporter's evidence has one where it "
        "may ptrace), read the end of the log for the phase it hangs in, check `ray status`; restart.",
        "8.1",
        evidence=True,
    ),
    Alert(
        "VerlExporterDown", "critical",
        f'up{{job="{EXPORTER_JOB}"}} == 0', "5m",
        "Prometheus cannot scrape a verl exporter.",
        "Target {{ $labels.instance }} of job {{ $labels.job }} has been down for 5 minutes: its run and "
        "GPUs are not monitored.",
        "The exporter (or its host) does not answer Prometheus, so no other alert can fire for it.",
        "Check the exporter process or container (`systemctl status`, `docker logs`) and the network path "
        "from Prometheus; `curl http://HOST:9945/-/ready`.",
    ),
    Alert(
        "VerlExporterCollectorFailing", "warning",
        "verl_exporter_collector_success == 0", "10m",
        "An exporter collector keeps failing.",
        "Collector {{ $labels.collector }} of the exporter at {{ $labels.instance }} has failed every scrape "
        "for 10 minutes.",
        "A collector (training, gpu or host) raises or times out at every scrape; its metrics are missing.",
        "Read the exporter's log for the collector's error (NVML not loaded, a hung driver call, an "
        "unreadable file).",
    ),
    Alert(
        "VerlExporterParseErrors", "info",
        "increase(verl_exporter_parse_errors_total[15m]) > 0", "0m",
        "The exporter cannot parse lines of a verl log.",
        "The exporter at {{ $labels.instance }} skipped " + NUMBER + " unreadable lines of "
        "{{ $labels.source }} in 15 minutes.",
        "Lines that look like verl step lines could not be parsed; their values are missing.",
        "Check the file's format (`--source.format`) and the exporter's log, which quotes the reason.",
    ),
    Alert(
        "VerlExporterSourceUnreadable", "warning",
        "verl_exporter_source_up == 0", "15m",
        "The exporter cannot read a verl log it is told to follow.",
        "The exporter at {{ $labels.instance }} has not been able to read {{ $labels.source }} for 15 "
        "minutes: it is missing, not a regular file, or unreadable.",
        "A `--source` path does not exist, or a path or glob match is a directory, a FIFO, a device, a "
        "symbolic link loop or a file the exporter may not read: nothing of it is exported, so no "
        "training alert can fire for its run. A FileLogger path appears only when verl starts training "
        "(after the models load), hence the 15 minutes.",
        "Read the exporter's log, which says once why it cannot read the path; fix the `--source` path or "
        "glob (`--source '/logs/*.log'` must not match directories), the file's permissions, or the volume "
        "mount of the sidecar.",
    ),
))

_GPU_INFO = "GPU {{ $labels.gpu }} on {{ $labels.instance }}"

GPUS = Group("verl-gpu", "verl-gpu.rules.yml", "GPUs and host", (
    Alert(
        "VerlGpuFatalXidError", "critical",
        _new_or_increased(f'verl_gpu_xid_errors_total{{xid=~"{_XID_FATAL}"}}', "15m"), "0m",
        "A GPU reported a fatal XID error.",
        f"{GPU} reported XID {{{{ $labels.xid }}}} ({NUMBER} new events in 15 minutes): the GPU or its memory failed.",
        "XIDs such as 48 (double-bit ECC), 79 (fallen off the bus), 94/95 (ECC) or 119/120 (GSP) mean "
        "the GPU cannot be trusted; the job on it will fail or compute garbage.",
        "Drain the node, reset the GPU (`nvidia-smi -r`) or reboot; replace it if it repeats. Restart the "
        "run elsewhere from its last checkpoint.",
    ),
    Alert(
        "VerlGpuXidError", "warning",
        _new_or_increased(f'verl_gpu_xid_errors_total{{xid!~"{_XID_FATAL}"}}', "15m"), "0m",
        "A GPU reported an XID error.",
        f"{GPU} reported XID {{{{ $labels.xid }}}} ({NUMBER} new events in 15 minutes).",
        "Other XIDs (13 graphics engine exception, 31 MMU fault, 43 channel reset) usually come from the "
        "application: a kernel fault in the job.",
        "Check the job's log at the same time; look the XID up in NVIDIA's XID catalog.",
    ),
    Alert(
        "VerlGpuUncorrectableEccErrors", "critical",
        'verl_gpu_ecc_volatile_errors_total{type="uncorrected"} > 0', "0m",
        "A GPU has uncorrectable ECC memory errors.",
        f"{GPU} has {NUMBER} uncorrectable ECC errors since the driver was loaded.",
        "Uncorrectable ECC errors corrupt data in GPU memory; the running job's results are not reliable.",
        "Drain the node and reset the GPU (row remapping takes effect on reset); replace it if errors "
        "come back.",
    ),
    Alert(
        "VerlGpuRowRemapFailure", "critical",
        'verl_gpu_remapped_rows{state="failure"} > 0', "0m",
        "A GPU failed to remap a faulty memory row.",
        f"{GPU} reports a row-remapping failure: its memory has a fault it cannot repair.",
        "When remapping fails the GPU has no spare rows left for a faulty memory row.",
        "Drain the node and have the GPU replaced (RMA).",
    ),
    Alert(
        "VerlGpuRowRemapPending", "warning",
        'verl_gpu_remapped_rows{state="pending"} > 0', "0m",
        "A GPU has memory rows waiting to be remapped.",
        f"{GPU} has {NUMBER} rows pending remapping; they are remapped at the next GPU reset.",
        "Faulty rows were found; the repair is applied only when the GPU is reset.",
        "Reset the GPU (`nvidia-smi -r`) or reboot when the job allows.",
    ),
    Alert(
        "VerlGpuLost", "critical",
        "verl_gpu_up == 0", "1m",
        "A GPU no longer answers NVML.",
        f"{GPU} does not answer NVML: it is lost.",
        "NVML cannot read the GPU (\"GPU is lost\", fallen off the bus); every process on it is stuck or "
        "dead.",
        "Drain the node and reboot it; check `dmesg` for XID 79; replace the GPU if it repeats.",
    ),
    Alert(
        "VerlGpuCountDropped", "critical",
        "verl_gpus < max_over_time(verl_gpus[6h])", "1m",
        "A host sees fewer GPUs than before.",
        "The host {{ $labels.instance }} sees " + NUMBER + " GPUs, fewer than in the last 6 hours.",
        "A GPU vanished from the driver's device list (fallen off the bus or disabled).",
        "Drain the node, check `nvidia-smi` and `dmesg`, reboot; replace the GPU if it repeats.",
    ),
    Alert(
        "VerlGpuHot", "warning",
        "verl_gpu_temperature_celsius > ${system:gpu_hot_celsius}", "5m",
        "A GPU runs hot.",
        f"{_GPU_INFO} is at {NUMBER} °C (limit ${{system:gpu_hot_celsius}} °C).",
        "Above about 85 °C data-centre GPUs get close to thermal slowdown.",
        "Check the node's cooling (fans, airflow, inlet temperature) and neighbouring GPUs.",
    ),
    Alert(
        "VerlGpuThrottled", "warning",
        f'verl_gpu_clock_event_active{{reason=~"{"|".join(THROTTLE_REASONS)}"}} == 1', "5m",
        "A GPU is throttled by heat or a power brake.",
        f"{_GPU_INFO} is slowed down: {{{{ $labels.reason }}}} is active.",
        "Thermal slowdown or the power brake lowers the GPU's clocks; the whole data-parallel job waits for "
        "the slowest GPU.",
        "Check cooling and the power supply of the node; `nvidia-smi -q -d PERFORMANCE` shows the reason.",
    ),
    Alert(
        "VerlGpusIdle", "warning",
        "avg by (job, instance) (verl_gpu_utilization_ratio) < ${system:gpu_idle_utilization}"
        " and on(job, instance) ((verl_job_running == 1)"
        " or (max by (job, instance) (verl_node_run_info and on(project, experiment) verl_training_finished == 0)"
        " unless on(job, instance) verl_job_running))",
        "10m",
        "GPUs are idle while the training job runs.",
        "GPUs on {{ $labels.instance }}" + NODE_RUNS + " average " + PERCENT + " utilisation while the training job "
        "runs.",
        "The job is alive but its GPUs do nothing: it waits on something (data, reward server, a hung "
        "collective, a dead Ray worker). Where the exporter watches no job processes, a node counts as "
        "running while a run it works for (`verl_node_run_info`) has not finished, as the head node's "
        "exporter says: the runs it follows, or on a worker node without logs the run of its "
        "`--project`/`--experiment`. An exporter that reads a shared log directory works for none of the "
        "runs it follows, so its own idle GPUs do not fire this.",
        "See VerlTrainingStalled; check the job's log, Ray's dashboard and the reward service.",
    ),
    Alert(
        "VerlHostMemoryNearlyFull", "warning",
        "verl_host_memory_available_bytes / verl_host_memory_total_bytes < ${system:host_memory_available_min}",
        "5m",
        "The host is nearly out of memory.",
        "Host {{ $labels.instance }} has only " + PERCENT + " of its memory available.",
        "Ray's object store, rollout buffers or data loading fill host memory; the OOM killer will end the "
        "job.",
        "Lower `data.train_batch_size` or the rollout batch, turn off CPU offloading, limit Ray's "
        "object store (`ray start --object-store-memory`).",
    ),
))

GROUPS = (PERFORMANCE, OPERATIONS, GPUS)


def recording_rules() -> list[dict]:
    """The fleet view: ``level:metric:operations`` rules over every followed run. Rules of a group run
    in order: the finished and the stalled runs are computed once, first, and shared by the rest."""
    finished, stalled = nodes.FINISHED, "project_experiment:verl_training_stalled:seconds"
    return [{
        "name": "verl-fleet",
        "rules": [
            {"record": finished, "expr": "max by (project, experiment) (verl_training_finished)"},
            {"record": stalled, "expr": f"max by (project, experiment) ({STALLED})"},
        ] + nodes.recording_rules() + [
            {"record": "project_experiment:verl_training_steps_ingested:rate5m",
             "expr": "sum by (project, experiment) (rate(verl_training_steps_ingested_total[5m]))"},
            {"record": "project_experiment:verl_training_last_step_age_seconds:min",
             "expr": "time() - max by (project, experiment) (verl_training_last_step_timestamp_seconds)"},
            {"record": "state:verl_training_runs:count", "labels": {"state": "finished"},
             "expr": f"count({finished} == 1) or vector(0)"},
            {"record": "state:verl_training_runs:count", "labels": {"state": "stalled"},
             "expr": f"count({stalled}) or vector(0)"},
            {"record": "project_experiment:verl_training_progress:ratio",
             "expr": "clamp_max(max by (project, experiment) (verl_training_last_step)"
                     " / max by (project, experiment) (verl_training_total_steps), 1)"},
            {"record": "project_experiment:verl_training_time_left_seconds:estimate",
             "expr": "max by (project, experiment) (clamp_min(verl_training_total_steps - verl_training_last_step, 0))"
                     " * on(project, experiment)"
                     " max by (project, experiment) (avg_over_time(verl_timing_step_seconds[30m]))"},
            {"record": "state:verl_training_runs:count", "labels": {"state": "running"},
             "expr": f"count({finished} == 0 unless on(project, experiment) {stalled}) or vector(0)"},
        ],
    }]
