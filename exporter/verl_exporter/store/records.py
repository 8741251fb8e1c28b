"""The one shape every source yields: a run's metrics at one training step."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# Counts one value a parser left out, by reason ("not_a_number", "object", "list", "null").
DropCounter = Callable[[str], None]
# How long verl says a step took (timing/step before 0.4; perf/time_per_step in its throughput keys).
STEP_DURATION_KEYS = ("timing_s/step", "timing/step", "perf/time_per_step")
# How long verl says a step's checkpoint save took (logged in the step after the save).
CHECKPOINT_SAVE_KEYS = ("timing_s/save_checkpoint", "timing/save_checkpoint")
MAX_STEP = 1 << 53  # beyond this a step is no longer exact as a float sample value
MAX_KEY_CHARS = 256  # of a logged key (verl's longest are under 80: val-core/<data source>/<var>/<stat>)
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, order=True)
class RunKey:
    """A training run, named as verl names it (trainer.project_name, trainer.experiment_name), and
    owned by ``user``: the owner of the file (or the user of the scheduler's job) that named it. Two
    users' runs of the same names are two runs. ``team`` (the owner's team, ``store.owners``) is a
    label, not part of the identity."""

    project: str
    experiment: str
    user: str = ""
    team: str = field(default="", compare=False)

    @property
    def labels(self) -> tuple[str, str, str, str]:
        """The values of the run's labels (``schema.RUN``)."""
        return self.project, self.experiment, self.user, self.team

    def named(self) -> str:
        """``project/experiment``, and the owner where known, for log lines."""
        return f"{self.project}/{self.experiment}" + (f" of {self.user}" if self.user else "")


@dataclass
class Record:
    """The values verl logged for one run at one step.

    ``values`` maps the verl key exactly as logged (``actor/pg_clipfrac``) to a float, which may be
    NaN or +/-Inf, or, where a source defers the conversion, to the number's text (``"0.125"``):
    the store converts it when it is scraped. ``time`` is the wall-clock time (unix seconds) at
    which the record was read.
    ``finished`` is set when the source saw verl's end-of-training marker; ``source`` names the
    file the record came from. A record that carries the run's ``run_config`` (verl's config, flattened
    to dotted keys) or its ``total_steps`` (verl's ``Total training steps: N``) tells the store
    about the run, not about a step: its ``step`` and ``values`` are not used. So does one with a
    ``checkpoint_step``: verl started saving the checkpoint of that step (its
    ``local_global_step_folder: .../global_step_N`` line); the run's next step ends the save. And so
    does one with an ``error``: a line of the log reports an error of that kind (``sources.errors``),
    ``line`` is its text; and one with a ``fatal`` kind: the trainer's output ended in a fatal error
    (``sources.fatal``), ``line`` is its text.
    A record feeds its run only if it comes from the source that first fed the run, or is ``named``:
    its file or its run was named by the operator, not found by a glob, or comes from another file
    of the same ``job`` (``sources.pairing``: a job's stdout and stderr; see ``RunStore.ingest``).
    ``from_path``: the run is named after the file's path, as no config print or flag named it yet;
    the store then gives the record to the run another file of its job named, if one did.
    """

    run: RunKey
    step: int
    values: Mapping[str, float | str] = field(default_factory=dict)
    time: float = 0.0
    finished: bool = False
    source: str = ""
    run_config: dict[str, float | int | str | bool | None] | None = None
    total_steps: int | None = None
    checkpoint_step: int | None = None
    error: str | None = None
    line: str = ""
    named: bool = False  # the operator named the file (a path, not a glob's match) or the run (flags)
    fatal: str | None = None
    job: str = ""  # the job whose output the file is (sources.pairing.job_of), "" where unknown
    from_path: bool = False


def is_event(record: Record) -> bool:
    """A checkpoint save's start, an error the log shows or the trainer's fatal end: something that
    happened, not a step."""
    return record.checkpoint_step is not None or record.error is not None or record.fatal is not None


class ParseError(ValueError):
    """A line that should be a record but cannot be read; the message says why, briefly."""


def logged_seconds(values: Mapping, keys: tuple[str, ...], positive: bool = False) -> float | None:
    """The first of ``keys`` in ``values`` that holds a finite number of seconds (0 or more; more than 0
    where ``positive``), as a float; None where none does."""
    for key in keys:
        if key in values:
            try:
                seconds = float(values[key])
            except (TypeError, ValueError):
                continue
            if (seconds > 0 if positive else seconds >= 0) and seconds != float("inf"):
                return seconds
    return None


def to_float(value: object) -> float:
    """A logged value as a float: numbers, bools and numeric strings ('nan', '1e-3'); else ParseError."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ParseError(f"not a number: {str(value)[:40]!r}")


def check_step(step: int) -> int:
    """``step`` itself when a float holds it exactly (|step| <= 2^53); else ParseError."""
    if -MAX_STEP <= step <= MAX_STEP:
        return step
    raise ParseError(f"step out of range: a {step.bit_length()}-bit integer, over 2^53")


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate (which UTF-8 cannot encode) replaced by U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def display_path(path: str) -> str:
    """A file name as it may be shown and served: bytes that are not UTF-8 (which ``os`` hands
    over as surrogate escapes) as ``\\xNN``, other unprintable characters escaped the same way."""
    if path.isascii() and path.isprintable():
        return path
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
