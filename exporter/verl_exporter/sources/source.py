"""``Source``: one path or glob of verl's output followed, each line turned into a Record for the
store: a step's values (FileLogger JSONL, flat JSON lines or console), the run's config print or
config file, its length, checkpoint saves, error lines and the trainer's fatal end."""

from __future__ import annotations

import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Mapping

from verl_exporter.sources.checkpoint import MARKER, parse_checkpoint_start
from verl_exporter.sources.config_files import CONFIG_READER, ConfigReader, Result, signature
from verl_exporter.sources.console import (
    ANSI,
    carriage_segments,
    is_finished_line,
    parse_console_continuation,
    parse_console_line,
)
from verl_exporter.sources.errors import MAX_LINE_CHARS, error_kind
from verl_exporter.sources.fatal import TrainerExit
from verl_exporter.sources.globs import is_literal
from verl_exporter.sources.jsonl import JsonlReader
from verl_exporter.sources.naming import FORMATS, format_for, run_for
from verl_exporter.sources.open_files import OpenFiles
from verl_exporter.sources.pairing import job_of
from verl_exporter.sources.quiet import ACTOR_LINE, is_quiet
from verl_exporter.sources.run_config import (
    ConfigPrint,
    Scalar,
    flatten,
    is_verl_config,
    parse_total_steps,
    run_names,
)
from verl_exporter.sources.store_interface import Store
from verl_exporter.sources.tail import FileFollower
from verl_exporter.store.owners import NO_TEAMS, Owners, file_owner, user_name
from verl_exporter.store.records import ParseError, Record, RunKey, clean_text, display_path

log = logging.getLogger("verl_exporter.sources")

_CONFIG_NAME = re.compile(r"'(project|experiment)_name': '([^'\\]+)'")  # in verl's printed config
WARNING_INTERVAL_S = 10.0  # at most one warning per file per interval; the rest are counted


@dataclass
class FileState:
    path: str  # as served (display_path); the follower reads the file by the name the system gives
    run: RunKey
    fmt: str
    dropped: Callable[[str], None] | None = None  # counts a value the parsers left out, by reason
    last_step: int | None = None
    after_step: bool = False  # the previous console line was a step line (or its continuation)
    config_print: ConfigPrint | None = None  # verl's config print, being read
    named: bool = False  # the run's config print was read: the run has its name
    raw: str = ""  # the path as the system gives it (the follower's)
    config_version: tuple | None = None  # of a config file (fmt "config"): the version last read
    job: str = ""  # the job whose output the file is (pairing.job_of)
    uid: int | None = None  # the file's owner (its run's user), as it was opened
    log_named: bool = False  # the log named the run (its config print or a line of it)
    exit: TrainerExit = field(default_factory=TrainerExit)  # the trainer's fatal end, watched for
    jsonl: JsonlReader = field(default_factory=JsonlReader)  # the shape of a JSON-lines file


class Source:
    """Follows verl log files matching ``pattern`` and ingests one Record per step line.

    Malformed and oversize lines are reported to ``store.parse_error(path, reason)`` and logged
    (rate limited), never raised: ``poll()`` does not raise.
    """

    def __init__(
        self,
        pattern: str,
        store: Store,
        *,
        fmt: str = "auto",
        project: str | None = None,
        experiment: str | None = None,
        clock: Callable[[], float] = time.time,
        max_line_bytes: int = 1 << 20,
        open_files: OpenFiles | None = None,
        config_reader: ConfigReader = CONFIG_READER,
        owners: Owners = NO_TEAMS,
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown log format {fmt!r}; expected one of {', '.join(FORMATS)}")
        self.pattern = pattern
        self.store = store
        self.fmt = fmt
        self.project = clean_text(project) if project else project  # a flag may hold surrogates
        self.experiment = clean_text(experiment) if experiment else experiment
        self.clock = clock
        self.owners = owners  # the team of each run's owner
        self.follower = FileFollower(pattern, max_line_bytes=max_line_bytes, open_files=open_files)
        self._files: dict[str, FileState] = {}
        self._reported: dict[str, str | None] = {}  # the follower's status as the store last heard it
        self._grown: dict[str, FileState] = {}  # config files that grew in this poll
        self.config_reader = config_reader  # parses config files on its own thread
        self._configs_read: deque[Result] = deque()
        self._warned_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    @property
    def named(self) -> bool:
        """Whether the operator named this source's run (``--project`` and ``--experiment``) or its
        file (a path, not a glob): its records may feed a run another source feeds too."""
        return bool(self.project and self.experiment) or is_literal(self.pattern)

    @property
    def behind(self) -> bool:
        """True when the last poll stopped before the end of a file (a backlog is being read)."""
        return self.follower.behind

    @property
    def caught_up(self) -> bool:
        """True once a poll has read every line its files held (the backlog at start is ingested)
        and its config files waiting to be parsed are parsed."""
        # The reader is asked first: it hands a result over before it stops being busy, so a result
        # that lands between the two checks is still seen in the outbox.
        return (self.follower.caught_up and not self.config_reader.pending(self._configs_read)
                and not self._configs_read)

    def settle(self, timeout: float = 30.0) -> int:
        """Poll until the backlog is read and the config files are parsed (or ``timeout``); the
        records ingested. For readers of whole files and tests: the ingestor just polls."""
        deadline, ingested = time.monotonic() + timeout, self.poll()
        while not self.caught_up and time.monotonic() < deadline:
            time.sleep(0.01)
            ingested += self.poll()
        return ingested

    def close(self) -> None:
        """Stop following; the store forgets this source's paths (a reload may have dropped it)."""
        self.follower.close()
        self.follower.status = {}
        self._report_status(self.clock())

    def poll(self) -> int:
        """Read what was written since the last poll; return the number of records ingested.

        Lines are parsed one file at a time as they are read: a backlog is never held whole."""
        ingested = 0
        written_at: dict[str, float] = {}
        now = self.clock()
        try:
            for lines in self.follower.poll_iter():
                ingested += self._ingest_lines(lines, written_at, now)
            oversize = self.follower.take_oversize()
        except Exception as exc:  # following must never stop ingestion
            self._warn(self.pattern, f"cannot follow {display_path(self.pattern)}: {exc!r}", time.time())
            return ingested
        if self.follower.status != self._reported:
            self._report_status(now)
        for path, size in oversize:
            limit = self.follower.max_line_bytes
            self._reject(path, f"line of {size}+ bytes over the {limit} byte limit", now)
        return ingested + self._read_config_files(written_at, now)

    def _ingest_lines(self, lines: list[tuple[str, str]], written_at: dict[str, float], now: float) -> int:
        ingested, named = 0, self.named
        first = self._files.get(lines[0][0]) if lines else None  # one file's lines
        if first is not None and self.follower.uid_of(first.raw) not in (None, first.uid):
            del self._files[first.raw]  # a file of another owner now at its path: a file of its own
        for path, line in lines:
            state = self._files.get(path) or self._new_state(path)
            if path not in written_at:
                written_at[path] = _written_at(path, now)
            self._sees(state)
            if (state.fmt == "console" and state.config_print is None and is_quiet(line, state.exit)
                    and (not state.after_step or "-" not in line)):
                state.after_step = False  # no record, nothing else to note (sources.quiet)
                continue
            if "\r" in line and state.fmt == "console":  # each segment a line of its own (no "\r" left)
                ingested += self._ingest_lines([(path, segment) for segment in carriage_segments(line)],
                                               written_at, now)
                continue
            try:
                record = self._parse(state, line, written_at[path])
            except ParseError as exc:
                self._reject(path, str(exc), now)
                continue
            except Exception as exc:
                self._reject(path, f"unreadable line ({type(exc).__name__})", now)
                continue
            if record is None:
                continue
            record.named = named
            try:
                self.store.ingest(record)
            except Exception as exc:
                self._warn(path, f"store rejected a record from {path}: {exc!r}", now)
                continue
            ingested += 1
        return ingested

    def line_parser(self, path: str) -> Callable[[str, float], Record | None]:
        """``parse(line, now)``: one line of ``path`` at a time, as ``poll`` reads it (the same
        records, the same errors raised), for readers of whole files such as ``backfill``. Of a console
        line with carriage returns, whose segments ``poll`` reads one by one, it returns the last step
        record (else the last record; the first error when there is none)."""
        state = self._new_state(path)

        def parse(line: str, now: float) -> Record | None:
            self._sees(state)
            if "\r" not in line or state.fmt != "console":
                return self._parse(state, line, now)
            records: list[Record] = []
            error: Exception | None = None
            for segment in carriage_segments(line):
                try:
                    record = self._parse(state, segment, now)
                except Exception as exc:
                    error = error or exc
                    continue
                if record is not None:
                    records.append(record)
            steps = [record for record in records if record.values]
            if steps or records:
                return (steps or records)[-1]
            if error is not None:
                raise error
            return None

        return parse

    def _new_state(self, path: str) -> FileState:
        uid = self.follower.uid_of(path)
        uid = file_owner(path) if uid is None else uid
        named = run_for(path, self.project, self.experiment)
        state = FileState(display_path(path), self.owners.run(named.project, named.experiment, user_name(uid)),
                          format_for(path, self.fmt), raw=path, uid=uid)
        if state.fmt != "config":
            state.job = job_of(path, uid)
        state.dropped = lambda reason: self._count_dropped(state.path, reason)
        self._files[path] = state
        return state

    def _report_status(self, now: float) -> None:
        """Tell the store which paths can be read, where it takes it (the follower logs why not)."""
        status, before = dict(self.follower.status), self._reported
        self._reported = status
        try:
            for path, reason in status.items():
                if path not in before or before[path] != reason:
                    self.store.source_state(display_path(path), reason)
            for path in before.keys() - status.keys():
                self.store.forget_source(display_path(path))
        except Exception as exc:
            self._warn(self.pattern, f"store failed to take the state of a source: {exc!r}", now)

    def _count_dropped(self, source: str, reason: str) -> None:
        """A value of ``source`` the parser left out (no number), counted where the store takes it."""
        try:
            self.store.values_dropped(source, reason)
        except Exception as exc:
            self._warn(source, f"store failed to count a dropped value: {exc!r}", time.time())

    def _sees(self, state: FileState) -> None:
        """A line of ``state``'s file arrived, read or skipped as quiet: a subclass notes what it must
        of every line here (a job's file takes the run its other file named)."""

    def _parse(self, state: FileState, line: str, now: float) -> Record | None:
        record = self._parse_line(state, line, now)
        if record is not None and state.job:
            record.job = state.job
            record.from_path = not (state.log_named or (self.project and self.experiment))
        return record

    def _parse_line(self, state: FileState, line: str, now: float) -> Record | None:
        if state.fmt == "config":
            self._grown[state.raw] = state  # read again, as a whole, off the ingest path
            return None
        if state.fmt == "jsonl":
            parsed: tuple[int, Mapping[str, float | str]] | None = state.jsonl.parse(line, state.dropped)
            if parsed is None:
                return None
            state.last_step = parsed[0]
            return Record(state.run, parsed[0], parsed[1], now, source=state.path)

        if state.config_print is not None or "{'" in line:
            record = self._config_print(state, line, now)
            if record is not False:
                return record
        if state.last_step is None and "_name': '" in line:
            self._name_run_from_config(state, line)
        if "Total training steps:" in line:
            total = parse_total_steps(line)
            if total is not None:
                return Record(state.run, state.last_step or 0, {}, now, source=state.path, total_steps=total)
        after_step, state.after_step = state.after_step, False
        # Most console lines are other output: skip them without parsing (ANSI codes could hide "step:").
        parsed = (parse_console_line(line, lazy=True, dropped=state.dropped)
                  if "step:" in line or ("\x1b" in line and "step" in line) else None)
        if parsed is not None:
            state.last_step, state.after_step = parsed[0], True
            state.exit.step()
            return Record(state.run, parsed[0], parsed[1], now, source=state.path)
        if MARKER in line:
            saved = parse_checkpoint_start(line)
            if saved is not None:
                return Record(state.run, state.last_step or 0, {}, now, source=state.path, checkpoint_step=saved)
        if after_step and state.last_step is not None:
            values = parse_console_continuation(line, state.dropped) or {}
            if values:
                state.after_step = True
                return Record(state.run, state.last_step, values, now, source=state.path)
        if is_finished_line(line):
            step = state.last_step if state.last_step is not None else 0
            return Record(state.run, step, {}, now, finished=True, source=state.path)
        if not ACTOR_LINE.match(line):  # the driver's own line: its fatal end, if it is one
            text = ANSI.sub("", line) if "\x1b" in line else line
            fatal = state.exit.feed(text)
            if fatal is not None:  # it names its run from the path if nothing did yet
                return Record(state.run, state.last_step or 0, {}, now, source=state.path, fatal=fatal,
                              line=clean_text(text[:MAX_LINE_CHARS]))
        kind = error_kind(line)
        # Before the run is known (its config print or first step) an error would name a run of its own,
        # and is Ray's start-up noise (caught exceptions) more often than the run's; an OOM is not.
        if kind is not None and (state.named or state.last_step is not None or kind == "cuda_oom"
                                 or (self.project and self.experiment)):
            return Record(state.run, state.last_step or 0, {}, now, source=state.path, error=kind,
                          line=clean_text(ANSI.sub("", line[:MAX_LINE_CHARS])))
        return None

    def _config_print(self, state: FileState, line: str, now: float) -> Record | None | Literal[False]:
        """A line of verl's config print: the run's settings once the print is complete, None while
        it goes on; False for a line that is not part of one."""
        if state.config_print is None:
            state.config_print = ConfigPrint.start(line)
            if state.config_print is None:
                return False
        try:
            taken, config = state.config_print.feed(line)
        except ParseError:
            state.config_print = None
            raise
        if not taken:
            if state.config_print.broken:
                state.config_print = None
                self._reject(state.path, "config print ends before its closing bracket", now)
            return False
        if config is None:
            return None
        state.config_print = None
        flat = flatten(config)
        if not is_verl_config(flat):
            return None  # another dict printed at the start of a line: not the config
        names = run_names(flat)
        if names is not None and state.last_step is None:  # a config printed later: the same run
            state.run = self._run(state, self.project or names[0], self.experiment or names[1])
            state.log_named = True
        state.named = True
        return Record(state.run, state.last_step or 0, {}, now, source=state.path, run_config=flat)

    def _read_config_files(self, written_at: dict[str, float], now: float) -> int:
        """Hand each config file that changed to the config reader (once per version: device,
        inode, size, mtime); ingest the settings it has read since the last poll."""
        grown, self._grown = self._grown, {}
        for path, state in grown.items():
            version = signature(path)
            if version is not None and version != state.config_version:
                state.config_version = version
                self.config_reader.submit(self._configs_read, path)
        ingested = 0
        while self._configs_read:
            path, result = self._configs_read.popleft()
            target = self._files.get(path)
            if target is None:
                continue
            try:
                if isinstance(result, ParseError):
                    raise result
                record = self._config_file_record(target, result, written_at.get(path) or _written_at(path, now))
                record.named = self.named
                self.store.ingest(record)
                ingested += 1
            except ParseError as exc:
                self._reject(path, str(exc), now)
            except Exception as exc:
                self._warn(path, f"store rejected a record from {path}: {exc!r}", now)
        return ingested

    def _config_file_record(self, state: FileState, flat: dict[str, Scalar], now: float) -> Record:
        """The settings of a config file (hydra's config.yaml, or a saved config print); the run is
        the config's trainer.project_name / experiment_name."""
        names = run_names(flat)
        if names is None and not (self.project and self.experiment):
            raise ParseError("not a verl config: no trainer.project_name and trainer.experiment_name")
        project, experiment = names or (self.project or "", self.experiment or "")  # both set when names is None
        state.run = self._run(state, self.project or project, self.experiment or experiment)
        return Record(state.run, 0, {}, now, source=state.path, run_config=flat)

    def _name_run_from_config(self, state: FileState, line: str) -> None:
        """verl prints its config before the first step; its trainer.project_name and
        trainer.experiment_name name the run better than the log's path (flags still win)."""
        names = dict(_CONFIG_NAME.findall(line))
        state.log_named = state.log_named or bool(names)
        state.run = self._run(
            state,
            state.run.project if self.project else names.get("project", state.run.project),
            state.run.experiment if self.experiment else names.get("experiment", state.run.experiment),
        )

    def _run(self, state: FileState, project: str, experiment: str) -> RunKey:
        """The run of these names owned by the file's owner: a file names only its own user's runs."""
        return self.owners.run(project, experiment, state.run.user)

    def _reject(self, path: str, reason: str, now: float) -> None:
        path = display_path(path)
        try:
            self.store.parse_error(path, reason)
        except Exception as exc:
            self._warn(path, f"store failed to count a parse error: {exc!r}", now)
        self._warn(path, f"skipped a line of {path}: {reason}", now)

    def _warn(self, key: str, message: str, now: float) -> None:
        last = self._warned_at.get(key)
        if last is not None and 0 <= now - last < WARNING_INTERVAL_S:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        self._warned_at[key] = now
        more = self._suppressed.pop(key, 0)
        log.warning("%s%s", message, f" ({more} similar warnings suppressed)" if more else "")


def _written_at(path: str, now: float) -> float:
    """When the lines just read were written, at the latest: the file's mtime, or now.

    A restarted exporter re-reads a file whose last step is hours old; the step clock must say so.
    """
    try:
        return min(now, os.stat(path).st_mtime)
    except OSError:
        return now
