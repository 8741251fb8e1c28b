"""The simulated verl run's values: PPO or GRPO metrics, step by step, for each scenario.

Each scenario moves the values the way the examples of metrics-guide.md do. Everything here is a
pure function of (scenario, step, seed); ``simulate`` formats and writes the lines.
"""

from __future__ import annotations

import math
import random
from typing import Iterator

SCENARIOS: dict[str, str] = {
    "healthy": "PPO with a critic: score rises 0.15 -> 0.8, pg_clipfrac 0.1-0.2, ppo_kl 0.002-0.006, the critic "
               "converges",
    "healthy-grpo": "on-policy GRPO (ppo_epochs 1, one mini-batch per batch): pg_clipfrac ~0.0008, ppo_kl ~-8e-06, "
                    "no critic; score rises 0.15 -> 0.8",
    "lr-too-high": "pg_clipfrac ~0.8, ppo_kl ~0.1, actor/grad_norm pinned at the clip value 1.0, score flat",
    "critic-underfit": "vf_explained_var stays negative (-0.8), vf_loss stuck near 45, vpred_mean far below returns",
    "entropy-collapse": "entropy 0.6 -> 0.05 within ~10 steps, ppo_kl -> 0.0001, score stops improving",
    "truncation": "85% of responses hit max_response_length (response_length/clip_ratio ~0.85)",
    "stall": "healthy, then the job hangs: no step is written after stall_after steps",
    "nan": "healthy, then actor/pg_loss and actor/grad_norm are NaN (critic/vf_loss inf) from nan_after",
    "grad-spike": "healthy, but at steps 100-111 grad_norm x8, ppo_kl x10, vf_loss x20 and pg_loss +0.4: a spike "
                  "that does not recover (one-step spikes that recover raise nothing)",
    "rollout-mismatch": "healthy with mismatch metrics logged; from step 60 rollout and trainer drift apart "
                        "(probs diff 0.003 -> 0.03, pearson 0.999 -> 0.85, rollout KL 0.002 -> 0.15)",
}
SPIKE_STEPS = range(100, 112)  # the grad-spike scenario's abnormal steps: a spike that does not recover
MISMATCH_FROM = 60  # the rollout-mismatch scenario's engines drift apart over the 10 steps from here
ALGORITHMS = ("ppo", "grpo")
# Scenarios that are one algorithm whatever the caller asks.
SCENARIO_ALGORITHMS = {"healthy-grpo": "grpo"}
VAL_KEYS = ("val-core/openai/gsm8k/reward/mean@1", "val-core/openai/gsm8k/acc/mean@1",
            "val-aux/openai/gsm8k/reward/std@1")

N_GPUS = 8
SAMPLES = 256  # responses per step (PPO: 256 prompts; GRPO: 64 prompts x rollout.n 4)
STEPS_PER_EPOCH = 29  # GSM8K train split (7473 prompts) / 256
GRAD_CLIP = 1.0
TARGET_THROUGHPUT = 145.0  # tokens/s/GPU
# Share of a step spent in each phase; the rest is overhead (reward, old log-probs, bookkeeping).
PHASES = {
    "ppo": {"gen": 0.40, "ref": 0.07, "values": 0.08, "adv": 0.002, "update_critic": 0.18, "update_actor": 0.24},
    "grpo": {"gen": 0.46, "ref": 0.14, "adv": 0.003, "update_actor": 0.37},
}


def _targets(scenario: str, t: int) -> dict[str, float]:
    """Noise-free headline values of a scenario at step t (1-based)."""
    def decay(tau: float) -> float:
        return math.exp(-t / tau)

    v = {
        "score": 0.15 + 0.65 * (1 - decay(40)),
        "pg_clipfrac": 0.15 + 0.03 * math.sin(t / 7),
        "ppo_kl": 0.004 + 0.0012 * math.sin(t / 5),
        "pg_loss": -0.005 * decay(40),
        "entropy": 0.38 + 0.42 * decay(90),
        "grad_norm": 0.55 + 0.2 * math.sin(t / 3),  # well under the clip value 1.0: never looks pinned
        "grad_norm_pinned": 0.0,
        "vf_loss": 0.6 + 14.4 * decay(25),
        "explained_var": 0.87 - 1.07 * decay(35),
        "returns": math.nan,  # NaN: returns follow the rewards
        "vpred_gap": -2.05 * decay(20),  # vpred_mean - returns/mean
        "response_mean": 180 + 15 * (1 - decay(60)),
        "response_clip": 0.01,
        "max_response": 512.0,
    }
    if scenario == "lr-too-high":
        v.update(pg_clipfrac=0.8 + 0.04 * math.sin(t / 2), ppo_kl=0.1 + 0.02 * math.sin(t / 3),
                 pg_loss=0.5 + 0.03 * math.sin(t / 4), grad_norm=GRAD_CLIP, grad_norm_pinned=1.0, score=0.003)
    elif scenario == "critic-underfit":
        v.update(vf_loss=45.0, explained_var=-0.8, returns=5.7, vpred_gap=-5.6,
                 score=0.15 + 0.15 * (1 - decay(60)))
    elif scenario == "entropy-collapse":
        early = math.exp(-(t - 1) / 2.7)  # 1 at the first step
        v.update(entropy=0.03 + 0.57 * early, ppo_kl=0.0001 + 0.004 * early, pg_clipfrac=0.01 + 0.14 * early,
                 score=0.15 + 0.02 * (1 - early))  # the guide's signature: the score stops rising
    elif scenario == "truncation":
        v.update(response_mean=253.8, response_clip=0.85, max_response=256.0)
    elif scenario == "healthy-grpo":  # one update per rollout: the ratio is 1, nothing is clipped
        v.update(pg_clipfrac=0.0008 + 0.0002 * math.sin(t / 7), ppo_kl=-8e-06 + 2e-06 * math.sin(t / 5))
    return v


def algorithm_of(scenario: str, algorithm: str = "ppo") -> str:
    """The algorithm a scenario runs: its own where it has one, else ``algorithm``."""
    return SCENARIO_ALGORITHMS.get(scenario, algorithm)


def run_config(scenario: str, *, algorithm: str = "ppo", project: str = "simulated", experiment: str = "run",
               total_steps: int | None = None, val_every: int = 10) -> dict:
    """The part of verl's resolved config (``trainer.*``, ``data.*``, ...) the simulated run uses.

    PPO runs update the policy four times per rollout (mini-batch 64 of a 256-prompt batch); GRPO
    runs are on-policy (one mini-batch per 64-prompt batch, ``rollout.n`` 4). ``total_steps`` is
    the user's ``trainer.total_training_steps`` (None: verl computes it from the epochs).
    """
    check(scenario, algorithm)
    ppo = algorithm_of(scenario, algorithm) == "ppo"
    prompts = SAMPLES if ppo else SAMPLES // 4
    max_response = int(_targets(scenario, 1)["max_response"])
    return {
        "actor_rollout_ref": {
            "actor": {"clip_ratio": 0.2, "clip_ratio_c": 3.0, "clip_ratio_high": 0.2, "clip_ratio_low": 0.2,
                      "entropy_coeff": 0, "grad_clip": GRAD_CLIP, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl",
                      "optim": {"lr": 1e-06, "lr_warmup_steps_ratio": 0.0, "weight_decay": 0.01},
                      "ppo_epochs": 1, "ppo_micro_batch_size_per_gpu": 8,
                      "ppo_mini_batch_size": 64 if ppo else prompts, "strategy": "fsdp",
                      "use_kl_loss": not ppo},
            "model": {"enable_gradient_checkpointing": True, "path": "Qwen/Qwen2.5-0.5B-Instruct"},
            "rollout": {"gpu_memory_utilization": 0.6, "n": 1 if ppo else SAMPLES // prompts, "name": "vllm",
                        "prompt_length": 512, "response_length": max_response, "temperature": 1.0,
                        "tensor_model_parallel_size": 1},
        },
        "algorithm": {"adv_estimator": "gae" if ppo else "grpo", "gamma": 1.0, "lam": 1.0,
                      "use_kl_in_reward": ppo},
        "critic": {"grad_clip": 1.0, "optim": {"lr": 1e-05}, "ppo_epochs": 1, "strategy": "fsdp"},
        "data": {"max_prompt_length": 512, "max_response_length": max_response, "train_batch_size": prompts,
                 "train_files": "~/data/gsm8k/train.parquet", "val_files": "~/data/gsm8k/test.parquet"},
        "trainer": {"critic_warmup": 0, "experiment_name": experiment, "logger": ["console", "file"],
                    "n_gpus_per_node": N_GPUS, "nnodes": 1, "project_name": project, "save_freq": -1,
                    "test_freq": val_every if val_every > 0 else -1, "total_epochs": 15,
                    "total_training_steps": total_steps, "val_before_train": False},
    }


def check(scenario: str, algorithm: str = "ppo") -> None:
    """ValueError naming the choices for an unknown scenario or algorithm."""
    for what, value, known in (("scenario", scenario, SCENARIOS), ("algorithm", algorithm, ALGORITHMS)):
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}; one of {', '.join(known)}")


def step_values(scenario: str, step: int, *, seed: int = 0, algorithm: str = "ppo",
                nan_after: int = 15) -> dict[str, float]:
    """The training metrics verl logs at ``step`` of a scenario, keyed by verl key."""
    check(scenario, algorithm)
    algorithm = algorithm_of(scenario, algorithm)
    rng = random.Random(f"{seed}/{scenario}/{algorithm}/{step}")
    ppo = algorithm == "ppo"
    tg = _targets(scenario, step)

    def jit(x: float, rel: float) -> float:
        return x * (1 + rng.uniform(-rel, rel))

    def clamp(x: float, lo: float, hi: float) -> float:
        return min(hi, max(lo, x))

    m: dict[str, float] = {}
    # Lengths and tokens first: timings and throughput follow from them.
    prompt_tokens = round(SAMPLES * jit(100.0, 0.01))
    response_mean = min(jit(tg["response_mean"], 0.01), tg["max_response"] - 0.1)
    response_tokens = round(SAMPLES * response_mean)
    total_tokens = prompt_tokens + response_tokens
    clip = clamp(jit(tg["response_clip"], 0.05), 0.0, 1.0)
    score = clamp(jit(tg["score"], 0.04), 0.0, 1.0)
    rkl = 0.02 * (1 - math.exp(-step / 50)) * (1 + rng.uniform(-0.05, 0.05))
    rewards = score - 0.001 * rkl * response_mean if ppo else score
    returns = jit(tg["returns"], 0.01) if not math.isnan(tg["returns"]) else rewards
    adv = (rng.uniform(-0.03, 0.03), jit(2.3, 0.05), -jit(2.3, 0.05))
    warmup = min(1.0, step / 10)

    if ppo:
        vpred = returns + jit(tg["vpred_gap"], 0.05)
        m.update({
            "critic/vf_loss": jit(tg["vf_loss"], 0.03),
            "critic/vf_clipfrac": clamp(jit(0.12 + 0.05 * math.sin(step / 6), 0.1), 0.0, 1.0),
            "critic/vpred_mean": vpred,
            "critic/grad_norm": jit(2.0 + 1000.0 * math.exp(-step / 25), 0.05),
            "critic/lr": 1e-5 * warmup,
        })
    m.update({
        "actor/pg_loss": tg["pg_loss"] + rng.uniform(-0.001, 0.001),
        "actor/pg_clipfrac": clamp(jit(tg["pg_clipfrac"], 0.05), 0.0, 1.0),
        "actor/pg_clipfrac_lower": jit(0.004 + 0.05 * tg["pg_clipfrac"] ** 2, 0.2),
        "actor/ppo_kl": jit(tg["ppo_kl"], 0.05),
        "actor/entropy": jit(tg["entropy"], 0.01),
        "actor/grad_norm": tg["grad_norm"] if tg["grad_norm_pinned"] else jit(tg["grad_norm"], 0.08),
        "actor/lr": 1e-6 * warmup,
    })
    if ppo:
        m.update({"actor/reward_kl_penalty": rkl, "actor/reward_kl_penalty_coeff": 0.001})
    else:
        m.update({"actor/kl_loss": jit(0.002 + 0.03 * (1 - math.exp(-step / 40)), 0.05), "actor/kl_coef": 0.001})
    m.update({
        "critic/score/mean": score, "critic/score/max": 1.0 if score > 0 else 0.0, "critic/score/min": 0.0,
        "critic/rewards/mean": rewards, "critic/rewards/max": 1.0 - 0.001 * rkl * 40 if ppo else 1.0,
        "critic/rewards/min": -0.001 * rkl * tg["max_response"] * 1.5 if ppo else 0.0,
        "critic/advantages/mean": adv[0], "critic/advantages/max": adv[1], "critic/advantages/min": adv[2],
    })
    if ppo:
        values_mean = vpred + rng.uniform(-0.02, 0.02)
        m.update({
            "critic/returns/mean": returns,
            "critic/returns/max": max(m["critic/rewards/max"], returns * 1.7),
            "critic/returns/min": min(m["critic/rewards/min"], returns * 0.2),
            "critic/values/mean": values_mean,
            "critic/values/max": values_mean + jit(1.2, 0.05),
            "critic/values/min": values_mean - jit(1.5, 0.05),
            "critic/vf_explained_var": tg["explained_var"] + rng.uniform(-0.03, 0.03),
        })
    else:  # GRPO's returns are its advantages
        m.update({"critic/returns/mean": adv[0], "critic/returns/max": adv[1], "critic/returns/min": adv[2]})
    m.update({
        "response_length/mean": response_tokens / SAMPLES,
        "response_length/max": tg["max_response"],
        "response_length/min": float(round(jit(tg["response_mean"] * 0.25 if clip < 0.5 else 180.0, 0.1))),
        "response_length/clip_ratio": clip,
        "prompt_length/mean": prompt_tokens / SAMPLES,
        "prompt_length/max": float(round(jit(210.0, 0.05))),
        "prompt_length/min": float(round(jit(45.0, 0.05))),
        "prompt_length/clip_ratio": 0.0,
    })
    nominal = total_tokens / (TARGET_THROUGHPUT * N_GPUS) * (1 + rng.uniform(-0.015, 0.015))
    phases = {name: share * nominal * (1 + rng.uniform(-0.02, 0.02)) for name, share in PHASES[algorithm].items()}
    step_time = sum(phases.values()) + nominal * (1 - sum(PHASES[algorithm].values())) * (1 + rng.uniform(-0.1, 0.1))
    m.update({f"timing_s/{name}": seconds for name, seconds in phases.items()})
    m["timing_s/step"] = step_time
    m.update({f"timing_per_token_ms/{name}": seconds * 1000 / (response_tokens if name == "gen" else total_tokens)
              for name, seconds in phases.items()})
    m.update({
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / (step_time * N_GPUS),
        "perf/mfu/actor": jit(0.35, 0.03),
    })
    if ppo:
        m["perf/mfu/critic"] = jit(0.28, 0.03)
    m.update({
        "perf/max_memory_allocated_gb": jit(45.2, 0.005),
        "perf/max_memory_reserved_gb": 48.0,
        "perf/cpu_memory_used_gb": 128.5 + 0.01 * step + rng.uniform(-0.1, 0.1),
        "training/global_step": step,
        "training/epoch": (step - 1) // STEPS_PER_EPOCH,
    })
    if scenario == "grad-spike" and step in SPIKE_STEPS:
        m["actor/grad_norm"] *= 8
        m["actor/ppo_kl"] *= 10
        m["actor/pg_loss"] += 0.4
        if ppo:
            m["critic/vf_loss"] *= 20
    if scenario == "rollout-mismatch":
        m.update(_mismatch_values(step, rng))
    if scenario == "nan" and step >= nan_after:
        m["actor/pg_loss"] = m["actor/grad_norm"] = math.nan
        if ppo:
            m["critic/vf_loss"] = math.inf
    return m


def _mismatch_values(step: int, rng: random.Random) -> dict[str, float]:
    """What verl logs with calculate_log_probs and rollout correction: healthy, then drifting apart."""
    drift = min(1.0, max(0.0, (step - MISMATCH_FROM) / 10))

    def between(healthy: float, bad: float) -> float:
        return (healthy + (bad - healthy) * drift) * (1 + rng.uniform(-0.03, 0.03))

    kl = between(0.002, 0.15)
    return {
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_mean": between(0.003, 0.03),
        "training/rollout_probs_diff_max": min(1.0, between(0.3, 0.95)),
        "training/rollout_probs_diff_std": between(0.01, 0.08),
        "training/rollout_actor_probs_pearson_corr": min(1.0, between(0.999, 0.85)),
        "rollout_corr/kl": kl,
        "rollout_corr/k3_kl": kl * 0.98,
        "rollout_corr/ppl_ratio": math.exp(kl),
        "rollout_corr/chi2_token": between(0.01, 1.5),
        "rollout_corr/rollout_is_mean": between(1.0, 1.05),
        "rollout_corr/rollout_is_std": between(0.1, 1.5),
        "rollout_corr/rollout_is_eff_sample_size": between(0.95, 0.2),
    }


def validation_values(scenario: str, step: int, *, seed: int = 0) -> dict[str, float]:
    """The validation metrics (GSM8K test split) verl logs at ``step``."""
    check(scenario)
    rng = random.Random(f"{seed}/{scenario}/validation/{step}")
    acc = min(1.0, max(0.0, _targets(scenario, step)["score"] * (1 + rng.uniform(-0.03, 0.03))))
    return {VAL_KEYS[0]: acc, VAL_KEYS[1]: acc, VAL_KEYS[2]: math.sqrt(acc * (1 - acc))}


def generate_steps(scenario: str, *, seed: int = 0, algorithm: str = "ppo", stall_after: int = 20,
                   nan_after: int = 15, val_every: int = 10) -> Iterator[tuple[int, dict[str, float]]]:
    """(step, values) from step 1 on, forever; validation comes as a second tuple at the same step.

    The ``stall`` scenario stops yielding after ``stall_after`` steps.
    """
    check(scenario, algorithm)

    def steps() -> Iterator[tuple[int, dict[str, float]]]:
        step = 1
        while scenario != "stall" or step <= stall_after:
            yield step, step_values(scenario, step, seed=seed, algorithm=algorithm, nan_after=nan_after)
            if val_every > 0 and step % val_every == 0:
                yield step, validation_values(scenario, step, seed=seed)
            step += 1

    return steps()


def is_validation(values: dict[str, float]) -> bool:
    """True for a validation tuple (``val-core/...``, ``val-aux/...`` keys)."""
    return any(key.startswith("val-") for key in values)


def scale_timings(values: dict[str, float], step_seconds: float) -> dict[str, float]:
    """A copy whose timing_s/step is ``step_seconds``: phase and per-token timings scaled alike,
    perf/time_per_step and perf/throughput to match. Values without timing_s/step are returned as is.
    """
    if not step_seconds > 0 or math.isinf(step_seconds):
        raise ValueError(f"step_seconds must be a positive number, not {step_seconds!r}")
    out = dict(values)
    step = values.get("timing_s/step")
    if step is None or not math.isfinite(step) or step <= 0:
        return out
    factor = step_seconds / step
    for key, value in values.items():
        if key.startswith(("timing_s/", "timing_per_token_ms/")):
            out[key] = value * factor
    out["timing_s/step"] = step_seconds
    if "perf/time_per_step" in out:
        out["perf/time_per_step"] = step_seconds
    if "perf/throughput" in out:
        out["perf/throughput"] = values["perf/throughput"] / factor
    return out
