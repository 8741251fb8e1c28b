"""Console lines that need no reading: a Ray actor's line (``(TaskRunner pid=N) ...``) that holds
none of the words any reader of a console line looks for (a step, a continuation after one, the
config print, the run's names, its length, a checkpoint save, the end of training, an error).
Most of a verl log is such lines (sample prompts, rollout logs): one match and one search in C
tell them, instead of every reader's tests."""

from __future__ import annotations

import re

from verl_exporter.sources import checkpoint, errors
from verl_exporter.sources.console import _ANSI

# A step line's "step:" may have ANSI codes between its letters (``console._content`` removes them
# before it reads the line): "step:" is looked for with any of them in between.
_STEP = f"(?:{_ANSI.pattern})*".join("step:")
# "Final" is the end of training even where ANSI codes colour its words apart; "\r", a line of carriage
# returns (read segment by segment: none of them holds a word the line does not).
WORDS = (checkpoint.MARKER, "Total training steps:", "Final", "{'", "_name': '", "\r", *errors.WORDS)
ACTOR_LINE = re.compile(r"(?:\x1b\[[0-9;]*m)*\(")  # a Ray actor's line: "(TaskRunner pid=N) ..."
_WORDS = re.compile("|".join([_STEP, *map(re.escape, WORDS)]))


def is_quiet(line: str) -> bool:
    """True for a Ray actor's line without "step:" or any of ``WORDS``: read outside a config print
    after a line that is no step (or its continuation), it gives no record and changes nothing;
    after one, it ends the step's continuation lines where it holds no "-" (it is none of them)."""
    return ACTOR_LINE.match(line) is not None and _WORDS.search(line) is None
