"""Alerts that learn the run's own normal: each value against its trailing mean and spread.

Per run, recording rules keep each watched metric's trailing mean and its z-score against the
trailing window (``run:<metric>:mean1h``, ``run:<metric>:zscore1h``): the window is the hour
that ended ``GAP`` ago, so a spike or a shift is not yet part of the normal it is measured
against; the standard deviation has a floor per metric, so a series that barely moves does not
turn noise into huge z-scores; and nothing is recorded until the window holds
``${anomaly:min_steps}`` steps, so the first steps (warm-up, fast early changes) never alert.
"Trailing hour" in the descriptions is that window. Spikes alert at once; collapses and rises
must last 10 minutes.
"""

from __future__ import annotations

from verl_exporter.catalog import default_catalog

from .model import NUMBER, RUN, RUN_MATCH, Alert, Group, fill

WINDOW = "1h"
GAP = "15m"
THRESHOLDS = {
    "spike_zscore": 6.0,   # a spike: this many trailing standard deviations above the trailing mean
    "spike_change": 1.0,   # ... and up by more than this share of the trailing mean (1: doubled)
    "shift_zscore": 4.0,   # a lasting shift (collapse, rise)
    "drop_change": 0.5,    # a collapse: down by more than this share of the trailing mean
    "rise_change": 0.5,    # entropy up by more than this share of its trailing mean
    "min_steps": 20.0,     # steps the trailing window must hold before anything is recorded
}
# Floors of the trailing standard deviation, in the metric's unit (about its healthy noise).
WATCHED = {
    "verl_actor_grad_norm": 0.01,
    "verl_actor_ppo_kl": 0.0001,
    "verl_actor_pg_loss": 0.001,
    "verl_critic_vf_loss": 0.01,
    "verl_critic_score_mean": 0.01,
    "verl_critic_rewards_mean": 0.01,
    "verl_actor_entropy": 0.01,
    "verl_response_length_mean": 1.0,
}
EXTRA = {"anomaly": THRESHOLDS}


def change(metric: str) -> str:
    return f"run:{metric}:change{WINDOW}"


def zscore(metric: str) -> str:
    return f"run:{metric}:zscore{WINDOW}"


def recording_rules() -> list[dict]:
    """``run:<metric>:zscore1h`` and ``run:<metric>:change1h`` (the change relative to the trailing
    mean) of every watched metric, per run. Alerts read only these, so that both come from the same
    evaluation."""
    enough = (f" and {RUN_MATCH} changes(verl_training_last_step[{WINDOW}] offset {GAP})"
              " >= ${anomaly:min_steps}")
    rules = []
    for metric, floor in WATCHED.items():
        trailing = f"{metric}[{WINDOW}] offset {GAP}"
        rules += [
            {"record": change(metric),
             "expr": f"({metric} - avg_over_time({trailing})) / clamp_min(abs(avg_over_time({trailing})), {floor:g})"
                     f"{enough}"},
            {"record": zscore(metric),
             "expr": f"({metric} - avg_over_time({trailing})) / clamp_min(stddev_over_time({trailing}), {floor:g})"
                     f"{enough}"},
        ]
    for entry in rules:
        entry["expr"] = fill(entry["expr"], default_catalog(), EXTRA)
    return [{"name": "verl-anomaly-baselines", "rules": rules}]


def _spike(metric: str, key: str, name: str, what: str, meaning: str, fix: str) -> Alert:
    return Alert(
        name, "warning", f"{zscore(metric)} > ${{anomaly:spike_zscore}} and {change(metric)} > ${{anomaly:spike_change}}",
        "0s",
        f"{what} spiked far above the run's own normal.",
        f"Run {RUN}: {key} has a z-score of {NUMBER} against its trailing hour and rose by more than "
        "${anomaly:spike_change} of that hour's mean.",
        meaning, fix)


_SHIFTS = {  # kind: (z-score comparison, change comparison, description)
    "drop": ("< -${anomaly:shift_zscore}", "< -${anomaly:drop_change}", "fell by more than ${anomaly:drop_change}"),
    "rise": ("> ${anomaly:shift_zscore}", "> ${anomaly:rise_change}", "rose by more than ${anomaly:rise_change}"),
    "spike": ("> ${anomaly:shift_zscore}", "> ${anomaly:spike_change}", "rose by more than ${anomaly:spike_change}"),
}


def _shift(metric: str, key: str, name: str, kind: str, summary: str, meaning: str, fix: str) -> Alert:
    """A lasting move (10 minutes) far outside the trailing spread and by a large share of the mean."""
    by_z, by_change, moved = _SHIFTS[kind]
    return Alert(
        name, "warning", f"{zscore(metric)} {by_z} and {change(metric)} {by_change}", "10m", summary,
        f"Run {RUN}: {key} has a z-score of {NUMBER} against its trailing hour and {moved} of that hour's mean.",
        meaning, fix)


ANOMALY = Group("verl-anomaly", "verl-anomaly.rules.yml", "The run's own normal (anomalies)", (
    _spike("verl_actor_grad_norm", "actor/grad_norm", "VerlActorGradNormSpike", "The actor's gradient norm",
           "`actor/grad_norm` jumped to more than ${anomaly:spike_zscore} standard deviations above its "
           "trailing mean (the hour that ended 15 minutes ago) and more than twice that mean. A single large "
           "gradient often comes from a few abnormal samples (very long or degenerate responses, a reward "
           "outlier) or from a numerical problem; repeated spikes usually precede a collapse.",
           "Look at the samples of that step (response lengths, rewards); check `actor/pg_clipfrac` and "
           "`actor/ppo_kl` at the same step. If spikes repeat, lower `actor_rollout_ref.actor.optim.lr` or "
           "`actor_rollout_ref.actor.grad_clip`."),
    _spike("verl_actor_ppo_kl", "actor/ppo_kl", "VerlPolicyKlSpike", "The PPO KL",
           "`actor/ppo_kl` jumped far above the run's normal: one update moved the policy much further than "
           "usual. With training-inference mismatch or stale rollouts this is often the first sign.",
           "Check `actor/grad_norm` and the mismatch metrics (`training/rollout_probs_diff_*`) of the same "
           "step; if it repeats, halve `actor_rollout_ref.actor.optim.lr`."),
    Alert(
        "VerlActorPgLossSpike", "warning",
        f"abs({zscore('verl_actor_pg_loss')}) > ${{anomaly:spike_zscore}}", "0s",
        "The policy loss jumped far from the run's own normal.",
        f"Run {RUN}: actor/pg_loss has a z-score of {NUMBER} against its trailing hour.",
        "`actor/pg_loss` sits near 0 and moves slowly; a value more than ${anomaly:spike_zscore} trailing "
        "standard deviations away (either sign) means a batch with extreme advantages or ratios.",
        "Check `critic/advantages/max` and `/min` and `actor/pg_clipfrac` at that step; look for reward "
        "outliers in the batch."),
    _spike("verl_critic_vf_loss", "critic/vf_loss", "VerlCriticVfLossSpike", "The critic's loss",
           "`critic/vf_loss` jumped far above its trailing mean: the returns of that batch are far from what "
           "the critic predicts (a reward scale change, outlier rewards) or the critic diverges.",
           "Check `critic/returns/*` and `critic/rewards/*` at that step; if the loss keeps climbing, lower "
           "`critic.optim.lr` or clip the rewards."),
    _shift("verl_critic_score_mean", "critic/score/mean", "VerlScoreCollapsed", "drop",
           "The mean score collapsed below the run's own normal.",
           "The mean score (accuracy on math tasks) fell by more than half and far outside its recent spread, "
           "for 10 minutes: a reward hacking phase ending, a policy collapse, or broken rollouts.",
           "Compare with `actor/entropy`, `response_length/mean` and the mismatch metrics; roll back to the "
           "last good checkpoint and lower `actor_rollout_ref.actor.optim.lr` if the policy collapsed."),
    _shift("verl_critic_rewards_mean", "critic/rewards/mean", "VerlRewardCollapsed", "drop",
           "The mean reward collapsed below the run's own normal.",
           "`critic/rewards/mean` (the score with the KL penalty) fell far below its recent level for 10 "
           "minutes. If the score did not fall too, the KL penalty grew: the policy drifts from the reference.",
           "If `critic/score/mean` fell too, see VerlScoreCollapsed; otherwise check "
           "`actor/reward_kl_penalty` and raise the KL coefficient (`algorithm.kl_ctrl.kl_coef`)."),
    _shift("verl_actor_entropy", "actor/entropy", "VerlEntropyRising", "rise",
           "Policy entropy rose well above the run's own normal.",
           "Entropy normally falls slowly during RL training. A lasting rise of more than half means the "
           "policy is becoming random: too large updates, a too high entropy bonus, or rollouts that no "
           "longer match the trained policy (training-inference mismatch).",
           "Check `actor_rollout_ref.actor.entropy_coeff`, `actor/ppo_kl` and "
           "`training/rollout_probs_diff_max`; lower `actor_rollout_ref.actor.optim.lr` or the entropy "
           "coefficient."),
    _shift("verl_response_length_mean", "response_length/mean", "VerlResponseLengthCollapsed", "drop",
           "Responses became far shorter than the run's own normal.",
           "The mean response length halved within the hour: the policy learned to stop early (a reward "
           "that favours short answers, a format shortcut) or generation is broken (EOS, stop tokens).",
           "Read a few responses of the latest steps; check the reward function for length effects and the "
           "rollout's stop settings."),
    _shift("verl_response_length_mean", "response_length/mean", "VerlResponseLengthExploded", "spike",
           "Responses became far longer than the run's own normal.",
           "The mean response length doubled within the hour: repetition loops or rambling, often right "
           "before `response_length/clip_ratio` rises and the rewards fall.",
           "Read a few responses; watch `response_length/clip_ratio`; consider a length penalty or a lower "
           "sampling temperature."),
), training=True)

GROUPS = (ANOMALY,)
