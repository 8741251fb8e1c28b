"""What the store knows of each run (``RunState``, its ``CheckpointState``) and the copy of
everything one scrape reads (``StoreSnapshot``): plain data, filled by ``store.RunStore``."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from verl_exporter.store.catalog import Resolved
from verl_exporter.store.ledger import Ledger
from verl_exporter.store.records import CHECKPOINT_SAVE_KEYS, RunKey, logged_seconds
from verl_exporter.store.step_windows import StepWindow

SeriesKey = tuple[str, tuple[str, ...]]  # (metric name, label values)
DROPPED_SAMPLE = 16  # keys the series cap refused that a run remembers by name; the rest are counted
DROPPED_BITS = 1 << 16  # the bitmap (8 KiB per run that drops keys) counting the others


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
    nonfinite_step: dict[str, int] = field(default_factory=dict)  # verl key -> the step of its latest NaN/Inf
    dropped_keys: set[str] = field(default_factory=set)  # the first DROPPED_SAMPLE keys the cap refused
    dropped_unremembered: int = 0  # the other distinct keys the cap refused (counted, not kept)
    dropped_bits: bytearray | None = None  # of those, by hash: linear counting
    dropped_ones: int = 0
    owner_at: float = 0.0  # when the owner last fed the run (by the time its lines were written)
    owner: str = ""  # the source that first fed the run: another (matched by a glob) cannot
    config_source: str = ""  # the config file, other than the owner, that describes the run
    config_by_owner: bool = False  # the owner's log printed the run's config
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
    error_step: dict[str, int] = field(default_factory=dict)  # kind -> the run's step when it was last seen
    error_lines: list[str] = field(default_factory=list)  # the latest ERROR_LINES of them
    fatal: tuple[str, int] | None = None  # the trainer's fatal end: its kind, at the run's step
    owner_job: str = ""  # the job the owner's file is the output of: its other files may feed the run
    windows: dict[str, StepWindow] = field(default_factory=dict)  # watched metric -> its latest steps
    pending_steps: list = field(default_factory=list)  # (step, values) not yet in ``windows`` (the store folds them)
    validations: tuple[int, ...] = ()  # the run's latest three steps that validated (validation.py)
    sparse_steps: dict[str, int] = field(default_factory=dict)  # sparse key -> the step it was last logged at
    ledger: Ledger = field(default_factory=Ledger)  # its GPU-seconds by bucket

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
            nonfinite_step=dict(self.nonfinite_step),
            dropped_keys=set(self.dropped_keys),
            owner=self.owner,
            owner_at=self.owner_at,
            config_source=self.config_source,
            config_by_owner=self.config_by_owner,
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
            error_step=dict(self.error_step),
            error_lines=list(self.error_lines),
            fatal=self.fatal,
            owner_job=self.owner_job,
            windows={name: window.copy() for name, window in self.windows.items()},
            validations=self.validations,
            sparse_steps=dict(self.sparse_steps),
            ledger=self.ledger.copy(),
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
