"""Where evidence is kept: the latest capture of each run in memory, and optionally one file each.

Memory holds the latest capture of at most ``max_runs`` runs (the oldest capture is let go first).
With a directory, every capture is also written there as
``evidence-<UTC time>-<project>-<experiment>-<hash>.txt``: the names keep only ``[A-Za-z0-9._-]``
of the run's names (runs of other characters become ``_``, 48 characters each at most) and the
hash of the exact names keeps apart two runs whose names read the same. A file is written under
a new temporary name (``mkstemp``: created, never opened through a planted link), then renamed,
readable by its owner only. Retention keeps the ``retention`` newest of the evidence files the
exporter could have written: regular files of its own user, named with a time that is not in the
future; other files, whatever their names, are never counted or touched. A run with no capture in
memory (the exporter restarted) is served its newest such file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

from verl_exporter.store.records import RunKey

from .report import MAX_BYTES, run_line

log = logging.getLogger(__name__)
MAX_RUNS = 32
MAX_RUNS_PER_OWNER = 8  # of those, the runs whose logs one user owns: decoy stalls cannot push the others out
NAME_CHARS = 48
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_FILE = re.compile(r"^evidence-(\d{8}T\d{6})\.\d{6}Z-.*-[0-9a-f]{12}\.txt$")
FUTURE_SLACK_SECONDS = 86400.0  # a name's time past now by more than this is no capture of ours


def run_hash(run: RunKey) -> str:
    names = f"{run.project}\0{run.experiment}".encode("utf-8", "surrogatepass")
    if run.user:  # two users' runs of the same names are two runs, with files of their own
        names += f"\0{run.user}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(names).hexdigest()[:12]


def safe_name(text: str) -> str:
    """``text`` with only ``[A-Za-z0-9._-]``, never empty, never starting with a dot."""
    return _UNSAFE.sub("_", text)[:NAME_CHARS].lstrip(".") or "_"


def file_name(run: RunKey, moment: float) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(moment)) + f".{int(moment % 1 * 1e6):06d}Z"
    return f"evidence-{stamp}-{safe_name(run.project)}-{safe_name(run.experiment)}-{run_hash(run)}.txt"


class EvidenceArchive:
    """Thread-safe: the monitor puts, the HTTP handlers get."""

    def __init__(self, directory: str | None = None, *, retention: int = 50, max_runs: int = MAX_RUNS,
                 max_bytes: int = MAX_BYTES):
        self.directory = Path(directory) if directory else None
        self.retention = retention
        self.max_runs = max_runs
        self.max_bytes = max_bytes
        self._latest: OrderedDict[RunKey, tuple[str, int | None]] = OrderedDict()  # text, its log's owner uid
        self._lock = threading.Lock()
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)  # OSError: the caller says why

    def put(self, run: RunKey, text: str, moment: float, owner: int | None = None) -> str | None:
        """Keep ``text`` as the run's latest evidence; the file written, if any. The file is written
        first, so that evidence that can be read has its file too. ``owner``: the uid owning the
        run's log; one owner's runs hold at most MAX_RUNS_PER_OWNER of the places in memory (its
        oldest capture goes first), so one user's decoy stalls cannot push other users' out."""
        path = None
        if self.directory is not None:
            try:
                path = str(self._write(self.directory, run, text, moment))
            except OSError as exc:
                log.warning("cannot write evidence to %s: %s (kept in memory)", self.directory, exc.strerror or exc)
        with self._lock:
            self._latest.pop(run, None)
            if owner is not None:
                same = [key for key, (_, theirs) in self._latest.items() if theirs == owner]
                for key in same[:max(0, len(same) - MAX_RUNS_PER_OWNER + 1)]:
                    del self._latest[key]
            self._latest[run] = (text, owner)
            while len(self._latest) > self.max_runs:
                self._latest.popitem(last=False)
        return path

    def get(self, run: RunKey) -> str | None:
        """The run's latest evidence: from memory, else its newest file; None if there is none."""
        with self._lock:
            kept = self._latest.get(run)
        text = kept[0] if kept is not None else None
        if text is not None or self.directory is None:
            return text
        return self._read_newest(run)

    def runs(self) -> list[RunKey]:
        with self._lock:
            return sorted(self._latest)

    def files(self) -> list[Path]:
        """The evidence files in the directory that the exporter could have written, oldest first:
        regular files (not links) of its own user, named with a time not in the future."""
        if self.directory is None:
            return []
        latest = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() + FUTURE_SLACK_SECONDS))
        names = []
        try:
            for entry in os.scandir(self.directory):
                match = _FILE.match(entry.name)
                if match is None or match.group(1) > latest:
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                    names.append(entry.name)
        except OSError:
            return []
        return [self.directory / name for name in sorted(names)]

    def _write(self, directory: Path, run: RunKey, text: str, moment: float) -> Path:
        path = directory / file_name(run, moment)
        while path.exists():  # two captures in one microsecond
            moment += 1e-6
            path = directory / file_name(run, moment)
        descriptor, name = tempfile.mkstemp(prefix=".evidence-", suffix=".tmp", dir=directory)  # 0600, O_EXCL
        temporary = Path(name)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8", errors="replace") as handle:
                handle.write(text)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        self._prune()
        return path

    def _prune(self) -> None:
        files = self.files()
        for path in files[:max(0, len(files) - self.retention)]:
            try:
                path.unlink()
            except OSError as exc:
                log.warning("cannot remove old evidence %s: %s", path, exc.strerror or exc)

    def _read_newest(self, run: RunKey) -> str | None:
        suffix, expected = f"-{run_hash(run)}.txt", run_line(run)
        for path in reversed(self.files()):
            if not path.name.endswith(suffix):
                continue
            try:
                descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(descriptor, encoding="utf-8", errors="replace") as handle:
                    text = handle.read(self.max_bytes + 1024)
            except OSError:
                continue
            if expected in text.split("\n", 2)[:2]:
                return text
        return None
