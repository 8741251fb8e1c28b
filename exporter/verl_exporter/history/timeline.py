"""A log file's steps, each with the wall-clock time at which verl logged it.

The lines are read by the live sources (``Source``'s own parsing, run naming from the path or from
the config verl prints), so a step's values and its run are exactly what the exporter would have
ingested. Neither of verl's formats carries a time, so each step's time is reconstructed:

- a console line that starts with a timestamp (``2025-06-12T10:22:31.123Z ...`` as
  ``kubectl logs --timestamps`` writes it, ``2025-06-12 10:22:31,123 ...``, ``[2025-06-12 10:22:31] ...``)
  gives its step that time (a time without an offset is read as UTC);
- otherwise the last step was logged when the file was last modified, and each earlier step
  ``timing_s/step`` (or ``perf/time_per_step``) seconds of the following step before the next one,
  going backwards from the nearest step whose time is known. A step that logged no duration
  takes the median of the others (60 s when none did).

Events are entries of their own: a checkpoint save (verl's ``local_global_step_folder:`` line,
before the metrics of the step it saves) is timed when the save started: its line's timestamp,
else the saved step's time less ``timing_s/save_checkpoint``, else just after the step before; an
error the log shows, at its line's timestamp, else just after the step before (at the next step
where none came before, at the file's modification time in a file of no step).
"""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone

from verl_exporter.sources import RecordsOnly, Source, format_for
from verl_exporter.store.records import (
    CHECKPOINT_SAVE_KEYS,
    STEP_DURATION_KEYS,
    ParseError,
    Record,
    is_event,
    logged_seconds,
)

DEFAULT_STEP_SECONDS = 60.0
MAX_LINE_BYTES = 1 << 20

_TIMESTAMP = re.compile(
    r"\s*\[?(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)([.,]\d+)?(Z|[+-]\d\d:?\d\d)?\]?[ \t]*")


@dataclass
class Step:
    """One step of a file: its records (training values, validation, the end marker), the
    parse errors met while reading it, and its time (unix seconds)."""

    step: int
    records: list[Record] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    logged_at: float | None = None  # the step line's own timestamp
    time: float = 0.0
    event: bool = False  # a checkpoint save's start or a logged error, not a step

    def duration(self) -> float | None:
        """How long verl says the step took, if it logged that."""
        return self.seconds(STEP_DURATION_KEYS, positive=True)

    def seconds(self, keys: tuple[str, ...], positive: bool = False) -> float | None:
        """The first of ``keys`` the step logged as a finite number of seconds (0 or more, or more than 0)."""
        for record in self.records:
            seconds = logged_seconds(record.values, keys, positive)
            if seconds is not None:
                return seconds
        return None


@dataclass
class FileTimeline:
    path: str
    steps: list[Step]
    timed_lines: int  # steps whose time came from their own line
    mtime: float

    @property
    def method(self) -> str:
        if not self.steps or self.timed_lines == 0:
            return "file modification time and timing_s/step"
        if self.timed_lines == len(self.steps):
            return "line timestamps"
        return "line timestamps where present, else timing_s/step"


def split_timestamp(line: str) -> tuple[float | None, str]:
    """(unix time, rest of the line) for a line that starts with an ISO-like timestamp, else (None, line)."""
    if not line[:1].isdigit() and not line.startswith(("[", " ", "\t")):
        return None, line
    match = _TIMESTAMP.match(line)
    if not match:
        return None, line
    fraction = (match.group(2) or "").replace(",", ".")[:7]
    zone = match.group(3) or "+00:00"
    if zone == "Z":
        zone = "+00:00"
    elif ":" not in zone:
        zone = zone[:3] + ":" + zone[3:]
    try:
        moment = datetime.fromisoformat(match.group(1).replace(" ", "T") + fraction + zone)
    except ValueError:
        return None, line
    return moment.astimezone(timezone.utc).timestamp(), line[match.end():]


class _Collector(RecordsOnly):
    """The store a ``Source`` parses into: it keeps the records instead of their latest values."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.errors: list[str] = []

    def ingest(self, record: Record) -> None:
        self.records.append(record)

    def parse_error(self, source: str, reason: str = "") -> None:
        self.errors.append(reason)


def read_file(path: str, *, fmt: str = "auto", project: str | None = None,
              experiment: str | None = None, default_step_seconds: float = DEFAULT_STEP_SECONDS) -> FileTimeline:
    """Every step of ``path`` with its time. Unreadable lines are kept as the step's errors."""
    source = Source(path, _Collector(), fmt=fmt, project=project, experiment=experiment)
    parse = source.line_parser(path)
    console = format_for(path, fmt) == "console"
    steps: list[Step] = []
    pending_errors: list[str] = []
    with open(path, "rb") as handle:
        for raw in handle:
            if len(raw) > MAX_LINE_BYTES:
                pending_errors.append(f"line of {len(raw)} bytes over the {MAX_LINE_BYTES} byte limit")
                continue
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            stamp, rest = split_timestamp(line) if console else (None, line)
            try:
                record = parse(rest, stamp or 0.0)
            except ParseError as exc:
                pending_errors.append(str(exc))
                continue
            except Exception as exc:
                pending_errors.append(f"unreadable line ({type(exc).__name__})")
                continue
            if record is None:
                continue
            if is_event(record):
                steps.append(Step(record.step, [record], pending_errors, logged_at=stamp, event=True))
                pending_errors = []
                continue
            if not steps or steps[-1].step != record.step or steps[-1].event:
                steps.append(Step(record.step, logged_at=stamp if not record.finished else None))
            current = steps[-1]
            if current.logged_at is None and stamp is not None and not record.finished:
                current.logged_at = stamp
            current.records.append(record)
            current.errors += pending_errors
            pending_errors = []
    if pending_errors and steps:
        steps[-1].errors += pending_errors
    mtime = os.stat(path).st_mtime
    _assign_times(steps, mtime, default_step_seconds)
    return FileTimeline(path, steps, sum(step.logged_at is not None and not step.event for step in steps), mtime)


def _assign_times(entries: list[Step], mtime: float, default_step_seconds: float) -> None:
    """Each step's time: its own timestamp, else the next step's time minus the next step's duration;
    then each event's."""
    steps = [entry for entry in entries if not entry.event]
    durations = [step.duration() for step in steps]
    known = [seconds for seconds in durations if seconds is not None]
    fallback = statistics.median(known) if known else default_step_seconds
    following: float | None = None
    for index in range(len(steps) - 1, -1, -1):
        step = steps[index]
        if step.logged_at is not None:
            step.time = step.logged_at
        elif following is None:
            step.time = mtime
        else:
            after = durations[index + 1]
            step.time = following - (after if after is not None else fallback)
        following = step.time
    _time_events(entries, mtime)
    for record_step in entries:
        record_step.time = round(record_step.time, 3)  # milliseconds, as Prometheus stores them
        for record in record_step.records:
            record.time = record_step.time


def _time_events(entries: list[Step], mtime: float) -> None:
    """An event at its line's timestamp; a save else at the saved step's time less how long verl says
    the save took, never before the step before it; else just after the step before (or at the next;
    at the file's modification time in a file of no step, such as a job's stderr)."""
    for index, entry in enumerate(entries):
        if not entry.event:
            continue
        before = next((e.time for e in reversed(entries[:index]) if not e.event), None)
        after = next((e for e in entries[index + 1:] if not e.event), None)
        if entry.logged_at is not None:
            entry.time = entry.logged_at
            continue
        saving = entry.records[0].checkpoint_step is not None
        seconds = after.seconds(CHECKPOINT_SAVE_KEYS) if after is not None and saving else None
        if after is not None and seconds is not None:
            entry.time = after.time - seconds if before is None else max(before + 0.001, after.time - seconds)
        elif before is not None:
            entry.time = before + 0.001
        else:
            entry.time = after.time if after is not None else mtime
