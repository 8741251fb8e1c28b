"""Alerts that learn the run's own normal: each value against its trailing mean and spread.

Per run, recording rules keep each watched metric's z-score against the trailing window and its
change relative to the trailing mean (``run:<metric>:zscore1h``, ``run:<metric>:change1h``): the
window is the hour that ended ``GAP`` ago (``COLLAPSE_GAP`` for collapses, which last: they stay out
of their own normal for an hour), so a spike or a shift is not yet part of the normal it is
measured against; the standard deviation has a floor per metric (at least the 0.001 that verl
before 0.5 prints), so a series that barely moves or is rounded does not turn noise into huge
z-scores; and nothing is recorded until the window holds ``${anomaly:min_steps}`` steps, so the
first steps (warm-up, fast early changes) never alert. "Trailing hour" in the descriptions is
that window.

What is compared with that normal is the median of the last ``RECENT`` (at least three steps
where anything is recorded), not the latest step: a one-step spike that recovers, common in
healthy runs, moves no median; a spike that lasts does. Collapses must last 10 minutes more.
"""

from __future__ import annotations

from .model import Alert, Group, format_number, sub

WINDOW = "1h"
GAP = "15m"  # spikes: the trailing hour ends this long ago
COLLAPSE_GAP = "1h"  # collapses: long enough that a collapse stays out of its own normal while it lasts
RECENT = "10m"
THRESHOLDS = {
    "spike_zscore": 6.0,   # a spike: this many trailing standard deviations above the trailing mean
    "spike_change": 1.0,   # ... and up by more than this share of the trailing mean (1: doubled)
    "shift_zscore": 4.0,   # a lasting shift (collapse, rise)
    "drop_change": 0.5,    # a collapse: down by more than this share of the trailing mean
    "min_steps": 20.0,     # steps the trailing window must hold before anything is recorded
}
# Floors of the trailing standard deviation, in the metric's unit (about its healthy noise), and
# how long ago the trailing hour ends.
WATCHED = {
    "verl_actor_grad_norm": (0.01, GAP),
    "verl_actor_ppo_kl": (0.001, GAP),  # verl before 0.5 prints 3 decimals: 0.000 to 0.001 is no spike
    "verl_actor_pg_loss": (0.05, GAP),  # healthy runs move it by up to 0.06 for hours while they learn
    "verl_critic_vf_loss": (0.01, GAP),
    "verl_critic_score_mean": (0.01, COLLAPSE_GAP),
    "verl_critic_rewards_mean": (0.01, COLLAPSE_GAP),
}
# Slow trends, measured over hours rather than steps (verl steps take 10 s to 20 minutes).
THRESHOLDS |= {
    "entropy_rise_ratio": 1.5,   # VerlEntropyRising: the last hour's median over the 6-hour low
    "entropy_rise_min": 0.05,    # ... and above it by at least this much (a collapsed 2e-4 may double)
    "length_drop_ratio": 0.5,    # VerlResponseLengthCollapsed: 30-minute median under this share of before
    "length_rise_ratio": 2.0,    # VerlResponseLengthExploded: ... over this multiple
    "min_baseline_steps": 5.0,   # steps the 6 hours before must hold
}
LONG = "6h"
EXTRA = {"anomaly": THRESHOLDS}


def median(series: str, window: str, offset: str = "") -> str:
    return sub("quantile_over_time(0.5, ${series}[${window}]${offset})", series=series, window=window,
               offset=sub(" offset ${offset}", offset=offset) if offset else "")


# The run's entropy low of the 6 hours before the last: its 10th percentile, so that one low step does
# not count, and an hour that collapsed is not the low it is compared with.
LOW_ENTROPY = "quantile_over_time(0.1, verl_actor_entropy[${LONG}] offset 1h)"


def change(metric: str) -> str:
    return sub("run:${metric}:change${WINDOW}", metric=metric, WINDOW=WINDOW)


def zscore(metric: str) -> str:
    return sub("run:${metric}:zscore${WINDOW}", metric=metric, WINDOW=WINDOW)


def recording_rules() -> list[dict]:
    """``run:<metric>:zscore1h`` and ``run:<metric>:change1h`` (the change relative to the trailing
    mean) of every watched metric, per run. Alerts read only these, so that both come from the same
    evaluation."""
    rules = []
    for metric, (floor, gap) in WATCHED.items():
        values = {"recent": sub("quantile_over_time(0.5, ${metric}[${RECENT}])", metric=metric),
                  "trailing": sub("${metric}[${WINDOW}] offset ${gap}", metric=metric, gap=gap),
                  "floor": format_number(floor), "gap": gap}
        enough = " and ${RUN_MATCH} changes(verl_training_last_step[${WINDOW}] offset ${gap}) >= ${anomaly:min_steps}"
        rules += [
            {"record": change(metric),
             "expr": sub("(${recent} - avg_over_time(${trailing})) / clamp_min(abs(avg_over_time(${trailing})), "
                         "${floor})" + enough, **values)},
            {"record": zscore(metric),
             "expr": sub("(${recent} - avg_over_time(${trailing})) / clamp_min(stddev_over_time(${trailing}), "
                         "${floor})" + enough, **values)},
        ]
    return [{"name": "verl-anomaly-baselines", "rules": rules}]


def _spike(metric: str, key: str, name: str, what: str, meaning: str, fix: str) -> Alert:
    return Alert(
        name=name, severity="warning",
        expr=sub("${zscore} > ${anomaly:spike_zscore} and ${change} > ${anomaly:spike_change}",
                 zscore=zscore(metric), change=change(metric)),
        for_="0s",
        summary=sub("${what} stays far above the run's own normal.", what=what),
        description=sub("Run ${RUN}: ${key} over the last 10 minutes (median) has a z-score of ${NUMBER} against its "
                        "trailing hour and rose by more than ${anomaly:spike_change} of that hour's mean: a spike that "
                        "did not recover.", key=key),
        meaning=meaning, fix=fix)


_SHIFTS = {  # kind: (z-score comparison, change comparison, description)
    "drop": ("< -${anomaly:shift_zscore}", "< -${anomaly:drop_change}", "fell by more than ${anomaly:drop_change}"),
}


def _shift(metric: str, key: str, name: str, kind: str, summary: str, meaning: str, fix: str) -> Alert:
    """A lasting move (10 minutes) far outside the trailing spread and by a large share of the mean."""
    by_z, by_change, moved = _SHIFTS[kind]
    return Alert(
        name=name, severity="warning",
        expr=sub("${zscore} ${by_z} and ${change} ${by_change}", zscore=zscore(metric), by_z=by_z,
                 change=change(metric), by_change=by_change),
        for_="10m", summary=summary,
        description=sub("Run ${RUN}: ${key} has a z-score of ${NUMBER} against its trailing hour and ${moved} of that "
                        "hour's mean.", key=key, moved=moved),
        meaning=meaning, fix=fix)


def _length_shift(name: str, comparison: str, ratio: str, summary: str, meaning: str, fix: str) -> Alert:
    """The last 15 minutes' median response length against the median of the 6 hours before the last 30
    minutes (more than half of the 15 minutes must be short or long: one odd step is not)."""
    recent, before = median("verl_response_length_mean", "15m"), median("verl_response_length_mean", LONG, "30m")
    return Alert(
        name=name, severity="warning",
        expr=sub("${recent} ${comparison} ${anomaly:${ratio}} * ${before}", recent=recent, comparison=comparison,
                 ratio=ratio, before=before) +
        " and ${RUN_MATCH} changes(verl_training_last_step[${LONG}] offset 30m) >= ${anomaly:min_baseline_steps}",
        for_="10m", summary=summary,
        description="Run ${RUN}: the median response_length/mean of the last 15 minutes is ${NUMBER} tokens, against "
        "${anomaly:" + ratio + "} of its median over the 6 hours before.",
        meaning=meaning, fix=fix, guide="4.1")


ANOMALY = Group(name="verl-anomaly", file="verl-anomaly.rules.yml", title="The run's own normal (anomalies)", alerts=(
    _spike("verl_actor_grad_norm", "actor/grad_norm", "VerlActorGradNormSpike", "The actor's gradient norm",
           "`actor/grad_norm` over the last 10 minutes (their median: high for more than half of them) is more "
           "than ${anomaly:spike_zscore} standard deviations above its trailing mean (the hour that ended 15 "
           "minutes ago) and more than twice that mean. Healthy runs have one-step spikes (70 against a "
           "usual 1) that recover at the next step: those do not alert. A gradient norm that stays high "
           "comes with degenerate responses or a numerical problem and usually precedes a collapse.",
           "Look at the samples of those steps (response lengths, rewards); check `actor/pg_clipfrac` and "
           "`actor/ppo_kl` at the same steps; lower `actor_rollout_ref.actor.optim.lr` or "
           "`actor_rollout_ref.actor.grad_clip`."),
    _spike("verl_actor_ppo_kl", "actor/ppo_kl", "VerlPolicyKlSpike", "The PPO KL",
           "`actor/ppo_kl` stayed far above the run's normal for 10 minutes (their median): updates move "
           "the policy much further than usual. The spread has a floor of 0.001, the resolution of verl before "
           "0.5, which prints 3 decimals: 0.000 to 0.002 is no spike. With training-inference mismatch or stale "
           "rollouts this is often the first sign.",
           "Check `actor/grad_norm` and the mismatch metrics (`training/rollout_probs_diff_*`) of the same "
           "step; if it repeats, halve `actor_rollout_ref.actor.optim.lr`."),
    Alert(
        name="VerlActorPgLossSpike", severity="warning",
        expr=sub("abs(${zscore}) > ${anomaly:spike_zscore}", zscore=zscore("verl_actor_pg_loss")), for_="0s",
        summary="The policy loss stays far from the run's own normal.",
        description="Run ${RUN}: actor/pg_loss over the last 10 minutes (median) has a z-score of ${NUMBER} "
        "against its trailing hour.",
        meaning="`actor/pg_loss` sits near 0 and moves slowly; ten minutes more than ${anomaly:spike_zscore} trailing "
        "standard deviations away (either sign, the deviation at least 0.05: healthy runs move it by up to "
        "0.06 for hours while they learn) mean batches with extreme advantages or ratios, as in a collapse.",
        fix="Check `critic/advantages/max` and `/min` and `actor/pg_clipfrac` at that step; look for reward "
        "outliers in the batch."),
    _spike("verl_critic_vf_loss", "critic/vf_loss", "VerlCriticVfLossSpike", "The critic's loss",
           "`critic/vf_loss` stayed far above its trailing mean for 10 minutes (their median): the returns are "
           "far from what "
           "the critic predicts (a reward scale change, outlier rewards) or the critic diverges.",
           "Check `critic/returns/*` and `critic/rewards/*` at that step; if the loss keeps climbing, lower "
           "`critic.optim.lr` or clip the rewards."),
    _shift("verl_critic_score_mean", "critic/score/mean", "VerlScoreCollapsed", "drop",
           "The mean score collapsed below the run's own normal.",
           "The mean score (accuracy on math tasks) fell by more than half and far outside its recent spread, "
           "for 10 minutes, against the hour that ended an hour ago: a reward hacking phase ending, a policy "
           "collapse, or broken rollouts.",
           "Compare with `actor/entropy`, `response_length/mean` and the mismatch metrics; roll back to the "
           "last good checkpoint and lower `actor_rollout_ref.actor.optim.lr` if the policy collapsed."),
    _shift("verl_critic_rewards_mean", "critic/rewards/mean", "VerlRewardCollapsed", "drop",
           "The mean reward collapsed below the run's own normal.",
           "`critic/rewards/mean` (the score with the KL penalty) fell far below its recent level for 10 "
           "minutes. If the score did not fall too, the KL penalty grew: the policy drifts from the reference.",
           "If `critic/score/mean` fell too, see VerlScoreCollapsed; otherwise check "
           "`actor/reward_kl_penalty` and raise the KL coefficient (`algorithm.kl_ctrl.kl_coef`)."),
    Alert(
        name="VerlEntropyRising", severity="warning",
        expr=sub("${entropy} > ${anomaly:entropy_rise_ratio} * ${LOW_ENTROPY}"
                 " and ${entropy} - ${LOW_ENTROPY} > ${anomaly:entropy_rise_min}",
                 entropy=median("verl_actor_entropy", "1h")) +
        " and ${RUN_MATCH} changes(verl_training_last_step[${LONG}] offset 1h) >= ${anomaly:min_baseline_steps}",
        for_="15m",
        summary="Policy entropy rose well above the run's own normal.",
        description="Run ${RUN}: actor/entropy over the last hour (median ${NUMBER}) is more than "
        "${anomaly:entropy_rise_ratio} times its low of the last 6 hours.",
        meaning="Entropy normally falls slowly during RL training. An hour whose median is half again above the "
        "run's own low of the last 6 hours (its 10th percentile, so one low step does not count) means the "
        "policy is becoming random: too large updates, a too high entropy bonus, no KL anchor, or rollouts "
        "that no longer match the trained policy (training-inference mismatch). Real runs that degrade this "
        "way rise from about 0.24 to 0.5-0.8 over a few hours while the score falls.",
        fix="Check `actor_rollout_ref.actor.entropy_coeff`, `actor/ppo_kl` and "
        "`training/rollout_probs_diff_max`; lower `actor_rollout_ref.actor.optim.lr` or the entropy "
        "coefficient, or add a KL loss (`actor_rollout_ref.actor.use_kl_loss`).",
        guide="1.5"),
    _length_shift("VerlResponseLengthCollapsed", "<", "length_drop_ratio",
                  "Responses became far shorter than the run's own normal.",
                  "The median response length of the last 15 minutes is under half of the median of the 6 "
                  "hours before: the policy learned to stop early (a reward that favours short answers, a "
                  "format shortcut, a KL penalty that outweighs the score) or generation is broken (EOS, "
                  "stop tokens). Real collapses go from about 1,000 tokens to 1-10.",
                  "Read a few responses of the latest steps; check the reward function for length effects, "
                  "the KL coefficient and the rollout's stop settings; restart from a checkpoint before the "
                  "collapse."),
    _length_shift("VerlResponseLengthExploded", ">", "length_rise_ratio",
                  "Responses became far longer than the run's own normal.",
                  "The median response length of the last 15 minutes is more than twice the median of the 6 "
                  "hours before: repetition loops or rambling, often right before "
                  "`response_length/clip_ratio` rises and the rewards fall.",
                  "Read a few responses; watch `response_length/clip_ratio`; consider a length penalty or a "
                  "lower sampling temperature."),
), training=True)

GROUPS = (ANOMALY,)
