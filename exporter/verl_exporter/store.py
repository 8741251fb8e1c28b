"""RunStore: the latest value of every metric of every run, and each run's step clock.

Sources write into it (``ingest``, ``parse_error``, ``values_dropped``, ``source_state``); the
training collector reads a snapshot at scrape time. Thread-safe and bounded: at most ``max_runs``
runs and, per run, ``max_series_per_run`` keys outside the catalog and as many keys of its
families (``val-core/...``); keys the catalog lists are always kept, however many came first.
What the caps drop is counted. Runs are removed only by retention (below).

Ingestion is the hot path (every key of every logged line), so ``ingest`` only records each run's
latest raw values. A source may hand over values still as the text it read (``"0.125"``), already
checked to look numeric: they are converted once, when a snapshot first sees them, and names and
units are applied to the latest values only, at scrape time.

Retention: a run that finished ``retention`` seconds ago, or logged no step for ``idle_retention``
seconds (by the time its lines were written), is dropped and counted; its place under the run cap
is free again. Reaching the run cap is logged once (until a place frees up) and flagged in the
snapshot. Every run carries a ``version`` that changes whenever the run does, so a renderer can
reuse what it rendered of an unchanged run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

from . import run_settings
from .catalog import Catalog, Resolved
from .records import CHECKPOINT_SAVE_KEYS, Record, RunKey, is_event, logged_seconds

log = logging.getLogger(__name__)
ERROR_LINES = 20  # error lines kept per run, for the evidence of a stall or crash
EXPIRY_CHECK_SECONDS = 1.0  # at most one retention sweep per second when the run cap is reached
SeriesKey = tuple[str, tuple[str, ...]]  # (metric name, label values)
DROPPED_SAMPLE = 16  # keys the series cap refused that a run remembers by name; the rest are counted
DROPPED_BITS = 1 << 16  # the bitmap (8 KiB per run that drops keys) counting the others
MAX_NAME_OWNERS = 100_000  # series names whose first key is remembered (two keys never share a series)
OTHER_SOURCE = "other_source"  # values_dropped reason: a record naming a run another source feeds
# A run whose feeding source wrote nothing for this long passes to the next source that names it: a
# job resumed from a checkpoint writes a new log, often matched by the same glob.
OWNER_HANDOVER_SECONDS = 300.0


@dataclass
class CheckpointState:
    """The run's checkpoint saves: the latest one started (its step and when), whether it still runs,
    and the step and duration of the latest one done."""

    step: int
    started: float
    saving: bool = True
    done_step: int | None = None
    done_seconds: float | None = None

    def start(self, step: int, moment: float) -> None:
        self.step, self.started, self.saving = step, moment, True

    def end(self, moment: float, values: Mapping) -> None:
        """The save ended with the run's next step (``values``, where verl says how long it took)."""
        seconds = logged_seconds(values, CHECKPOINT_SAVE_KEYS)
        self.saving, self.done_step = False, self.step
        self.done_seconds = seconds if seconds is not None else max(0.0, moment - self.started)


@dataclass
class RunState:
    """What is known of one run. ``values`` maps verl keys to their latest value; ``series`` (on
    snapshot copies) maps each exported series to its metric and value in base units."""

    run: RunKey
    source: str = ""
    last_step: int | None = None
    last_step_time: float | None = None
    steps_ingested: int = 0
    finished: bool = False
    values: dict[str, float | str] = field(default_factory=dict)
    nonfinite: Counter = field(default_factory=Counter)
    dropped_keys: set[str] = field(default_factory=set)  # the first DROPPED_SAMPLE keys the cap refused
    dropped_unremembered: int = 0  # the other distinct keys the cap refused (counted, not kept)
    dropped_bits: bytearray | None = None  # of those, by hash: linear counting
    dropped_ones: int = 0
    owner_at: float = 0.0  # when the owner last fed the run (by the time its lines were written)
    owner: str = ""  # the source that first fed the run: another (matched by a glob) cannot
    config_source: str = ""  # the config file, other than the owner, that describes the run
    room: list[int] | None = None  # keys the cap still takes: [outside the catalog, of its families]
    series: dict[SeriesKey, tuple[Resolved, float]] = field(default_factory=dict)
    logged_at: dict[str, int] = field(default_factory=dict)  # of metrics logged under two spellings: when
    # The run's length and settings: total from verl's "Total training steps" line (else from the
    # config), the step at which it finished, its catalog settings and info labels.
    total_steps: int | None = None
    total_from_log: bool = False
    finished_at: int | None = None
    config: dict[str, float] = field(default_factory=dict)
    config_info: dict[str, str] = field(default_factory=dict)
    active_at: float | None = None  # when the latest record of the run was written
    version: int = 0  # changes whenever the run does
    checkpoint: CheckpointState | None = None  # once the run started saving a checkpoint
    started_at: float | None = None  # when the run's first line was written (config print or first step)
    log_errors: Counter = field(default_factory=Counter)  # errors its log showed, by kind
    error_lines: list[str] = field(default_factory=list)  # the latest ERROR_LINES of them

    def copy(self) -> "RunState":
        return RunState(
            run=self.run,
            source=self.source,
            last_step=self.last_step,
            last_step_time=self.last_step_time,
            steps_ingested=self.steps_ingested,
            finished=self.finished,
            values=dict(self.values),
            dropped_unremembered=self.dropped_unremembered,
            nonfinite=Counter(self.nonfinite),
            dropped_keys=set(self.dropped_keys),
            owner=self.owner,
            owner_at=self.owner_at,
            config_source=self.config_source,
            logged_at=dict(self.logged_at),
            total_steps=self.total_steps,
            total_from_log=self.total_from_log,
            finished_at=self.finished_at,
            config=dict(self.config),
            config_info=dict(self.config_info),
            active_at=self.active_at,
            version=self.version,
            checkpoint=dataclasses.replace(self.checkpoint) if self.checkpoint else None,
            started_at=self.started_at,
            log_errors=Counter(self.log_errors),
            error_lines=list(self.error_lines),
        )

    def drop_key(self, key: str) -> None:
        """Count ``key``, refused by the series cap, once: the first few by name, the others in a
        bitmap of DROPPED_BITS bits (linear counting: exact in practice up to a few thousand keys,
        within a few percent up to ~200,000; past that each refused value counts)."""
        sample = self.dropped_keys
        if key in sample:
            return
        if len(sample) < DROPPED_SAMPLE:
            sample.add(key)
            return
        bits = self.dropped_bits
        if bits is None:
            bits = self.dropped_bits = bytearray(DROPPED_BITS // 8)
        if self.dropped_ones >= DROPPED_BITS - DROPPED_BITS // 256:  # saturated: no estimate left
            self.dropped_unremembered += 1
            return
        slot = hash(key) % DROPPED_BITS
        byte, bit = divmod(slot, 8)
        if bits[byte] & (1 << bit):
            return
        bits[byte] |= 1 << bit
        self.dropped_ones += 1
        estimate = round(-DROPPED_BITS * math.log1p(-self.dropped_ones / DROPPED_BITS))
        self.dropped_unremembered = max(self.dropped_unremembered, estimate)

    def finish(self, step: int) -> None:
        """The run ended at ``step``: later records of steps up to it (another source of the same
        run, a re-read file) leave it finished; a later step means it went on."""
        self.finished = True
        self.finished_at = step if self.finished_at is None else max(self.finished_at, step)

    def reached_total(self, exactly: bool = True) -> None:
        """Finished once the last step is the total (or, when the total has just become known, past it):
        a step beyond a total already reached means the run went on with a larger one."""
        total, step = self.total_steps, self.last_step
        if total is not None and step is not None and (step == total or (not exactly and step > total)):
            self.finish(step)


@dataclass
class StoreSnapshot:
    runs: list[RunState]
    parse_errors: dict[str, int]
    runs_dropped: int
    values_dropped: dict[tuple[str, str], int] = field(default_factory=dict)  # (source, reason)
    sources: dict[str, str | None] = field(default_factory=dict)  # source -> why unreadable, None if readable
    runs_expired: dict[str, int] = field(default_factory=dict)  # reason (finished, idle, no_step) -> runs dropped
    run_cap_reached: bool = False  # a run was refused since a place under the cap last freed up
    versions: dict[RunKey, int] | None = field(default_factory=dict)  # every run's version (None: as ``since``)
    serial: int = 0  # changes whenever a run does, or a run is dropped


class RunStore:
    """Latest values per run, fed by sources, read by the training collector."""

    def __init__(self, catalog: Catalog, *, max_series_per_run: int = 2000, max_runs: int = 1000,
                 max_error_sources: int = 1000, retention: float = 0.0, idle_retention: float = 0.0,
                 clock=time.time):
        self.catalog = catalog
        self.retention = retention
        self.idle_retention = idle_retention
        self.clock = clock
        self._runs_expired: Counter = Counter()
        self._cap_reached = False
        self._swept_at = float("-inf")
        self._version = 0
        self.max_series_per_run = max_series_per_run
        self.max_runs = max_runs
        self.max_error_sources = max_error_sources
        self._runs: dict[RunKey, RunState] = {}
        self._unconverted: set[RunKey] = set()
        self._parse_errors: Counter = Counter()
        self._values_dropped: Counter = Counter()
        self._sources: dict[str, str | None] = {}
        self._unreadable = 0  # of the sources, those that cannot be read
        self._warned_sources: set[str] = set()
        self._owners: dict[SeriesKey, str] = {}  # series -> the key (catalog key) that first took it
        self._listed = catalog.listed_keys()
        self._runs_dropped = 0
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[SeriesKey, Resolved, float]] = {}
        self._serial = 0  # orders the records that hold a metric the run logs under two spellings

    def ingest(self, record: Record) -> None:
        """Take one record: update the run's step clock and the latest value of each key."""
        values = record.values
        if type(next(iter(values.values()), 0.0)) is str:
            total = None  # values still as text (a source's choice for a whole record): checked when converted
        else:
            total = sum(cast("Iterable[float]", values.values()))  # a record's values: all text or all numbers
        with self._lock:
            state = self._runs.get(record.run)
            if state is None:
                state = self._new_run(record)
                if state is None:
                    return
            if record.source and not self._may_feed(state, record):
                return
            self._version += 1
            state.version = self._version
            if state.started_at is None or record.time < state.started_at:
                state.started_at = record.time
            if record.run_config is not None or record.total_steps is not None:
                self._describe(state, record)
                return
            if record.source:
                state.source = record.source
            if state.active_at is None or record.time > state.active_at:
                state.active_at = record.time  # the run's settings (a config file written at its start) do not count
            if record.checkpoint_step is not None:
                self._checkpoint_started(state, record.checkpoint_step, record.time)
                return
            if record.error is not None:
                state.log_errors[record.error] += 1
                state.error_lines = (state.error_lines + [record.line])[-ERROR_LINES:]
                return
            if state.checkpoint is not None and state.checkpoint.saving and (
                    record.finished or record.step >= state.checkpoint.step):
                state.checkpoint.end(record.time, values)
            if record.finished:
                state.finish(record.step)
                return
            if record.step != state.last_step:
                state.last_step = record.step
                state.steps_ingested += 1
                if state.finished and state.finished_at is not None and record.step > state.finished_at:
                    state.finished = False  # resumed with more steps
                state.reached_total()
            state.last_step_time = record.time
            latest = state.values
            known = len(latest)
            if known + len(values) <= self.max_series_per_run:
                latest.update(values)
                state.room = None  # counted again when the cap is next reached
            else:
                self._update_capped(state, values)
            if len(latest) != known:
                self._find_respellings(state, values)
            if state.logged_at:
                self._stamp(state, values)
            if total is None:
                self._unconverted.add(record.run)
            elif total - total != 0:  # a NaN or an infinity among the values
                for key, value in values.items():
                    if not isinstance(value, str) and value - value != 0 and key in latest:
                        state.nonfinite[key] += 1

    def _may_feed(self, state: RunState, record: Record) -> bool:
        """Whether ``record`` may feed its run: it comes from the source that feeds the run, or it is
        ``named`` (its file or run named by the operator), or the feeding source was silent for
        ``OWNER_HANDOVER_SECONDS`` (a resumed job's new log takes over), or it is the run's config
        (settings and length) from the first config file that describes the run (hydra writes
        ``.hydra/config.yaml`` apart from the log). Otherwise a file in a shared folder could name
        itself another team's run and step or finish it: refused, counted (``values_dropped``,
        reason other_source) and logged once per source."""
        source, owner = record.source, state.owner
        if not owner or source == owner:
            state.owner, state.owner_at = source, max(state.owner_at, record.time)
            return True
        if record.named:
            return True
        if record.run_config is None and record.time - state.owner_at >= OWNER_HANDOVER_SECONDS:
            log.info("run %s/%s passes from %s, silent for %.0f s, to %s", record.run.project,
                     record.run.experiment, owner, record.time - state.owner_at, source)
            state.owner, state.owner_at = source, record.time
            return True
        if record.run_config is not None and state.config_source in ("", source):
            state.config_source = source
            return True
        self._count_dropped(source, OTHER_SOURCE, len(record.values) or 1)
        if source not in self._warned_sources and len(self._warned_sources) < self.max_error_sources:
            self._warned_sources.add(source)
            log.warning("%s names run %s/%s, which %s feeds: its records are not taken (name the file, or "
                        "set --project and --experiment, to read both)", source, record.run.project,
                        record.run.experiment, owner)
        return False

    def _new_run(self, record: Record) -> RunState | None:
        """A place for a run not seen yet: None for a record of a run already past its idle
        retention (a backlog being read again), or when the run cap is reached even after dropping
        the runs retention lets go (logged once, counted)."""
        describes = record.run_config is not None or record.total_steps is not None
        if self.idle_retention and not describes and self.clock() - record.time > self.idle_retention:
            return None
        if len(self._runs) >= self.max_runs:
            now = self.clock()
            if now - self._swept_at >= EXPIRY_CHECK_SECONDS:
                self._expire(now)
            if len(self._runs) >= self.max_runs and not describes and not is_event(record):
                self._drop_a_stepless_run()
            if len(self._runs) >= self.max_runs:
                self._runs_dropped += 1
                if not self._cap_reached:
                    self._cap_reached = True
                    log.warning("reached the cap of %d runs (--store.max-runs): records of new runs are dropped "
                                "until retention frees a place", self.max_runs)
                return None
        state = self._runs[record.run] = RunState(record.run)
        return state

    def _drop_a_stepless_run(self) -> None:
        """Make room for a run that steps: drop the oldest run that never logged a step (only its config
        or errors were read), so that config prints alone cannot hold every place."""
        stepless = [state for state in self._runs.values() if state.last_step is None and not state.finished]
        if not stepless:
            return
        oldest = min(stepless, key=lambda state: state.started_at if state.started_at is not None else 0.0)
        del self._runs[oldest.run]
        self._version += 1
        self._unconverted.discard(oldest.run)
        self._runs_expired["no_step"] += 1

    def _expire(self, now: float) -> None:
        """Drop the runs retention lets go: finished ``retention`` ago, idle for ``idle_retention``."""
        self._swept_at = now
        if not (self.retention or self.idle_retention):
            return
        for key, state in list(self._runs.items()):
            age = now - state.active_at if state.active_at is not None else 0.0
            if self.retention and state.finished and age > self.retention:
                reason = "finished"
            elif self.idle_retention and age > self.idle_retention:
                reason = "idle"
            else:
                continue
            del self._runs[key]
            self._version += 1
            self._unconverted.discard(key)
            self._runs_expired[reason] += 1
            if self._cap_reached:
                self._cap_reached = False
                log.info("a place under the run cap is free again")

    @staticmethod
    def _checkpoint_started(state: RunState, step: int, moment: float) -> None:
        if state.checkpoint is None:
            state.checkpoint = CheckpointState(step, moment)
        else:
            state.checkpoint.start(step, moment)

    def _describe(self, state: RunState, record: Record) -> None:
        """Take a record about the run: its settings (config) and its length."""
        if record.run_config is not None:
            state.config, state.config_info = run_settings.pick(self.catalog, record.run_config)
            configured = run_settings.total_steps(state.config)
            if configured is not None and not state.total_from_log:
                state.total_steps = configured
        if record.total_steps is not None and record.total_steps >= 1:
            state.total_steps, state.total_from_log = record.total_steps, True
        state.reached_total(exactly=False)

    def _find_respellings(self, state: RunState, values: Mapping) -> None:
        """On new keys: the metrics the run now logs under two spellings (a run resumed on a newer
        release) are timed from here on, so that the spelling logged last is served."""
        spellings, latest = self.catalog.spellings, state.values
        for key in values:
            others = spellings.get(key)
            if others and key in latest and sum(other in latest for other in others) > 1:
                for other in others:
                    if other in latest:
                        state.logged_at.setdefault(other, 0)

    def _stamp(self, state: RunState, values: Mapping) -> None:
        hits = state.logged_at.keys() & values.keys()
        if hits:
            self._serial += 1
            state.logged_at.update(dict.fromkeys(hits, self._serial))

    def _update_capped(self, state: RunState, values: Mapping) -> None:
        """Keys the catalog lists are always kept; keys outside it and keys of its families each
        have ``max_series_per_run`` places, so junk keys never push out a catalog metric."""
        latest, listed, in_family = state.values, self._listed, self._in_family
        if state.room is None:
            unlisted = latest.keys() - listed
            families = sum(map(in_family, unlisted))
            state.room = [self.max_series_per_run - (len(unlisted) - families), self.max_series_per_run - families]
        room = state.room
        for key, value in values.items():
            if key in latest or key in listed:
                latest[key] = value
                continue
            kind = in_family(key) if room[0] > 0 or room[1] > 0 else 0  # both full: no lookup, nothing cached
            if room[kind] > 0:
                latest[key] = value
                room[kind] -= 1
            else:
                state.drop_key(key)

    def _in_family(self, key: str) -> int:
        """1 for a key of a catalog family (``val-core/...``), 0 for a key outside the catalog."""
        return 1 if self.catalog.is_known(key) else 0

    def parse_error(self, source: str, reason: str = "") -> None:
        """Count one line of ``source`` that could not be read."""
        with self._lock:
            self._count_error(source)

    def _count_error(self, source: str) -> None:
        if source not in self._parse_errors and len(self._parse_errors) >= self.max_error_sources:
            source = "other"
        self._parse_errors[source] += 1

    def values_dropped(self, source: str, reason: str, count: int = 1) -> None:
        """Count ``count`` values of ``source`` left out for ``reason`` (not_a_number, object, ...)."""
        with self._lock:
            self._count_dropped(source, reason, count)

    def _count_dropped(self, source: str, reason: str, count: int = 1) -> None:
        key = (source, reason)
        if key not in self._values_dropped and len(self._values_dropped) >= self.max_error_sources:
            key = ("other", reason)
        self._values_dropped[key] += count

    def source_state(self, source: str, reason: str | None) -> None:
        """Whether ``source`` (a configured path or a glob's match) can be read: ``reason`` says why
        not, None when it can."""
        with self._lock:
            self._unreadable += (reason is not None) - (self._sources.get(source) is not None)
            self._sources[source] = reason

    def forget_source(self, source: str) -> None:
        """``source`` is no longer matched (a glob's file went away)."""
        with self._lock:
            if source in self._sources:
                self._unreadable -= self._sources.pop(source) is not None

    def _served_sources(self) -> dict[str, str | None]:
        """The sources' states as served: at most ``max_error_sources`` by name, the rest as one
        ``other``, unreadable (with how many) when any of them is."""
        sources, cap = self._sources, self.max_error_sources
        if len(sources) <= cap:
            return dict(sources)
        served: dict[str, str | None] = {}
        for name, reason in sources.items():
            if len(served) == cap:
                break
            served[name] = reason
        rest = self._unreadable - sum(reason is not None for reason in served.values())
        served["other"] = f"{rest} more sources cannot be read" if rest else None
        return served

    def snapshot(self, known: dict[RunKey, int] | None = None, since: int | None = None) -> StoreSnapshot:
        """A consistent copy of everything, for one scrape, with every series in base units.

        With ``known`` (run -> version, as a previous snapshot's ``versions``), ``runs`` holds only
        the runs that changed or are new since; ``versions`` names every run. With ``since`` (a
        previous snapshot's ``serial``) as well and no run changed since: no runs, versions None."""
        with self._lock:
            self._expire(self.clock())
            for run in self._unconverted:
                self._convert(self._runs[run])
            self._unconverted.clear()
            if since is not None and since == self._version:
                runs, versions = [], None
            else:
                runs = [state.copy() for key, state in self._runs.items()
                        if known is None or known.get(key) != state.version]
                versions = {key: state.version for key, state in self._runs.items()}
            snapshot = StoreSnapshot(runs, dict(self._parse_errors), self._runs_dropped,
                                     dict(self._values_dropped), self._served_sources(), dict(self._runs_expired),
                                     self._cap_reached, versions, self._version)
        for state in runs:
            self._fill_series(state)
        return snapshot

    def run(self, key: RunKey) -> RunState | None:
        """A copy of one run's state (as a snapshot has it), or None; copies no other run."""
        with self._lock:
            if key in self._unconverted:
                self._convert(self._runs[key])
                self._unconverted.discard(key)
            state = self._runs.get(key)
            state = state.copy() if state is not None else None
        if state is not None:
            self._fill_series(state)
        return state

    def unfinished_runs(self) -> list[RunKey]:
        """The runs that have not finished (retention applied first); copies no run."""
        with self._lock:
            self._expire(self.clock())
            return [key for key, state in self._runs.items() if not state.finished]

    def _convert(self, state: RunState) -> None:
        """Turn the run's values still held as text into floats; a value that is no number is
        dropped and counted as a value dropped (not_a_number) of the run's source."""
        for key, value in list(state.values.items()):
            if type(value) is float:
                continue
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                del state.values[key]
                self._count_dropped(state.source, "not_a_number")
                continue
            if number - number != 0:
                state.nonfinite[key] += 1
            state.values[key] = number

    def _fill_series(self, state: RunState) -> None:
        """Name the run's latest values: one series per catalog metric and label set. Where two
        spellings of one metric were logged (a run resumed on a newer verl), the one logged last
        wins; two logged side by side in one record are two metrics: the alias gets its own name."""
        series, logged_at = state.series, state.logged_at
        owners: dict[SeriesKey, str] = {}
        for key, value in state.values.items():
            series_key, resolved, scale = self._entries.get(key) or self._entry(key)
            if key in logged_at:
                owner = owners.get(series_key)
                if owner is not None and logged_at[owner] > logged_at[key]:
                    continue
                if owner is not None and logged_at[owner] == logged_at[key]:
                    alias = key if resolved.spec.key != key else owner
                    own = self.catalog.own(alias)
                    alias_value = state.values[alias]
                    assert not isinstance(alias_value, str)  # converted: snapshot() and run() convert first
                    series[(own.spec.name, ())] = (own, alias_value * own.spec.scale)
                    if alias == key:
                        continue
                owners[series_key] = key
            assert not isinstance(value, str)  # converted: snapshot() and run() convert first
            series[series_key] = (resolved, value * scale)

    def _entry(self, key: str) -> tuple[SeriesKey, Resolved, float]:
        """(series key, resolved metric, scale) of a verl key, cached like the catalog's lookups."""
        resolved = self.catalog.resolve(key)
        series_key = (resolved.spec.name, resolved.label_values)
        owner = self._owners.get(series_key)
        if owner is None and len(self._owners) < MAX_NAME_OWNERS:
            self._owners[series_key] = resolved.spec.key
        elif owner != resolved.spec.key and (owner is not None or not resolved.spec.known):
            series_key, resolved = self._own_name(key, resolved)
        entry = (series_key, resolved, resolved.spec.scale)
        if len(self._entries) < 100_000:
            self._entries[key] = entry
        return entry

    def _own_name(self, key: str, resolved: Resolved) -> tuple[SeriesKey, Resolved]:
        """A name of its own for a key whose name another key took first (``a:b`` and ``a/b`` are
        both ``verl_a_b``): the name and a suffix from the key's hash, the same on every start, so
        two keys' values never interleave in one series."""
        spec = resolved.spec
        for size in (4, 8):
            name = f"{spec.name}_{hashlib.blake2b(key.encode('utf-8', 'replace'), digest_size=size).hexdigest()}"
            series_key = (name, resolved.label_values)
            owner = self._owners.get(series_key)
            if owner is None or owner == key:
                break
        if owner is None and len(self._owners) < MAX_NAME_OWNERS:
            self._owners[series_key] = key
        own = Resolved(dataclasses.replace(spec, key=key, name=name, aliases=(), help_keys=(),
                                           help=f"{spec.help} (logged as {key!r}, whose name {spec.name} another "
                                                f"key has)"), resolved.label_values)
        return series_key, own

