"""The keys of verl's step lines, remembered: a run logs the same keys, in the same order, at nearly
every step. A line whose keys are those of a layout seen before is read by one compiled regex that
takes its values (``step:N - key:value - ...``, each value made of number characters only), so its
keys are not split out and checked again. Any other line is left to the caller (None).

A layout is compiled the second time its keys are read, at most MAX_LAYOUTS of them per process and
none of more than MAX_KEYS keys: whatever a log holds, compiling costs a bounded time.
"""

from __future__ import annotations

import re
import threading

MAX_LAYOUTS = 16
MAX_KEYS = 1000
MAX_SEEN = 64  # layouts read once, remembered to be compiled when read again
_NUMBER = "([-+.0-9eE]+)"  # as console._plain_pairs reads a value: number characters, at least one


class StepLayouts:
    """The layouts compiled so far, and by the count of their keys the one last used (a run's lines
    with validation metrics have more keys than its other lines: each finds its own)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, ...], re.Pattern] = {}
        self._last: dict[int, tuple[tuple[str, ...], re.Pattern]] = {}
        self._seen: set[tuple[str, ...]] = set()  # keys read without a layout (at most MAX_SEEN)
        self._lock = threading.Lock()

    def values(self, text: str) -> dict[str, str] | None:
        """``{key: "value"}`` of ``text`` (a step line without its prefix, from ``step:`` on) where
        it has the keys of the layout of as many keys last used; None otherwise."""
        last = self._last.get(text.count(":"))
        if last is None:
            return None
        match = last[1].fullmatch(text)
        return dict(zip(last[0], match.groups())) if match else None

    def read(self, keys: list[str]) -> None:
        """A line with these keys, in this order, was read without a layout: its layout is used for
        the next line of as many keys where it is known, compiled where these keys were read before."""
        layout = tuple(keys)
        with self._lock:
            pattern = self._known.get(layout)
            if pattern is None and len(keys) <= MAX_KEYS:
                if layout in self._seen and len(self._known) < MAX_LAYOUTS:
                    pattern = self._known[layout] = re.compile(
                        "step:[0-9]+" + "".join(f" - {re.escape(key)}:{_NUMBER}" for key in keys))
                elif len(self._seen) >= MAX_SEEN:
                    self._seen.clear()
                self._seen.add(layout)
            if pattern is not None:
                self._last[len(keys) + 1] = layout, pattern  # the colons of its lines


LAYOUTS = StepLayouts()
