"""A simulated verl run: PPO or GRPO metrics, step by step, in verl's JSONL or console format.

Lets anyone see live metrics and firing alerts without a GPU (``verl-exporter simulate``), and gives
the tests and benchmarks realistic input. Each scenario moves the values the way the examples of
metrics-guide.md do. Values are pure functions of (scenario, step, seed); I/O comes last.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import threading
from pathlib import Path
from typing import Iterator

SCENARIOS: dict[str, str] = {
    "healthy": "score rises 0.15 -> 0.8, pg_clipfrac 0.1-0.2, ppo_kl 0.002-0.006, the critic converges",
    "lr-too-high": "pg_clipfrac ~0.8, ppo_kl ~0.1, actor/grad_norm pinned at the clip value 1.0, score flat",
    "critic-underfit": "vf_explained_var stays negative, vf_loss stuck near 45, vpred_mean far below returns",
    "entropy-collapse": "entropy 0.6 -> 0.05 within ~10 steps, ppo_kl -> 0.0001, score stops improving",
    "truncation": "85% of responses hit max_response_length (response_length/clip_ratio ~0.85)",
    "stall": "healthy, then the job hangs: no step is written after stall_after steps",
    "nan": "healthy, then actor/pg_loss and actor/grad_norm are NaN (critic/vf_loss inf) from nan_after",
}
ALGORITHMS = ("ppo", "grpo")
FORMATS = ("jsonl", "console")
STYLES = ("full", "old", "numpy")
PREFIX = "(TaskRunner pid=1234) "
FINAL_MARKER = "Final validation metrics:"
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
        "grad_norm": 0.95 + 0.3 * math.sin(t / 3),
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
        v.update(vf_loss=45.0, explained_var=-0.2, returns=5.7, vpred_gap=-5.6,
                 score=0.15 + 0.15 * (1 - decay(60)))
    elif scenario == "entropy-collapse":
        early = math.exp(-(t - 1) / 2.7)  # 1 at the first step
        v.update(entropy=0.03 + 0.57 * early, ppo_kl=0.0001 + 0.004 * early, pg_clipfrac=0.01 + 0.14 * early,
                 score=0.15 + 0.15 * (1 - early))
    elif scenario == "truncation":
        v.update(response_mean=253.8, response_clip=0.85, max_response=256.0)
    return v


def _check(scenario: str, algorithm: str = "ppo", fmt: str = "jsonl", style: str = "full") -> None:
    for what, value, known in (("scenario", scenario, SCENARIOS), ("algorithm", algorithm, ALGORITHMS),
                               ("format", fmt, FORMATS), ("console style", style, STYLES)):
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}; one of {', '.join(known)}")


def step_values(scenario: str, step: int, *, seed: int = 0, algorithm: str = "ppo",
                nan_after: int = 15) -> dict[str, float]:
    """The training metrics verl logs at ``step`` of a scenario, keyed by verl key."""
    _check(scenario, algorithm)
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
    if scenario == "nan" and step >= nan_after:
        m["actor/pg_loss"] = m["actor/grad_norm"] = math.nan
        if ppo:
            m["critic/vf_loss"] = math.inf
    return m


def validation_values(scenario: str, step: int, *, seed: int = 0) -> dict[str, float]:
    """The validation metrics (GSM8K test split) verl logs at ``step``."""
    _check(scenario)
    rng = random.Random(f"{seed}/{scenario}/validation/{step}")
    acc = min(1.0, max(0.0, _targets(scenario, step)["score"] * (1 + rng.uniform(-0.03, 0.03))))
    return {VAL_KEYS[0]: acc, VAL_KEYS[1]: acc, VAL_KEYS[2]: math.sqrt(acc * (1 - acc))}


def generate_steps(scenario: str, *, seed: int = 0, algorithm: str = "ppo", stall_after: int = 20,
                   nan_after: int = 15, val_every: int = 10) -> Iterator[tuple[int, dict[str, float]]]:
    """(step, values) from step 1 on, forever; validation comes as a second tuple at the same step.

    The ``stall`` scenario stops yielding after ``stall_after`` steps.
    """
    _check(scenario, algorithm)

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


def format_jsonl(step: int, values: dict[str, float]) -> str:
    """One line as verl's FileLogger writes it (no newline)."""
    return json.dumps({"step": step, "data": values})


def _console_value(value: float, style: str) -> str:
    if style == "old":
        return f"{value:.3f}"
    if style == "numpy" and isinstance(value, float):
        return f"np.float64({value!r})"
    return repr(value)


def format_console(step: int, values: dict[str, float], style: str = "full", prefix: str = PREFIX) -> str:
    """One line as verl's console logger prints it: ``step:N - key:value - ...`` (no newline).

    ``full``: newer verl (repr, full precision); ``old``: three decimals; ``numpy``: numpy-2 reprs.
    """
    _check("healthy", style=style)
    parts = [f"step:{step}"] + [f"{key}:{_console_value(value, style)}" for key, value in values.items()]
    return prefix + " - ".join(parts)


def noise_lines(rng: random.Random, step: int = 1, total: int = 100) -> list[str]:
    """Non-step console output seen between steps: Ray worker and vLLM logs, progress bars, warnings."""
    worker = f"(WorkerDict pid={rng.choice((5678, 5679, 5680))}) "
    clock = f"06-12 10:{(step * 61 // 60) % 60:02d}:{step % 60:02d}"
    done, total = step, max(step, total)
    pool = [
        f"{worker}INFO {clock} [executor_base.py:204] It took {rng.uniform(0.2, 0.9):.6f} seconds to wake up "
        "tags ['weights', 'kv_cache'].",
        f"\x1b[36m{worker.strip()}\x1b[0m INFO {clock} [block_pool.py:264] Successfully reset prefix cache",
        f"{worker}INFO {clock} [gpu_worker.py:104] Sleep mode freed {rng.uniform(60, 70):.2f} GiB memory, "
        f"{rng.uniform(3, 5):.2f} GiB memory is still in use.",
        f"{worker}kwargs: {{'n': 1, 'logprobs': 0, 'max_tokens': 512, 'detokenize': False, 'temperature': 1.0, "
        "'top_k': -1, 'top_p': 1, 'ignore_eos': False}",
        f"{worker}/usr/local/lib/python3.10/dist-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py:690:"
        " FutureWarning: FSDP.state_dict_type() and FSDP.set_state_dict_type() are being deprecated.",
        f"{worker}  warnings.warn( [repeated 7x across cluster]",
        f"{PREFIX}[prompt] Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in"
        " May. How many clips did Natalia sell altogether in April and May?",
        f"{PREFIX}[ground_truth] 72 - [score] {rng.choice((0.0, 1.0))}",
        f"{worker}[rank0]:[W612 10:22:31.{rng.randint(100000, 999999)} ProcessGroupNCCL.cpp:4561] Warning: "
        "using default stream for NCCL collectives",
    ]
    progress = (f"{PREFIX}Training Progress: {100 * done // total:>3d}%|{'#' * (10 * done // total):<10s}| "
                f"{done}/{total} [{step:02d}:{rng.randint(10, 59)}<1:43:21, {rng.uniform(60, 70):.2f}s/it, "
                f"step:{step}/{total}]")
    return [*rng.sample(pool, rng.randint(1, 4)), progress]


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


def _render(fmt: str, step: int, values: dict[str, float], style: str, noise: list[str]) -> str:
    line = format_jsonl(step, values) if fmt == "jsonl" else format_console(step, values, style)
    return "".join(f"{text}\n" for text in [*noise, line])


def _chunks(scenario: str, fmt: str, style: str, *, steps: int | None, seed: int, noise: bool,
            step_seconds: float | None, **run: object) -> Iterator[tuple[bool, str]]:
    """(is a training step, text to append) for each step of a run, then, once ``steps`` steps are
    out, what verl writes at the end: validation at the last step and, on the console, its end line.
    """
    noise_rng = random.Random(f"{seed}/noise")
    written, last_val = 0, None
    for step, values in generate_steps(scenario, seed=seed, **run):
        if steps is not None and step > steps:
            break
        training, extra = not is_validation(values), []
        if not training:
            last_val = (step, values)
        else:
            written += 1
            if step_seconds:
                values = scale_timings(values, step_seconds)
            if noise and fmt == "console":
                extra = noise_lines(noise_rng, step, steps or 100)
        yield training, _render(fmt, step, values, style, extra)
    if steps is None or written < steps:
        return  # a stalled run: nothing more
    text = ""
    if last_val is None or last_val[0] != steps:
        last_val = (steps, validation_values(scenario, steps, seed=seed))
        text = _render(fmt, steps, last_val[1], style, [])
    if fmt == "console":
        text += f"{PREFIX}{FINAL_MARKER} {last_val[1]}\n"
    yield False, text


def write_run(path: str | Path, scenario: str = "healthy", *, fmt: str = "jsonl", steps: int | None = None,
              interval: float = 1.0, seed: int = 0, algorithm: str = "ppo", realtime_timings: bool = True,
              stop_event: threading.Event | None = None, noise: bool = True, style: str = "full",
              stall_after: int = 20, nan_after: int = 15, val_every: int = 10) -> int:
    """Append a live run to ``path``, one step every ``interval`` seconds; return the steps written.

    Stops when ``stop_event`` is set, or after ``steps`` steps (then writes verl's final validation
    and, on the console, its end line). A stalled run writes nothing more but keeps running until
    ``stop_event`` is set or the time the remaining steps would have taken has passed.
    With ``realtime_timings`` the timings say a step took ``interval`` seconds.
    """
    _check(scenario, algorithm, fmt, style)
    if interval < 0:
        raise ValueError(f"interval must be >= 0, not {interval!r}")
    chunks = _chunks(scenario, fmt, style, steps=steps, seed=seed, noise=noise,
                     step_seconds=interval if realtime_timings and interval > 0 else None,
                     algorithm=algorithm, stall_after=stall_after, nan_after=nan_after, val_every=val_every)
    stop = stop_event or threading.Event()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("a", encoding="utf-8") as out:
        for training, text in chunks:
            if training:
                if stop.is_set() or (written and stop.wait(interval)):
                    return written
                written += 1
            out.write(text)
            out.flush()
    if steps is None or written < steps:  # the job hangs
        stop.wait(None if steps is None else interval * (steps - written))
    return written


def write_file(path: str | Path, scenario: str, fmt: str, *, steps: int | None, target_bytes: int | None = None,
               seed: int = 0) -> int:
    """Write a run to ``path`` (replacing it) as fast as possible, for benchmarks; return the steps written.

    Stops after ``steps`` steps (then writes verl's end lines) or before the first step that would
    start past ``target_bytes``, whichever comes first. Console output has noise lines between steps.
    """
    _check(scenario, fmt=fmt)
    if steps is None and target_bytes is None:
        raise ValueError("give steps, target_bytes or both")
    chunks = _chunks(scenario, fmt, "full", steps=steps, seed=seed, noise=True, step_seconds=None)
    size = written = 0
    with Path(path).open("w", encoding="utf-8") as out:
        for training, text in chunks:
            if training and target_bytes is not None and size >= target_bytes:
                break
            written += training
            out.write(text)
            size += len(text.encode("utf-8"))
    return written


def main(argv: list[str] | None = None) -> int:
    """``verl-exporter simulate``: write a simulated verl run to a file, live."""
    parser = argparse.ArgumentParser(prog="verl-exporter simulate",
                                     description="Write a simulated verl training run, step by step.")
    parser.add_argument("--scenario", default="healthy", choices=list(SCENARIOS))
    parser.add_argument("--format", default="jsonl", choices=FORMATS, help="verl's file logger or console output")
    parser.add_argument("--output", help="file to append to (parent folders are created)")
    parser.add_argument("--steps", type=int, help="stop after this many steps (default: run until interrupted)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between steps; 0 = as fast as possible")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithm", default="ppo", choices=ALGORITHMS)
    parser.add_argument("--style", default="full", choices=STYLES, help="console value style")
    parser.add_argument("--list-scenarios", action="store_true", help="print the scenarios and exit")
    args = parser.parse_args(argv)
    if args.list_scenarios:
        for name, description in SCENARIOS.items():
            print(f"{name:18s} {description}")
        return 0
    if not args.output:
        parser.error("--output is required")
    if args.interval < 0 or (args.steps is not None and args.steps < 1):
        parser.error("--interval must be >= 0 and --steps >= 1")
    print(f"writing a simulated {args.algorithm} run ({args.scenario}, {args.format}) to {args.output}",
          file=sys.stderr)
    try:
        write_run(args.output, args.scenario, fmt=args.format, steps=args.steps, interval=args.interval,
                  seed=args.seed, algorithm=args.algorithm, style=args.style)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
