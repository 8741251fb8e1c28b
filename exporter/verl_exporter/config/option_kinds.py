"""The kinds of the exporter's options (``options.Option.kind``): what a value may be, how it is
read from the command line, the environment or the options file, and how it is shown in the help."""

from __future__ import annotations

import re
import threading
from typing import Any, Callable

from verl_exporter.config.durations import DurationError, format_duration, parse_duration

# Each type turns a value from the command line (a string; a bool for a switch, a list for a
# repeatable option), the environment (a string) or the options file (any YAML) into the option's
# value, or raises ValueError with what is wrong ("must be ..., not 'x'").


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Kind:
    metavar = "VALUE"

    def parse(self, value: Any) -> Any:
        raise NotImplementedError

    def show(self, value: Any) -> str:
        return "none" if value is None else str(value)


class Text(Kind):
    """A string; a number in the options file is taken as its text (``experiment: 7``)."""

    def __init__(self, metavar: str = "TEXT", check: Callable[[str], None] | None = None):
        self.metavar, self.check = metavar, check

    def parse(self, value: Any) -> str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise ValueError(f"must be a string, not {_shown(value)}")
        if self.check is not None:
            self.check(value)
        return value


class Count(Kind):
    """A whole number above 0 (a cap, a count, a PID)."""

    metavar = "N"

    def parse(self, value: Any) -> int:
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
            number = int(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            raise ValueError(f"must be a whole number, not {_shown(value)}")
        if number <= 0:
            raise ValueError(f"must be positive, not {number}")
        return number


class Switch(Kind):
    """``--x`` / ``--no-x`` on the command line, ``true`` or ``false`` in the options file."""

    def parse(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, not {_shown(value)}")
        return value

    def show(self, value: Any) -> str:
        return "on" if value else "off"


class Paths(Kind):
    """Repeatable on the command line; a path or a list of paths in the options file."""

    metavar = "PATH"

    def parse(self, value: Any) -> tuple[str, ...]:
        items = value if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(item, str) for item in items):
            raise ValueError(f"must be a path or a list of paths, not {_shown(value)}")
        return tuple(items)

    def show(self, value: Any) -> str:
        return ", ".join(value) or "none"


class Choice(Kind):
    """One of a few words, any case; ``aliases`` maps other spellings to them."""

    def __init__(self, *choices: str, aliases: dict[str, str] | None = None):
        self.choices, self.aliases = choices, aliases or {}
        self.metavar = "{" + ",".join(choices) + "}"

    def parse(self, value: Any) -> str:
        word = value.lower() if isinstance(value, str) else None
        word = self.aliases.get(word, word) if word is not None else None
        if word not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}, not {_shown(value)}")
        return word


class Duration(Kind):
    """Seconds, written in the project's duration grammar (``500ms``, ``30s``, ``1h30m``, ``7d``) or
    as a bare number of seconds; ``positive`` where 0 means nothing useful."""

    metavar = "DURATION"
    LONGEST = threading.TIMEOUT_MAX  # a wait longer than this cannot be waited for

    def __init__(self, positive: bool = False):
        self.positive = positive

    def parse(self, value: Any) -> float:
        wrong = f"must be a duration such as 500ms, 30s, 10m or 1h30m, not {_shown(value)}"
        if value is None or value == "" or isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(wrong)
        try:
            seconds = parse_duration(value)
        except DurationError:
            raise ValueError(wrong) from None
        if self.positive and seconds <= 0:
            raise ValueError(f"must be positive, not {_shown(value)}")
        if seconds > self.LONGEST:
            raise ValueError(f"must be at most {format_duration(self.LONGEST)}, not {_shown(value)}")
        return seconds

    def show(self, value: Any) -> str:
        return format_duration(value)


TEXT, COUNT, SWITCH, DURATION = Text(), Count(), Switch(), Duration()
