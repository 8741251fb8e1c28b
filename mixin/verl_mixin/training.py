"""Training alerts: actor, critic, rewards and advantages, lengths, and the guide's diagnoses.

Numbers are catalog placeholders (``${verl/key:threshold}``); sections refer to metrics-guide.md.
"""

from __future__ import annotations

from .model import Alert, Group, held, mostly, recorded, steps, steps_of_any, sub
from .settings import ACTOR_GRAD_CLIP, CRITIC_GRAD_CLIP, quote, setting

WARMED_ACTOR = "verl_training_last_step >= ${actor/pg_clipfrac:warmup_steps}"
WARMED_CRITIC = "verl_training_last_step >= ${critic/vf_explained_var:warmup_steps}"
# Windows are the run's own steps (step_windows.py), never minutes: "held" is each of the last 3
# steps, an alert stays firing while the condition holds at about half of the last 10 (``stay``),
# trends compare the mean of the last 10 steps with the 10 before.
SCORE = "verl_critic_score_mean"


# Mean score of the last 10 steps minus the mean of the 10 before (needs 20 steps).
SCORE_GAIN = f"({steps('window_mean', SCORE)} - {steps('prior_mean', SCORE)})"
# The same over the last 30 steps and the 30 before (needs 60): a plateau, told from noise.
SCORE_LONG_GAIN = f"({steps('long_mean', SCORE)} - {steps('long_prior_mean', SCORE)})"
# ... and what that gain would be if the score rose by flat_noise standard errors of it more: the
# difference of two means of 30 steps has the spread of one step (of the 10 before the last 10)
# times sqrt(2/30). A noisy score "has not risen" only when even this is under min_gain.
SCORE_LONG_GAIN_BOUND = (f"({SCORE_LONG_GAIN} + ${{critic/score/mean:flat_noise}} * ${{anomaly:long_gain_stderr}}"
                         f" * {steps('prior_stddev', SCORE)})")
# The score has not risen over the last 10 steps against the 10 before, or (a young run, or one whose
# trend is not known yet) none of its last 3 steps is above its first 10 steps' median.
SCORE_STALLED = ("(${SCORE_GAIN} < ${critic/score/mean:min_gain}"
                 f" or {steps('recent_max', SCORE)} - {steps('early_median', SCORE)} < "
                 f"${{critic/score/mean:min_gain}})")
# The score's range over the run, from the batches' best and worst sequence scores.
SCORE_RANGE = (f"({steps('run_max', 'verl_critic_score_max')} - {steps('run_min', 'verl_critic_score_min')})")
# The unit of the run's rewards, returns and values: that range where the batches scored apart, else 1
# (the guide's runs score 0 to 1). The critic's thresholds are in it (squared for its loss), so a run that
# scores 0 to 10 is judged as one that scores 0 to 1.
SCORE_SCALE_OF_STATISTICS = f"({SCORE_RANGE} > 0 or 0 * verl_training_last_step + 1)"  # for rules that record
SCORE_SCALE = recorded("run:verl_critic_score:scale", SCORE_SCALE_OF_STATISTICS)
SCORE_SCALE_SQUARED = f"({SCORE_SCALE} * {SCORE_SCALE})"
# The middle of that range: below it the score is in the lower half of what the batches scored.
SCORE_MIDDLE = f"({steps('run_min', 'verl_critic_score_min')} + ${{critic/score/mean:low_share}} * ${{SCORE_RANGE}})"
SCORE_LOW = f"{steps('window_median', SCORE)} < ${{SCORE_MIDDLE}}"
# Converged near its best: the last 10 steps' mean within a tenth of that range of the run's best 10
# steps in a row, and in the upper half of the range or a fifth of it above the run's first 10 steps
# (a run that never learned is also "at its best").
NEAR_BEST = (f"({steps('window_mean', SCORE)} >= {steps('best_window_mean', SCORE)}"
             " - ${critic/score/mean:near_best_share} * ${SCORE_RANGE}"
             f" and ({steps('window_mean', SCORE)} >= ${{SCORE_MIDDLE}}"
             f" or {steps('window_mean', SCORE)} - {steps('early_median', SCORE)}"
             " >= ${critic/score/mean:learned_share} * ${SCORE_RANGE}))")
# The same, closer (half the share): what ends an alert that NEAR_BEST kept from starting, so that a
# noisy score around the edge of "near its best" does not end and start it again step after step.
NEAR_BEST_CLOSE = NEAR_BEST.replace("${critic/score/mean:near_best_share}",
                                    "${hysteresis:half} * ${critic/score/mean:near_best_share}")
# Some value of the last steps was not exactly 0: verl before 0.5 prints 3 decimals, and a KL of
# 0.000 every step says nothing about how small it really was.
RESOLVED_KL = (f"({steps('recent_max', 'verl_actor_ppo_kl')} > 0 or {steps('recent_min', 'verl_actor_ppo_kl')} < 0)")


def grad_pinned(metric: str, clip: str, tolerance: str, held_stats: tuple[str, str]) -> str:
    """``metric``'s statistics ``held_stats`` (low, high) within ``tolerance`` (relative) of the run's
    own grad_clip (recording rule ``clip``)."""
    low, high = (steps(stat, metric) for stat in held_stats)
    return sub("${low} >= ${RUN_MATCH} ((1 - ${tolerance}) * ${clip})"
               " and ${high} <= ${RUN_MATCH} ((1 + ${tolerance}) * ${clip})",
               low=low, high=high, clip=clip, tolerance=tolerance)


def grad_mostly_pinned(metric: str, clip: str, tolerance: str) -> str:
    """The median of ``metric``'s last 10 steps within ``tolerance`` of the run's grad_clip."""
    return grad_pinned(metric, clip, tolerance, ("window_median", "window_median"))


GRAD_PINNED = grad_pinned("verl_actor_grad_norm", ACTOR_GRAD_CLIP, "${actor/grad_norm:pinned_tolerance}",
                          ("recent_min", "recent_max"))
GRAD_MOSTLY_PINNED = grad_mostly_pinned("verl_actor_grad_norm", ACTOR_GRAD_CLIP, "${actor/grad_norm:pinned_tolerance}")
# "Frozen" and "conservative" mean something only when the policy is updated more than once per
# rollout: on-policy (ppo_epochs 1, one mini-batch per batch) has pg_clipfrac and ppo_kl at 0 by
# construction. Runs whose config is unknown are left out too (no series).
MULTI_UPDATE = "${RUN_MATCH} ${POLICY_UPDATES} > 1"
UNKNOWN = " (verl's default; the run's config is unknown)"
CLIP_RATIO = quote("actor_rollout_ref.actor.clip_ratio", "${setting:actor_rollout_ref.actor.clip_ratio}" + UNKNOWN)
# No description quotes grad_clip: where the gradient norm is pinned, its value shown is the clip
# value, and a `query` in a description runs at every evaluation of every pending alert.
MAX_RESPONSE = quote("data.max_response_length", "(unknown: the run's config is not known)")
MAX_PROMPT = quote("data.max_prompt_length", "(unknown: the run's config is not known)")
# Entropy's mean over the last 30 steps within a few percent of the 30 steps before.
# And steady step to step: a converged policy's entropy can swing by a third around a level that
# no longer moves (verl-agent's GiGPO on ALFWorld, 0.07-0.31), which is no stuck policy.
ENTROPY_STEADY = (f"{steps('prior_stddev', 'verl_actor_entropy')} / {steps('prior_mean', 'verl_actor_entropy')}"
                  " < ${actor/entropy:flat_spread_ratio}")
ENTROPY_FLAT = (f"abs({steps('long_mean', 'verl_actor_entropy')} - {steps('long_prior_mean', 'verl_actor_entropy')})"
                f" / {steps('long_prior_mean', 'verl_actor_entropy')} < ${{actor/entropy:flat_change_ratio}}"
                " and ${ENTROPY_STEADY}")
ENTROPY_ABOUT_FLAT = (f"abs({steps('long_mean', 'verl_actor_entropy')}"
                      f" - {steps('long_prior_mean', 'verl_actor_entropy')})"
                      f" / {steps('long_prior_mean', 'verl_actor_entropy')} < ${{hysteresis:twice}} * "
                      f"${{actor/entropy:flat_change_ratio}} and ${{ENTROPY_STEADY}}")
# The critic's loss over the last 10 steps has not fallen by its share from the 10 steps before.
VF_LOSS_FLAT = (f"{steps('window_mean', 'verl_critic_vf_loss')} > (1 - ${{critic/vf_loss:min_drop_ratio}})"
                f" * {steps('prior_mean', 'verl_critic_vf_loss')}")
# The critic's values and the returns apart at about half of the last 10 steps (their medians).
VALUE_GAP = (f"abs({steps('window_median', 'verl_critic_vpred_mean')}"
             f" - {steps('window_median', 'verl_critic_returns_mean')})"
             " > ${RUN_MATCH} ${VALUE_GAP_LIMIT}")
# The critic's values this far from the returns, in the run's score unit; its loss (a squared error) over
# these many squared units.
VALUE_GAP_LIMIT = "(${critic/vpred_mean:max_gap_to_returns} * ${SCORE_SCALE})"
VF_LOSS_HIGH = "(${critic/vf_loss:high} * ${SCORE_SCALE_SQUARED})"
VF_LOSS_CONVERGED = "(${critic/vf_loss:converged} * ${SCORE_SCALE_SQUARED})"
SCORE_UNITS_NOTE = " times the run's score range"
SCORE_UNITS_MEANING = (" The threshold is in the run's own unit, its score range (the run's highest `critic/score/max` "
                       "minus its lowest `critic/score/min`; 1 where every batch scored alike), squared for a loss: "
                       "a run that scores 0 to 10 is judged as one that scores 0 to 1.")
# How many of the run's latest steps in a row had every advantage 0 (max and min), and how likely such a
# step is in this run: its own share of them before the streak (after 10 steps), else by its batch.
ADVANTAGES = ("verl_critic_advantages_max", "verl_critic_advantages_min")
ADVANTAGES_NAME = "verl_critic_advantages"  # their statistics taken together, as recorded
NO_SIGNAL_STREAK = steps_of_any("zero_streak", "|".join(ADVANTAGES), ADVANTAGES, aggregate="min", name=ADVANTAGES_NAME)
# The chance of such a step in this run: its share of them before the streak, weighed with a prior of
# no_signal_prior_steps steps at small_batch_share (a batch under small_batch prompts) or share_floor.
NO_SIGNAL_PRIOR = ("(0 * ${NO_SIGNAL_STREAK} + ${critic/advantages/max:small_batch_share}"
                   " and ${RUN_MATCH} " + setting("data.train_batch_size") + " < ${critic/advantages/max:small_batch}"
                   " or 0 * ${NO_SIGNAL_STREAK} + ${critic/advantages/max:share_floor})")
NO_SIGNAL_CHANCE = ("clamp((" + steps_of_any("zero_before", "|".join(ADVANTAGES), ADVANTAGES, name=ADVANTAGES_NAME)
                    + " + ${critic/advantages/max:no_signal_prior_steps} * ${NO_SIGNAL_PRIOR}) / ("
                    + steps_of_any("steps_before", "|".join(ADVANTAGES), ADVANTAGES, name=ADVANTAGES_NAME)
                    + " + ${critic/advantages/max:no_signal_prior_steps}),"
                    " ${critic/advantages/max:share_floor}, ${critic/advantages/max:share_ceiling})")
# Entropy not collapsed (that is VerlEntropyCollapsing's and VerlPrematureConvergence's to tell).
ENTROPY_LEFT = steps("recent_min", "verl_actor_entropy") + " > ${actor/entropy:collapsed}"
HALVE_LR = "Halve `actor_rollout_ref.actor.optim.lr` (e.g. 1e-6 -> 5e-7)"

ACTOR = Group(name="verl-actor", file="verl-training.rules.yml", title="Actor (policy network)", alerts=(
    Alert(
        name="VerlPolicyUpdateAggressive", severity="warning",
        expr=held("verl_actor_pg_clipfrac", ">", "${actor/pg_clipfrac:aggressive}"),
        stay=mostly("verl_actor_pg_clipfrac", ">", "${actor/pg_clipfrac:aggressive}"), for_="0s",
        summary="PPO clips more than half of the policy updates.",
        description="Run ${RUN}: actor/pg_clipfrac is ${PERCENT}, above ${actor/pg_clipfrac:aggressive}: "
        "policy updates are aggressive and may be unstable (clip_ratio ${CLIP_RATIO}).",
        meaning="`actor/pg_clipfrac` is the share of samples whose probability ratio left the PPO clip range. "
        "The guide's healthy range is 0.05-0.30; above 0.5 the updates are too large and training may "
        "become unstable.",
        fix="${HALVE_LR}; if the learning rate is already small, widen `actor_rollout_ref.actor.clip_ratio` "
        "by half (e.g. 0.2 -> 0.3).",
        guide="1.2",
    ),
    Alert(
        name="VerlPolicyUpdateConservative", severity="info",
        expr=held("verl_actor_pg_clipfrac", "<", "${actor/pg_clipfrac:conservative}") + " and "
        + mostly("verl_actor_pg_clipfrac", "<", "${actor/pg_clipfrac:conservative}")
        + " and " + steps("recent_max", "verl_actor_pg_clipfrac") + " > 0 and ${WARMED_ACTOR} and ${MULTI_UPDATE}",
        stay=mostly("verl_actor_pg_clipfrac", "<", "${actor/pg_clipfrac:conservative}") + " and ${MULTI_UPDATE}",
        for_="0s",
        summary="PPO has clipped almost no policy updates for many steps.",
        description="Run ${RUN}: actor/pg_clipfrac has stayed below ${actor/pg_clipfrac:conservative} at each of the "
                    "last 3 "
        "steps and most of the last 10 (at most ${PERCENT}; clip_ratio ${CLIP_RATIO}): policy updates are "
        "conservative and learning may be slow.",
        meaning="The guide calls below 0.05 conservative, but healthy real runs that update several times per "
        "rollout clip 0.1-0.5% of their samples (0.001-0.005) for their whole life: the rule waits for "
        "below 0.001, where almost no update reaches the clip range and the policy changes little per step. "
        "A fraction printed as 0.000 at every step (verl before 0.5) says nothing and is left out, like an "
        "exact 0. After convergence (score high and flat) this is expected. Only for runs that "
        "update the policy more than once per rollout (`ppo_epochs` > 1 or `ppo_mini_batch_size` below "
        "`data.train_batch_size`): on-policy runs (the common GRPO recipe) clip nothing by construction, "
        "and runs whose config the exporter does not know are left out.",
        fix="If the score is still rising slowly, raise `actor_rollout_ref.actor.optim.lr` (e.g. x2); if the "
        "run has converged, nothing to do.",
        guide="1.2",
    ),
    Alert(
        name="VerlPolicyChangeTooLarge", severity="warning",
        expr=held("verl_actor_ppo_kl", ">", "${actor/ppo_kl:too_large}"),
        stay=mostly("verl_actor_ppo_kl", ">", "${actor/ppo_kl:too_large}"), for_="0s",
        summary="The policy changes too much per update (PPO KL too large).",
        description="Run ${RUN}: actor/ppo_kl is ${NUMBER}, above ${actor/ppo_kl:too_large}.",
        meaning="`actor/ppo_kl` approximates the KL divergence between the old and the new policy. The guide's "
        "healthy range is 0.001-0.01; above 0.05 the policy moves too far in one update.",
        fix="${HALVE_LR}.",
        guide="1.3",
    ),
    Alert(
        name="VerlPolicyFrozen", severity="info",
        expr=held("verl_actor_ppo_kl", "<", "${actor/ppo_kl:frozen}") + " and "
        + held("verl_actor_ppo_kl", ">", "-${actor/ppo_kl:frozen}") + " and "
        + mostly("verl_actor_ppo_kl", "<", "${actor/ppo_kl:frozen}")
        + " and ${RESOLVED_KL} and ${WARMED_ACTOR} and ${MULTI_UPDATE}",
        stay=mostly("verl_actor_ppo_kl", "<", "${actor/ppo_kl:frozen}") + " and "
        + mostly("verl_actor_ppo_kl", ">", "-${actor/ppo_kl:frozen}") + " and ${MULTI_UPDATE}",
        for_="0s",
        summary="The policy has barely changed for many steps (PPO KL about 0).",
        description="Run ${RUN}: actor/ppo_kl has stayed within ±${actor/ppo_kl:frozen} at each of the last 3 "
        "steps and most of the last 10 (at most ${NUMBER}): the policy is almost frozen.",
        meaning="Below 0.001 the policy hardly changes: either the run has converged, or the learning rate "
        "has decayed to nothing or exploration has collapsed. Only for runs that update the policy more "
        "than once per rollout: on-policy, the old and the new policy are the same and `ppo_kl` is 0 by "
        "construction; runs whose config the exporter does not know are left out. A KL printed as 0.000 "
        "at every step (verl before 0.5 prints 3 decimals) says nothing: such steps are left out too.",
        fix="Check `actor/lr` (warm-up and decay schedule) and `actor/entropy`; if the score is still low, "
        "raise `actor_rollout_ref.actor.optim.lr` or `actor_rollout_ref.actor.entropy_coeff`.",
        guide="1.3",
    ),
    Alert(
        name="VerlEntropyCollapsing", severity="warning",
        expr=steps("recent_max", "verl_actor_entropy") + " < ${actor/entropy:collapse_drop_ratio} * "
        + steps("early_median", "verl_actor_entropy") + " and "
        + held("verl_actor_entropy", "<", "${actor/entropy:healthy.min}") + " and ${SCORE_STALLED}"
        " unless ${NEAR_BEST}",
        stay=mostly("verl_actor_entropy", "<", "${actor/entropy:healthy.min}") + " unless ${NEAR_BEST}",
        for_="0s",
        summary="Policy entropy fell fast to near zero while the score stalled.",
        description="Run ${RUN}: actor/entropy is ${NUMBER}, at most ${actor/entropy:collapse_drop_ratio} of its "
        "median over the run's first 10 steps and below ${actor/entropy:healthy.min} at each of the last 3 steps, "
        "and critic/score/mean has not risen over the last 10 steps against the 10 before.",
        meaning="Entropy measures how random the policy's output is. It should fall slowly (e.g. 0.8 -> 0.4 over "
        "200 steps); halving from the run's first steps to below 0.1 while the score stops rising is the guide's "
        "signature of a collapse: exploration has ended and the policy may be stuck in a local optimum. "
        "Healthy math runs also drop fast early (0.36 -> 0.09 in 20 steps) and end at 0.01-0.05, but "
        "with a score that is rising then, or has converged near its best: neither alerts.",
        fix="Raise `actor_rollout_ref.actor.entropy_coeff` (e.g. 0.001 -> 0.01) or the sampling temperature "
        "`actor_rollout_ref.rollout.temperature` (e.g. 1.0 -> 1.2).",
        guide="1.5",
    ),
    Alert(
        name="VerlEntropyFlat", severity="warning",
        expr="${ENTROPY_FLAT} and ${SCORE_LONG_GAIN_BOUND} < ${critic/score/mean:min_gain} and ${ENTROPY_LEFT}"
        " unless ${NEAR_BEST}",
        stay="${ENTROPY_ABOUT_FLAT} and ${SCORE_LONG_GAIN_BOUND} < ${hysteresis:twice} * ${critic/score/mean:min_gain}"
             " and ${ENTROPY_LEFT}"
        " unless ${NEAR_BEST_CLOSE}",
        for_="0s",
        summary="Entropy and score have both stayed flat: the policy is not learning.",
        description="Run ${RUN}: actor/entropy changed by only ${PERCENT} over the last 30 steps against the 30 "
        "before while critic/score/mean gained less than ${critic/score/mean:min_gain}, by more than "
        "${critic/score/mean:flat_noise} standard errors of its own noise.",
        meaning="Entropy that barely moves (e.g. 0.50 -> 0.48 over 100 steps) while the score does not rise means "
        "the policy is not learning anything: the reward signal is missing or uninformative. A run that "
        "has converged near its best score (the last 10 steps within a tenth of the score's range of its best "
        "10 steps in a row, and in the upper half of that range) is flat by design and is left out, and so "
        "is entropy that swings from step to step (a standard deviation over ${actor/entropy:flat_spread_ratio} "
        "of its mean) around a level that no longer moves.",
        fix="Check the reward function and `critic/rewards/mean` (is any sample rewarded?), then the data "
        "and the learning rate `actor_rollout_ref.actor.optim.lr`.",
        guide="1.5",
    ),
    Alert(
        name="VerlKlLossHigh", severity="warning",
        expr=held("verl_actor_kl_loss", ">", "${actor/kl_loss:too_large}"),
        stay=mostly("verl_actor_kl_loss", ">", "${actor/kl_loss:too_large}"), for_="0s",
        summary="The policy drifts far from the reference policy (KL loss too large).",
        description=sub("Run ${RUN}: actor/kl_loss is ${NUMBER}, above ${actor/kl_loss:too_large} "
                        "(kl_loss_coef ${coef}).", coef=quote("actor_rollout_ref.actor.kl_loss_coef", "unknown")),
        meaning="`actor/kl_loss` is the KL divergence between the policy and the reference policy (GRPO and "
        "similar). The guide's range is 0.001-0.1; above it the policy leaves the trust region.",
        fix="Raise `actor_rollout_ref.actor.kl_loss_coef` or lower `actor_rollout_ref.actor.optim.lr`.",
        guide="1.6",
    ),
    Alert(
        name="VerlActorGradNormPinned", severity="warning",
        expr="${GRAD_PINNED}", stay="${GRAD_MOSTLY_PINNED}", for_="0s",
        summary="The actor's gradient norm is pinned at the clip value.",
        description="Run ${RUN}: actor/grad_norm has stayed at the run's grad_clip (now ${NUMBER}): every update is "
        "clipped.",
        meaning="When `actor/grad_norm` equals the gradient clip value (the run's "
        "`actor_rollout_ref.actor.grad_clip`, else verl's default "
        "${setting:actor_rollout_ref.actor.grad_clip}) step after step, every gradient is being clipped: "
        "the learning rate is too high or some data is abnormal.",
        fix="${HALVE_LR}; check the data for abnormal samples; only then consider a larger "
        "`actor_rollout_ref.actor.grad_clip`.",
        guide="1.7",
    ),
), training=True)

CRITIC = Group(name="verl-critic", file="verl-training.rules.yml", title="Critic (value network)", alerts=(
    Alert(
        name="VerlCriticGradNormPinned", severity="warning",
        expr=grad_pinned("verl_critic_grad_norm", CRITIC_GRAD_CLIP, "${critic/grad_norm:pinned_tolerance}",
                         ("recent_min", "recent_max")),
        stay=grad_mostly_pinned("verl_critic_grad_norm", CRITIC_GRAD_CLIP, "${critic/grad_norm:pinned_tolerance}"),
        for_="0s",
        summary="The critic's gradient norm is pinned at the clip value.",
        description="Run ${RUN}: critic/grad_norm has stayed at the run's critic.grad_clip (now ${NUMBER}): every "
        "critic update is clipped.",
        meaning="When `critic/grad_norm` equals the critic's gradient clip value (the run's `critic.grad_clip`, "
        "else verl's default ${setting:critic.grad_clip}) step after step, every critic gradient is "
        "clipped: the critic's learning rate is too high or the returns are out of scale.",
        fix="Lower `critic.optim.lr` (e.g. halve it); check the reward scale; only then consider a larger "
        "`critic.grad_clip`.",
        guide="2.5",
    ),
    Alert(
        name="VerlCriticWorseThanConstant", severity="warning",
        expr=held("verl_critic_vf_explained_var", "<", "${critic/vf_explained_var:negative}") + " and "
        + mostly("verl_critic_vf_explained_var", "<", "${critic/vf_explained_var:negative_median}")
        + " and " + steps("window_mean", "verl_critic_vf_explained_var") + " <= "
        + steps("prior_mean", "verl_critic_vf_explained_var") + " and ${WARMED_CRITIC}",
        stay=mostly("verl_critic_vf_explained_var", "<", "${critic/vf_explained_var:negative_median}"), for_="0s",
        summary="The critic predicts returns worse than a constant.",
        description="Run ${RUN}: critic/vf_explained_var is ${NUMBER} after warm-up: the value function is worse "
        "than predicting the mean return.",
        meaning="Explained variance is like R^2: 1 is perfect, 0 is no better than a constant, below 0 is worse. "
        "Early in training -1 to 0.2 is normal; past warm-up it must be positive.",
        fix="Raise `critic.optim.lr` (e.g. 1e-5 -> 5e-5) or `critic.ppo_epochs` (1 -> 2); check the reward "
        "scale.",
        guide="2.4",
    ),
    Alert(
        name="VerlCriticLearningSlowly", severity="info",
        expr=held("verl_critic_vf_explained_var", "<", "${critic/vf_explained_var:learning}") + " and "
        + mostly("verl_critic_vf_explained_var", "<", "${critic/vf_explained_var:learning}") + " and "
        + steps("window_mean", "verl_critic_vf_explained_var") + " - "
        + steps("prior_mean", "verl_critic_vf_explained_var") + " < ${critic/vf_explained_var:learning_rise}"
        " and ${WARMED_CRITIC}",
        stay=mostly("verl_critic_vf_explained_var", "<", "${critic/vf_explained_var:learning}"), for_="0s",
        summary="The critic explains less than 30% of the returns' variance.",
        description="Run ${RUN}: critic/vf_explained_var has stayed below ${critic/vf_explained_var:learning} at "
                    "each of "
        "the last 3 steps and most of the last 10 (at most ${NUMBER}).",
        meaning="During training explained variance should reach 0.2-0.8 and above 0.7 when it converges; below "
        "0.3 for long the critic is not learning enough (guide 11.2, step 3).",
        fix="Raise `critic.optim.lr` (e.g. x5, 1e-5 -> 5e-5).",
        guide="2.4",
    ),
    Alert(
        name="VerlCriticLossNotDecreasing", severity="info",
        expr="${VF_LOSS_FLAT} and " + held("verl_critic_vf_loss", ">", "${RUN_MATCH} ${VF_LOSS_CONVERGED}")
        + " and ${WARMED_CRITIC}",
        stay="${VF_LOSS_FLAT} and " + mostly("verl_critic_vf_loss", ">", "${RUN_MATCH} ${VF_LOSS_CONVERGED}"),
        for_="0s",
        summary="The critic's loss has stopped decreasing while still high.",
        description="Run ${RUN}: critic/vf_loss averaged ${NUMBER} over the last 10 steps, not lower than the 10 "
        "steps before, and is above ${critic/vf_loss:converged}" + SCORE_UNITS_NOTE + " squared.",
        meaning="`critic/vf_loss` should fall from 10-100 to 0.1-10 and below 1 when converged. A loss that stays "
        "high and flat means the value network does not fit the returns." + SCORE_UNITS_MEANING,
        fix="Raise `critic.optim.lr` or `critic.ppo_epochs`; check that the reward scale is reasonable.",
        guide="2.1",
    ),
    Alert(
        name="VerlCriticValueClipping", severity="warning",
        expr=held("verl_critic_vf_clipfrac", ">", "${critic/vf_clipfrac:too_high}"),
        stay=mostly("verl_critic_vf_clipfrac", ">", "${critic/vf_clipfrac:too_high}"), for_="0s",
        summary="More than half of the value predictions are clipped.",
        description="Run ${RUN}: critic/vf_clipfrac is ${PERCENT}, above ${critic/vf_clipfrac:too_high}: the value "
        "function's updates are held back.",
        meaning="`critic/vf_clipfrac` is the share of value predictions clipped to the value clip range; 0-0.5 is "
        "normal, usually below 0.2. Above 0.5 the critic cannot follow the returns.",
        fix="Widen `critic.cliprange_value` or lower `critic.optim.lr`; check the reward scale.",
        guide="2.2",
    ),
    Alert(
        name="VerlCriticValueOffTarget", severity="warning",
        expr="abs(verl_critic_vpred_mean - verl_critic_returns_mean) > ${RUN_MATCH} ${VALUE_GAP_LIMIT}"
        " and ${VALUE_GAP} and ${WARMED_CRITIC}", stay="${VALUE_GAP}", for_="0s",
        summary="The critic's predicted values are far from the returns.",
        description="Run ${RUN}: critic/vpred_mean is ${NUMBER} away from critic/returns/mean (more than "
        "${critic/vpred_mean:max_gap_to_returns}" + SCORE_UNITS_NOTE + ").",
        meaning="The mean predicted value should approach the mean return as the critic learns (e.g. 2.34 vs "
        "2.45). A lasting gap means the critic has not learned the value scale." + SCORE_UNITS_MEANING,
        fix="Raise `critic.optim.lr` or `critic.ppo_epochs`; check reward normalisation.",
        guide="2.3",
    ),
), training=True)

REWARD = Group(name="verl-reward", file="verl-training.rules.yml", title="Rewards and advantages", alerts=(
    Alert(
        name="VerlAdvantageMeanOffCenter", severity="warning",
        expr=f"abs({steps('recent_min', 'verl_critic_advantages_mean')}) > ${{critic/advantages/mean:max_abs_mean}}"
        f" and abs({steps('recent_max', 'verl_critic_advantages_mean')}) > ${{critic/advantages/mean:max_abs_mean}}"
        " and (" + steps("recent_min", "verl_critic_advantages_mean") + " > 0 or "
        + steps("recent_max", "verl_critic_advantages_mean") + " < 0)",
        # It stays while the median of the last 10 steps is off center, or their mean half as far (steps at
        # exactly 0, where every group scored alike, do not end it).
        stay=f"abs({steps('window_median', 'verl_critic_advantages_mean')}) > ${{critic/advantages/mean:max_abs_mean}}"
        f" or abs({steps('window_mean', 'verl_critic_advantages_mean')}) > ${{hysteresis:half}}"
        " * ${critic/advantages/mean:max_abs_mean}",
        for_="0s",
        summary="The mean advantage is far from 0.",
        description="Run ${RUN}: critic/advantages/mean is off 0 by ${NUMBER} (more than "
        "${critic/advantages/mean:max_abs_mean}).",
        meaning="After normalisation advantages have mean about 0 and standard deviation 1. A mean far from 0 "
        "points at the reward scale, a broken normalisation or a critic that does not learn.",
        fix="Check the reward scale and advantage normalisation (`algorithm.norm_adv_by_std_in_grpo`, "
        "GAE settings) and the critic (`critic/vf_explained_var`).",
        guide="3.3",
    ),
    Alert(
        name="VerlAdvantageRangeExploding", severity="warning",
        expr=held("verl_critic_advantages_max", ">", "${critic/advantages/max:max_abs}") + " or -"
        + steps("recent_max", "verl_critic_advantages_min") + " > ${critic/advantages/min:max_abs}",
        stay=mostly("verl_critic_advantages_max", ">", "${critic/advantages/max:max_abs}") + " or -"
        + steps("window_median", "verl_critic_advantages_min") + " > ${critic/advantages/min:max_abs}", for_="0s",
        summary="Advantages have an exploding range.",
        description="Run ${RUN}: an advantage of magnitude ${NUMBER} (limit ${critic/advantages/max:max_abs}): the "
        "advantage range is exploding.",
        meaning="Normalised advantages stay within a few units (e.g. -2.3 to 2.4); values like 50 or -45 mean "
        "the rewards or the critic are out of scale.",
        fix="Check the reward scale (clip or normalise rewards), advantage normalisation and the critic.",
        guide="3.3",
    ),
    Alert(
        name="VerlNoLearningSignal", severity="warning",
        # A streak of steps whose every advantage is 0, long enough to be unlikely by chance for this run.
        expr="${NO_SIGNAL_STREAK} >= ${critic/advantages/max:no_signal_steps}"
        " and ${NO_SIGNAL_CHANCE} ^ ${NO_SIGNAL_STREAK} <= ${critic/advantages/max:no_signal_chance}",
        stay="${NO_SIGNAL_STREAK} >= 1 or "
        + mostly("verl_critic_advantages_max", "<", "${critic/advantages/max:no_signal}") + " and "
        + mostly("verl_critic_advantages_min", ">", "-${critic/advantages/min:no_signal}"), for_="0s",
        summary="Every advantage is 0: the run has no learning signal.",
        description="Run ${RUN}: every advantage has been 0 at each of the last {{ $value }} steps: no sample is "
        "better or worse than its group, so the policy gets no gradient, for longer than this run's own share of "
        "such steps makes likely by chance (under ${critic/advantages/max:no_signal_chance}).",
        meaning="With group-relative advantages (GRPO, RLOO and similar) every response of a prompt that scores the "
        "same as the others gets advantage 0. When all advantages are 0 step after step, every group is "
        "uniform: usually every response scores 0 (a reward function that never matches the answer "
        "format, responses cut at `data.max_response_length`), sometimes all score the maximum (data too "
        "easy). `pg_loss` and `grad_norm` sit at about 0 and the run learns nothing. With sparse rewards or "
        "small batches many steps carry no signal and the run still learns from the others, so a streak "
        "counts only once it is unlikely for this run: the chance p of such a step, its share of them before "
        "the streak weighed with a prior of ${critic/advantages/max:no_signal_prior_steps} steps at "
        "${critic/advantages/max:small_batch_share} (a batch under ${critic/advantages/max:small_batch} prompts) "
        "or ${critic/advantages/max:share_floor}, raised to the streak's length is under "
        "${critic/advantages/max:no_signal_chance}: 4 steps for a run that rarely has one, 10 at p = 0.4, "
        "24 at p = 0.7.",
        fix="Look at `critic/score/mean` and a few responses: check the reward function against the answer "
        "format and the data source, `response_length/clip_ratio` (raise `data.max_response_length`), and "
        "the prompt template; if every response is right, use harder data.",
        guide="3.3",
    ),
    Alert(
        name="VerlScoreNotImproving", severity="info",
        # The gain is under min_gain, and would be by flat_noise standard errors of the score's own noise more.
        expr="${SCORE_LONG_GAIN} < ${critic/score/mean:min_gain} and ${SCORE_LONG_GAIN_BOUND} < "
        "${critic/score/mean:min_gain} unless ${NEAR_BEST}",
        stay="(${SCORE_LONG_GAIN} < ${hysteresis:thrice} * ${critic/score/mean:min_gain}"
        " or ${SCORE_LONG_GAIN} < ${critic/score/mean:near_best_share} * ${SCORE_RANGE})"
        " unless ${NEAR_BEST_CLOSE}",
        for_="0s",
        summary="The mean score has not improved for 30 steps.",
        description="Run ${RUN}: critic/score/mean changed by ${NUMBER} over the last 30 steps against the 30 "
        "before (less than ${critic/score/mean:min_gain}, by more than ${critic/score/mean:flat_noise} standard "
        "errors of its own noise).",
        meaning="`critic/score/mean` is the mean raw reward (on math tasks, accuracy); it should rise during "
        "training. A flat score far from the run's best means it stopped learning; one within a tenth of "
        "the score's range of its best 10 steps in a row, in the upper half of that range, has converged, and is "
        "left out.",
        fix="If the score is still low, follow the guide's checklist: learning rate (`actor/grad_norm`), "
        "reward signal (`critic/rewards/mean`), critic (`critic/vf_explained_var`), batch size.",
        guide="3.1",
    ),
), training=True)

LENGTHS = Group(name="verl-lengths", file="verl-training.rules.yml", title="Sequence lengths", alerts=(
    Alert(
        name="VerlResponsesTruncated", severity="warning",
        expr=held("verl_response_length_clip_ratio", ">", "${response_length/clip_ratio:too_high}"),
        stay=mostly("verl_response_length_clip_ratio", ">", "${response_length/clip_ratio:too_high}"), for_="0s",
        summary="More than half of the responses hit max_response_length.",
        description="Run ${RUN}: ${PERCENT} of responses are truncated at max_response_length ${MAX_RESPONSE} (limit "
        "${response_length/clip_ratio:too_high}).",
        meaning="`response_length/clip_ratio` is the share of responses cut at the maximum length. Below 0.1 is "
        "ideal, 0.1-0.3 acceptable; above 0.5 most answers are cut off and their rewards are wrong.",
        fix="Raise `data.max_response_length` (e.g. double it, 256 -> 512).",
        guide="4.2",
    ),
    Alert(
        name="VerlResponsesOftenTruncated", severity="info",
        expr=held("verl_response_length_clip_ratio", ">", "${response_length/clip_ratio:elevated}") + " and "
        + mostly("verl_response_length_clip_ratio", ">", "${response_length/clip_ratio:elevated}"),
        stay=mostly("verl_response_length_clip_ratio", ">", "${response_length/clip_ratio:elevated}"), for_="0s",
        summary="More than 10% of the responses hit max_response_length.",
        description="Run ${RUN}: ${PERCENT} of responses have been truncated at max_response_length "
        "${MAX_RESPONSE} at each of the last 3 steps and most of the last 10 "
        "(ideal below ${response_length/clip_ratio:elevated}).",
        meaning="Most responses should end on their own; above 10% truncation for long, answers are being cut.",
        fix="Consider a larger `data.max_response_length`.",
        guide="4.2",
    ),
    Alert(
        name="VerlPromptsTruncated", severity="warning",
        expr=held("verl_prompt_length_clip_ratio", ">", "${prompt_length/clip_ratio:too_high}"),
        stay=mostly("verl_prompt_length_clip_ratio", ">", "${prompt_length/clip_ratio:too_high}"), for_="0s",
        summary="More than 10% of the prompts hit max_prompt_length.",
        description="Run ${RUN}: ${PERCENT} of prompts are truncated at max_prompt_length ${MAX_PROMPT} (limit "
        "${prompt_length/clip_ratio:too_high}).",
        meaning="`prompt_length/clip_ratio` is the share of prompts cut at the maximum prompt length; below 0.05 "
        "the data is prepared well, above 0.1 prompts lose content.",
        fix="Raise `data.max_prompt_length`, or filter over-long prompts (`data.filter_overlong_prompts`).",
        guide="4.4",
    ),
), training=True)

DIAGNOSES = Group(name="verl-diagnoses", file="verl-training.rules.yml", title="The guide's diagnoses", alerts=(
    Alert(
        name="VerlLearningRateTooHigh", severity="warning",
        expr=held("verl_actor_pg_clipfrac", ">", "${actor/pg_clipfrac:lr_too_high}") + " and "
        + held("verl_actor_ppo_kl", ">", "${actor/ppo_kl:too_large}") + " and ${GRAD_PINNED}",
        stay=mostly("verl_actor_pg_clipfrac", ">", "${actor/pg_clipfrac:lr_too_high}") + " and "
        + mostly("verl_actor_ppo_kl", ">", "${actor/ppo_kl:too_large}") + " and ${GRAD_MOSTLY_PINNED}", for_="0s",
        summary="The learning rate is too high: heavy clipping, large KL and clipped gradients together.",
        description="Run ${RUN}: actor/pg_clipfrac is ${PERCENT} with actor/ppo_kl above ${actor/ppo_kl:too_large} and "
        "actor/grad_norm pinned at the run's grad_clip: the learning rate is too high.",
        meaning="The guide's worked example 2: `actor/pg_clipfrac` 0.85, `actor/ppo_kl` 0.125 and `actor/grad_norm` "
        "at the clip value 1.0 while the score does not rise. Each update overshoots, PPO clips most "
        "samples and every gradient is clipped.",
        fix="${HALVE_LR}.",
        guide="11.4",
    ),
    Alert(
        name="VerlPrematureConvergence", severity="warning",
        expr=held("verl_actor_entropy", "<", "${actor/entropy:collapsed}") + " and "
        + held("verl_actor_ppo_kl", "<", "${actor/ppo_kl:frozen}") + " and "
        + held("verl_actor_ppo_kl", ">", "-${actor/ppo_kl:frozen}")
        + " and ${SCORE_GAIN} < ${critic/score/mean:min_gain} and ${SCORE_LOW}",
        stay=mostly("verl_actor_entropy", "<", "${actor/entropy:collapsed}") + " and ${SCORE_LOW}", for_="0s",
        summary="The policy converged prematurely: entropy near 0, KL near 0, score flat and low.",
        description="Run ${RUN}: actor/entropy is ${NUMBER} with actor/ppo_kl near 0 and a flat "
        "critic/score/mean in the "
        "lower half of its range: the policy has converged prematurely.",
        meaning="The guide's problem 2: entropy drops quickly to near 0, the score stops rising and `ppo_kl` is "
        "about 0. The policy is stuck in a local optimum because it stopped exploring. \"Premature\" is "
        "told from a finished convergence by the score: it is in the lower half of the range the batches' "
        "scores spanned over the run (`critic/score/min` to `/max`). Healthy math runs converge with "
        "entropy 0.02-0.05 and a KL that prints as 0, but near the top of that range.",
        fix="Raise `actor_rollout_ref.actor.entropy_coeff` (e.g. 0.001 -> 0.01) or "
        "`actor_rollout_ref.rollout.temperature` (e.g. 1.0 -> 1.2), then restart from an earlier checkpoint.",
        guide="11.2",
    ),
    Alert(
        name="VerlCriticNotLearning", severity="warning",
        expr=held("verl_critic_vf_explained_var", "<", "${critic/vf_explained_var:negative}") + " and "
        + held("verl_critic_vf_loss", ">", "${RUN_MATCH} ${VF_LOSS_HIGH}")
        + " and abs(verl_critic_vpred_mean - verl_critic_returns_mean) > ${RUN_MATCH} ${VALUE_GAP_LIMIT}"
        " and ${WARMED_CRITIC}",
        stay=mostly("verl_critic_vf_explained_var", "<", "${critic/vf_explained_var:negative}") + " and "
        + mostly("verl_critic_vf_loss", ">", "${RUN_MATCH} ${VF_LOSS_HIGH}"), for_="0s",
        summary="The critic is not learning: negative explained variance, high loss, values far from returns.",
        description="Run ${RUN}: critic/vf_explained_var is ${NUMBER} with critic/vf_loss above ${critic/vf_loss:high}"
        + SCORE_UNITS_NOTE + " squared, and critic/vpred_mean far from critic/returns/mean: the critic is not "
        "learning.",
        meaning="The guide's worked example 3: after 50 steps `vf_explained_var` -0.234, `vf_loss` 45.23 and "
        "`vpred_mean` 0.123 against `returns/mean` 5.678. The advantages built on such a critic are noise."
        + SCORE_UNITS_MEANING,
        fix="Raise `critic.optim.lr` (e.g. 1e-5 -> 5e-5) or `critic.ppo_epochs` (1 -> 2).",
        guide="11.4",
    ),
), training=True)

GROUPS = (ACTOR, CRITIC, REWARD, LENGTHS, DIAGNOSES)
