"""Where a rule differs from the metrics guide, and why: what replaying it over real training runs
measured (docs/precision.md has the per-run figures). The runbook prints each under its alert."""

from __future__ import annotations

_REAL = "the healthy real runs of docs/precision.md"

DEPARTURES = {
    "VerlPolicyUpdateConservative":
        "The guide calls `pg_clipfrac` below 0.05 conservative. Every healthy real run clips less: medians "
        "0.001-0.004, at most 0.009, over whole runs (" + _REAL + "). The rule waits for below "
        "${actor/pg_clipfrac:conservative}, and leaves out an hour printed as 0.000 (verl before 0.5 prints 3 "
        "decimals).",
    "VerlPolicyFrozen":
        "Same KL bound as the guide, but an hour of `ppo_kl` printed as 0.000 at every step (verl before 0.5; "
        "the healthy 0.1-0.4 releases print 1-11 distinct KL values over a whole run) says nothing and is "
        "left out.",
    "VerlEntropyCollapsing":
        "The guide's drop to near 0 alone fired on 3 healthy runs: math runs fall from 0.36 to 0.09 within "
        "20 minutes while their score climbs from 0.27 to 0.80, and end at 0.02-0.08. The rule also wants "
        "the guide's other half of the signature, a score that stopped rising (30 minutes against the 30 "
        "before).",
    "VerlEntropyFlat":
        "Left out for a run that converged near its best score: the healthy math runs end at a score of "
        "0.95-0.99 with entropy that no longer moves, by design. Also left out: entropy whose spread from "
        "step to step is over ${actor/entropy:flat_spread_ratio} of its mean; verl-agent's converged GiGPO "
        "run swings between 0.07 and 0.31 around a level that no longer moves.",
    "VerlKlLossHigh":
        "The guide's range ends at 0.1. verl-agent's healthy GRPO and GiGPO runs (ALFWorld, WebShop, "
        "kl_loss_coef 0.01) climb to 0.26-0.39 while their validation success rises from 0.2 to 0.9; the "
        "rule waits for ${actor/kl_loss:too_large}.",
    "VerlScoreNotImproving":
        "Left out for a run that converged near its best (the last hour within a tenth of the score's range "
        "of its best step, in the upper half of that range): it fired on 6 of 10 healthy real runs, all "
        "converged.",
    "VerlPrematureConvergence":
        "The guide's entropy near 0, KL near 0 and flat score describe every converged healthy math run "
        "(entropy 0.02, KL printed as 0.000, score 0.95-0.98). \"Premature\" is told by the score: the "
        "rule wants it in the lower half of the range the batches scored over 6 hours.",
    "VerlAdvantageRangeExploding":
        "The guide's example calls 50 or -45 out of scale. Healthy PPO runs with whitened GAE reach |45| "
        "(2-node Qwen2.5-7B) and 37 (Qwen2.5-0.5B); GRPO's are bounded by sqrt(n). The limit is "
        "${critic/advantages/max:max_abs}.",
    "VerlStepSlow":
        "The guide's 120 s fired on 4 of 10 healthy runs: their median steps take 11-346 s (agent runs "
        "600-1,100 s). The rule compares the run with its own earlier steps (twice as slow).",
    "VerlActorMfuLow":
        "The guide's bands (below 0.2 poor) fired on 3 healthy runs: healthy real runs have MFU medians of "
        "0.07 to 0.79 (AMD GPUs, RL steps with short sequences, releases that count FLOPs differently). The "
        "rule compares the run with its own (half of its 90th percentile).",
    "VerlGenerationBottleneck":
        "Generation is more than half of the step in most healthy RL runs (medians 0.21-0.59 of the step): "
        "the rule speaks only when the steps also became twice as slow, the guide's symptom of problem 4.",
    "VerlActorUpdateBottleneck":
        "Healthy 7B runs on FSDP and Megatron spend 0.44-0.52 of a step updating the actor (medians): the "
        "rule speaks only when the steps also became twice as slow, the guide's symptom of problem 4.",
    "VerlActorGradNormSpike":
        "Healthy runs have one-step spikes far above their normal (151 times the median gradient norm in "
        "the AMD GRPO baseline, 69 in its PPO twin) that recover at the next step. The rule compares the "
        "median of 10 minutes, so only a spike that lasts fires.",
    "VerlPolicyKlSpike":
        "verl before 0.5 prints `ppo_kl` with 3 decimals: 0.000, 0.001, 0.002 looked like spikes of 10 "
        "standard deviations. The spread has a floor of 0.001, and the median of 10 minutes is compared.",
    "VerlActorPgLossSpike":
        "Healthy runs move `pg_loss` from about 0 to -0.05 for hours while they learn (PPO Qwen2.5-0.5B): "
        "the spread has a floor of 0.05, above the guide's healthy ±0.01, and the median of 10 minutes is "
        "compared.",
    "VerlTrainingStalled":
        "A checkpoint save is no stall: the verl team's GRPO baseline saves for 40 minutes every 20 steps "
        "(`timing_s/step` 2,500 s against 150 s), which paged. The rule waits while a save runs, for up to "
        "${system:checkpoint_save_ceiling_seconds} s. Nor is a validation: agent runs validate for 10-20 "
        "of their steps every 8 or 50 steps, which paged at 5 and 40 minutes a step; the step the run "
        "validates next gets the larger of ${timing_s/step:validation_ratio} times its longest validation "
        "and ${timing_s/step:validation_steps} of its steps.",
    "VerlEntropyRising":
        "The guide says entropy should fall slowly; a real run without a KL anchor rose from 0.24 to 0.78 "
        "over 6 hours with steps of 4-10 minutes, which an hour-against-hour z-score never saw. The rule "
        "compares each of the last 3 steps, or the median of the last 10, with the run's first 10 steps, "
        "and wants the rise over ${actor/entropy:rise_noise} times their spread: sparse-reward agent runs "
        "swing from 0.17 to 1.25 around a flat level.",
    "VerlNoLearningSignal":
        "The guide's advantages near 0 fired on sparse-reward agent runs, where 70-80% of steps have every "
        "advantage 0 and the run still learns from the rest. A streak of such steps counts once it is as "
        "unlikely as ${critic/advantages/max:no_signal_chance} for the run's own share of them.",
    "VerlResponseLengthCollapsed":
        "Real collapses (1,759 to 1 token in 12 steps, 970 to 9 tokens) have steps of 3-7 minutes before "
        "they collapse: too few for an hour's z-score. The rule compares 15-minute medians with the 6 hours "
        "before.",
}
