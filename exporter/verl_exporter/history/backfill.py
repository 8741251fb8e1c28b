"""``verl-exporter backfill``: a run's whole history as the samples Prometheus would have scraped.

Every step of the given logs goes, in time order, through the exporter's own ``RunStore`` and
``TrainingCollector``, so names, labels, units and HELP are those the live exporter serves,
``verl_training_last_step`` and the step clock included. The series are then written as they
would have been scraped: one sample per scrape interval (15 s, as ``prometheus/prometheus.yml``)
from the first step to the last (or ``--until``), each holding the latest value, with the target
labels ``job`` and ``instance`` that Prometheus adds. The output is OpenMetrics with timestamps;
``promtool tsdb create-blocks-from openmetrics`` turns it into TSDB blocks, run here when
promtool is on PATH (otherwise the command is printed). How each step's time is found: see
``timeline``.

The samples are streamed to the file series by series and split into block windows through files,
so memory follows the log's length (its steps), not the history's length in scrapes.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import glob
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, TextIO

from prometheus_client.utils import floatToGoString

from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.config.durations import parse_duration
from verl_exporter.sources import FORMATS
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import RunKey, is_event
from verl_exporter.store.run_store import RunStore

from .tempo import median_step_seconds, retime
from .timeline import DEFAULT_STEP_SECONDS, FileTimeline, read_file, split_timestamp

SCRAPE_INTERVAL = 15.0
BLOCK_MILLISECONDS = 2 * 3600 * 1000  # promtool's block windows, aligned to multiples of this
# The block ranges Prometheus compacts to (2h, 6h, 18h ... 39,366h): promtool's --max-block-duration
# is rounded down to one of them.
BLOCK_RANGES = tuple(BLOCK_MILLISECONDS * 3 ** power for power in range(10))
PROMTOOLS_AT_ONCE = 2
OPENMETRICS_FILE = "backfill.om"
BLOCKS_DIR = "blocks"
HELP_NOTE = (" Backfilled from the log: step times are the lines' own timestamps where they have them,"
             " else reconstructed backwards from the file's modification time by timing_s/step.")

# A history longer than this is no run's: a line's timestamp (1970, 2100) or a logged step time
# (timing_s/step 1e12) is wrong, and its samples would not fit in memory.
MAX_HISTORY_SECONDS = 366 * 86400.0
MAX_SAMPLES = 50_000_000  # written by one backfill: past it, a longer --scrape-interval
WRITE_LINES = 4096  # lines of one series written at once
SPLIT_BUFFER = 16 * 1024 * 1024  # characters split_by_block holds before appending them to the parts

SeriesId = tuple[str, str, tuple[tuple[str, str], ...]]  # (family, sample name, labels)


@dataclass
class History:
    """What the live exporter would have served over a run: each series' values as they changed."""

    families: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (type, help)
    series: dict[SeriesId, list[tuple[float, float | None]]] = field(default_factory=dict)  # None: no longer served
    steps: dict[RunKey, list[tuple[float, int]]] = field(default_factory=dict)  # each run's step clock
    runs: set[RunKey] = field(default_factory=set)  # every run its records fed, stepped or not
    timelines: list[FileTimeline] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0

    def step_at(self, run: RunKey, moment: float) -> int | None:
        """The run's last step logged at or before ``moment``."""
        clock = self.steps.get(run, [])
        index = bisect.bisect_right(clock, (moment, math.inf))
        return clock[index - 1][1] if index else None

    def median_step(self) -> float | None:
        """The median time between consecutive steps of its files."""
        return median_step_seconds(self.timelines)

    def grid(self, interval: float) -> list[float]:
        """The scrape times: every ``interval`` from the first step, and the end."""
        return list(self.scrapes(interval))

    def scrapes(self, interval: float) -> Iterator[float]:
        """``grid``, one time after the other."""
        count = int((self.end - self.start) // interval)
        for k in range(count + 1):
            yield round(self.start + k * interval, 3)
        if round(self.start + count * interval, 3) < round(self.end, 3):
            yield round(self.end, 3)


def build(paths: list[str], *, fmt: str = "auto", project: str | None = None, experiment: str | None = None,
          until: float | None = None, default_step_seconds: float = DEFAULT_STEP_SECONDS,
          tempo: float | None = None, gpus: float = 0.0) -> History:
    """Read ``paths`` and replay their steps through a RunStore, in time order. With ``tempo``, as
    the same run whose median step takes ``tempo`` seconds (``history.tempo``); ``gpus``: of a run
    whose config names none, for its goodput ledger."""
    history = History()
    events = []
    for path in paths:
        history.timelines.append(read_file(path, fmt=fmt, project=project, experiment=experiment,
                                           default_step_seconds=default_step_seconds))
    if tempo is not None:
        retime(history.timelines, tempo)
    for index, timeline in enumerate(history.timelines):
        events += [(step.time, index, order, step) for order, step in enumerate(timeline.steps)]
    if not events:
        raise ValueError("no training steps and no errors in " + ", ".join(paths))
    events.sort(key=lambda event: event[:3])
    span = max(events[-1][0], until if until is not None else -math.inf) - events[0][0]
    if span > MAX_HISTORY_SECONDS:
        raise ValueError(f"the logs' times span {span / 86400 / 365.25:.3g} years, {_iso(events[0][0])} to "
                         f"{_iso(events[-1][0] if until is None else max(until, events[-1][0]))}: over a year, so a "
                         "line's timestamp or a logged step time (timing_s/step) is wrong")
    store = RunStore(default_catalog(), gpus=gpus)
    collector = TrainingCollector(store)
    latest: dict[SeriesId, float] = {}
    position = 0
    while position < len(events):
        moment = events[position][0]
        while position < len(events) and events[position][0] == moment:
            _, index, _, step = events[position]
            for reason in step.errors:
                store.parse_error(paths[index], reason)
            for record in step.records:
                store.ingest(record)  # which may give it to the run of its job's other file (pairing)
                history.runs.add(record.run)
                if not record.finished and not is_event(record):
                    clock = history.steps.setdefault(record.run, [])
                    if not clock or clock[-1][1] != record.step:
                        clock.append((moment, record.step))
            position += 1
        store.tick(moment)
        _record_changes(history, collector, latest, moment)
    history.start = events[0][0]
    history.end = max(events[-1][0], until if until is not None else -math.inf)
    return history


def _record_changes(history: History, collector: TrainingCollector, latest: dict, moment: float) -> None:
    """The samples that changed at ``moment``, and the end (None) of each series no longer served, as a
    live Prometheus marks it stale."""
    served = set()
    for family in collector.collect():
        if family.name not in history.families:
            history.families[family.name] = (family.type, family.documentation)
        for sample in family.samples:
            key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
            served.add(key)
            value = float(sample.value)
            before = latest.get(key)
            if before is not None and (before == value or (math.isnan(before) and math.isnan(value))):
                continue
            latest[key] = value
            history.series.setdefault(key, []).append((moment, value))
    if len(served) < len(latest):
        for key in [key for key in latest if key not in served]:
            del latest[key]
            history.series[key].append((moment, None))


def escape(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def write_openmetrics(history: History, out: TextIO | BlockParts, *, interval: float = SCRAPE_INTERVAL,
                      job: str = "verl", instance: str = "backfill", keep: Callable[[str], bool] | None = None,
                      copies: Mapping[tuple[str, str], str] | None = None) -> int:
    """Write the history as OpenMetrics with a timestamp on every sample; return the samples written.
    ``out``: a text file, or ``BlockParts`` (one file per block window of the samples' times).
    ``keep``: whether a series name is written (all are without it). ``copies``: (series name, its
    ``metric`` label) -> a recorded name under which the series is written again without that label
    (a recording rule that only drops it: the same samples). Each series is written as its samples
    are made, a few thousand lines at a time: the text is never held whole."""
    count = int((history.end - history.start) // interval) + 2
    if count * len(history.series) > MAX_SAMPLES:
        shortest = (history.end - history.start) * len(history.series) / MAX_SAMPLES
        raise ValueError(f"{count} scrapes of {len(history.series)} series are over {MAX_SAMPLES:,} samples: "
                         f"give a longer --scrape-interval (at least {math.ceil(shortest)} s)")
    parts = out if isinstance(out, BlockParts) else BlockParts.single(out)
    scrapes = Scrapes(history.scrapes(interval), parts.block)
    target = (("instance", instance), ("job", job))
    written = 0
    by_family: dict[str, list[SeriesId]] = {}
    copied: dict[str, list[SeriesId]] = {}
    for key in history.series:
        by_family.setdefault(key[0], []).append(key)
        copy = copies.get((key[1], dict(key[2]).get("metric", ""))) if copies else None
        if copy is not None:
            copied.setdefault(copy, []).append(key)
    for name, (kind, documentation) in history.families.items():
        keys = [key for key in by_family.get(name, ()) if keep is None or keep(key[1])]
        if not keys:
            continue
        parts.family(f"# HELP {name} {escape(documentation + HELP_NOTE)}\n# TYPE {name} {kind}\n")
        for key in sorted(keys):
            labels = ",".join(f'{label}="{escape(value)}"' for label, value in sorted(key[2] + target))
            written += _write_series(parts, f"{key[1]}{{{labels}}} ", history.series[key], scrapes)
    for name, keys in sorted(copied.items()):
        parts.family(f"# TYPE {name} gauge\n")
        for key in sorted(keys):
            labels = ",".join(f'{label}="{escape(value)}"' for label, value in sorted(key[2] + target)
                              if label != "metric")
            written += _write_series(parts, f"{name}{{{labels}}} ", history.series[key], scrapes)
    parts.end()
    return written


class Scrapes:
    """The scrape times, each as written after a sample's value (`` <time>\\n``), and the block window
    (``block`` milliseconds; 0 for none) each falls in."""

    def __init__(self, times: Iterable[float], block: int = 0):
        self.times = tuple(times)
        self.texts = tuple(f" {moment:.3f}\n" for moment in self.times)
        self.windows = tuple(int(moment * 1000) // block if block else 0 for moment in self.times)


class BlockParts:
    """OpenMetrics text as one file per block window (``block`` milliseconds) of its samples' times,
    each with the HELP and TYPE lines of the families it holds and its own ``# EOF``: what promtool
    reads once per block it writes. The parts are new files (``mkstemp``) in ``folder``; ``single``
    writes everything to one text file instead."""

    def __init__(self, folder: Path | None, block: int, stem: str = "backfill"):
        self.folder, self.block, self.stem = folder, block, stem
        self.files: dict[int, TextIO] = {}
        self.paths: dict[int, Path] = {}
        self.header = ""
        self.headed: dict[int, str] = {}  # window -> the header it got last

    @classmethod
    def single(cls, out: TextIO) -> BlockParts:
        parts = cls(None, 0)
        parts.files[0] = out
        return parts

    def family(self, header: str) -> None:
        self.header = header
        if self.folder is None:  # one file: every family named, as written
            self.files[0].write(header)
            self.headed[0] = header

    def write(self, window: int, lines: list[str]) -> None:
        out = self.files.get(window)
        if out is None:
            assert self.folder is not None
            handle, name = tempfile.mkstemp(prefix=f".{self.stem}-{window}-", suffix=".om", dir=self.folder)
            out = self.files[window] = os.fdopen(handle, "w", encoding="utf-8")
            self.paths[window] = Path(name)
        if self.headed.get(window) != self.header:
            out.write(self.header)
            self.headed[window] = self.header
        out.writelines(lines)

    def end(self) -> None:
        for out in self.files.values():
            out.write("# EOF\n")
        if self.folder is not None:
            self.close()

    def close(self) -> None:
        for out in self.files.values():
            out.close()

    def discard(self) -> None:
        self.close()
        for path in self.paths.values():
            path.unlink(missing_ok=True)

    def written(self) -> list[Path]:
        return [self.paths[window] for window in sorted(self.paths)]


def _write_series(parts: BlockParts, prefix: str, changes: list, scrapes: Scrapes) -> int:
    """One series' sample at each scrape (its value then, while it has one); the samples written.
    A value is formatted once, at the change that brings it."""
    position, head, written = 0, None, 0
    lines: list[str] = []
    window = None
    for moment, text, part in zip(scrapes.times, scrapes.texts, scrapes.windows):
        while position < len(changes) and changes[position][0] <= moment:
            value = changes[position][1]
            head = None if value is None else prefix + floatToGoString(value)
            position += 1
        if head is not None:
            if part != window or len(lines) == WRITE_LINES:
                if lines:
                    parts.write(window, lines)  # type: ignore[arg-type]
                    written += len(lines)
                lines, window = [], part
            lines.append(head + text)
    if lines:
        parts.write(window, lines)  # type: ignore[arg-type]
    return written + len(lines)


def promtool_command(openmetrics: Path, blocks: Path, promtool: str = "promtool",
                     block: int = BLOCK_MILLISECONDS) -> list[str]:
    wider = [f"--max-block-duration={block // 1000}s"] if block != BLOCK_MILLISECONDS else []
    return [promtool, "tsdb", "create-blocks-from", "openmetrics", *wider, str(openmetrics), str(blocks)]


def block_for(start: float, end: float, most: int = 4) -> int:
    """The shortest block range (milliseconds) that holds ``start``..``end`` (unix seconds) in at most
    ``most`` blocks: a replay's Prometheus opens and searches a few blocks, not one per two hours."""
    span = (end - start) * 1000
    return next((block for block in BLOCK_RANGES if span / block <= most - 1), BLOCK_RANGES[-1])


def create_blocks(openmetrics: Path, blocks: Path, promtool: str, block: int = BLOCK_MILLISECONDS) -> None:
    """Run promtool over the OpenMetrics file, in blocks of ``block`` milliseconds (a block range);
    RuntimeError with promtool's output if it fails.

    promtool reads its whole input once for every block it writes, so a history of weeks (slow
    steps) in two-hour blocks would cost hundreds of passes: it is first split into one file per
    block window, each read once, two promtools at a time."""
    blocks.mkdir(parents=True, exist_ok=True)
    parts = split_by_block(openmetrics, block)
    try:
        blocks_from_parts(parts, blocks, promtool, block)
    finally:
        for part in parts:
            if part != openmetrics:
                part.unlink(missing_ok=True)


def write_blocks(history: History, folder: Path, blocks: Path, promtool: str, block: int = BLOCK_MILLISECONDS,
                 **openmetrics: Any) -> int:
    """``write_openmetrics`` of ``history`` straight into one file per block window (in ``folder``,
    removed after), then promtool over each into ``blocks``: ``create_blocks`` without the whole
    text written and read again. The samples written."""
    blocks.mkdir(parents=True, exist_ok=True)
    parts = BlockParts(folder, block)
    try:
        written = write_openmetrics(history, parts, **openmetrics)
        blocks_from_parts(parts.written(), blocks, promtool, block)
    finally:
        parts.discard()
    return written


def blocks_from_parts(parts: list[Path], blocks: Path, promtool: str, block: int) -> None:
    """promtool over each part (an OpenMetrics file of one block window), two at a time."""
    with ThreadPoolExecutor(PROMTOOLS_AT_ONCE) as pool:
        results = list(pool.map(lambda part: subprocess.run(promtool_command(part, blocks, promtool, block),
                                                            capture_output=True, text=True), parts))
    for result in results:
        if result.returncode:
            raise RuntimeError(f"promtool failed ({result.returncode}): "
                               f"{(result.stderr or result.stdout).strip()[-2000:]}")


def split_by_block(openmetrics: Path, block: int = BLOCK_MILLISECONDS) -> list[Path]:
    """``openmetrics`` as one file per block window (``block`` milliseconds) of its samples (itself
    when it has one). The parts are new files (``mkstemp``) beside it; at most ``SPLIT_BUFFER``
    characters are held before they are appended to their parts."""
    parts: dict[int, Path] = {}
    pending: dict[int, list[str]] = {}  # window -> its lines not yet in its part
    held = 0
    header: dict[str, list[str]] = {}  # family -> its HELP and TYPE lines
    family = ""
    seen: dict[int, str] = {}  # window -> the last family whose header it got

    def flush() -> None:
        for window, lines in pending.items():
            if window not in parts:
                handle, name = tempfile.mkstemp(prefix=f".{openmetrics.stem}-{window}-", suffix=".om",
                                                dir=openmetrics.parent)
                os.close(handle)
                parts[window] = Path(name)
            _append(parts[window], lines)
        pending.clear()

    try:
        with openmetrics.open(encoding="utf-8") as lines:
            for line in lines:
                if line.startswith("#"):
                    if line.startswith(("# HELP ", "# TYPE ")):
                        name = line.split(" ", 3)[2]
                        if name != family:
                            family, header[name] = name, []
                        header[name].append(line)
                    continue
                window = int(float(line.rsplit(" ", 1)[1]) * 1000) // block
                out = pending.setdefault(window, [])
                if seen.get(window) != family:
                    out += header.get(family, [])
                    held += sum(map(len, header.get(family, [])))
                    seen[window] = family
                out.append(line)
                held += len(line)
                if held > SPLIT_BUFFER:
                    flush()
                    held = 0
        if len(seen) <= 1:
            for part in parts.values():
                part.unlink()
            return [openmetrics]
        for window in seen:
            pending.setdefault(window, []).append("# EOF\n")
        flush()
    except BaseException:
        for part in parts.values():
            part.unlink(missing_ok=True)
        raise
    return [parts[window] for window in sorted(parts)]


def _append(path: Path, lines: list[str]) -> None:
    """Append ``lines`` to ``path``, a file this process made: never through a link put in its place."""
    with open(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW), "w", encoding="utf-8") as out:
        out.writelines(lines)


def parse_time(text: str) -> float:
    """``now``, unix seconds or an RFC 3339 time, as unix seconds."""
    if text == "now":
        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    moment, rest = split_timestamp(text)
    if moment is None or rest.strip():
        raise ValueError(f"not a time: {text!r} (want now, unix seconds or RFC 3339)")
    return moment


def expand(patterns: list[str]) -> list[str]:
    """The files the SOURCE arguments name (paths or globs); ValueError for one that names none."""
    paths: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        matches = [path for path in matches if Path(path).is_file()]
        if not matches:
            raise ValueError(f"no such file: {pattern}")
        paths += [path for path in matches if path not in paths]
    return paths


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments ``backfill`` and ``replay`` share."""
    parser.add_argument("sources", nargs="+", metavar="SOURCE", help="verl JSONL or console log (path or glob)")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="log format (auto: by extension)")
    parser.add_argument("--project", help="project label (default: from the config verl printed, else the folder)")
    parser.add_argument("--experiment", help="experiment label (default: from the config, else the file name)")
    parser.add_argument("--until", type=parse_time, metavar="TIME",
                        help="keep serving the last values until TIME (now, unix seconds or RFC 3339), "
                             "as a live exporter would after the last step")
    parser.add_argument("--scrape-interval", type=float, default=SCRAPE_INTERVAL, metavar="SECONDS",
                        help="seconds between the reconstructed scrapes (default 15)")
    parser.add_argument("--tempo", type=parse_duration, metavar="DURATION",
                        help="replay the run as if its median step took DURATION (e.g. 30s, 40m): every step's "
                             "time and logged duration scaled alike, the same run on faster or slower GPUs")
    parser.add_argument("--gpus", type=float, default=0.0, metavar="N",
                        help="GPUs the run held, where its config does not say (trainer.n_gpus_per_node x "
                             "trainer.nnodes): its goodput ledger in GPU-seconds")
    parser.add_argument("--job", default="verl", help="the job label Prometheus would add")
    parser.add_argument("--instance", default="backfill", help="the instance label Prometheus would add")


def build_from_args(args: argparse.Namespace) -> History:
    return build(expand(args.sources), fmt=args.format, project=args.project, experiment=args.experiment,
                 until=args.until, tempo=args.tempo, gpus=args.gpus)


def backfill(args: argparse.Namespace, output: Path, *, blocks: bool = True) -> tuple[History, Path, int]:
    """Write ``output``/backfill.om and, when asked and promtool is found, ``output``/blocks/.

    Nothing is written through what someone else put there. An existing backfill.om must be a
    regular file and blocks/ a folder, both the running user's, else ValueError: refusing is safer
    than replacing, as nothing of another user's is touched and the user sees what was planted.
    backfill.om is then written to a new file beside it and renamed onto it (``replacing``), so a
    link put there meanwhile is replaced, not followed."""
    openmetrics = output / OPENMETRICS_FILE
    refuse_foreign(openmetrics, stat.S_ISREG, "regular file")
    if blocks:
        refuse_foreign(output / BLOCKS_DIR, stat.S_ISDIR, "folder")
    history = build_from_args(args)
    output.mkdir(parents=True, exist_ok=True)
    with replacing(openmetrics) as out:
        samples = write_openmetrics(history, out, interval=args.scrape_interval, job=args.job,
                                    instance=args.instance)
    if blocks:
        refuse_foreign(output / BLOCKS_DIR, stat.S_ISDIR, "folder")  # again: the build took a while
        create_blocks(openmetrics, output / BLOCKS_DIR, args.promtool)
    return history, openmetrics, samples


def refuse_foreign(path: Path, is_kind: Callable[[int], bool], kind: str) -> None:
    """ValueError where ``path`` exists and is not a ``kind`` of the running user (a link is not)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        reason = "a symbolic link"
    elif not is_kind(info.st_mode):
        reason = f"not a {kind}"
    elif info.st_uid != os.geteuid():
        reason = f"owned by another user (uid {info.st_uid})"
    else:
        return
    raise ValueError(f"refusing to write {path}: it is {reason}; remove it or give another --output")


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[TextIO]:
    """A new file beside ``path`` (``mkstemp``: created, never opened through a link), renamed onto
    ``path`` when the block ends (a link there is replaced, not followed), removed if it raises."""
    handle, name = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    out = os.fdopen(handle, "w", encoding="utf-8")
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(handle, 0o666 & ~mask)  # as open() would have made it
        with out:
            yield out
        os.replace(name, path)
    except BaseException:
        out.close()
        Path(name).unlink(missing_ok=True)
        raise


def describe(history: History) -> str:
    """One line per file: its runs, steps, time span and how the times were found."""
    lines = []
    for timeline in history.timelines:
        if not timeline.steps:
            lines.append(f"{timeline.path}: no steps")
            continue
        first, last = timeline.steps[0], timeline.steps[-1]
        runs = sorted({f"{r.run.project}/{r.run.experiment}" for s in timeline.steps for r in s.records})
        lines.append(f"{timeline.path}: {', '.join(runs)}: {len(timeline.steps)} steps ({first.step}-{last.step}), "
                     f"{iso(first.time)} to {iso(last.time)}, times from {timeline.method}")
    return "\n".join(lines)


def _iso(moment: float) -> str:
    try:
        return iso(moment)
    except (OverflowError, OSError, ValueError):
        return f"{moment:.0f} s"


def iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


DESCRIPTION = ("Write every step of verl logs as timestamped samples (OpenMetrics) and TSDB blocks.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``verl-exporter backfill``."""
    add_source_arguments(parser)
    parser.add_argument("--output", required=True, type=Path, metavar="DIR",
                        help=f"folder for {OPENMETRICS_FILE} and the blocks ({BLOCKS_DIR}/)")
    parser.add_argument("--no-blocks", action="store_true", help="only write OpenMetrics; print the promtool line")
    parser.add_argument("--promtool", default=shutil.which("promtool"), help="promtool binary (default: from PATH)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.scrape_interval <= 0:
        parser.error("--scrape-interval must be > 0")
    make_blocks = not args.no_blocks and bool(args.promtool)
    try:
        history, openmetrics, samples = backfill(args, args.output, blocks=make_blocks)
    except (OSError, ValueError, RuntimeError, ArithmeticError, MemoryError) as exc:
        print(f"verl-exporter backfill: error: {one_line(exc)}", file=sys.stderr)
        return 2
    print(describe(history))
    print(f"wrote {samples} samples of {len(history.series)} series to {openmetrics}")
    blocks = args.output / BLOCKS_DIR
    if make_blocks:
        print(f"wrote TSDB blocks to {blocks}/: copy them into Prometheus' --storage.tsdb.path (see docs/forensics.md)")
    else:
        print("make TSDB blocks with: " + " ".join(promtool_command(openmetrics, blocks)))
    return 0


def one_line(exc: BaseException) -> str:
    """The error as one line."""
    if isinstance(exc, MemoryError):
        return "out of memory: give fewer logs at once or a longer --scrape-interval"
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text or type(exc).__name__
