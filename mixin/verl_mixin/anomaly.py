"""Alerts that learn the run's own normal: each value against its own earlier steps.

Windows are steps of the run (``step_windows``), never minutes, so a run gets the same diagnosis
at the same step whether its steps take 20 seconds or an hour. A spike or a shift compares the
last 3 steps (each of them: a spike of a step or two that recovers, common in healthy runs, does
not count; a spike must also hold at about half of the last 10) with the mean and spread of the
10 steps before the last 10, so that the move is not yet part of the normal it is measured
against. The spread has a floor per metric (at least the 0.001 that verl before 0.5 prints), so a
series that barely moves or is rounded does not turn noise into huge z-scores; and nothing is
served until the run has 20 steps of the metric, so the first steps (warm-up, fast early changes)
never alert. An alert stays firing while the median of the last 10 steps is still half as far
out, or (collapses) still far below the run's best 10 steps (``stay``): one incident, one
notification.
"""

from __future__ import annotations

import math

from verl_exporter.store.step_windows import LONG

from .model import Alert, Group, raw_steps, recorded, steps, sub

# Its numbers are the catalog's table ``rules.anomaly`` (``${anomaly:spike_zscore}``, ``${anomaly:floor_<metric>}``).
# The standard error of the difference of two means of LONG steps, in standard deviations of one step:
# a consequence of LONG, not a choice.
EXTRA = {"anomaly": {"long_gain_stderr": round(math.sqrt(2 / LONG), 4)}}


# Metrics in the unit of the run's rewards, squared for a squared error: their floor is in that unit too, so
# a run that scores 0 to 10 is judged as one that scores 0 to 1. The floored figures are recorded once per
# run (``model.recorded``), from the statistics themselves.
IN_SCORE_UNITS = {"verl_critic_vf_loss": "(${SCORE_SCALE_OF_STATISTICS} * ${SCORE_SCALE_OF_STATISTICS})"}


def floor(metric: str) -> str:
    """The placeholder of ``metric``'s floor of the spread."""
    return "${anomaly:floor_" + metric.removeprefix("verl_") + "}"


def floored(stat: str, metric: str, *, size: bool = False) -> str:
    """``metric``'s statistic ``stat`` (its absolute value where ``size``), or its floor where it is below."""
    value = (raw_steps if metric in IN_SCORE_UNITS else steps)(stat, metric)
    value = f"abs({value})" if size else value
    if metric not in IN_SCORE_UNITS:
        return sub("clamp_min(${value}, ${floor})", value=value, floor=floor(metric))
    scaled = sub("(${floor} * ${unit})", floor=floor(metric), unit=IN_SCORE_UNITS[metric])
    return recorded(f"run:{metric}:{'size_' if size else ''}{stat}_floored",
                    sub("${value} > ${RUN_MATCH} ${scaled} or ${RUN_MATCH} ${scaled}", value=value, scaled=scaled))


def zscore(metric: str, stat: str) -> str:
    """Statistic ``stat`` of ``metric``'s last steps, in standard deviations of the 10 steps before the
    last 10 away from their mean."""
    return sub("(${now} - ${mean}) / ${spread}", now=steps(stat, metric),
               mean=steps("prior_mean", metric), spread=floored("prior_stddev", metric))


def change(metric: str, stat: str) -> str:
    """Statistic ``stat`` of ``metric``'s last steps relative to the mean of the 10 steps before the last 10."""
    return sub("(${now} - ${mean}) / ${size}", now=steps(stat, metric), mean=steps("prior_mean", metric),
               size=floored("prior_mean", metric, size=True))


def recording_rules() -> list[dict]:
    """None: the anomaly alerts read the exporter's step statistics directly."""
    return []


def _spike(metric: str, key: str, name: str, what: str, meaning: str, fix: str) -> Alert:
    return Alert(
        name=name, severity="warning",
        # The value is the metric's own: the lowest of its last 3 steps, then the median of the last 10.
        expr=sub("${low} and (${zscore} > ${anomaly:spike_zscore} and ${change} > ${anomaly:spike_change}"
                 " and ${median} > ${hysteresis:half} * ${anomaly:spike_zscore})", low=steps("recent_min", metric),
                 zscore=zscore(metric, "recent_min"), change=change(metric, "recent_min"),
                 median=zscore(metric, "window_median")),
        stay=sub("${median} and ${zscore} > ${hysteresis:half} * ${anomaly:spike_zscore}",
                 median=steps("window_median", metric),
                 zscore=zscore(metric, "window_median")),
        for_="0s",
        summary=sub("${what} stays far above the run's own normal.", what=what),
        description=sub("Run ${RUN}: ${key} is ${NUMBER} or more, far above its mean over the 10 steps before "
                        "the last 10 (over ${anomaly:spike_zscore} of their standard deviations and "
                        "${anomaly:spike_change} "
                        "of that mean at each of the last 3 steps, and high at about half of the last 10): a spike "
                        "that did not recover.", key=key),
        meaning=meaning, fix=fix)


_SHIFTS = {  # kind: (z-score comparison, change comparison, description)
    "drop": ("< -${anomaly:shift_zscore}", "< -${anomaly:drop_change}", "fell by more than ${anomaly:drop_change}"),
}


def _shift(metric: str, key: str, name: str, kind: str, summary: str, meaning: str, fix: str) -> Alert:
    """A lasting move (each of the last 3 steps) far outside the earlier spread and by a large share of the mean."""
    by_z, by_change, moved = _SHIFTS[kind]
    return Alert(
        name=name, severity="warning",
        # The value is the metric's own: the highest of its last 3 steps, then the median of the last 10.
        expr=sub("${high} and (${zscore} ${by_z} and ${change} ${by_change})", high=steps("recent_max", metric),
                 zscore=zscore(metric, "recent_max"), by_z=by_z, change=change(metric, "recent_max"),
                 by_change=by_change),
        # It lasts while the median of the last 10 steps is still that far below the run's best 10 steps.
        stay=sub("${median} and (${best} - ${median} > ${anomaly:drop_change} * ${size})",
                 best=steps("best_window_mean", metric), median=steps("window_median", metric),
                 size=floored("best_window_mean", metric, size=True)),
        for_="0s", summary=summary,
        description=sub("Run ${RUN}: ${key} has fallen to ${NUMBER}, far below its mean over the 10 steps before "
                        "the last 10 (over ${anomaly:shift_zscore} of their standard deviations at each of the last 3 "
                        "steps, and ${moved} of that mean).", key=key, moved=moved),
        meaning=meaning, fix=fix)


ENTROPY_EARLY = steps("early_median", "verl_actor_entropy")


def _entropy_risen(stat: str) -> str:
    """Entropy's statistic ``stat`` over entropy_rise_ratio times its median over the run's first 10 steps,
    and above it by more than rise_noise times their spread (and entropy_rise_min)."""
    return sub("${entropy} > ${anomaly:entropy_rise_ratio} * ${early}"
               " and ${entropy} - ${early} > clamp_min(${actor/entropy:rise_noise} * ${spread}, "
               "${anomaly:entropy_rise_min})",
               entropy=steps(stat, "verl_actor_entropy"), early=ENTROPY_EARLY,
               spread=steps("early_mad", "verl_actor_entropy"))
# The run's response length before: its first 10 steps, or the 10 steps before the last 10.
LENGTH_BEFORE = {"<": (steps("early_median", "verl_response_length_mean"),
                       steps("prior_mean", "verl_response_length_mean"))}
LENGTH_BEFORE[">"] = LENGTH_BEFORE["<"]


def _length_shift(name: str, comparison: str, ratio: str, summary: str, meaning: str, fix: str) -> Alert:
    """Each of the last 3 steps' mean response length under (over) a share of the run's length before,
    its first 10 steps or the 10 steps before the last 10; it stays firing while the median of the last
    10 steps is."""
    stat = "recent_max" if comparison == "<" else "recent_min"
    early, prior = LENGTH_BEFORE[comparison]
    now, median = steps(stat, "verl_response_length_mean"), steps("window_median", "verl_response_length_mean")
    # Longer than at the start is also a run that learned to use tools or to reason longer: that counts
    # only once responses reach the length cap as well.
    capped = (" and " + steps("recent_min", "verl_response_length_clip_ratio")
              + " > ${response_length/clip_ratio:elevated}") if comparison == ">" else ""
    expr = sub("(${now} ${comparison} ${anomaly:${ratio}} * ${early}${capped}"
               " or ${now} ${comparison} ${anomaly:${ratio}} * ${prior})",
               now=now, comparison=comparison, ratio=ratio, early=early, prior=prior, capped=capped)
    return Alert(
        name=name, severity="warning", expr=expr,
        stay=sub("${median} ${comparison} ${anomaly:${ratio}} * ${early}", median=median, comparison=comparison,
                 ratio=ratio, early=early),
        for_="0s", summary=summary,
        description="Run ${RUN}: response_length/mean at each of the last 3 steps is ${NUMBER} tokens or "
        + ("less" if comparison == "<" else "more") + ", against ${anomaly:" + ratio + "} of its median over the "
        "run's first 10 steps or of its mean over the 10 steps before the last 10.",
        meaning=meaning, fix=fix, guide="4.1")


ANOMALY = Group(name="verl-anomaly", file="verl-anomaly.rules.yml", title="The run's own normal (anomalies)", alerts=(
    _spike("verl_actor_grad_norm", "actor/grad_norm", "VerlActorGradNormSpike", "The actor's gradient norm",
           "`actor/grad_norm` at each of the last 3 steps is more than ${anomaly:spike_zscore} standard "
           "deviations above its mean over the 10 steps before the last 10, and more than twice that mean. Healthy "
           "runs have one-step spikes (70 against a "
           "usual 1) that recover at the next step: those do not alert. A gradient norm that stays high "
           "comes with degenerate responses or a numerical problem and usually precedes a collapse.",
           "Look at the samples of those steps (response lengths, rewards); check `actor/pg_clipfrac` and "
           "`actor/ppo_kl` at the same steps; lower `actor_rollout_ref.actor.optim.lr` or "
           "`actor_rollout_ref.actor.grad_clip`."),
    _spike("verl_actor_ppo_kl", "actor/ppo_kl", "VerlPolicyKlSpike", "The PPO KL",
           "`actor/ppo_kl` stayed far above the run's normal for 3 steps: updates move "
           "the policy much further than usual. The spread has a floor of 0.001, the resolution of verl before "
           "0.5, which prints 3 decimals: 0.000 to 0.002 is no spike. With training-inference mismatch or stale "
           "rollouts this is often the first sign.",
           "Check `actor/grad_norm` and the mismatch metrics (`training/rollout_probs_diff_*`) of the same "
           "step; if it repeats, halve `actor_rollout_ref.actor.optim.lr`."),
    Alert(
        name="VerlActorPgLossSpike", severity="warning",
        expr=sub("${now} and (${high} > ${anomaly:spike_zscore} or ${low} < -${anomaly:spike_zscore})"
                 " and abs(${median}) > ${hysteresis:half} * ${anomaly:spike_zscore}",
                 now=steps("window_median", "verl_actor_pg_loss"),
                 high=zscore("verl_actor_pg_loss", "recent_min"), low=zscore("verl_actor_pg_loss", "recent_max"),
                 median=zscore("verl_actor_pg_loss", "window_median")),
        stay=sub("${now} and abs(${zscore}) > ${hysteresis:half} * ${anomaly:spike_zscore}",
                 now=steps("window_median", "verl_actor_pg_loss"),
                 zscore=zscore("verl_actor_pg_loss", "window_median")),
        for_="0s",
        summary="The policy loss stays far from the run's own normal.",
        description="Run ${RUN}: actor/pg_loss is ${NUMBER} (the median of its last 10 steps), more than "
        "${anomaly:spike_zscore} standard deviations of the 10 steps before those from their mean at each of the "
        "last 3 steps.",
        meaning="`actor/pg_loss` sits near 0 and moves slowly; 3 steps more than ${anomaly:spike_zscore} "
        "standard deviations of the steps before away (either sign, the deviation at least 0.05: healthy runs move "
        "it by up to "
        "0.06 for hours while they learn) mean batches with extreme advantages or ratios, as in a collapse.",
        fix="Check `critic/advantages/max` and `/min` and `actor/pg_clipfrac` at that step; look for reward "
        "outliers in the batch."),
    _spike("verl_critic_vf_loss", "critic/vf_loss", "VerlCriticVfLossSpike", "The critic's loss",
           "`critic/vf_loss` stayed far above its earlier mean for 3 steps: the returns are "
           "far from what "
           "the critic predicts (a reward scale change, outlier rewards) or the critic diverges. The floor of "
           "its spread is in the square of the run's score range (`critic/score/max` minus `/min` over the run, "
           "1 where every batch scored alike), so a run that scores 0 to 10 is judged as one that scores 0 to 1.",
           "Check `critic/returns/*` and `critic/rewards/*` at that step; if the loss keeps climbing, lower "
           "`critic.optim.lr` or clip the rewards."),
    _shift("verl_critic_score_mean", "critic/score/mean", "VerlScoreCollapsed", "drop",
           "The mean score collapsed below the run's own normal.",
           "The mean score (accuracy on math tasks) fell by more than half and far outside its recent spread, "
           "for 3 steps, against the 10 steps before the last 10: a reward hacking phase ending, a policy "
           "collapse, or broken rollouts.",
           "Compare with `actor/entropy`, `response_length/mean` and the mismatch metrics; roll back to the "
           "last good checkpoint and lower `actor_rollout_ref.actor.optim.lr` if the policy collapsed."),
    _shift("verl_rollout_spec_accept_rate", "rollout/spec_accept_rate", "VerlSpeculativeAcceptanceDropped", "drop",
           "Speculative decoding accepts far fewer draft tokens than the run's own normal.",
           "`rollout/spec_accept_rate` (verl 0.8 on, with a draft model or MTP heads) fell by more than half and far "
           "outside its recent spread for 3 steps: the drafts no longer match what the policy samples (the "
           "policy drifted from the draft model, or the draft weights were not synced), and every rejected "
           "draft is wasted rollout time.",
           "Check that the draft model or MTP heads are updated with the policy (weight sync); retrain or "
           "refresh the draft, or turn speculative decoding off for this phase of training."),
    _spike("verl_rollout_moe_max_vio_max", "rollout/moe/max_vio/max", "VerlMoeImbalanceSpike",
           "The MoE routing imbalance",
           "`rollout/moe/max_vio/max` (verl 0.9 on: the most overloaded expert's load over an even share, less "
           "1, largest over layers) stayed far above its own earlier level for 3 steps: routing collapses onto "
           "a few experts, which slows rollout (the overloaded experts' GPUs) and often precedes a policy "
           "collapse. `verl_rollout_moe_max_vio{layer}` shows which layers.",
           "Compare with `actor/entropy` and the score; check the router's load-balancing loss coefficient and "
           "the learning rate; roll back to the last checkpoint if the imbalance keeps growing."),
    _shift("verl_critic_rewards_mean", "critic/rewards/mean", "VerlRewardCollapsed", "drop",
           "The mean reward collapsed below the run's own normal.",
           "`critic/rewards/mean` (the score with the KL penalty) fell far below its recent level for 3 "
           "steps. If the score did not fall too, the KL penalty grew: the policy drifts from the reference.",
           "If `critic/score/mean` fell too, see VerlScoreCollapsed; otherwise check "
           "`actor/reward_kl_penalty` and raise the KL coefficient (`algorithm.kl_ctrl.kl_coef`)."),
    Alert(
        name="VerlEntropyRising", severity="warning",
        # Each of the last 3 steps, or the median of the last 10 (a slow, noisy drift), well above the start.
        expr=sub("${held} or ${median}", held=_entropy_risen("recent_min"), median=_entropy_risen("window_median")),
        stay=sub("${entropy} > (1 + ${anomaly:entropy_rise_ratio}) * ${hysteresis:half} * ${early}",
                 entropy=steps("window_median", "verl_actor_entropy"), early=ENTROPY_EARLY),
        for_="0s",
        summary="Policy entropy rose well above the run's own normal.",
        description="Run ${RUN}: actor/entropy at each of the last 3 steps, or the median of the last 10 "
        "(${NUMBER}), is more than ${anomaly:entropy_rise_ratio} times its median over the run's first 10 steps, "
        "and above it by more than ${actor/entropy:rise_noise} times their spread.",
        meaning="Entropy normally falls slowly during RL training. Each of 3 steps, or the median of 10 (a slow "
        "drift through noisy steps), half again above the run's own start (the median of its first 10 steps, "
        "so one odd step does not count), and by more than ${actor/entropy:rise_noise} times the spread of "
        "those steps (a run whose entropy swings widely from step to step must move further), means the "
        "policy is becoming random: too large updates, a too high entropy bonus, no KL anchor, or rollouts "
        "that no longer match the trained policy (training-inference mismatch). Real runs that degrade this "
        "way rise from about 0.24 to 0.5-0.8 over tens of steps while the score falls.",
        fix="Check `actor_rollout_ref.actor.entropy_coeff`, `actor/ppo_kl` and "
        "`training/rollout_probs_diff_max`; lower `actor_rollout_ref.actor.optim.lr` or the entropy "
        "coefficient, or add a KL loss (`actor_rollout_ref.actor.use_kl_loss`).",
        guide="1.5"),
    _length_shift("VerlResponseLengthCollapsed", "<", "length_drop_ratio",
                  "Responses became far shorter than the run's own normal.",
                  "Each of the last 3 steps' response length is under half of the run's first 10 steps' median "
                  "or of the mean of the 10 steps before the last 10: the policy learned to stop early (a reward "
                  "that favours short answers, a "
                  "format shortcut, a KL penalty that outweighs the score) or generation is broken (EOS, "
                  "stop tokens). Real collapses go from about 1,000 tokens to 1-10.",
                  "Read a few responses of the latest steps; check the reward function for length effects, "
                  "the KL coefficient and the rollout's stop settings; restart from a checkpoint before the "
                  "collapse."),
    _length_shift("VerlResponseLengthExploded", ">", "length_rise_ratio",
                  "Responses became far longer than the run's own normal.",
                  "Each of the last 3 steps' response length is more than twice the run's first 10 steps' "
                  "median or the mean of the 10 steps before the last 10: repetition loops or rambling, often right "
                  "before "
                  "`response_length/clip_ratio` rises and the rewards fall.",
                  "Read a few responses; watch `response_length/clip_ratio`; consider a length penalty or a "
                  "lower sampling temperature."),
), training=True)

GROUPS = (ANOMALY,)
