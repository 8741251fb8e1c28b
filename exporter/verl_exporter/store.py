"""RunStore: the latest value of every metric of every run, and each run's step clock.

Sources write into it (``ingest``, ``parse_error``); the training collector reads a snapshot at
scrape time. Thread-safe and bounded: at most ``max_runs`` runs and ``max_series_per_run`` series
per run; what the caps drop is counted. Nothing is removed while the exporter runs.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from .catalog import Catalog, Resolved
from .records import Record, RunKey

SeriesKey = tuple[str, tuple[str, ...]]  # (metric name, label values)


@dataclass
class RunState:
    """What is known of one run."""

    run: RunKey
    source: str = ""
    last_step: int | None = None
    last_step_time: float | None = None
    steps_ingested: int = 0
    finished: bool = False
    series: dict[SeriesKey, tuple[Resolved, float]] = field(default_factory=dict)
    nonfinite: Counter = field(default_factory=Counter)
    dropped_keys: set[str] = field(default_factory=set)

    def copy(self) -> "RunState":
        return RunState(
            run=self.run,
            source=self.source,
            last_step=self.last_step,
            last_step_time=self.last_step_time,
            steps_ingested=self.steps_ingested,
            finished=self.finished,
            series=dict(self.series),
            nonfinite=Counter(self.nonfinite),
            dropped_keys=set(self.dropped_keys),
        )


@dataclass
class StoreSnapshot:
    runs: list[RunState]
    parse_errors: dict[str, int]
    runs_dropped: int


class RunStore:
    """Latest values per run, fed by sources, read by the training collector."""

    def __init__(self, catalog: Catalog, *, max_series_per_run: int = 2000, max_runs: int = 1000,
                 max_error_sources: int = 1000):
        self.catalog = catalog
        self.max_series_per_run = max_series_per_run
        self.max_runs = max_runs
        self.max_error_sources = max_error_sources
        self._runs: dict[RunKey, RunState] = {}
        self._parse_errors: Counter = Counter()
        self._runs_dropped = 0
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[SeriesKey, Resolved, float]] = {}

    def ingest(self, record: Record) -> None:
        """Take one record: update the run's step clock and the latest value of each key."""
        with self._lock:
            state = self._runs.get(record.run)
            if state is None:
                if len(self._runs) >= self.max_runs:
                    self._runs_dropped += 1
                    return
                state = self._runs[record.run] = RunState(record.run)
            if record.source:
                state.source = record.source
            if record.finished:
                state.finished = True
                return
            if record.step != state.last_step:
                state.last_step = record.step
                state.steps_ingested += 1
                state.finished = False
            state.last_step_time = record.time
            # One tight loop, no call per key: this runs for every key of every logged line.
            series, entries, cap = state.series, self._entries, self.max_series_per_run
            for key, value in record.values.items():
                entry = entries.get(key) or self._entry(key)
                if entry[0] not in series and len(series) >= cap:
                    if len(state.dropped_keys) < 100_000:
                        state.dropped_keys.add(key)
                    continue
                if value - value != 0:  # NaN or +/-inf
                    state.nonfinite[key] += 1
                series[entry[0]] = (entry[1], value * entry[2])

    def _entry(self, key: str) -> tuple[SeriesKey, Resolved, float]:
        """(series key, resolved metric, scale) of a verl key, cached like the catalog's lookups."""
        resolved = self.catalog.resolve(key)
        entry = ((resolved.spec.name, resolved.label_values), resolved, resolved.spec.scale)
        if len(self._entries) < 100_000:
            self._entries[key] = entry
        return entry

    def parse_error(self, source: str, reason: str = "") -> None:
        """Count one line of ``source`` that could not be read."""
        with self._lock:
            if source not in self._parse_errors and len(self._parse_errors) >= self.max_error_sources:
                source = "other"
            self._parse_errors[source] += 1

    def snapshot(self) -> StoreSnapshot:
        """A consistent copy of everything, for one scrape."""
        with self._lock:
            return StoreSnapshot(
                runs=[state.copy() for state in self._runs.values()],
                parse_errors=dict(self._parse_errors),
                runs_dropped=self._runs_dropped,
            )

    def run(self, key: RunKey) -> RunState | None:
        """A copy of one run's state, or None."""
        with self._lock:
            state = self._runs.get(key)
            return state.copy() if state else None
