"""A real run rewritten into another regime a healthy run can be in (``TRANSFORMS``), written as verl's
console prints it: the run's config print (with the regime's settings), its steps, its checkpoint
saves and its end, so that the replay tests can ask whether the rules still tell it right.

Each transform keeps what the run's own values say about its health (the trend of every metric, the
onset of its failure) and changes only what the regime changes:

- ``sparse``: sparse rewards with a batch of 8 prompts: 70% of the steps (at random) carry no learning
  signal, every group scoring its group's value (advantages 0, score and reward at their mean);
- ``small-batch``: per-step noise of entropy, score and gradient norm 3 times larger around the same
  trend (the median of 5 steps around each);
- ``long-validation``: each of the run's validations (where it has none, one every 8 steps, with
  ``trainer.test_freq`` 8 in the config print) taking 15 times the run's median step (``timing_s/testing``,
  inside ``timing_s/step``);
- ``zero-gradient``: 38% of the steps (at random) with every sample of the batch scoring the same:
  gradient norm, policy loss and advantages 0;
- ``resumed``: the run resumed at step 101 (a run of fewer than 120 steps: at its middle step), no
  step before it logged;
- ``progress-bars``: a tqdm bar drawn over every step line after a carriage return (and every third
  one before it too), as on an Ascend NPU cluster;
- ``rescaled``: rewards 10 times larger (a reward function that scores 0 to 10, as ALFWorld's success
  does): every value in their unit (scores, rewards, returns, values, validation scores) 10 times, the
  critic's loss 100 times and its gradient norm 10 times; advantages, normalised, stay as they are.

The random choices are seeded by the run's name: the same steps every time.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from verl_exporter.history.timeline import read_file
from verl_exporter.store.validation import is_validation_key

SPARSE_SHARE = 0.7
ZERO_GRADIENT_SHARE = 0.38
NOISE_FACTOR = 3.0
NOISY_KEYS = ("actor/entropy", "actor/entropy_loss", "critic/score/mean", "actor/grad_norm")
VALIDATION_EVERY = 8
VALIDATION_STEPS = 15.0  # a validation takes this many of the run's median steps
RESUME_AT = 101
SMALL_BATCH = 8
NO_SIGNAL = ("critic/advantages/mean", "critic/advantages/max", "critic/advantages/min")
REWARD_SCALE = 10.0
IN_REWARD_UNITS = ("critic/score/", "critic/rewards/", "critic/returns/", "critic/values/", "critic/vpred_mean")


@dataclass
class Run:
    """What a run's log holds, as the exporter reads it: its steps and events, each at its time."""

    config: dict = field(default_factory=dict)  # flattened dotted keys
    total_steps: int | None = None
    steps: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    times: dict[int, float] = field(default_factory=dict)  # step -> when it was logged (unix seconds)
    events: list[tuple[float, str]] = field(default_factory=list)  # (time, line): saves, errors, the fatal end
    finished: bool = False

    def but(self, **changes: object) -> "Run":
        return replace(self, **changes)


FATAL_BLOCK_LINES = 400  # how far back the trainer's fatal end may start (hydra's header, the traceback)


def fatal_block(path: str, line: str) -> str:
    """The lines of ``path`` that end in the fatal line ``line``, from hydra's ``Error executing job``
    header or the outermost ``Traceback`` before it: a crash is told by its whole end, not one line."""
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    ends = [index for index, text in enumerate(lines) if text.rstrip() == line.rstrip()]
    if not ends:
        return line
    end = ends[-1]
    starts = [index for index in range(max(0, end - FATAL_BLOCK_LINES), end)
              if lines[index].startswith(("Error executing job", "Traceback (most recent call last)"))]
    return "\n".join(lines[starts[0]:end + 1]) if starts else line


def read_run(path: str) -> Run:
    """The steps (with the times the exporter gives them), config, saves, errors and end of ``path``;
    the trainer's fatal end with the lines it ends (``fatal_block``)."""
    run = Run()
    for step in read_file(path).steps:
        values: dict[str, float] = {}
        for record in step.records:
            if record.run_config is not None:
                run.config.update(record.run_config)
            elif record.total_steps is not None:
                run.total_steps = record.total_steps
            elif record.checkpoint_step is not None:
                saved = record.checkpoint_step
                run.events.append((step.time, f"local_global_step_folder: /checkpoints/global_step_{saved}"))
            elif record.fatal is not None:
                run.events.append((step.time, fatal_block(path, record.line)))
            elif record.error is not None:
                run.events.append((step.time, record.line))
            elif record.finished:
                run.finished = True
            elif record.values:
                values.update({key: float(value) for key, value in record.values.items()})
        if values and not step.event:
            run.steps.append((step.step, values))
            run.times[step.step] = step.time
    return run


def _chosen(name: str, steps: list[int], share: float) -> set[int]:
    rng = random.Random(name)
    return {step for step in steps if rng.random() < share}


def _uniform_groups(values: dict[str, float], *, gradient: bool) -> dict[str, float]:
    """Every group of the step scored its group's value: no advantage, no policy gradient."""
    out = dict(values)  # a NaN or Inf stays as logged: it is the run's own failure
    out.update({key: 0.0 for key in NO_SIGNAL if math.isfinite(values.get(key, math.nan))})
    for kind in ("score", "rewards"):
        mean = values.get(f"critic/{kind}/mean")
        if mean is not None:
            out.update({f"critic/{kind}/{stat}": mean for stat in ("max", "min")
                        if math.isfinite(values.get(f"critic/{kind}/{stat}", math.nan))})
    for key in ("actor/pg_loss", "actor/pg_clipfrac") + (("actor/grad_norm",) if gradient else ()):
        if math.isfinite(values.get(key, math.nan)):
            out[key] = 0.0
    return out


def sparse(name: str, run: Run) -> Run:
    chosen = _chosen(name, [step for step, _ in run.steps], SPARSE_SHARE)
    steps = [(step, _uniform_groups(values, gradient=False) if step in chosen else values)
             for step, values in run.steps]
    return run.but(config={**run.config, "data.train_batch_size": SMALL_BATCH}, steps=steps)


def zero_gradient(name: str, run: Run) -> Run:
    chosen = _chosen(name, [step for step, _ in run.steps], ZERO_GRADIENT_SHARE)
    steps = [(step, _uniform_groups(values, gradient=True) if step in chosen else values)
             for step, values in run.steps]
    return run.but(steps=steps)


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
    return run.but(steps=steps)


def _validates(values: dict[str, float]) -> bool:
    return any(map(is_validation_key, values))


def long_validation(name: str, run: Run) -> Run:
    """Each validation takes VALIDATION_STEPS of the run's median steps: the run's own (after step 0), or
    where it has none, one every VALIDATION_EVERY steps (``trainer.test_freq``). The validating step's line,
    and every later one, comes that much later."""
    numbers = [step for step, _ in run.steps]
    gaps = [run.times[b] - run.times[a] for a, b in zip(numbers, numbers[1:]) if run.times[b] > run.times[a]]
    testing = VALIDATION_STEPS * (statistics.median(gaps) if gaps else 60.0)
    own = {step for step, values in run.steps if step > 0 and _validates(values)}
    config = run.config if own else {**run.config, "trainer.test_freq": VALIDATION_EVERY}
    steps, times, shift, shifts = [], {}, 0.0, []
    for step, values in run.steps:
        if step in own or (not own and step > 0 and step % VALIDATION_EVERY == 0):
            shift += testing
            values = dict(values)
            values["timing_s/testing"] = testing
            logged = values.get("timing_s/step", values.get("timing/step"))
            if logged is not None and math.isfinite(logged):
                values["timing_s/step"] = logged + testing
        steps.append((step, values))
        times[step] = run.times[step] + shift
        shifts.append((run.times[step], shift))
    # An event before a step's line is part of that step, after its validation (verl saves after validating).
    events = [(time + next((moved for at, moved in shifts if at >= time), shift), line) for time, line in run.events]
    return run.but(config=config, steps=steps, times=times, events=events)


def resume_point(run: Run) -> int:
    """The step a resumed copy of ``run`` starts at."""
    numbers = [step for step, _ in run.steps]
    if len(numbers) >= 120:
        return RESUME_AT
    return numbers[len(numbers) // 2] if numbers else 0


def resumed(name: str, run: Run) -> Run:
    start = resume_point(run)
    begins = run.times.get(start, -math.inf)
    return run.but(steps=[(step, values) for step, values in run.steps if step >= start],
                   events=[(time, line) for time, line in run.events if time >= begins])


def _in_reward_units(key: str) -> bool:
    if key.startswith(IN_REWARD_UNITS):
        return True
    return is_validation_key(key) and ("reward" in key or "score" in key)


def rescaled(name: str, run: Run) -> Run:
    powers = {"critic/vf_loss": 2, "critic/grad_norm": 1}
    steps = []
    for step, values in run.steps:
        out = dict(values)  # a NaN or Inf stays as logged
        for key, value in values.items():
            power = powers.get(key, 1 if _in_reward_units(key) else 0)
            if power and math.isfinite(value):
                out[key] = value * REWARD_SCALE ** power
        steps.append((step, out))
    return run.but(steps=steps)


def progress_bars(name: str, run: Run) -> Run:
    return run  # the bars are drawn when the run is written (``write_run``)


TRANSFORMS: dict[str, Callable[[str, Run], Run]] = {
    "sparse": sparse,
    "small-batch": small_batch,
    "long-validation": long_validation,
    "zero-gradient": zero_gradient,
    "resumed": resumed,
    "progress-bars": progress_bars,
    "rescaled": rescaled,
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
    return (f"Training Progress:  {100 * step // max(total, 1)}%|{'#' * done}{' ' * (10 - done)}| "
            f"{step}/{total} [00:10<01:00,  1.00s/it]")


def _stamp(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z "


def write_run(run: Run, path: Path, *, bars: bool = False) -> None:
    """``run`` as verl's console prints it, each line stamped with its time: the config print and total
    steps before the first step, the steps and events in time order, then the end."""
    entries: list[tuple[float, int, str]] = []
    total = run.total_steps or (run.steps[-1][0] if run.steps else 0)
    for step, values in run.steps:
        text = f"step:{step} - " + " - ".join(f"{key}:{_number(value)}" for key, value in values.items())
        if bars:
            text = text + " -\r" + _bar(step, total)
            if step % 3 == 0:
                text = _bar(step - 1, total) + "\r" + text
        entries.append((run.times[step], 1, text))
    entries += [(time, 0, line) for time, line in run.events]
    entries.sort(key=lambda entry: entry[:2])
    first = entries[0][0] if entries else 0.0
    lines = []
    if run.config:  # verl's config has a trainer section; the exporter takes no other dict for it
        lines.append(_stamp(first) + repr(_nested({"trainer.critic_warmup": 0, **run.config})))
    if run.total_steps is not None:
        lines.append(_stamp(first) + f"Total training steps: {run.total_steps}")
    lines += [text if "\n" in text else _stamp(time) + text for time, _, text in entries]  # a crash as printed
    if run.finished:
        lines.append(_stamp(entries[-1][0] if entries else first) + "Final validation metrics: {}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_transformed(name: str, transform: str, source: str, path: Path) -> Run:
    """The log ``source`` of run ``name`` rewritten under ``transform`` to ``path``; the transformed run."""
    run = TRANSFORMS[transform](name, read_run(source))
    write_run(run, path, bars=transform == "progress-bars")
    return run
