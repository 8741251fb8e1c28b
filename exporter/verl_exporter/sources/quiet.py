"""Console lines that need no reading: a line that holds none of the words any reader of a console
line looks for (a step, a continuation after one, the config print, the run's names, its length, a
checkpoint save, the end of training, an error, the trainer's fatal end), and is a Ray actor's line
(``(TaskRunner pid=N) ...``) or, while no traceback of the driver is being read, one of the driver's
without ANSI codes (a progress bar). Most of a verl log is such lines (sample prompts, rollout logs,
bars): one match and one search in C tell them, instead of every reader's tests."""

from __future__ import annotations

import re

from verl_exporter.sources import checkpoint, errors, fatal
from verl_exporter.sources.console import ANSI

# A step line's "step:" may have ANSI codes between its letters (``console.content`` removes them
# before it reads the line): "step:" is looked for with any of them in between.
_STEP = f"(?:{ANSI.pattern})*".join("step:")
# "Final" is the end of training even where ANSI codes colour its words apart; "\r", a line of carriage
# returns (read segment by segment: none of them holds a word the line does not).
WORDS = (checkpoint.MARKER, "Total training steps:", "Final", "{'", "_name': '", "\r", *errors.WORDS, *fatal.WORDS)
ACTOR_LINE = re.compile(r"(?:\x1b\[[0-9;]*m)*\(")  # a Ray actor's line: "(TaskRunner pid=N) ..."
_WORDS = re.compile("|".join([_STEP, *map(re.escape, WORDS)]))


def is_quiet(line: str, trainer_exit: fatal.TrainerExit) -> bool:
    """True for a line without "step:" or any of ``WORDS`` that is a Ray actor's, or the driver's
    without ANSI codes while ``trainer_exit`` is at rest: read outside a config print after a line
    that is no step (or its continuation), it gives no record and changes nothing; after one, it
    ends the step's continuation lines where it holds no "-" (it is none of them)."""
    if ACTOR_LINE.match(line) is None and ("\x1b" in line or not trainer_exit.at_rest):
        return False
    return _WORDS.search(line) is None
