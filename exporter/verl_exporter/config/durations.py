"""Durations, in one grammar for options, rule files and replays: Prometheus's.

A duration is units in decreasing order, each at most once, with whole numbers: ``90s``, ``1h30m``,
``7d``, ``500ms``, ``1y2w``; or ``0``. A bare number (``2``, ``0.5``) is seconds, for options
written as numbers in YAML. Nothing else is one: no spaces, no negative numbers, no ``10 minutes``.
"""

from __future__ import annotations

import re

UNIT_SECONDS = {"y": 31_536_000, "w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1, "ms": 0.001}
_PATTERN = re.compile("".join(rf"(?:(?P<{'milli' if unit == 'ms' else unit}>[0-9]+){unit})?"
                              for unit in UNIT_SECONDS))
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")
MAX_CHARS = 64


class DurationError(ValueError):
    """Text that is no duration; the message names the text."""


def parse_duration(text: str | int | float | None) -> float:
    """Seconds of ``text``: a Prometheus duration (``1h30m``), ``0``, or a bare number of seconds.
    None and the empty string are 0. DurationError for anything else."""
    if text is None or text == "":
        return 0.0
    if isinstance(text, bool):
        raise DurationError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if not 0 <= text < float("inf"):
            raise DurationError(f"not a duration: {text!r} (want a non-negative number of seconds)")
        return float(text)
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        raise DurationError(f"not a duration: {str(text)[:MAX_CHARS]!r}")
    if _SECONDS.fullmatch(text):
        return float(text)
    match = _PATTERN.fullmatch(text)
    if not text or match is None or not any(match.groups()):
        raise DurationError(f"not a duration: {text!r} (want e.g. 90s, 30m, 1h30m, 7d)")
    return float(sum(int(value) * UNIT_SECONDS["ms" if group == "milli" else group]
                     for group, value in match.groupdict().items() if value))


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration for ``seconds``, rounded to whole milliseconds:
    ``5400`` -> ``1h30m``, ``0.5`` -> ``500ms``, ``0`` -> ``0s``."""
    millis = int(round(seconds * 1000))
    if millis <= 0:
        return "0s"
    parts = []
    for unit, size in UNIT_SECONDS.items():
        unit_millis = int(round(size * 1000))
        count, millis = divmod(millis, unit_millis)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
