"""What a renderer made of each run, kept until the run changes.

The store gives every run a version that changes whenever the run does; a ``RunCache`` asks it
only for the runs whose version differs from what it holds, builds each of those once, and drops
the runs the store no longer has. A scrape of an unchanged store copies no run.
"""

from __future__ import annotations

import logging
from typing import Callable, Generic, TypeVar

from verl_exporter.store.records import RunKey
from verl_exporter.store.run_state import RunState, StoreSnapshot
from verl_exporter.store.run_store import RunStore

log = logging.getLogger(__name__)
Built = TypeVar("Built")
_WARNED_RUNS: set = set()  # runs whose families could not be built, warned about once (bounded)


def unrenderable(run: RunKey, exc: Exception) -> None:
    """Log, once per run, that the run's families could not be built; it is left out of the scrape."""
    if run not in _WARNED_RUNS and len(_WARNED_RUNS) < 1000:
        _WARNED_RUNS.add(run)
        log.warning("run %r left out of /metrics: its values cannot be served (%s: %s)", run, type(exc).__name__,
                    str(exc)[:200])


class RunCache(Generic[Built]):
    """``build(state)`` of every run, rebuilt when the run's version changes. A run whose build
    raises is left out (and logged once), alone."""

    def __init__(self, store: RunStore, build: Callable[[RunState], Built]):
        self.store = store
        self.build = build
        self.by_run: dict[RunKey, Built] = {}
        self._versions: dict[RunKey, int] = {}
        self._serial: int | None = None

    def update(self) -> tuple[StoreSnapshot, bool]:
        """Bring every run up to date: (the store's snapshot of the changed runs, whether any run
        changed, came or went)."""
        snapshot = self.store.snapshot(known=self._versions, since=self._serial)
        self._serial = snapshot.serial
        if snapshot.versions is None:  # no run changed, none came or went
            snapshot.versions, changed = self._versions, False
        else:
            changed = bool(snapshot.runs) or snapshot.versions.keys() != self._versions.keys()
        for state in snapshot.runs:
            try:
                self.by_run[state.run] = self.build(state)
            except Exception as exc:  # what one run logged never fails the others' rendering
                self.by_run.pop(state.run, None)
                unrenderable(state.run, exc)
        if changed:
            for gone in self._versions.keys() - snapshot.versions.keys():
                self.by_run.pop(gone, None)
        self._versions = snapshot.versions
        return snapshot, changed

    def in_order(self) -> list[Built]:
        """What was built of each run, the runs sorted by (project, experiment)."""
        return [self.by_run[run] for run in sorted(self.by_run)]
