"""Which followed runs have stalled, each stall reported once.

A run that has not finished stalls when

- it logged no step for longer than the larger of ``stall_after`` and ``MEDIAN_FACTOR`` times the
  median of its step durations (verl's ``timing_s/step``);
- it logged no first step ``max(stall_after, NO_FIRST_STEP_SECONDS)`` after its first line;
- or (with a job selector) the job's processes went away: seen running, then gone for
  ``exit_grace`` seconds (time for the log's last lines to be read), and the run still unfinished.

A checkpoint save under way (verl's ``local_global_step_folder:`` line until the next step) is no
stall for up to the catalog's ``checkpoint_save_ceiling_seconds``, the alert rules' own ceiling.

A stall is reported once: a step that comes in ends it, and the next one is reported again.

The watch reads the store at check time, copying only the runs that changed since the previous
check, and keeps per run only what it needs: the step clock, the files the run was read from and
the last ``STEP_SAMPLES`` step durations it saw. A step that came and went between two checks is
not sampled, so the median is that of the steps the checks saw; nothing is added to ingestion.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from verl_exporter.store.records import STEP_DURATION_KEYS, RunKey, logged_seconds
from verl_exporter.store.run_state import RunState
from verl_exporter.store.run_store import RunStore

STEP_SAMPLES = 64
MEDIAN_FACTOR = 5
NO_FIRST_STEP_SECONDS = 3600.0
MAX_SOURCES = 8  # files remembered per run
EXIT_GRACE_SECONDS = 2.0


@dataclass
class Stall:
    """One stall of one run: ``kind`` is ``no_step``, ``no_first_step``, ``job_exited`` or ``fatal``
    (the trainer's output ended in a fatal error, ``sources.fatal``); ``why``
    says it in one line; ``sources`` are the files the run was read from, latest first."""

    run: RunKey
    kind: str
    why: str
    sources: list[str]


@dataclass
class _View:
    last_step: int | None = None
    last_step_time: float | None = None
    started_at: float | None = None
    finished: bool = False
    sources: dict[str, None] = field(default_factory=dict)  # insertion-ordered set, latest last
    step_seconds: deque = field(default_factory=lambda: deque(maxlen=STEP_SAMPLES))
    sampled: tuple | None = None  # the episode whose step duration was sampled
    reported: tuple | None = None  # the episode already reported
    saving_since: float | None = None  # when the checkpoint save under way started
    fatal: tuple[str, int] | None = None  # the trainer's fatal end: its kind, at the run's step

    @property
    def episode(self) -> tuple:
        """What a step changes: the stall in progress is the one since this step."""
        return self.last_step, self.last_step_time


class StallWatch:
    """Call :meth:`check` now and then; it returns the stalls not reported yet."""

    def __init__(self, store: RunStore, *, stall_after: float = 600.0, exit_grace: float = EXIT_GRACE_SECONDS,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.save_ceiling = store.catalog.system.get("checkpoint_save_ceiling_seconds", 8 * 3600.0)
        self.stall_after = stall_after
        self.exit_grace = exit_grace
        self.clock = clock
        self._views: dict[RunKey, _View] = {}
        self._versions: dict[RunKey, int] = {}
        self._serial: int | None = None
        self._job_seen = False  # the job's processes were seen running
        self._exited_at: float | None = None  # when they were first seen gone
        self._exit_runs: set[RunKey] = set()  # runs to report as left by the job's exit

    def median_step_seconds(self, run: RunKey) -> float | None:
        view = self._views.get(run)
        return statistics.median(view.step_seconds) if view and view.step_seconds else None

    def threshold(self, run: RunKey) -> float:
        """How long the run may go without a step."""
        median = self.median_step_seconds(run)
        return max(self.stall_after, MEDIAN_FACTOR * median) if median is not None else self.stall_after

    def check(self, job_running: bool | None = None,
              node_runs: Callable[[], Iterable[RunKey]] = lambda: (), limit: int | None = None) -> list[Stall]:
        """The stalls found now, at most ``limit`` (the others are found by the next check).
        ``job_running``: whether the job's processes run (None: no job selector); ``node_runs``:
        the runs this node's job works for."""
        now = self.clock()
        self._read_store()
        stalls: list[Stall] = []
        self._job_exited(job_running, now, node_runs)
        for run in list(self._exit_runs):
            view = self._views.get(run)
            if limit is not None and len(stalls) >= limit:
                break
            self._exit_runs.discard(run)
            if view is not None and not view.finished and view.reported != view.episode:
                view.reported = view.episode
                stalls.append(Stall(run, "job_exited", self._exit_why(view), self._sources(view)))
        for run, view in self._views.items():
            if limit is not None and len(stalls) >= limit:
                break
            if view.finished or view.reported == view.episode:
                continue
            why = self._stalled(run, view, now)
            if why is not None:
                view.reported = view.episode
                stalls.append(Stall(run, why[0], why[1], self._sources(view)))
        return stalls

    def state(self, run: RunKey) -> RunState | None:
        """A full copy of one run's state (errors, checkpoint, values) as the store holds it now."""
        return self.store.run(run)

    def _read_store(self) -> None:
        snapshot = self.store.snapshot(known=self._versions, since=self._serial)
        for state in snapshot.runs:
            self._update(self._views.setdefault(state.run, _View()), state)
        if snapshot.versions is not None:
            self._versions = snapshot.versions
            for run in [run for run in self._views if run not in snapshot.versions]:
                del self._views[run]  # dropped by the store's retention
        self._serial = snapshot.serial

    @staticmethod
    def _update(view: _View, state: RunState) -> None:
        view.last_step, view.last_step_time = state.last_step, state.last_step_time
        view.started_at, view.finished, view.fatal = state.started_at, state.finished, state.fatal
        if state.source:
            view.sources.pop(state.source, None)
            view.sources[state.source] = None
            while len(view.sources) > MAX_SOURCES:
                del view.sources[next(iter(view.sources))]
        if state.last_step is not None and view.sampled != view.episode:
            view.sampled = view.episode
            seconds = logged_seconds(state.values, STEP_DURATION_KEYS, positive=True)
            if seconds is not None:
                view.step_seconds.append(seconds)
        checkpoint = state.checkpoint
        view.saving_since = checkpoint.started if checkpoint is not None and checkpoint.saving else None

    def _stalled(self, run: RunKey, view: _View, now: float) -> tuple[str, str] | None:
        if view.fatal is not None:  # no need to wait: the trainer said it stopped
            where = f"at step {view.fatal[1]}" if view.last_step is not None else "before its first step"
            return "fatal", f"the trainer's output ended in a fatal {view.fatal[0]} error {where}"
        if view.last_step_time is not None:
            idle, limit = now - view.last_step_time, self.threshold(run)
            if idle <= limit or (view.saving_since is not None
                                 and now - view.saving_since < self.save_ceiling):
                return None
            median = self.median_step_seconds(run)
            rule = (f"the larger of --forensics.stall-after {duration(self.stall_after)} and {MEDIAN_FACTOR} x "
                    f"the median step time {duration(median)}" if median is not None
                    else f"--forensics.stall-after {duration(self.stall_after)}; no step time known")
            return "no_step", (f"no step for {duration(idle)} since step {view.last_step} "
                               f"(the limit is {duration(limit)}: {rule})")
        if view.started_at is not None:
            waited, limit = now - view.started_at, max(self.stall_after, NO_FIRST_STEP_SECONDS)
            if waited > limit:
                return "no_first_step", (f"no first step {duration(waited)} after the run's first line "
                                         f"(the limit is {duration(limit)})")
        return None

    def _job_exited(self, job_running: bool | None, now: float,
                    node_runs: Callable[[], Iterable[RunKey]]) -> None:
        """Once the job's processes, seen before, have been gone for ``exit_grace``: this node's
        unfinished runs are to be reported (``_exit_runs``)."""
        if job_running is None:
            return
        if job_running:
            self._job_seen, self._exited_at, self._exit_runs = True, None, set()
            return
        if not self._job_seen:
            return
        if self._exited_at is None:
            self._exited_at = now
        if now - self._exited_at >= self.exit_grace:
            self._job_seen = False  # the next exit needs the job seen running again
            mine = set(node_runs())
            self._exit_runs = {run for run, view in self._views.items()
                               if run in mine and not view.finished}

    @staticmethod
    def _exit_why(view: _View) -> str:
        where = f"after step {view.last_step}" if view.last_step is not None else "before its first step"
        return f"the job's processes exited {where}, before the run finished"

    @staticmethod
    def _sources(view: _View) -> list[str]:
        return list(reversed(view.sources))


def duration(seconds: float | None) -> str:
    """``seconds`` for people: ``4.5s``, ``10m``, ``12m03s``, ``2h05m``, ``3d04h``."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = int(seconds)
    for size, unit, part, part_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if whole >= size:
            big, rest = divmod(whole, size)
            rest //= part
            return f"{big}{unit}{rest:02d}{part_unit}" if rest else f"{big}{unit}"
    return f"{whole}s"
