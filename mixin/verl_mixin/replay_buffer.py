"""The V1 trainer's replay buffer and the asynchronous trainers (verl 0.9 on): prompt groups dropped
before training, and a trainer or a rollout that waits for the other.

verl 0.9's replay buffer counts, per step, the prompt groups it evicts: ``training/filter_groups/
evicted_samples`` (every rollout of the prompt scored the same: no learning signal,
``algorithm.filter_groups``), ``training/rollout_failure/evicted_samples`` (the rollout failed, with
``trainer.v1.sampler.sync_refill_failed_groups``). It logs them only at steps that evicted some; the
exporter counts a later step without them as 0 (``step_windows.SPARSE``). Each step trains
``data.train_batch_size`` groups, so the groups generated for a step are the evicted ones plus the batch.

The separate_async trainer logs ``separate_async/switch/idle`` (1 when it waited for sampleable prompts
more than the replay buffer's poll interval this step), fully_async_policy ``fully_async/trainer/
idle_ratio`` (``timing_s/gen`` over ``timing_s/step``) and ``fully_async/rollouter/idle_ratio`` (the share
of the time since the last weight sync its rollout sat paused).
"""

from __future__ import annotations

from .model import Alert, Group, held, mostly, steps, sub
from .settings import TRAIN_BATCH

# The catalog's bounds (thresholds of the metrics they bound).
PER_TRAINED = "${training/filter_groups/evicted_samples:no_signal_per_trained}"
BATCH_SHARE = "${training/rollout_failure/evicted_samples:batch_share}"
STARVED_STEPS = "${separate_async/switch/idle:starved_steps}"
TRAINER_IDLE_BOUND = "${fully_async/trainer/idle_ratio:too_high}"
ROLLOUT_IDLE_BOUND = "${fully_async/rollouter/idle_ratio:too_high}"
FILTERED = "verl_training_filter_groups_evicted_samples"
FAILED = "verl_training_rollout_failure_evicted_samples"
SWITCH_IDLE = "verl_separate_async_switch_idle"
TRAINER_IDLE = "verl_fully_async_trainer_idle_ratio"
ROLLOUT_IDLE = "verl_fully_async_rollouter_idle_ratio"

# Groups evicted as without signal: no_signal_per_trained times the batch (9: nine of ten generated).
NO_SIGNAL_GROUPS = "${PER_TRAINED} * " + TRAIN_BATCH
# Failed groups that count: failure_share of the batch, at least one; one where the batch is unknown.
FAILED_GROUPS = sub("${RUN_MATCH} (clamp_min(${BATCH_SHARE} * ${batch}, 1)"
                    " or 0 * verl_training_last_step + 1)", batch=TRAIN_BATCH)


def _became(stat: str, metric: str, bound: str) -> str:
    """Statistic ``stat`` of ``metric`` at ``bound`` or above, unless the run's first 10 steps were too
    (a balance the run was set up with, not a change)."""
    return sub("${now} >= ${bound} unless ${early} >= ${bound}", now=steps(stat, metric), bound=bound,
               early=steps("early_median", metric))


REPLAY_BUFFER = Group(name="verl-replay-buffer", file="verl-training.rules.yml",
                      title="The V1 trainer's replay buffer", alerts=(
    Alert(
        name="VerlGroupsWithoutSignal", severity="warning",
        expr=held(FILTERED, ">=", sub("${RUN_MATCH} (${groups})", groups=NO_SIGNAL_GROUPS)),
        stay=mostly(FILTERED, ">=", sub("${RUN_MATCH} (${hysteresis:half} * ${groups})", groups=NO_SIGNAL_GROUPS)),
        for_="0s",
        summary="Nine of ten prompt groups generated carry no learning signal.",
        description="Run ${RUN}: the replay buffer evicted ${NUMBER} or more prompt groups at each of the last 3 "
        "steps because every rollout of the prompt scored the same: ${PER_TRAINED} for each "
        "group trained (`data.train_batch_size` a step), nine of ten generated.",
        meaning="With `algorithm.filter_groups` the V1 trainer drops groups whose rollouts all score the same "
        "(`training/filter_groups/evicted_samples`) and generates more until a batch of groups with signal is "
        "ready, so the no-signal streak VerlNoLearningSignal looks for never reaches the trained batch. When "
        "${PER_TRAINED} groups or more are dropped for each one trained, the run spends nine tenths "
        "of its rollout on groups it throws away, and the data is near the edge of what the run learns from: "
        "every response right (the data became too easy for the policy) or every response wrong (a reward "
        "function that never matches, responses cut at `data.max_response_length`). A run whose config is "
        "unknown has no batch size, and no alert.",
        fix="Look at `critic/score/mean` and `training/filter_groups/*`: with a score near its maximum, move to "
        "harder data (curriculum); near 0, check the reward function against the answer format and "
        "`response_length/clip_ratio`. Raise `actor_rollout_ref.rollout.n` to make mixed groups likelier.",
        guide="3.3",
    ),
    Alert(
        name="VerlRolloutFailuresEvicted", severity="warning",
        expr=held(FAILED, ">=", FAILED_GROUPS),
        stay=mostly(FAILED, ">=", FAILED_GROUPS), for_="0s",
        summary="Prompt groups keep failing in rollout and are dropped.",
        description="Run ${RUN}: the replay buffer dropped ${NUMBER} or more prompt groups whose rollout failed at "
        "each of the last 3 steps (${BATCH_SHARE} of `data.train_batch_size` or more, at least one).",
        meaning="`training/rollout_failure/evicted_samples` counts prompt groups of which a session failed (an "
        "agent loop's exception, a tool or sandbox error, an engine error) and which the V1 trainer replaced "
        "(`trainer.v1.sampler.sync_refill_failed_groups`). verl logs them and goes on: nothing else "
        "says so. Failures at every step, at a tenth of the batch or more, bias the data (the prompts that "
        "fail are rarely a random sample: long, tool-heavy or malformed ones) and waste rollout time.",
        fix="Read the rollout workers' logs for the exception (agent loop, tool server, sandbox, reward "
        "service); check the tool and reward services are up and not rate-limited; lower the agent's turn "
        "or length limits if sessions time out.",
    ),
), training=True)

ASYNC = Group(name="verl-async-trainers", file="verl-performance.rules.yml",
              title="Asynchronous trainers: who waits for whom", alerts=(
    Alert(
        name="VerlTrainerStarved", severity="info",
        expr=sub("${switch} or ${ratio}",
                 switch=_became("window_mean", SWITCH_IDLE, "${STARVED_STEPS}"),
                 ratio=_became("window_median", TRAINER_IDLE, "${TRAINER_IDLE_BOUND}")),
        stay=sub("${switch} >= ${hysteresis:half} * ${STARVED_STEPS}"
                 " or ${ratio} >= ${hysteresis:half} * ${TRAINER_IDLE_BOUND}",
                 switch=steps("window_mean", SWITCH_IDLE), ratio=steps("window_median", TRAINER_IDLE)),
        for_="0s",
        summary="The trainer waits for rollouts most of the time.",
        description="Run ${RUN}: the trainer waited for rollouts in ${PERCENT} of its last 10 steps "
        "(separate_async: `separate_async/switch/idle`), or for that share of its step time "
        "(fully_async: the median of `fully_async/trainer/idle_ratio` over the last 10 steps), and it did not "
        "in its first 10 steps.",
        meaning="In the asynchronous trainers rollout and training overlap; the trainer idles when rollout cannot "
        "produce a batch in time. A run set up that way from its start (its first 10 steps idle too) is "
        "left alone: the rule names a run that became starved, as when responses grow longer, agent "
        "sessions slow down, rollout failures refill groups, or rollout replicas were lost.",
        fix="Look at `response_length/mean`, `timing_s/gen` and the rollout engines' queue; give rollout more "
        "GPUs or replicas, raise `trainer.v1.sampler.max_off_policy_threshold` (or fully_async's "
        "`staleness_threshold`) so rollout may run further ahead, lower `actor_rollout_ref.rollout.n`.",
    ),
    Alert(
        name="VerlRolloutIdle", severity="info",
        expr=_became("window_median", ROLLOUT_IDLE, "${ROLLOUT_IDLE_BOUND}"),
        stay=steps("window_median", ROLLOUT_IDLE) + " >= ${hysteresis:half} * ${ROLLOUT_IDLE_BOUND}",
        for_="0s",
        summary="The rollout GPUs wait for the trainer most of the time.",
        description="Run ${RUN}: the rollouter sat idle for ${PERCENT} of its time between weight syncs (median "
        "of `fully_async/rollouter/idle_ratio` over the last 10 steps), and it did not in its first 10 steps.",
        meaning="fully_async_policy's rollouter pauses when its queue is full or the staleness bound is "
        "reached: it waits for the trainer to take samples and sync new weights. Idle half the time, its "
        "GPUs are half wasted; the trainer became the bottleneck (slower updates, longer sequences to "
        "train on, a lost trainer node).",
        fix="Look at `timing_s/update_actor` and the trainer's MFU; give the trainer more GPUs or the rollouter "
        "fewer, or raise `staleness_threshold` so rollout may run further ahead.",
    ),
), training=True)

GROUPS = (REPLAY_BUFFER, ASYNC)
