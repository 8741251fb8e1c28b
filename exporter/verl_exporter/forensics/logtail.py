"""The end of a log file, read from the end in bounded blocks, and the last verl phase it shows.

``read_tail`` never reads more than ``max_bytes`` from the end of the file, whatever its size; the
evidence shows the last ``TAIL_LINES`` of those lines and looks for the phase in all of them.
Progress bars rewrite their line with ``\\r``: a line shows its last rewrite, as a terminal does.
Colour codes are removed and each line is cut at ``MAX_LINE_CHARS``.

The last phase is the last line, read from the end, that matches one of ``PHASES`` (in this order
of names, the first that matches a line wins):

- ``step``: a console step line (``step:41 - ...``) or a FileLogger JSONL line (``{"step": 41, ...``);
- ``progress``: verl's ``Training Progress`` tqdm bar;
- ``checkpoint``: ``local_global_step_folder: ...`` (a save started) or a rank's ``Saved model to``;
- ``validation``: ``Initial validation metrics``, ``Final validation metrics``, ``validation generation end``;
- ``setup``: ``Total training steps: N`` (printed before the first step).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import BinaryIO

TAIL_LINES = 50
MAX_TAIL_BYTES = 64 * 1024
MAX_LINE_CHARS = 1000
BLOCK_BYTES = 8192
_TAIL_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PHASES = (
    ("step", re.compile(r"(?:^|[\s)])step:\d+ - |^\s*\{\s*\"step\"\s*:\s*\d+")),
    ("progress", re.compile(r"Training Progress")),
    ("checkpoint", re.compile(r"local_global_step_folder:|Saved model to")),
    ("validation", re.compile(r"(?:Initial|Final) validation metrics|validation generation end")),
    ("setup", re.compile(r"Total training steps\s*:")),
)


@dataclass
class Tail:
    """The last lines of ``path`` (at most ``max_bytes`` of its end); ``error`` when it could not be read."""

    path: str
    lines: list[str] = field(default_factory=list)
    size: int | None = None
    mtime: float | None = None
    error: str | None = None

    def phase(self) -> tuple[str, str] | None:
        """(phase name, line) of the last line that shows a verl phase, or None."""
        for line in reversed(self.lines):
            for name, pattern in PHASES:
                if pattern.search(line):
                    return name, line
        return None


def read_tail(path: str, max_bytes: int = MAX_TAIL_BYTES, *, inode: tuple[int, int] | None = None,
              follower_read: bool = True) -> Tail:
    """The complete lines among the last ``max_bytes`` bytes of ``path`` (the phase is looked for in
    all of them; ``TAIL_LINES`` of them are shown).

    The file is read as the log followers read: a regular file only, opened without blocking and
    without following a link at its name, and only the file a follower read there (``inode``, its
    device and inode as the follower opened it; with ``follower_read`` and no inode known, none is
    read). A FIFO, a device or a file swapped since for another says why in ``error``."""
    tail = Tail(path)
    if follower_read and inode is None:
        tail.error = "no log follower read this path"
        return tail
    try:
        descriptor = os.open(path, _TAIL_FLAGS)
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                tail.error = "not a regular file"
                return tail
            if inode is not None and (info.st_dev, info.st_ino) != inode:
                tail.error = "not the file the log follower read (the path names another file since)"
                return tail
            tail.size, tail.mtime = info.st_size, info.st_mtime
            data = _read_end(handle, info.st_size, max_bytes)
    except OSError as exc:
        tail.error = exc.strerror or str(exc)
        return tail
    tail.lines = [clean_line(line) for line in data.decode("utf-8", "replace").split("\n")]
    if tail.lines and tail.lines[-1] == "":
        tail.lines.pop()  # the file ends with a newline
    return tail


def _read_end(handle: BinaryIO, size: int, max_bytes: int) -> bytes:
    """The last ``max_bytes`` of the file, read backwards in blocks; a first line cut by the limit
    is left out."""
    blocks, start = [], size
    while start > 0 and size - start < max_bytes:
        length = min(BLOCK_BYTES, start, max_bytes - (size - start))
        start -= length
        handle.seek(start)
        block = handle.read(length)
        if not block:  # the file shrank meanwhile
            break
        blocks.append(block)
    data = b"".join(reversed(blocks))
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
    return data


def clean_line(line: str) -> str:
    """A log line as a terminal shows it: its last ``\\r`` rewrite, no colour codes, cut at ``MAX_LINE_CHARS``."""
    if "\r" in line:
        line = next((part for part in reversed(line.split("\r")) if part.strip()), "")
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " [line cut]"
