"""Performance and operations alerts, and the fleet recording rules (``verl-fleet``).

Their thresholds that are not verl metrics are the catalog's ``system`` section.
"""

from __future__ import annotations

from . import nodes
from .model import NUMBER, Alert, Group, new_or_increased, run_query, steps, sub
from .settings import setting

# The Prometheus job that scrapes the exporters (prometheus/prometheus.yml).
EXPORTER_JOB = "verl"
# The job under which VictoriaMetrics scrapes the vmagent members of a scaled-out fleet
# (prometheus/victoriametrics/scrapers.yml).
SCRAPER_JOB = "vmagent"


# Seconds the run had gone without a step at the last scrape, for runs that have not finished, while
# more than `stalled_steps` times its longest step of the last 3 (of its steps so far while it has
# fewer). A run that has not logged the time of a
# step yet is not stalled: its first step (model loading, rollout start-up) may take over an hour;
# VerlTrainingNoFirstStep watches it. Measured at the scrape (timestamp()), not at evaluation, so the
# scrape interval adds nothing.
# A save is slow past this many of the run's steps (saves do not speed up with the GPUs: the same run on
# faster GPUs saves for more steps), or past the catalog's hour for a run whose step time is unknown.
SAVE_SLOW_FLOOR = ("(${system:checkpoint_save_slow_steps} * (${STEP_TIME})"
                   " or ${RUN_MATCH} (0 * verl_checkpoint_saving + ${system:checkpoint_save_slow_seconds}))")
# How long the run's checkpoint save has been running, for runs saving one now.
STEP_TIME = (steps("recent_max", "verl_timing_step_seconds") + " or "
             + steps("run_max", "verl_timing_step_seconds"))
SAVING_FOR = (
    "((timestamp(verl_checkpoint_saving) - verl_checkpoint_save_started_timestamp_seconds)"
    " and verl_checkpoint_saving == 1)"
)
# A step that validates takes the run's validation on top (timing_s/testing: 10-20 times a training step
# for agent runs). The exporter predicts the run's next validation (verl_training_next_validation_step: by
# trainer.test_freq, else every as many steps as between its last two validations). That step (and the one
# before it), and every
# step of a run whose cadence is unknown (no config, fewer than two validations seen), gets the larger of
# validation_ratio times the run's longest validation so far and validation_steps of its steps. A stall
# during a validation still pages once the log is silent past that.
TEST_FREQ = setting("trainer.test_freq")
# The next step or the one after (verl before 0.3 validates one step before test_freq's multiples).
VALIDATES_NEXT = ("(verl_training_next_validation_step - ${RUN_MATCH} verl_training_last_step"
                  " <= ${timing_s/step:validation_lead_steps})")
CADENCE_UNKNOWN = ("(verl_training_last_step unless ${RUN_MATCH} verl_training_next_validation_step"
                   " unless ${RUN_MATCH} ${TEST_FREQ})")
LONGEST_VALIDATION = steps("run_max", "verl_timing_testing_seconds")
VALIDATION_ALLOWANCE = (
    "((${timing_s/step:validation_ratio} * ${LONGEST_VALIDATION}"
    " >= ${RUN_MATCH} ${timing_s/step:validation_steps} * (${STEP_TIME})"
    " or ${timing_s/step:validation_steps} * (${STEP_TIME}))"
    " and ${RUN_MATCH} (${VALIDATES_NEXT} or ${CADENCE_UNKNOWN})"
    " or 0 * (${STEP_TIME}))"
)
STALLED = (
    "(timestamp(verl_training_last_step_timestamp_seconds) - verl_training_last_step_timestamp_seconds)"
    " > ${RUN_MATCH} (${timing_s/step:stalled_steps} * (${STEP_TIME}) + ${RUN_MATCH} ${VALIDATION_ALLOWANCE})"
    " unless ${RUN_MATCH} verl_training_finished_timestamp_seconds"
    " unless ${RUN_MATCH} ${SAVING_FOR} < ${RUN_MATCH} clamp_min(${system:checkpoint_save_ceiling_steps}"
    " * (${STEP_TIME}), ${system:checkpoint_save_ceiling_seconds})"
)

# The guide's problem 4, slow training, told against the run's own earlier steps: the median of the
# last 10 steps over twice the mean of the 10 before.
STEP_SLOWER = (steps("window_median", "verl_timing_step_seconds") + " > ${timing_s/step:slowdown_ratio} * "
               + steps("prior_mean", "verl_timing_step_seconds"))
# ... and it lasts while the median of the last 10 steps is twice the median of the run's first 10.
STEP_STILL_SLOWER = (steps("window_median", "verl_timing_step_seconds") + " > ${timing_s/step:slowdown_ratio} * "
                     + steps("early_median", "verl_timing_step_seconds"))

# The run's throughput before: the mean of the 10 steps before the last 10.
THROUGHPUT_BEFORE = steps("prior_mean", "verl_perf_throughput")
UNFINISHED = "unless ${RUN_MATCH} verl_training_finished_timestamp_seconds"
# The run's GPUs over all its nodes (the fleet recording rules), where Prometheus has them.
RUN_GPUS = (run_query("project_experiment:verl_gpu_utilization_ratio:avg{project=%q,experiment=%q,user=%q}")
            + " Its GPUs, over all its nodes, are {{ . | first | value | humanizePercentage }} busy.{{ end }}")
# The run's total of steps (verl's Total training steps), where known.
TOTAL_STEPS = run_query("verl_training_total_steps{project=%q,experiment=%q,user=%q}")
# The run's job has no live process. A sidecar serves one verl_job_running per exporter, without run labels;
# a node exporter under --slurm serves one per job's run, with them: a run is gone unless its own job
# (or the sidecar's job) still runs, on an exporter that watches jobs at all.
JOB_GONE = ("unless on(job, instance, project, experiment, user, team) verl_job_running == 1 "
            "unless on(job, instance) verl_job_running{project=\"\"} == 1 "
            "and on(job, instance) verl_job_running")
# How the scheduler ended the run's job (--slurm: Slurm's final state, reason and exit code), the
# latest of its jobs where a resumed run had several.
LATEST_JOB_END = run_query("topk(1, verl_job_ended_timestamp_seconds{project=%q,experiment=%q,user=%q})")
JOB_END = (LATEST_JOB_END + "{{ with . | first }} Slurm ended job {{ .Labels.job_id }}"
           " as {{ .Labels.state }}{{ with .Labels.reason }} ({{ . }}){{ end }}, exit code"
           " {{ .Labels.exit_code }}.{{ end }}{{ end }}")
# The run's latest job was cancelled (Slurm's CANCELLED: `scancel`, by its user or an admin): a stop
# someone chose, told to the team rather than paged.
CANCELLED_LAST = ("(verl_job_ended_timestamp_seconds{state=\"CANCELLED\"}"
                  " >= on(project, experiment, user, team) group_left()"
                  " max by (project, experiment, user, team) (verl_job_ended_timestamp_seconds))")
JOB_END_MEANING = (" Under `--slurm` the page quotes how Slurm ended the job: `TIMEOUT` (its time limit: "
                   "resubmit with a longer `--time`, resuming from the last checkpoint), `OUT_OF_MEMORY` (the "
                   "job's host memory limit: ask for more `--mem`), `NODE_FAIL` (a node of the job died), "
                   "`PREEMPTED`, `CANCELLED` (`scancel`), `FAILED` (a non-zero exit code: the log's exception).")
JOB_FIX = ("Read the end of the job's log for the exception or OOM; `dmesg` for the OOM killer; restart from "
           "the last checkpoint (`trainer.resume_mode=auto`).")


# Where the job hangs, from the exporter's evidence of the stop (py-spy's top frame), where it has one.
HANGS_IN = (run_query("verl_evidence_top_frame_info{project=%q,experiment=%q,user=%q}")
            + " The job hangs in {{ . | first | label \"frame\" }}.{{ end }}")


def _within_steps(selector: str, steps: str) -> str:
    """Gauge ``selector`` (the run's step of an event) within the run's last ``steps`` steps; its value that step."""
    return sub("${selector} > ${RUN_MATCH} group_left() (verl_training_last_step - ${steps})",
               selector=selector, steps=steps)


PERFORMANCE = Group(name="verl-performance", file="verl-performance.rules.yml", title="Performance", alerts=(
    Alert(
        name="VerlGenerationBottleneck", severity="info",
        expr="verl_timing_gen_seconds / verl_timing_step_seconds > ${timing_s/step:gen_share} and ${STEP_SLOWER}",
        stay="verl_timing_gen_seconds / verl_timing_step_seconds and ${STEP_STILL_SLOWER}", for_="0s",
        summary="Steps got twice as slow, and generation takes more than half of each.",
        description="Run ${RUN}: the steps take twice as long as earlier in the run, and generation (timing_s/gen) "
        "takes ${PERCENT} of the step time.",
        meaning="When `timing_s/gen` exceeds half of `timing_s/step`, rollout generation is the bottleneck (the "
        "guide's problem 4). In most healthy RL runs generation is more than half of the step by design, so "
        "the rule speaks only when the steps also became twice as slow as earlier in the run (as "
        "VerlStepSlow): then it says which phase to look at.",
        fix="Raise `actor_rollout_ref.rollout.max_num_seqs` (more concurrent sequences in vLLM/SGLang), adjust "
        "`actor_rollout_ref.rollout.tensor_model_parallel_size`, raise "
        "`actor_rollout_ref.rollout.gpu_memory_utilization`.",
        guide="11.2",
    ),
    Alert(
        name="VerlActorUpdateBottleneck", severity="info",
        expr="verl_timing_update_actor_seconds / verl_timing_step_seconds > ${timing_s/step:update_actor_share}"
        " and ${STEP_SLOWER}",
        stay="verl_timing_update_actor_seconds / verl_timing_step_seconds and ${STEP_STILL_SLOWER}", for_="0s",
        summary="Steps got twice as slow, and actor updates take more than 40% of each.",
        description="Run ${RUN}: the steps take twice as long as earlier in the run, and the actor update "
        "(timing_s/update_actor) takes ${PERCENT} of the step time.",
        meaning="When `timing_s/update_actor` exceeds 40% of `timing_s/step`, training the actor is the bottleneck "
        "(the guide's problem 4). Healthy 7B runs on FSDP and Megatron spend 40-60% of a step there by "
        "design, so the rule speaks only when the steps also became twice as slow as earlier in the run.",
        fix="Tune `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` (or `use_dynamic_bsz`), enable "
        "`actor_rollout_ref.actor.use_torch_compile`.",
        guide="11.2",
    ),
    Alert(
        name="VerlThroughputDropped", severity="warning",
        # Each of the last 3 steps and most of the last 10: slow steps that come alone (a long-tail rollout, a
        # validation or a save now and then) do not make a run slower, however they fall together.
        expr=steps("recent_max", "verl_perf_throughput") + " < ${perf/throughput:drop_ratio} * ${THROUGHPUT_BEFORE}"
        " and " + steps("window_median", "verl_perf_throughput")
        + " < ${perf/throughput:drop_ratio} * ${THROUGHPUT_BEFORE}",
        stay=steps("window_median", "verl_perf_throughput")
        + " < (1 + ${perf/throughput:drop_ratio}) * ${hysteresis:half} * "
        + steps("best_window_mean", "verl_perf_throughput"), for_="0s",
        summary="Training throughput fell to half of the run's own earlier throughput.",
        description="Run ${RUN}: perf/throughput is ${NUMBER} tokens/s per GPU or less at each of the last 3 steps, "
        "and at most of the last 10, below ${perf/throughput:drop_ratio} of its mean over the 10 steps before "
        "those.",
        meaning="`perf/throughput` is tokens processed per second per GPU. What is normal depends on the model "
        "size, the GPUs and the batch and sequence lengths (the guide's 50 tokens/s/GPU is for a 7B "
        "model), so the rule compares the run with itself, in steps: each of its last 3 steps and the median "
        "of its last 10 against the mean of the 10 steps before those (slow steps that come alone, a long-tail "
        "rollout or a validation now and then, are no slower run, even three in a row); it stays firing while "
        "the median of the last 10 steps is under three quarters of the run's best 10 steps in a row. A restart "
        "of the job (its config printed "
        "again) starts the comparison again: a resumed job may run on other GPUs or another release, and "
        "verl 0.9's separate_async trainer counts the rollout GPUs in the denominator (verl PR #7049), so a "
        "run resumed under 0.9 logs a lower `perf/throughput` for the same speed.",
        fix="Find the slow phase in `timing_s/*` (generation, actor update) and follow its alert; check MFU and "
        "that GPUs are not throttled.",
        guide="11.2",
    ),
    Alert(
        name="VerlActorMfuLow", severity="info",
        expr=steps("recent_max", "verl_perf_mfu_actor") + " < ${perf/mfu/actor:drop_ratio} * "
        + steps("prior_mean", "verl_perf_mfu_actor"),
        stay=steps("window_median", "verl_perf_mfu_actor")
        + " < (1 + ${perf/mfu/actor:drop_ratio}) * ${hysteresis:half} * "
        + steps("best_window_mean", "verl_perf_mfu_actor"), for_="0s",
        summary="Actor model FLOPs utilisation fell to half of the run's own.",
        description="Run ${RUN}: perf/mfu/actor is ${PERCENT} or less at each of the last 3 steps, under "
        "${perf/mfu/actor:drop_ratio} of its mean over the 10 steps before the last 10.",
        meaning="MFU is achieved FLOPs over the hardware peak. The guide's bands (above 40% excellent, below 20% "
        "poor) are for dense training on NVIDIA GPUs; real healthy runs log from 7% to 79% (RL steps with short "
        "sequences, AMD GPUs whose peak verl does not know, older releases that count FLOPs differently), "
        "so the rule compares the run with itself: a drop to half means the actor update became slower "
        "for the same work (throttled or shared GPUs, a memory-bound micro batch, offloading). As for "
        "VerlThroughputDropped, a restart of the job starts the comparison again.",
        fix="Raise micro batch sizes, use `use_dynamic_bsz` and sequence packing (`use_remove_padding`), "
        "avoid needless gradient checkpointing or offloading.",
        guide="7.4",
    ),
    Alert(
        name="VerlStepSlow", severity="info",
        expr=STEP_SLOWER, stay=STEP_STILL_SLOWER, for_="0s",
        summary="Training steps take twice as long as earlier in the run.",
        description="Run ${RUN}: the median of the last 10 steps takes ${DURATION} (timing_s/step), over "
        "${timing_s/step:slowdown_ratio} times the mean of the 10 steps before them.",
        meaning="The guide treats a step time above 120 s as slow training, but a step's time follows the model "
        "size, `data.train_batch_size` x `actor_rollout_ref.rollout.n` and the response length: healthy "
        "7B runs take 150-400 s a step, agent runs up to 1,000 s. So the rule compares the run with its "
        "own earlier steps, by medians (a checkpoint save or a validation makes one step long, and "
        "counts for nothing): twice as slow means longer responses (see `response_length/mean`), a slower "
        "phase or slower hardware.",
        fix="See which `timing_s/*` phase dominates (VerlGenerationBottleneck, VerlActorUpdateBottleneck) and "
        "tune that phase.",
        guide="11.2",
    ),
    Alert(
        name="VerlGpuMemoryNearlyFull", severity="warning",
        expr="verl_perf_max_memory_allocated_bytes / on(job, instance) group_left()"
        " max by (job, instance) (verl_gpu_memory_total_bytes)"
        " > ${perf/max_memory_allocated_gb:near_total_ratio}", for_="5m",
        summary="Peak GPU memory allocated is close to the GPU's total.",
        description="Run ${RUN}: the {{ $labels.role }}'s peak allocated memory is ${PERCENT} of the GPU's memory: "
        "close to CUDA out of memory.",
        meaning="When the actor's or the critic's peak allocated memory (`actor/perf/max_memory_allocated_gb`, "
        "`critic/perf/...`; before verl 0.8 the actor's `perf/max_memory_allocated_gb`) approaches the GPU's "
        "total memory, the next longer batch can fail with CUDA out of memory.",
        fix="Halve `actor_rollout_ref.actor.ppo_mini_batch_size`, enable "
        "`actor_rollout_ref.model.enable_gradient_checkpointing`, or use `use_dynamic_bsz` with a smaller "
        "`ppo_max_token_len_per_gpu` (e.g. 16384 -> 8192).",
        guide="11.2",
    ),
), training=True)

OPERATIONS = Group(name="verl-operations", file="verl-operations.rules.yml", title="Operations", audience="oncall",
                   alerts=(
    Alert(
        name="VerlTrainingStalled", severity="critical",
        expr="${STALLED} unless on(job, instance) verl_job_running == 0", for_="10m",
        summary="The training run has stopped making progress.",
        description="Run ${RUN}: no new step for ${DURATION}, over ${timing_s/step:stalled_steps} times its usual step "
        "time, and the run has not finished." + RUN_GPUS + HANGS_IN,
        meaning="No new step has been read for several times the run's usual step time (plus the `for` "
        "duration), the run has not finished (reached its last step, or verl printed its end of "
        "training), it is not saving a checkpoint (verl's `local_global_step_folder:` line until the "
        "next step; a save counts for at most ${system:checkpoint_save_ceiling_seconds} s, and a slow one "
        "raises VerlCheckpointSaveSlow), it is not validating (the step the run validates next, by "
        "`trainer.test_freq` or every as many steps as between its last two validations, and every step of a run "
        "whose cadence is unknown, gets the larger of ${timing_s/step:validation_ratio} times the run's longest "
        "`timing_s/testing` so far and ${timing_s/step:validation_steps} of its steps) and, where the exporter "
        "knows the job "
        "(`--job.pid`/`--job.match`), the job's processes are still alive: the job hangs "
        "(NCCL, a dead Ray worker, a stuck rollout) while holding its GPUs.",
        fix="Look at the job's log tail and `py-spy dump` of the trainer; check Ray (`ray status`) and the GPU "
        "alerts on the same hosts; restart from the last checkpoint (`trainer.resume_mode=auto`).",
        guide="8.1",
        evidence=True,
    ),
    Alert(
        name="VerlCheckpointSaveSlow", severity="warning",
        expr="${SAVING_FOR} > ${RUN_MATCH} ${SAVE_SLOW_FLOOR}"
        " and ${RUN_MATCH} (${SAVING_FOR} > ${RUN_MATCH} ${system:checkpoint_save_slow_ratio}"
        " * verl_checkpoint_last_save_duration_seconds"
        " or ${SAVING_FOR} unless ${RUN_MATCH} verl_checkpoint_last_save_duration_seconds)", for_="5m",
        summary="A checkpoint save runs far longer than the run's saves before.",
        description="Run ${RUN}: a checkpoint save has run for ${DURATION}, over "
        "${system:checkpoint_save_slow_steps} of the run's steps and over ${system:checkpoint_save_slow_ratio} times "
        "the run's previous save.",
        meaning="verl prints `local_global_step_folder: .../global_step_N` when it starts saving step N's "
        "checkpoint and logs step N's metrics when the save is done. Saves of a 7B model take minutes to "
        "40 minutes (the verl team's GRPO baseline saves for 40 minutes every 20 steps); one that runs past "
        "an hour and three times the run's previous save is stuck on its storage (a full or slow shared "
        "file system, an object store that throttles) or on a rank that died while saving. The GPUs are "
        "idle meanwhile. VerlTrainingStalled stays silent while a save runs, for up to "
        "${system:checkpoint_save_ceiling_seconds} s.",
        fix="Check the checkpoint folder (`trainer.default_local_dir`): free space, write speed, files still "
        "growing; look for a rank that exited in the job's log; save less often (`trainer.save_freq`) or to "
        "faster local storage and copy asynchronously.",
        evidence=True,
    ),
    Alert(
        name="VerlTrainingJobCrashed", severity="critical",
        expr="((verl_training_last_step < ${RUN_MATCH} verl_training_total_steps) ${UNFINISHED}) ${JOB_GONE}"
        " unless on(project, experiment, user, team) ${CANCELLED_LAST}",
        for_="2m",
        summary="The training job exited before its last step.",
        description="Run ${RUN}: the training job has no live process, and the run stopped at step {{ $value }} of "
        + TOTAL_STEPS + "{{ . | first | value }}{{ end }}: it crashed or was stopped." + JOB_END,
        meaning="The exporter watches the job's processes (`--job.pid`/`--job.match`); none is left, and the run "
        "had not reached its last step (verl's `Total training steps`). The job crashed (OOM killer, "
        "exception, node failure) or was stopped by hand. A job that exits at its last step is finished "
        "and raises nothing. A job Slurm ended as `CANCELLED` raises VerlTrainingJobCancelled instead."
        + JOB_END_MEANING,
        fix=JOB_FIX,
        guide="8.1",
        evidence=True,
    ),
    Alert(
        name="VerlTrainingJobExited", severity="warning",
        expr="((verl_training_last_step unless ${RUN_MATCH} verl_training_total_steps) ${UNFINISHED}) ${JOB_GONE}"
        " unless on(project, experiment, user, team) ${CANCELLED_LAST}",
        for_="2m",
        summary="The training job's processes are gone and its run's length is unknown.",
        description="Run ${RUN}: the training job watched by {{ $labels.instance }} has no live process, "
        "the run did not "
        "report the end of training and its total of steps is unknown: it crashed, was stopped, or ended." + JOB_END,
        meaning="As VerlTrainingJobCrashed, for a run whose length the exporter does not know (a JSONL-only run "
        "without `--run.config` or a config with `trainer.total_training_steps`): whether it ended "
        "cannot be told, so this is a warning, not a page.",
        fix=JOB_FIX + " Give the exporter the run's config (`--run.config`) to tell an end from a crash.",
        guide="8.1",
    ),
    Alert(
        name="VerlTrainingJobCancelled", severity="warning",
        expr="(verl_training_last_step ${UNFINISHED}) ${JOB_GONE}"
        " and on(project, experiment, user, team) ${CANCELLED_LAST}",
        for_="2m",
        summary="The run's Slurm job was cancelled before the run finished.",
        description="Run ${RUN}: " + LATEST_JOB_END + "{{ with . | first }}Slurm job {{ .Labels.job_id }}{{ end }}"
        "{{ else }}its Slurm job{{ end }} was cancelled at step {{ $value }}" + TOTAL_STEPS
        + " of {{ . | first | value }}{{ end }}; the run is unfinished.",
        meaning="Under `--slurm`, the run's latest job ended as `CANCELLED` (`scancel`, by its user or by an "
        "admin) before the run reached its last step. A cancel is chosen, not a failure, so it is told to the "
        "team and does not page; every other early end of the job pages as VerlTrainingJobCrashed.",
        fix="If nobody of the team cancelled it, ask who did (`sacct -j <job id> -o JobID,State%30` shows "
        "`CANCELLED by <uid>`); to go on, resubmit with `trainer.resume_mode=auto` to resume from the last "
        "checkpoint.",
        guide="8.1",
    ),
    Alert(
        name="VerlTrainingNonFinite", severity="critical", audience="team",
        expr=_within_steps('verl_training_nonfinite_last_step{key=~".*(loss|grad_norm).*"}', "${system:recent_steps}"),
        stay=_within_steps('verl_training_nonfinite_last_step{key=~".*(loss|grad_norm).*"}',
                           "${hysteresis:twice} * ${system:recent_steps}"), for_="0m",
        summary="A loss or gradient norm of the run is NaN or Inf.",
        description="Run ${RUN}: {{ $labels.key }} was NaN or Inf at step {{ $value }}, within the run's last "
        "${system:recent_steps} steps.",
        meaning="A NaN or Inf loss or gradient norm means the weights are or will be corrupted; training cannot "
        "recover by itself.",
        fix="Stop the run and restart from the last good checkpoint with a lower "
        "`actor_rollout_ref.actor.optim.lr`; check the data for empty or extreme samples and the rewards "
        "for NaN; keep `grad_clip` on.",
        guide="1.7",
    ),
    Alert(
        name="VerlTrainingOutOfMemory", severity="critical", audience="team",
        expr=new_or_increased('verl_training_log_errors_total{kind="cuda_oom"}', "15m"), for_="0m",
        summary="The run's log shows a CUDA out-of-memory error.",
        description="Run ${RUN}: its log shows ${NUMBER} new CUDA (or HIP) out-of-memory errors in 15 minutes; the job "
        "has crashed or is about to, often before its first step.",
        meaning="A worker printed `torch.OutOfMemoryError: CUDA out of memory` (HIP on AMD GPUs): the actor update, "
        "the reference or critic forward, or the rollout engine asked for more GPU memory than was left. "
        "verl's workers then die and the trainer exits or hangs; runs that never logged a step page here "
        "first. The error line is in the exporter's evidence of the run.",
        fix="Halve `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` (or `ppo_max_token_len_per_gpu` with "
        "`use_dynamic_bsz`), enable `actor_rollout_ref.model.enable_gradient_checkpointing`, lower "
        "`actor_rollout_ref.rollout.gpu_memory_utilization` (the engine's share), or offload parameters "
        "(`actor_rollout_ref.actor.fsdp_config.param_offload`).",
        guide="11.2",
        evidence=True,
    ),
    Alert(
        name="VerlTrainingCrashed", severity="critical",
        expr="verl_training_fatal_error_last_step ${UNFINISHED}", for_="0m",
        summary="The trainer's output ended in a fatal error: the run has stopped.",
        description="Run ${RUN}: the trainer exited with a fatal {{ $labels.kind }} error at step {{ $value }}"
        "{{ if eq $value 0.0 }}, before its first step{{ end }}; the error line is in the exporter's evidence.",
        meaning="The trainer's own process printed its end, in the log alone: a `RayTaskError(...)` out of "
        "`ray::TaskRunner.run()` (`main_task` before verl 0.3), hydra's `Error executing job with overrides`, "
        "or an uncaught traceback of the trainer's entry file (torchrun's `ChildFailedError` for the SFT "
        "trainer). `kind` is the exception's: `cuda_oom`, `nccl`, `import_error` (a broken install: flash-attn "
        "or vLLM built against another torch), `assertion`, `ray_actor_died`, `timeout`, `config`, "
        "`file_not_found` or `exception`. Errors of workers that the trainer survives do not raise this; a "
        "run that steps again (resumed) ends it.",
        fix="Read the error line and the traceback before it (the exporter's `/debug/evidence`, or the end of "
        "the log and of the job's stderr file); the kind's own alert (VerlTrainingOutOfMemory for `cuda_oom`) "
        "has its fix. `import_error` at start-up: reinstall the package the traceback names for the "
        "installed torch. Resume with `trainer.resume_mode=auto` once fixed.",
        guide="8.1",
        evidence=True,
    ),
    Alert(
        name="VerlTrainingLogErrors", severity="warning",
        expr=_within_steps('verl_training_log_errors_last_step{kind!="cuda_oom"}', "${system:recent_steps}")
        + " >= 1 ${UNFINISHED}",
        stay=_within_steps('verl_training_log_errors_last_step{kind!="cuda_oom"}',
                           "${hysteresis:twice} * ${system:recent_steps}")
        + " >= 1 ${UNFINISHED}", for_="0m",
        summary="The log of a running run shows errors (NCCL timeout, segfault, dead Ray actor, traceback).",
        description="Run ${RUN}: its log showed {{ $labels.kind }} errors at step {{ $value }}, within the run's "
        "last ${system:recent_steps} steps, while the run is stepping.",
        meaning="A worker or the trainer of a run that has been stepping printed an error: `nccl_timeout` (a "
        "collective timed out: a rank hangs or died), `segfault`, `ray_actor_died` (a worker is gone) or "
        "`traceback` (an exception; Ray prints handled ones too, so a few can be harmless). Errors before "
        "the first step are left out: Ray prints caught exceptions while it starts. The lines are in the "
        "exporter's evidence of the run.",
        fix="Read the error lines and the lines before them (`/debug/evidence` of the exporter, or the log); "
        "for NCCL timeouts and dead actors check the other nodes' GPUs and `ray status`; for tracebacks "
        "in a reward function fix the function.",
        evidence=True,
    ),
    Alert(
        name="VerlTrainingNoFirstStep", severity="critical",
        expr="(timestamp(verl_training_started_timestamp_seconds) - verl_training_started_timestamp_seconds)"
        " > ${system:no_first_step_seconds}"
        " unless ${RUN_MATCH} verl_training_last_step_timestamp_seconds ${UNFINISHED}"
        " and on(job, instance) verl_job_running == 1"
        " unless on(project, experiment, user, team) project_experiment:verl_gpu_utilization_ratio:avg"
        " > ${system:gpu_idle_utilization}", for_="5m",
        summary="The job runs, but its run has logged no step an hour after it started.",
        description="Run ${RUN}: the run started ${DURATION} ago (its config print) and has logged no step, while the "
        "training job's processes are alive: it hangs before its first step." + HANGS_IN,
        meaning="verl printed the run's config (or its first line) more than an hour ago and no training step "
        "since, while the job's processes (`--job.pid`/`--job.match`) are alive. The first step includes "
        "loading the model and starting the rollout engine, which take minutes, not an hour: the job "
        "hangs (a worker stuck in NCCL initialisation, a rollout engine that never came up, a compile "
        "that never ends). A first step whose GPUs work (a 70B model, a long agent rollout: over an hour) is "
        "no hang: where the exporters know the run's GPUs, it waits while they are busy. The stall rule "
        "needs a step to measure, so this is its rule for the first one.",
        fix="Take a `py-spy dump` of the trainer and the workers (the exporter's evidence has one where it "
        "may ptrace), read the end of the log for the phase it hangs in, check `ray status`; restart.",
        guide="8.1",
        evidence=True,
    ),
    Alert(
        name="VerlExporterDown", severity="critical",
        expr='up{job="${EXPORTER_JOB}"} == 0', for_="5m",
        summary="Prometheus cannot scrape a verl exporter.",
        description="Target {{ $labels.instance }} of job {{ $labels.job }} has been down for 5 minutes: its run and "
        "GPUs are not monitored.",
        meaning="The exporter (or its host) does not answer Prometheus, so no other alert can fire for it.",
        fix="Check the exporter process or container (`systemctl status`, `docker logs`) and the network path "
        "from Prometheus; `curl http://HOST:9945/-/ready`.",
    ),
    Alert(
        name="VerlScrapeShardDown", severity="critical",
        # Down (0), or its series gone within the last day: absent is down too.
        expr='up{job="${SCRAPER_JOB}"} == 0'
        ' or (last_over_time(up{job="${SCRAPER_JOB}"}[1d]) unless up{job="${SCRAPER_JOB}"})', for_="5m",
        summary="A vmagent that scrapes a share of the verl exporters is down.",
        description="Scraper {{ $labels.instance }} (job {{ $labels.job }}) {{ if eq $value 0.0 }}has not answered "
        "its scrape{{ else }}is no longer scraped (its up series stopped){{ end }} for 5 minutes: the verl "
        "exporters of its share of the targets are not scraped, and VerlExporterDown cannot fire for them.",
        meaning="In a fleet scraped by a cluster of vmagents (`prometheus/victoriametrics/`), each member scrapes "
        "its share of the targets. When a member dies, the `up` series of its targets stop rather than turn 0, "
        "so VerlExporterDown (`up == 0`) and every other alert of those nodes stay silent. VictoriaMetrics "
        "scrapes each member as job `vmagent` (`scrapers.yml`): a member that does not answer, or whose `up` "
        "series stopped within the last day, fires this. Silent where no job `vmagent` is scraped (one "
        "Prometheus). Taking a member out for good: `prometheus/victoriametrics/README.md`.",
        fix="Restart the member with the same `-promscrape.cluster.memberNum` (its log says why it stopped); its "
        "targets go unscraped until then. A member taken out for good fires for a day unless its series are "
        "deleted from VictoriaMetrics.",
    ),
    Alert(
        name="VerlExporterCollectorFailing", severity="warning",
        expr="verl_exporter_collector_success == 0", for_="10m",
        summary="An exporter collector keeps failing.",
        description="Collector {{ $labels.collector }} of the exporter at {{ $labels.instance }} has failed "
        "every scrape "
        "for 10 minutes.",
        meaning="A collector (training, gpu or host) raises or times out at every scrape; its metrics are missing.",
        fix="Read the exporter's log for the collector's error (NVML not loaded, a hung driver call, an "
        "unreadable file).",
    ),
    Alert(
        name="VerlExporterParseErrors", severity="info",
        expr="increase(verl_exporter_parse_errors_total[15m]) > 0", for_="0m",
        summary="The exporter cannot parse lines of a verl log.",
        description="The exporter at {{ $labels.instance }} skipped " + NUMBER + " unreadable lines of "
        "{{ $labels.source }} in 15 minutes.",
        meaning="Lines that look like verl step lines could not be parsed; their values are missing.",
        fix="Check the file's format (`--source.format`) and the exporter's log, which quotes the reason.",
    ),
    Alert(
        name="VerlExporterSourceUnreadable", severity="warning",
        expr="verl_exporter_source_up == 0", for_="15m",
        summary="The exporter cannot read a verl log it is told to follow.",
        description="The exporter at {{ $labels.instance }} has not been able to read {{ $labels.source }} for 15 "
        "minutes: it is missing, not a regular file, or unreadable.",
        meaning="A `--source` path does not exist, or a path or glob match is a directory, a FIFO, a device, a "
        "symbolic link loop or a file the exporter may not read: nothing of it is exported, so no "
        "training alert can fire for its run. A FileLogger path appears only when verl starts training "
        "(after the models load), hence the 15 minutes.",
        fix="Read the exporter's log, which says once why it cannot read the path; fix the `--source` path or "
        "glob (`--source '/logs/*.log'` must not match directories), the file's permissions, or the volume "
        "mount of the sidecar.",
    ),
))

GROUPS = (PERFORMANCE, OPERATIONS)


def recording_rules() -> list[dict]:
    """The fleet view: ``level:metric:operations`` rules over every followed run. Rules of a group run
    in order: the finished and the stalled runs are computed once, first, and shared by the rest."""
    finished, stalled = nodes.FINISHED, nodes.STALLED_RUNS
    return [{
        "name": "verl-fleet",
        "rules": [
            {"record": finished, "expr": "max by (project, experiment, user, team) (verl_training_finished)"},
            {"record": stalled, "expr": "max by (project, experiment, user, team) (${STALLED})"},
        ] + nodes.recording_rules() + [
            {"record": "project_experiment:verl_training_steps_ingested:rate5m",
             "expr": "sum by (project, experiment, user, team) (rate(verl_training_steps_ingested_total[5m]))"},
            {"record": "project_experiment:verl_training_last_step_age_seconds:min",
             "expr": "time() - max by (project, experiment, user, team) (verl_training_last_step_timestamp_seconds)"},
            {"record": "state:verl_training_runs:count", "labels": {"state": "finished"},
             "expr": sub("count(${finished} == 1) or vector(0)", finished=finished)},
            {"record": "state:verl_training_runs:count", "labels": {"state": "stalled"},
             "expr": sub("count(${stalled}) or vector(0)", stalled=stalled)},
            {"record": "project_experiment:verl_training_progress:ratio",
             "expr": "clamp_max(max by (project, experiment, user, team) (verl_training_last_step)"
                     " / max by (project, experiment, user, team) (verl_training_total_steps), 1)"},
            {"record": "project_experiment:verl_training_time_left_seconds:estimate",
             "expr": "max by (project, experiment, user, team)"
                     " (clamp_min(verl_training_total_steps - verl_training_last_step, 0))"
                     " * on(project, experiment, user, team)"
                     " max by (project, experiment, user, team) (avg_over_time(verl_timing_step_seconds[30m]))"},
            {"record": "state:verl_training_runs:count", "labels": {"state": "running"},
             "expr": sub("count(${finished} == 0 unless on(project, experiment, user, team) ${stalled}) or vector(0)",
                         finished=finished, stalled=stalled)},
        ],
    }]
