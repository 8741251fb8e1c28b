"""Long runs of verl's V1 trainer built from its 6-step fixtures (tests/fixtures/verl/0.9.1/v1-<mode>/), so
that the rules' step statistics (20-60 steps) can be replayed over them.

``tiled``: a healthy run of ``STEPS`` steps, one every ``seconds``, each step's values the fixture's steps in
turn (its NaN/Inf gradient-norm steps left out) with small seeded noise, under the fixture's own config
print; each step's durations and throughput scaled as ``history.tempo`` scales them, to a step of ``seconds``.
``changed``: the same run with some keys set by step (a healthy level; a failure from ``ONSET``). The noise
is seeded by the fixture's mode, so a failing run is its healthy twin plus the change.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

from regimes import Run, read_run, write_run
from servers import REPO
from verl_exporter.history.tempo import DURATION_PREFIXES, RATE_KEYS

FIXTURES = REPO / "tests" / "fixtures" / "verl" / "0.9.1"
PROJECT = "v1-replays"
STEPS = 60
ONSET = 35
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
NOISE = 0.02  # relative noise of the fixture's non-integer values

Values = Callable[[int], float | None]  # step -> the value logged at it (None: not logged)


def tiled(mode: str, name: str, *, seconds: float = 60.0, steps: int = STEPS) -> Run:
    """A healthy ``steps``-step run named ``name`` from fixture ``v1-<mode>``, one step every ``seconds``."""
    fixture = read_run(str(FIXTURES / f"v1-{mode}" / "console.log"))
    first, *rest = fixture.steps  # step 0: the validation before training
    source = [values for _, values in rest if math.isfinite(values.get("actor/grad_norm", 0.0))]
    rng = random.Random(mode)
    run_steps = [(0, dict(first[1]))]
    for step in range(1, steps + 1):
        values = {key: value if float(value).is_integer() else value * (1 + rng.gauss(0, NOISE))
                  for key, value in source[(step - 1) % len(source)].items()}
        values["training/global_step"] = float(step)
        run_steps.append((step, paced(values, seconds)))
    config = {**fixture.config, "trainer.project_name": PROJECT, "trainer.experiment_name": name}
    return Run(config=config, total_steps=steps, steps=run_steps,
               times={step: START + seconds * step for step, _ in run_steps}, finished=fixture.finished)


def paced(values: dict[str, float], seconds: float) -> dict[str, float]:
    """A step's values as if it took ``seconds``: its durations scaled to it, its throughput inversely."""
    factor = seconds / values["timing_s/step"]
    return {key: value * factor if key.startswith(DURATION_PREFIXES) else value / factor if key in RATE_KEYS
            else value for key, value in values.items()}


def changed(run: Run, keys: dict[str, Values], *, start: int = 1, config: dict | None = None) -> Run:
    """``run`` with each of ``keys`` set, from step ``start`` on, to its value at the step (left out where that is
    None), and with the settings of ``config``."""
    steps = []
    for step, values in run.steps:
        if step >= max(start, 1):
            values = {key: value for key, value in values.items() if key not in keys}
            values.update({key: value for key, value_at in keys.items() if (value := value_at(step)) is not None})
        steps.append((step, values))
    return run.but(steps=steps, config={**run.config, **(config or {})})


def level(mean: float, spread: float, seed: str) -> Values:
    """A level with seeded noise: ``mean`` +- ``spread`` (uniform) at each step."""
    return lambda step: mean + random.Random(f"{seed}:{step}").uniform(-spread, spread)


def sometimes(value: float, share: float, seed: str, otherwise: float | None = None) -> Values:
    """``value`` at a seeded ``share`` of the steps, ``otherwise`` at the others."""
    return lambda step: value if random.Random(f"{seed}:{step}").random() < share else otherwise


def write(run: Run, folder: Path) -> str:
    """``run`` written as verl's console prints it, to ``folder/<experiment>/console.log`` (a job of its own)."""
    path = folder / run.config["trainer.experiment_name"] / "console.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_run(run, path)
    return str(path)
