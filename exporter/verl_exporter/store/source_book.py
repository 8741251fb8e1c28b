"""What the sources report of their files, as the store serves it: lines that could not be read,
values left out (not a number, an object, a key too long), and whether each path can be read.

Each count is kept per source up to ``max_sources`` names; past that, a new source's counts go to
``other``, so a directory of a million files cannot grow the exposition. Not locked: ``RunStore``
calls it under its own lock.
"""

from __future__ import annotations

from collections import Counter

OTHER = "other"


class SourceBook:
    """Parse errors, values dropped and source states, capped at ``max_sources`` names each."""

    def __init__(self, max_sources: int = 1000):
        self.max_sources = max_sources
        self.parse_errors: Counter[str] = Counter()
        self.values_dropped: Counter[tuple[str, str]] = Counter()
        self._states: dict[str, str | None] = {}
        self._unreadable = 0  # of the sources, those that cannot be read

    def count_error(self, source: str) -> None:
        """One line of ``source`` that could not be read."""
        if source not in self.parse_errors and len(self.parse_errors) >= self.max_sources:
            source = OTHER
        self.parse_errors[source] += 1

    def count_dropped(self, source: str, reason: str, count: int = 1) -> None:
        """``count`` values of ``source`` left out for ``reason``."""
        key = (source, reason)
        if key not in self.values_dropped and len(self.values_dropped) >= self.max_sources:
            key = (OTHER, reason)
        self.values_dropped[key] += count

    def set_state(self, source: str, reason: str | None) -> None:
        """Whether ``source`` can be read: ``reason`` says why not, None when it can."""
        self._unreadable += (reason is not None) - (self._states.get(source) is not None)
        self._states[source] = reason

    def forget(self, source: str) -> None:
        """``source`` is no longer matched (a glob's file went away)."""
        if source in self._states:
            self._unreadable -= self._states.pop(source) is not None

    def served_states(self) -> dict[str, str | None]:
        """The sources' states as served: at most ``max_sources`` by name, the rest as one
        ``other``, unreadable (with how many) when any of them is."""
        states, cap = self._states, self.max_sources
        if len(states) <= cap:
            return dict(states)
        served: dict[str, str | None] = {}
        for name, reason in states.items():
            if len(served) == cap:
                break
            served[name] = reason
        rest = self._unreadable - sum(reason is not None for reason in served.values())
        served[OTHER] = f"{rest} more sources cannot be read" if rest else None
        return served
