"""Failures that users reported in verl's issues, rebuilt from a real healthy log: its steps up to a
point, then the values the reporter pasted (``FAILURES``, written by ``write_failure``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from real_runs import log_files
from verl_exporter.history.timeline import read_file

NAN = math.nan
ACTOR_NAN = {key: NAN for key in ("actor/kl_loss", "actor/entropy_loss", "actor/entropy", "actor/pg_loss",
                                   "actor/ppo_kl", "actor/grad_norm")}
NO_SIGNAL = {"critic/advantages/mean": 0.0, "critic/advantages/max": 0.0, "critic/advantages/min": 0.0}


def pinned_responses(length: float) -> dict[str, float]:
    return {"response_length/mean": length, "response_length/max": length, "response_length/min": length,
            "response_length/clip_ratio": 1.0}


def scores(value: float) -> dict[str, float]:
    return {f"critic/{kind}/{stat}": value for kind in ("score", "rewards") for stat in ("mean", "max", "min")}


@dataclass
class Failure:
    """``base``'s steps up to ``last``; from step ``at`` on, ``values`` replace what was logged (and
    ``first`` only at step ``at``)."""

    issue: str
    base: str
    last: int
    at: int
    values: dict[str, float]
    fires: set[str]
    first: dict[str, float] = field(default_factory=dict)
    nonfinite_key: str = ""  # VerlTrainingNonFinite must name a key starting so


FAILURES = [
    Failure("TinyZero#101: grad norm always NaN with a tiny batch (PPO)", "verl-data-ppo-qwen0.5b-resp512",
            last=120, at=80,
            values={**ACTOR_NAN, **{key: NAN for key in (
                "critic/kl", "critic/vf_loss", "critic/vpred_mean", "critic/grad_norm", "critic/rewards/mean",
                "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min", "critic/returns/mean",
                "critic/values/mean", "critic/vf_explained_var")},
                    "critic/score/mean": 0.0, **pinned_responses(512.0)},
            fires={"VerlTrainingNonFinite"}, nonfinite_key="actor/"),
    Failure("verl#498: critic/vf_loss NaN at step 1, the actor finite (PPO)", "mi300-ppo-deepseek7b",
            last=40, at=1,
            values={"critic/vf_loss": NAN, "critic/vpred_mean": NAN, "critic/grad_norm": NAN},
            first={"actor/grad_norm": 9.819, "critic/vf_explained_var": -72.348, "critic/kl_coeff": 0.04},
            fires={"VerlTrainingNonFinite"}, nonfinite_key="critic/"),
    Failure("verl#721, #2626: NaN, then reward 0 and responses pinned at the maximum length (GRPO)",
            "mi300-grpo-deepseek7b", last=110, at=60,
            values={**ACTOR_NAN, **scores(0.0), **NO_SIGNAL, **pinned_responses(1024.0)},
            first={"actor/pg_clipfrac": 0.002},
            fires={"VerlTrainingNonFinite", "VerlResponsesTruncated", "VerlScoreCollapsed", "VerlNoLearningSignal"},
            nonfinite_key="actor/"),
    Failure("rllm#54: test score always 0, no learning signal (GRPO)", "mi300-grpo-deepseek7b", last=60, at=1,
            values={**scores(0.0), **NO_SIGNAL, "actor/pg_loss": 0.0, "actor/grad_norm": 0.004,
                    "response_length/max": 4096.0, "batch/solve_none": 128.0, "batch/solve_all": 0.0},
            fires={"VerlNoLearningSignal"}),
    Failure("Agent-R1#30: NaN in GRPO, score -1 and every response cut at 257 tokens",
            "opd-grpo-qwen2.5-3b-kl0.001-healthy-52steps", last=45, at=20,
            values={**ACTOR_NAN, **scores(-1.0), **NO_SIGNAL, **pinned_responses(257.0)},
            fires={"VerlTrainingNonFinite", "VerlResponsesTruncated", "VerlNoLearningSignal"},
            nonfinite_key="actor/"),
]


def _number(value: float) -> str:
    return "nan" if math.isnan(value) else repr(value)


def write_failure(failure: Failure, path: Path) -> None:
    """The base run's steps as verl's console prints them, with the failure's values from step ``at``."""
    lines = []
    for step in read_file(log_files(failure.base)[0]).steps:
        if step.step > failure.last:
            break
        values: dict[str, float] = {}
        for record in step.records:
            if record.run_config is None and record.total_steps is None and not record.finished:
                values.update({key: float(value) for key, value in record.values.items()})
        if not values:
            continue
        if step.step >= failure.at:
            values.update(failure.values)
        if step.step == failure.at:
            values.update(failure.first)
        lines.append(f"step:{step.step} - " + " - ".join(f"{key}:{_number(value)}" for key, value in values.items()))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
