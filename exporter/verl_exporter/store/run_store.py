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

import itertools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import cast

from verl_exporter.store import run_settings, validation
from verl_exporter.store.catalog import Catalog
from verl_exporter.store.records import MAX_KEY_CHARS, Record, RunKey, is_event
from verl_exporter.store.run_state import CheckpointState, RunState, StoreSnapshot
from verl_exporter.store.series_names import SeriesNames
from verl_exporter.store.source_book import SourceBook
from verl_exporter.store.step_folding import StepFolder
from verl_exporter.store.step_windows import PER_ATTEMPT

log = logging.getLogger(__name__)
MAX_JOBS = 100_000  # jobs whose run is remembered for their other files (sources.pairing)
ERROR_LINES = 20  # error lines kept per run, for the evidence of a stall or crash
EXPIRY_CHECK_SECONDS = 1.0  # at most one retention sweep per second when the run cap is reached
QUIET_MARGIN = 1e-3  # seconds: a skipped sweep is one that could not have dropped a run, rounding included
OTHER_SOURCE = "other_source"  # values_dropped reason: a record naming a run another source feeds
# A run whose feeding source wrote nothing for this long passes to the next source that names it: a
# job resumed from a checkpoint writes a new log, often matched by the same glob.
OWNER_HANDOVER_SECONDS = 300.0
PENDING_STEPS = 256  # records a run keeps for its step statistics before they are folded in


class RunStore:
    """Latest values per run, fed by sources, read by the training collector."""

    def __init__(self, catalog: Catalog, *, max_series_per_run: int = 2000, max_runs: int = 1000,
                 max_error_sources: int = 1000, retention: float = 0.0, idle_retention: float = 0.0,
                 clock: Callable[[], float] = time.time, gpus: float = 0.0):
        self.catalog = catalog
        self.gpus = gpus  # of a run whose config names none (the ledger counts nothing where both are unknown)
        self.retention = retention
        self.idle_retention = idle_retention
        self.clock = clock
        self._runs_expired: Counter = Counter()
        self._cap_reached = False
        self._swept_at = float("-inf")
        # No run can expire before this moment while nothing changed since the sweep that found it (the
        # store's version and the retention): a scrape of many quiet runs skips the sweep.
        self._quiet_until = float("-inf")
        self._swept: tuple = ()
        self._version = 0
        self.max_series_per_run = max_series_per_run
        self.max_runs = max_runs
        self.max_error_sources = max_error_sources
        self._runs: dict[RunKey, RunState] = {}
        self._unconverted: set[RunKey] = set()
        self._book = SourceBook(max_error_sources)
        self._warned_sources: set[str] = set()
        self._listed = catalog.listed_keys()
        self._runs_dropped = 0
        self._lock = threading.Lock()
        self._names = SeriesNames(catalog)
        self._steps = StepFolder(catalog)
        self._job_runs: dict[str, RunKey] = {}  # a job's files (sources.pairing) -> the run one of them named
        self._path_runs: dict[str, RunKey] = {}  # ... -> the path's run they fed before that
        self._serial = 0  # orders the records that hold a metric the run logs under two spellings

    def ingest(self, record: Record) -> None:
        """Take one record: update the run's step clock and the latest value of each key."""
        values = record.values
        if type(next(iter(values.values()), 0.0)) is str:
            total = None  # values still as text (a source's choice for a whole record): checked when converted
        else:
            total = sum(cast("Iterable[float]", values.values()))  # a record's values: all text or all numbers
        with self._lock:
            if record.job and record.from_path:
                self._follow_job(record)
            state = self._runs.get(record.run)
            if state is None:
                state = self._new_run(record)
                if state is None:
                    return
            source = record.source
            if source == state.owner:  # the common case, kept cheap: the run's own file
                if record.time > state.owner_at:
                    state.owner_at = record.time
            elif source and not self._may_feed(state, record):
                return
            if record.job and not record.from_path and self._job_runs.get(record.job) != record.run:
                self._name_job(state, record.job)
            self._version += 1
            state.version = self._version
            if state.started_at is None:
                state.ledger.gpus = state.ledger.gpus or self.gpus
                state.ledger.start(record.time)
            if state.started_at is None or record.time < state.started_at:
                state.started_at = record.time
            if record.run_config is not None or record.total_steps is not None:
                if record.run_config is not None and source == state.owner:
                    state.config_by_owner = True  # the run's own log printed it: no config file overrides
                if (record.run_config is not None and state.last_step_time is not None
                        and record.time >= state.last_step_time):
                    self._restarted(state, record.time)
                self._describe(state, record)
                return
            if record.source:
                state.source = record.source
            if state.active_at is None or record.time > state.active_at:
                state.active_at = record.time  # the run's settings (a config file written at its start) do not count
            if record.checkpoint_step is not None:
                self._checkpoint_started(state, record.checkpoint_step, record.time)
                return
            if record.error is not None or record.fatal is not None:
                self._log_error(state, record)
                return
            saved, saving_since = False, None
            if state.checkpoint is not None and state.checkpoint.saving and (
                    record.finished or record.step >= state.checkpoint.step):
                saving_since = state.checkpoint.started
                state.checkpoint.end(record.time, values)
                saved = True
            if record.finished:
                state.finish(record.step)
                state.ledger.end(record.time, failed=False)
                return
            if record.step != state.last_step:
                state.ledger.step(record.time, values, saving_since=saving_since)
                if saved:
                    state.ledger.saved()
                state.last_step = record.step
                state.steps_ingested += 1
                if state.fatal is not None and record.step > state.fatal[1]:
                    state.fatal = None  # resumed: it steps again after its fatal end
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
            if len(latest) != known:  # new keys: checked here, not on every record
                self._drop_long_keys(state, source, values)
                self._find_respellings(state, values)
            if state.logged_at:
                self._stamp(state, values)
            self._watch_steps(state, record.step, values)
            if total is None:
                self._unconverted.add(record.run)
            elif total - total != 0:  # a NaN or an infinity among the values
                for key, value in values.items():
                    if not isinstance(value, str) and value - value != 0 and key in latest:
                        state.nonfinite[key] += 1
                        state.nonfinite_step[key] = record.step

    def _restarted(self, state: RunState, moment: float) -> None:
        """The run's config came again after its steps: the job started again (resumed). Baselines of
        one attempt (``step_windows.PER_ATTEMPT``) start again from its next step; so does its ledger."""
        state.ledger.start(moment)
        self._steps.fold(state)
        for name in PER_ATTEMPT:
            state.windows.pop(name, None)

    def _watch_steps(self, state: RunState, step: int, values: Mapping[str, float | str]) -> None:
        """Keep this step's values of the watched metrics for the step statistics (``step_windows``):
        folded in by the next snapshot, or at once once PENDING_STEPS wait. Only those are kept: a
        line may hold thousands of keys."""
        watched = self._steps.watched(state, step, values)
        if not watched:
            return
        pending = state.pending_steps
        pending.append((step, watched))
        if len(pending) >= PENDING_STEPS:
            self._steps.fold(state)
        else:
            self._unconverted.add(state.run)

    def _follow_job(self, record: Record) -> None:
        """The files of one job feed one run (``sources.pairing``): a record of a file whose run is
        named after its path goes to the run another file of its job named, if one did."""
        named = self._job_runs.get(record.job)
        if named is not None:
            record.run = named
        elif len(self._path_runs) < MAX_JOBS:
            self._path_runs[record.job] = record.run

    def _name_job(self, state: RunState, job: str) -> None:
        """A file of ``job`` that named its run, taken: the run is the job's. It adopts the errors that
        another file of the job told of the path's run before (its stderr, read first); that run,
        which never stepped, is dropped."""
        if state.owner_job != job or (job not in self._job_runs and len(self._job_runs) >= MAX_JOBS):
            return  # another job's config, taken as a config file's: the run is not its job's
        self._job_runs[job] = state.run
        orphan_key = self._path_runs.pop(job, None)
        orphan = self._runs.get(orphan_key) if orphan_key is not None and orphan_key != state.run else None
        if orphan is None or orphan.last_step is not None or orphan.finished:
            return
        state.log_errors.update(orphan.log_errors)
        for kind, step in orphan.error_step.items():
            state.error_step.setdefault(kind, step)
        state.fatal = state.fatal or orphan.fatal
        state.error_lines = (orphan.error_lines + state.error_lines)[-ERROR_LINES:]
        if orphan.started_at is not None and (state.started_at is None or orphan.started_at < state.started_at):
            state.started_at = orphan.started_at
        del self._runs[orphan.run]
        self._unconverted.discard(orphan.run)

    @staticmethod
    def _log_error(state: RunState, record: Record) -> None:
        """An error line of the run's log, or the trainer's fatal end (at the run's step)."""
        step = state.last_step if state.last_step is not None else 0
        if record.error is not None:
            state.log_errors[record.error] += 1
            state.error_step[record.error] = step
        if record.fatal is not None:
            state.fatal = (record.fatal, step)
            state.ledger.end(record.time, failed=True)
        state.error_lines = (state.error_lines + [record.line])[-ERROR_LINES:]

    def _may_feed(self, state: RunState, record: Record) -> bool:
        """Whether ``record`` may feed its run: it comes from the source that feeds the run, or it is
        ``named`` (its file or run named by the operator), or the feeding source was silent for
        ``OWNER_HANDOVER_SECONDS`` (a resumed job's new log takes over), or it is the run's config
        (settings and length) from the first config file that describes the run (hydra writes
        ``.hydra/config.yaml`` apart from the log), while the run's own log printed none: another
        log's config print never describes, lengthens or finishes the run. Otherwise a file in a
        shared folder could name itself another team's run and step or finish it: refused, counted
        (``values_dropped``, reason other_source) and logged once per source."""
        source, owner = record.source, state.owner
        if not owner or source == owner:
            state.owner, state.owner_at = source, max(state.owner_at, record.time)
            state.owner_job = record.job
            return True
        if record.named or (record.job and record.job == state.owner_job):
            return True
        if record.run_config is None and record.time - state.owner_at >= OWNER_HANDOVER_SECONDS:
            log.info("run %s/%s passes from %s, silent for %.0f s, to %s", record.run.project,
                     record.run.experiment, owner, record.time - state.owner_at, source)
            state.owner, state.owner_at = source, record.time
            state.owner_job = record.job
            return True
        if (record.run_config is not None and not record.job and not state.config_by_owner
                and state.config_source in ("", source)):  # a config file (hydra's: no job), not a log
            state.config_source = source
            return True
        self._book.count_dropped(source, OTHER_SOURCE, len(record.values) or 1)
        if source not in self._warned_sources and len(self._warned_sources) < self.max_error_sources:
            self._warned_sources.add(source)
            log.warning("%s names run %s/%s, which %s feeds: its records are not taken (name the file, or "
                        "set --project and --experiment, to read both)", source, record.run.project,
                        record.run.experiment, owner)
        return False

    def _drop_long_keys(self, state: RunState, source: str, values: Mapping[str, float | str]) -> None:
        """Keys longer than ``MAX_KEY_CHARS`` are not kept: counted as dropped (``key_too_long``) each
        time they are logged."""
        for key in [key for key in values if len(key) > MAX_KEY_CHARS and key in state.values]:
            del state.values[key]
            state.room = None
            self._book.count_dropped(source, "key_too_long")

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
        if now < self._quiet_until and self._swept == (self._version, self.retention, self.idle_retention):
            return
        # The soonest moment any run left could go, as if every run had finished: a run that finishes,
        # resumes or logs again changes the version, which makes the next call sweep again.
        soonest, bound = math.inf, min(self.retention or math.inf, self.idle_retention or math.inf)
        for key, state in list(self._runs.items()):
            age = now - state.active_at if state.active_at is not None else 0.0
            if self.retention and state.finished and age > self.retention:
                reason = "finished"
            elif self.idle_retention and age > self.idle_retention:
                reason = "idle"
            else:
                if state.active_at is not None:
                    soonest = min(soonest, state.active_at + bound)
                continue
            del self._runs[key]
            self._version += 1
            self._unconverted.discard(key)
            self._runs_expired[reason] += 1
            if self._cap_reached:
                self._cap_reached = False
                log.info("a place under the run cap is free again")
        self._quiet_until = soonest - QUIET_MARGIN
        self._swept = (self._version, self.retention, self.idle_retention)

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
            state.ledger.gpus = run_settings.gpus(state.config) or state.ledger.gpus
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
            self._book.count_error(source)

    def values_dropped(self, source: str, reason: str, count: int = 1) -> None:
        """Count ``count`` values of ``source`` left out for ``reason`` (not_a_number, object, ...)."""
        with self._lock:
            self._book.count_dropped(source, reason, count)

    def source_state(self, source: str, reason: str | None) -> None:
        """Whether ``source`` (a configured path or a glob's match) can be read: ``reason`` says why
        not, None when it can."""
        with self._lock:
            self._book.set_state(source, reason)

    def forget_source(self, source: str) -> None:
        """``source`` is no longer matched (a glob's file went away)."""
        with self._lock:
            self._book.forget(source)

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
            book = self._book
            snapshot = StoreSnapshot(runs, dict(book.parse_errors), self._runs_dropped,
                                     dict(book.values_dropped), book.served_states(), dict(self._runs_expired),
                                     self._cap_reached, versions, self._version)
        for state in runs:
            self._names.fill_series(state)
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
            self._names.fill_series(state)
        return state

    def tick(self, now: float) -> None:
        """Count in each run's ledger the time that is startup or stalled whatever comes next (a run
        that hangs shows its hours while it hangs)."""
        with self._lock:
            for state in self._runs.values():
                if state.ledger.since is None:
                    continue
                saving = state.checkpoint is not None and state.checkpoint.saving
                validates = state.last_step is not None and validation.next_validation(state) == state.last_step + 1
                if state.ledger.tick(now, busy=saving or validates):
                    self._version += 1
                    state.version = self._version

    def unfinished_runs(self, limit: int | None = None) -> list[RunKey]:
        """The runs that have not finished (retention applied first), the first ``limit`` of them where
        given; copies no run."""
        with self._lock:
            self._expire(self.clock())
            return list(itertools.islice((key for key, state in self._runs.items() if not state.finished), limit))

    def _convert(self, state: RunState) -> None:
        """Turn the run's values still held as text into floats; a value that is no number is
        dropped and counted as a value dropped (not_a_number) of the run's source. Fold in the steps
        waiting for the step statistics."""
        if state.pending_steps:
            self._steps.fold(state)
        for key, value in list(state.values.items()):
            if type(value) is float:
                continue
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                del state.values[key]
                self._book.count_dropped(state.source, "not_a_number")
                continue
            if number - number != 0:
                state.nonfinite[key] += 1
                state.nonfinite_step[key] = state.last_step if state.last_step is not None else 0
            state.values[key] = number
