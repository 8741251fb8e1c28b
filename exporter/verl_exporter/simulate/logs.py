"""A simulated verl run written in verl's JSONL or console format, step by step.

Lets anyone see live metrics and firing alerts without a GPU (``verl-exporter simulate``), and gives
the tests and benchmarks realistic input. The values come from ``scenarios``; this module formats
them as verl does, adds the console's other output, and writes live runs and big files.
"""

from __future__ import annotations

import argparse
import json
import pprint
import random
import sys
import threading
from pathlib import Path
from typing import Iterator

import yaml

from verl_exporter.simulate.scenarios import (
    ALGORITHMS,
    SCENARIOS,
    STEPS_PER_EPOCH,
    check,
    generate_steps,
    is_validation,
    run_config,
    scale_timings,
    validation_values,
)

FORMATS = ("jsonl", "console")
STYLES = ("full", "old", "numpy")
PREFIX = "(TaskRunner pid=1234) "
FINAL_MARKER = "Final validation metrics:"


def _check(scenario: str, algorithm: str = "ppo", fmt: str = "jsonl", style: str = "full") -> None:
    check(scenario, algorithm)
    for what, value, known in (("format", fmt, FORMATS), ("console style", style, STYLES)):
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}; one of {', '.join(known)}")

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


def format_config(config: dict, prefix: str = PREFIX) -> str:
    """verl's config print before the first step: ``pprint`` of the resolved config, one prefixed
    line per row (with a newline)."""
    return "".join(f"{prefix}{row}\n" for row in pprint.pformat(config).splitlines())


def total_steps(config: dict) -> int:
    """The total verl prints (``Total training steps: N``): the config's, else epochs x batches."""
    trainer = config["trainer"]
    return trainer["total_training_steps"] or STEPS_PER_EPOCH * trainer["total_epochs"]


def write_hydra_config(path: str | Path, config: dict) -> None:
    """Write ``config`` as hydra writes ``.hydra/config.yaml`` in the run's output folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def _render(fmt: str, step: int, values: dict[str, float], style: str, noise: list[str]) -> str:
    line = format_jsonl(step, values) if fmt == "jsonl" else format_console(step, values, style)
    return "".join(f"{text}\n" for text in [*noise, line])


def _chunks(scenario: str, fmt: str, style: str, *, steps: int | None, seed: int, noise: bool,
            step_seconds: float | None, config: dict | None = None, algorithm: str = "ppo", stall_after: int = 20,
            nan_after: int = 15, val_every: int = 10) -> Iterator[tuple[bool, str]]:
    """(is a training step, text to append) for each step of a run, then, once ``steps`` steps are
    out, what verl writes at the end: validation at the last step and, on the console, its end line
    (both only where validation is configured, ``val_every`` > 0). On the console ``config`` is
    printed first, with the total of training steps, as verl does.
    """
    noise_rng = random.Random(f"{seed}/noise")
    written, last_val = 0, None
    if config is not None and fmt == "console":
        yield False, format_config(config) + f"{PREFIX}Total training steps: {total_steps(config)}\n"
    for step, values in generate_steps(scenario, seed=seed, algorithm=algorithm, stall_after=stall_after,
                                       nan_after=nan_after, val_every=val_every):
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
    if val_every <= 0:
        return  # no validation: verl prints no final validation line either
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
              stall_after: int = 20, nan_after: int = 15, val_every: int = 10, print_config: bool = True,
              hydra_config: str | Path | None = None, total: int | None = None) -> int:
    """Append a live run to ``path``, one step every ``interval`` seconds; return the steps written.

    Stops when ``stop_event`` is set, or after ``steps`` steps (then writes verl's final validation
    and, on the console, its end line, where validation is configured: ``val_every`` > 0). A stalled
    run writes nothing more but keeps running until ``stop_event`` is set or the time the remaining
    steps would have taken has passed. With ``realtime_timings`` the timings say a step took
    ``interval`` seconds. The run is named as ``run_for`` names ``path`` (its folder and its stem);
    a console run prints its config first (``print_config``), and ``hydra_config`` names a
    ``config.yaml`` to write it to as hydra does. The config's ``trainer.total_training_steps`` is
    ``total``, else ``steps``.
    """
    _check(scenario, algorithm, fmt, style)
    if interval < 0:
        raise ValueError(f"interval must be >= 0, not {interval!r}")
    path = Path(path)
    config = run_config(scenario, algorithm=algorithm, project=path.resolve().parent.name, experiment=path.stem,
                        total_steps=total or steps, val_every=val_every)
    if hydra_config is not None:
        write_hydra_config(hydra_config, config)
    chunks = _chunks(scenario, fmt, style, steps=steps, seed=seed, noise=noise,
                     step_seconds=interval if realtime_timings and interval > 0 else None,
                     config=config if print_config else None,
                     algorithm=algorithm, stall_after=stall_after, nan_after=nan_after, val_every=val_every)
    stop = stop_event or threading.Event()
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


def _duration(text: str) -> float:
    """``--interval``: the exporter's one duration grammar (``500ms``, ``2s``; a bare number is seconds)."""
    from verl_exporter.config.durations import DurationError, parse_duration

    try:
        if not text:
            raise DurationError("not a duration: ''")
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


DESCRIPTION = ("Write a simulated verl training run, step by step.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``verl-exporter simulate``."""
    parser.add_argument("--scenario", default="healthy", choices=list(SCENARIOS))
    parser.add_argument("--format", default="jsonl", choices=FORMATS, help="verl's file logger or console output")
    parser.add_argument("--output", help="file to append to (parent folders are created)")
    parser.add_argument("--steps", type=int, help="stop after this many steps (default: run until interrupted)")
    parser.add_argument("--interval", type=_duration, default=1.0, metavar="DURATION",
                        help="time between steps (500ms, 2s, or a bare number of seconds); 0 = as fast as possible")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithm", default="ppo", choices=ALGORITHMS)
    parser.add_argument("--style", default="full", choices=STYLES, help="console value style")
    parser.add_argument("--no-validation", action="store_true", help="a run without validation (no end line)")
    parser.add_argument("--hydra-config", help="also write the run's config as hydra's .hydra/config.yaml here")
    parser.add_argument("--list-scenarios", action="store_true", help="print the scenarios and exit")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``verl-exporter simulate``: write a simulated verl run to a file, live."""
    if args.list_scenarios:
        for name, description in SCENARIOS.items():
            print(f"{name:18s} {description}")
        return 0
    if not args.output:
        parser.error("--output is required")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be >= 1")
    print(f"writing a simulated {args.algorithm} run ({args.scenario}, {args.format}) to {args.output}",
          file=sys.stderr)
    try:
        write_run(args.output, args.scenario, fmt=args.format, steps=args.steps, interval=args.interval,
                  seed=args.seed, algorithm=args.algorithm, style=args.style,
                  val_every=0 if args.no_validation else 10, hydra_config=args.hydra_config)
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    """``verl-exporter simulate`` on its own (``python -m``)."""
    parser = argparse.ArgumentParser(prog="verl-exporter simulate", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


if __name__ == "__main__":
    sys.exit(main())
