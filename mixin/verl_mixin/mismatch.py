"""Training-inference mismatch: the rollout engine (vLLM, SGLang) and the trainer (FSDP, Megatron)
disagree on the policy's probabilities, or asynchronous training trains on stale rollouts.

verl logs the mismatch when ``actor_rollout_ref.rollout.calculate_log_probs=True`` (0.5 and
later): ``training/rollout_probs_diff_*`` and ``training/rollout_actor_probs_pearson_corr``, and,
with rollout correction configured (``algorithm.rollout_correction``), ``rollout_corr/*`` (also
logged by the actor as ``actor/rollout_corr/*`` in bypass mode). Fully asynchronous training logs
``training/off_policy/*``. Thresholds follow verl's documentation:

- docs/algo/rollout_corr.md (Rollout Correction): |KL| above 0.1 is a significant off-policy gap,
  ``chi2_token`` above 1 a severe distribution shift, a mean IS weight outside 0.5-2 or an effective
  sample size below 0.3 (IS weight std above 1) need attention; its Troubleshooting section gives the
  fixes quoted below. The perplexity ratio's bound is the same KL bound: log(ppl_ratio) is the mean
  log-probability gap per token.
- docs/ascend_tutorial/en/dev_guide/model_dev/transfer_to_npu_guide.md (Precision Alignment): keep
  ``training/rollout_probs_diff_mean`` within 0.01.
- the V1 async trainer's documentation: ``trainer.v1.sampler.max_off_policy_threshold`` (default 8
  model versions) bounds a trajectory's staleness before it is dropped or waited for.
"""

from __future__ import annotations

from verl_exporter.store.catalog import default_catalog

from .model import RUN_MATCH, Alert, Group, held, mostly, steps_of_any, sub
from .settings import STALENESS_BOUND, STALENESS_KEY

_CATALOG = default_catalog()
# The thresholds are the catalog's (healthy ranges from the guides above), read once here so the
# alerts' texts can name them; the staleness bound is the run's own setting (settings.STALENESS_BOUND).
THRESHOLDS = {
    "probs_diff_mean": _CATALOG.spec("training/rollout_probs_diff_mean").thresholds["too_high"],
    "probs_diff_max": _CATALOG.spec("training/rollout_probs_diff_max").thresholds["too_high"],
    "pearson_min": _CATALOG.spec("training/rollout_actor_probs_pearson_corr").thresholds["too_low"],
    "kl": _CATALOG.spec("rollout_corr/kl").healthy["max"],
    "chi2": _CATALOG.spec("rollout_corr/chi2_token").healthy["max"],
    "is_mean_min": _CATALOG.spec("rollout_corr/rollout_is_mean").healthy["min"],
    "is_mean_max": _CATALOG.spec("rollout_corr/rollout_is_mean").healthy["max"],
    "ess_min": _CATALOG.spec("rollout_corr/rollout_is_eff_sample_size").healthy["min"],
    "is_std_max": _CATALOG.spec("rollout_corr/rollout_is_std").healthy["max"],
}
EXTRA = {"mismatch": THRESHOLDS}
STALE = f"{RUN_MATCH} {STALENESS_BOUND}"  # the run's own staleness bound
CORR = "verl_(actor_)?rollout_corr_"  # ray_trainer logs rollout_corr/*, the bypass-mode actor actor/rollout_corr/*
DOC = "verl's docs/algo/rollout_corr.md"
DOC_LINK = "[verl's Rollout Correction guide](https://github.com/verl-project/verl/blob/main/docs/algo/rollout_corr.md)"
PRECISION_LINK = ("[verl's NPU migration guide, Precision Alignment](https://github.com/verl-project/verl/blob/main/"
                  "docs/ascend_tutorial/en/dev_guide/model_dev/transfer_to_npu_guide.md)")
ENABLE = "`actor_rollout_ref.rollout.calculate_log_probs=True`"


def corr(name: str, stat: str) -> str:
    """Step statistic ``stat`` of rollout_corr/``name``, under either spelling."""
    return steps_of_any(stat, CORR + name, (f"verl_rollout_corr_{name}", f"verl_actor_rollout_corr_{name}"),
                        name=f"verl_rollout_corr_{name}")


def corr_held(name: str, op: str, threshold: str) -> str:
    return f"{corr(name, 'recent_min' if op == '>' else 'recent_max')} {op} {threshold}"


def corr_mostly(name: str, op: str, threshold: str) -> str:
    return f"{corr(name, 'window_median')} {op} {threshold}"


MISMATCH = Group(name="verl-mismatch", file="verl-training.rules.yml",
                 title="Training-inference mismatch and off-policy data", alerts=(
    Alert(
        name="VerlRolloutProbsDiffHigh", severity="warning",
        expr=held("verl_training_rollout_probs_diff_mean", ">", "${mismatch:probs_diff_mean}"),
        stay=mostly("verl_training_rollout_probs_diff_mean", ">", "${mismatch:probs_diff_mean}"), for_="0s",
        summary="The rollout engine and the trainer disagree on token probabilities.",
        description="Run ${RUN}: training/rollout_probs_diff_mean is ${NUMBER}, above ${mismatch:probs_diff_mean}.",
        meaning="`training/rollout_probs_diff_mean` is the mean absolute difference between the probability the "
        "rollout engine gave each sampled token and the one the trainer recomputes. "
        "${PRECISION_LINK} says to keep it within 0.01: consistently above, the engines differ "
        "(precision, kernels, a missing scaling, "
        "different hyperparameters such as an `eps`) and the policy gradient is biased; this mismatch is a "
        "known cause of RL collapse.",
        fix="Compare rollout and trainer precision and versions (dtype, vLLM/SGLang kernels, MoE routing: use "
        "routing replay for MoE models); enable rollout correction "
        "(`algorithm.rollout_correction`, see ${DOC}), e.g. the `bypass_ppo_clip` preset."),
    Alert(
        name="VerlRolloutProbsDiffMaxHigh", severity="info",
        expr=held("verl_training_rollout_probs_diff_max", ">", "${mismatch:probs_diff_max}") + " and "
        + mostly("verl_training_rollout_probs_diff_max", ">", "${mismatch:probs_diff_max}"),
        stay=mostly("verl_training_rollout_probs_diff_max", ">", "${mismatch:probs_diff_max}"), for_="0s",
        summary="Some tokens get very different probabilities in rollout and training.",
        description="Run ${RUN}: training/rollout_probs_diff_max is ${NUMBER}, above ${mismatch:probs_diff_max}, at "
        "each of the last 3 steps and most of the last 10.",
        meaning="The largest per-token probability difference stays near 1: some tokens are near-certain in one "
        "engine and unlikely in the other (${PRECISION_LINK} names this extreme case). A few such "
        "tokens can dominate the importance ratios.",
        fix="Enable rejection sampling of outliers (`algorithm.rollout_correction.rollout_rs`, see ${DOC}); "
        "check the tokenizer and chat template are the same for rollout and training."),
    Alert(
        name="VerlRolloutActorProbsUncorrelated", severity="warning",
        expr=held("verl_training_rollout_actor_probs_pearson_corr", "<", "${mismatch:pearson_min}"),
        stay=mostly("verl_training_rollout_actor_probs_pearson_corr", "<", "${mismatch:pearson_min}"), for_="0s",
        summary="Rollout and trainer log-probabilities are poorly correlated.",
        description="Run ${RUN}: training/rollout_actor_probs_pearson_corr is ${NUMBER}, "
        "below ${mismatch:pearson_min}.",
        meaning="The Pearson correlation between the rollout engine's and the trainer's log-probabilities of the "
        "sampled tokens is about 0.999 in healthy runs. Well below, the tokens that reach training are not "
        "the ones the policy sampled (misaligned token ids, a different template) or the engines differ.",
        fix="Check that rollout log-probs are passed with their tokens (${ENABLE}); compare the rollout and "
        "training tokenization; then the precision of both engines."),
    Alert(
        name="VerlRolloutOffPolicyGap", severity="warning",
        # Each of the last 3 steps beyond, either side; the value is the KL's size.
        expr=" or ".join((corr_held("kl", ">", "${mismatch:kl}"), "-" + corr("kl", "recent_max") + " > ${mismatch:kl}",
                          corr_held("k3_kl", ">", "${mismatch:kl}"),
                          "ln(" + corr("ppl_ratio", "recent_min") + ") > ${mismatch:kl}",
                          "-ln(" + corr("ppl_ratio", "recent_max") + ") > ${mismatch:kl}")),
        stay=sub("abs(${kl}) > ${mismatch:kl} or ${k3_kl} > ${mismatch:kl} or abs(ln(${ppl_ratio})) > ${mismatch:kl}",
                 kl=corr("kl", "window_median"), k3_kl=corr("k3_kl", "window_median"),
                 ppl_ratio=corr("ppl_ratio", "window_median")), for_="0s",
        summary="The rollout policy and the training policy have drifted apart (rollout KL too large).",
        description="Run ${RUN}: the KL between rollout and training policy (rollout_corr/kl, k3_kl or the log of "
        "ppl_ratio) is ${NUMBER}, beyond ${mismatch:kl}.",
        meaning="${DOC_LINK} calls a KL between the rollout policy and the training policy above 0.1 a significant "
        "off-policy gap. `k3_kl` estimates the same KL more stably; `ppl_ratio` is exp of the mean log "
        "probability gap, so its log is held to the same bound.",
        fix="Follow the Rollout Correction guide: start with bypass mode and rejection sampling "
        "(`algorithm.rollout_correction.rollout_rs`), then IS weights (`rollout_is: sequence`); verify the "
        "rollout and training engines are not too different (precision, versions, stale weights)."),
    Alert(
        name="VerlRolloutChiSquaredHigh", severity="warning",
        expr=corr_held("chi2_token", ">", "${mismatch:chi2}"),
        stay=corr_mostly("chi2_token", ">", "${mismatch:chi2}"), for_="0s",
        summary="The rollout and training distributions have shifted severely (chi-squared).",
        description="Run ${RUN}: rollout_corr/chi2_token is ${NUMBER}, above ${mismatch:chi2}.",
        meaning="`chi2_token` is the second moment of the token IS weights minus 1; ${DOC_LINK} reads above 1.0 as a "
        "severe distribution shift: the IS-weighted gradient has a very high variance.",
        fix="Tighten `algorithm.rollout_correction.rollout_is_threshold`, switch from sequence to geometric "
        "rejection sampling, and check why rollout and training differ."),
    Alert(
        name="VerlRolloutIsWeightsOffCenter", severity="warning",
        expr=corr_held("rollout_is_mean", "<", "${mismatch:is_mean_min}") + " or "
        + corr_held("rollout_is_mean", ">", "${mismatch:is_mean_max}"),
        stay=corr_mostly("rollout_is_mean", "<", "${mismatch:is_mean_min}") + " or "
        + corr_mostly("rollout_is_mean", ">", "${mismatch:is_mean_max}"), for_="0s",
        summary="The mean importance-sampling weight is far from 1.",
        description="Run ${RUN}: rollout_corr/rollout_is_mean is ${NUMBER}, outside ${mismatch:is_mean_min}-"
        "${mismatch:is_mean_max}.",
        meaning="A mean IS weight close to 1 means little off-policy gap; ${DOC_LINK} flags below 0.5 or "
        "above 2.0 as a "
        "significant, systematic distribution shift, most often a setup error.",
        fix="As the guide's troubleshooting says: verify ${ENABLE}, check that the rollout log-probs are passed "
        "correctly, then look for a systematic shift between the engines."),
    Alert(
        name="VerlRolloutIsWeightsConcentrated", severity="warning",
        expr=corr_held("rollout_is_eff_sample_size", "<", "${mismatch:ess_min}") + " or "
        + corr_held("rollout_is_std", ">", "${mismatch:is_std_max}"),
        stay=corr_mostly("rollout_is_eff_sample_size", "<", "${mismatch:ess_min}") + " or "
        + corr_mostly("rollout_is_std", ">", "${mismatch:is_std_max}"), for_="0s",
        summary="Importance-sampling weights concentrate on few samples.",
        description="Run ${RUN}: the IS weights' effective sample size (fraction of the batch) or std is "
        "${NUMBER}: below "
        "${mismatch:ess_min} or above ${mismatch:is_std_max}.",
        meaning="${DOC_LINK}: an effective sample size below 0.3 of the batch or an IS weight std above 1.0 "
        "means a few "
        "samples carry most of the gradient (high spread in IS weights).",
        fix="Switch `algorithm.rollout_correction` from `sequence` to `geometric` level, tighten the thresholds, "
        "and verify rollout and training are not too different."),
    Alert(
        name="VerlRolloutTrajectoriesStale", severity="warning",
        expr=held("verl_training_off_policy_trajectory_staleness_worst_max", ">=", STALE),
        stay=mostly("verl_training_off_policy_trajectory_staleness_worst_max", ">=", STALE),
        for_="0s",
        summary="Asynchronous training trains on very stale trajectories.",
        description="Run ${RUN}: the stalest trajectory was generated ${NUMBER} model versions before the one trained.",
        meaning="`training/off_policy/trajectory_staleness_worst/*` is the gap between the oldest model version "
        "used by a trajectory and the version being trained. At the run's own "
        "`trainer.v1.sampler.max_off_policy_threshold` (verl's default ${setting:" + STALENESS_KEY + "} "
        "where the run's config is unknown; no bound, and no alert, where it is null) trajectories are "
        "dropped or waited for; staleness this large makes the data off-policy enough to need correction.",
        fix="Lower `trainer.v1.sampler.max_off_policy_threshold` or sync parameters more often "
        "(`parameter_sync_step`); enable rollout correction; give rollout more resources if the trainer "
        "outpaces it."),
), training=True)

GROUPS = (MISMATCH,)
