"""A real run rewritten into another regime a healthy run can be in (``TRANSFORMS``), written as verl's
console prints it: the run's config print (with the regime's settings), its steps, its checkpoint
saves and its end, so that the replay tests can ask whether the rules still tell it right.

Each transform keeps what the run's own values say about its health (the trend of every metric, the
onset of its failure) and changes only what the regime changes:

- ``sparse``: sparse rewards with a batch of 8 prompts: 70% of the steps (at random) carry no learning
  signal, every group scoring its group's value (advantages 0, score and reward at their mean);
- ``small-batch``: per-step noise of entropy, score and gradient norm 3 times larger around the same
  trend (the median of 5 steps around each);
- ``long-validation``: a validation every 8 steps (``trainer.test_freq`` 8 in the config print) taking 15
  times the run's median step (``timing_s/testing``, inside ``timing_s/step``);
- ``zero-gradient``: 38% of the steps (at random) with every sample of the batch scoring the same:
  gradient norm, policy loss and advantages 0;
- ``resumed``: the run resumed at step 101 (a run of fewer than 120 steps: at its middle step), no
  step before it logged;
- ``progress-bars``: a tqdm bar drawn over every step line after a carriage return (and every third
  one before it too), as on an Ascend NPU cluster.

The random choices are seeded by the run's name: the same steps every time.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from verl_exporter.history.timeline import read_file

SPARSE_SHARE = 0.7
ZERO_GRADIENT_SHARE = 0.38
NOISE_FACTOR = 3.0
NOISY_KEYS = ("actor/entropy", "actor/entropy_loss", "critic/score/mean", "actor/grad_norm")
VALIDATION_EVERY = 8
VALIDATION_STEPS = 15.0  # a validation takes this many of the run's median steps
RESUME_AT = 101
SMALL_BATCH = 8
NO_SIGNAL = ("critic/advantages/mean", "critic/advantages/max", "critic/advantages/min")


@dataclass
class Run:
    """What a run's log holds, step by step, as the exporter reads it."""

    config: dict = field(default_factory=dict)  # flattened dotted keys
    total_steps: int | None = None
    steps: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    checkpoints: dict[int, int] = field(default_factory=dict)  # step before which a save of that step began
    finished: bool = False


def read_run(path: str) -> Run:
    """The steps, config, saves and end of the log at ``path``."""
    run = Run()
    pending_save: int | None = None
    for step in read_file(path).steps:
        values: dict[str, float] = {}
        for record in step.records:
            if record.run_config is not None:
                run.config.update(record.run_config)
            elif record.total_steps is not None:
                run.total_steps = record.total_steps
            elif record.checkpoint_step is not None:
                pending_save = record.checkpoint_step
            elif record.finished:
                run.finished = True
            elif record.values and not record.error and not record.fatal:
                values.update({key: float(value) for key, value in record.values.items()})
        if values:
            if pending_save is not None:
                run.checkpoints[step.step] = pending_save
                pending_save = None
            run.steps.append((step.step, values))
    return run


def _chosen(name: str, steps: list[int], share: float) -> set[int]:
    rng = random.Random(name)
    return {step for step in steps if rng.random() < share}


def _uniform_groups(values: dict[str, float], *, gradient: bool) -> dict[str, float]:
    """Every group of the step scored its group's value: no advantage, no policy gradient."""
    out = dict(values)
    out.update({key: 0.0 for key in NO_SIGNAL if key in values})
    for kind in ("score", "rewards"):
        mean = values.get(f"critic/{kind}/mean")
        if mean is not None:
            out.update({f"critic/{kind}/{stat}": mean for stat in ("max", "min") if f"critic/{kind}/{stat}" in values})
    for key in ("actor/pg_loss", "actor/pg_clipfrac"):
        if key in values:
            out[key] = 0.0
    if gradient and "actor/grad_norm" in values:
        out["actor/grad_norm"] = 0.0
    return out


def sparse(name: str, run: Run) -> Run:
    chosen = _chosen(name, [step for step, _ in run.steps], SPARSE_SHARE)
    steps = [(step, _uniform_groups(values, gradient=False) if step in chosen else values) for step, values in run.steps]
    return Run({**run.config, "data.train_batch_size": SMALL_BATCH}, run.total_steps, steps, run.checkpoints,
               run.finished)


def zero_gradient(name: str, run: Run) -> Run:
    chosen = _chosen(name, [step for step, _ in run.steps], ZERO_GRADIENT_SHARE)
    steps = [(step, _uniform_groups(values, gradient=True) if step in chosen else values) for step, values in run.steps]
    return Run(run.config, run.total_steps, steps, run.checkpoints, run.finished)


def small_batch(name: str, run: Run) -> Run:
    steps = [(step, dict(values)) for step, values in run.steps]
    for key in NOISY_KEYS:
        series = [(index, values[key]) for index, (_, values) in enumerate(run.steps)
                  if key in values and math.isfinite(values[key])]
        for position, (index, value) in enumerate(series):
            around = [v for _, v in series[max(0, position - 2):position + 3]]
            trend = statistics.median(around)
            noisy = trend + NOISE_FACTOR * (value - trend)
            if key != "critic/score/mean":
                noisy = max(noisy, 0.0)  # entropy and norms stay positive
            else:
                values = run.steps[index][1]
                low, high = values.get("critic/score/min", -math.inf), values.get("critic/score/max", math.inf)
                noisy = min(max(noisy, low), high)
            steps[index][1][key] = noisy
    return Run(run.config, run.total_steps, steps, run.checkpoints, run.finished)


def long_validation(name: str, run: Run) -> Run:
    times = [values["timing_s/step"] for _, values in run.steps
             if math.isfinite(values.get("timing_s/step", math.nan))]
    median = statistics.median(times) if times else 60.0
    steps = []
    for step, values in run.steps:
        if step % VALIDATION_EVERY == 0:
            values = dict(values)
            testing = VALIDATION_STEPS * median
            values["timing_s/testing"] = testing
            values["timing_s/step"] = values.get("timing_s/step", median) + testing
        steps.append((step, values))
    return Run({**run.config, "trainer.test_freq": VALIDATION_EVERY}, run.total_steps, steps, run.checkpoints,
               run.finished)


def resume_point(run: Run) -> int:
    """The step a resumed copy of ``run`` starts at."""
    numbers = [step for step, _ in run.steps]
    if len(numbers) >= 120:
        return RESUME_AT
    return numbers[len(numbers) // 2] if numbers else 0


def resumed(name: str, run: Run) -> Run:
    start = resume_point(run)
    return Run(run.config, run.total_steps, [(step, values) for step, values in run.steps if step >= start],
               {step: saved for step, saved in run.checkpoints.items() if step >= start}, run.finished)


def progress_bars(name: str, run: Run) -> Run:
    return run  # the bars are drawn when the run is written (``write_run``)


TRANSFORMS: dict[str, Callable[[str, Run], Run]] = {
    "sparse": sparse,
    "small-batch": small_batch,
    "long-validation": long_validation,
    "zero-gradient": zero_gradient,
    "resumed": resumed,
    "progress-bars": progress_bars,
}


def _nested(flat: dict) -> dict:
    tree: dict = {}
    for key, value in flat.items():
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[parts[-1]] = value
    return tree


def _number(value: float) -> str:
    return "nan" if math.isnan(value) else repr(value)


def _bar(step: int, total: int) -> str:
    done = int(10 * step / max(total, 1))
    return f"Training Progress:  {100 * step // max(total, 1)}%|{'#' * done}{' ' * (10 - done)}| {step}/{total} [00:10<01:00,  1.00s/it]"


def write_run(run: Run, path: Path, *, bars: bool = False) -> None:
    """``run`` as verl's console prints it: config print, total steps, steps, saves, the end."""
    lines = []
    if run.config:  # verl's config has a trainer section; the exporter takes no other dict for it
        lines.append(repr(_nested({"trainer.logger": ["console"], **run.config})))
    total = run.total_steps or (run.steps[-1][0] if run.steps else 0)
    if run.total_steps is not None:
        lines.append(f"Total training steps: {run.total_steps}")
    for step, values in run.steps:
        if step in run.checkpoints:
            lines.append(f"local_global_step_folder: /checkpoints/global_step_{run.checkpoints[step]}")
        text = f"step:{step} - " + " - ".join(f"{key}:{_number(value)}" for key, value in values.items())
        if bars:
            text = text + " -\r" + _bar(step, total)
            if step % 3 == 0:
                text = _bar(step - 1, total) + "\r" + text
        lines.append(text)
    if run.finished:
        lines.append("Final validation metrics: {}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_transformed(name: str, transform: str, source: str, path: Path) -> Run:
    """The log ``source`` of run ``name`` rewritten under ``transform`` to ``path``; the transformed run."""
    run = TRANSFORMS[transform](name, read_run(source))
    write_run(run, path, bars=transform == "progress-bars")
    return run
