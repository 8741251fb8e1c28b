"""Follow log files like ``tail -F``: complete new lines from a path or a glob, without blocking."""

from __future__ import annotations

import glob
import logging
import math
import os
import stat
from collections.abc import Iterator
from itertools import chain, repeat
from operator import methodcaller

from verl_exporter.sources.birth_time import birth_time
from verl_exporter.sources.globs import MAX_GLOB_DIRS, MAX_MATCHES, expand, is_literal
from verl_exporter.sources.open_files import OPEN_FILE_FLAGS, OPEN_FILES, FileHandle, OpenFiles, close_handle
from verl_exporter.store.records import display_path

log = logging.getLogger(__name__)

_GONE = "\0gone"  # a matched path that is no longer there: no status to report (no real reason is this)

# Each line is decoded on its own: a block holding one character past U+FFFF would be decoded into 4
# bytes a character as a whole. No UTF-8 sequence holds a newline byte: the lines are the same.
_DECODE = methodcaller("decode", "utf-8", "replace")
HEAD_BYTES = 64  # of a file, kept to tell a file rewritten in place (truncated, then grown past the offset)

class FileFollower:
    """Complete new lines of every file matching ``pattern`` (a path or a glob), as ``tail -F`` would.

    Files are read from the beginning; a file created later is picked up when it appears. A file
    that shrinks is read again from 0 (truncation); a path that now names another file (rename and
    create) first yields the old file's remaining complete lines, then the new file from 0. A last
    line without its newline stays buffered until the newline arrives. Lines longer than
    ``max_line_bytes`` are dropped (never held in memory) and listed by ``take_oversize()``.
    Invalid UTF-8 is decoded with U+FFFD. One ``poll()`` reads at most ``max_poll_bytes`` per file;
    ``behind`` tells the caller that more is waiting. A file unchanged for ``close_idle_after``
    polls, or the least recently read one when ``open_files`` holds its limit of descriptors, has
    its descriptor closed (a glob over many runs must not exhaust descriptors) and is reopened at
    the same offset, by path and inode, when it grows; if such a file is rotated, lines written to
    the old file in the meantime are not read. ``poll_iter()`` hands over the lines one file at a
    time, so a backlog is streamed rather than collected; ``caught_up`` becomes True once a poll
    has read everything that was there.

    ``status`` maps every path followed to None when it can be read, else why not: a configured
    path (not a glob) that is missing, or any path that is a directory, a FIFO, a device, a symlink
    loop or unreadable. Such a path is never opened for reading (a FIFO would block). Each reason
    is logged once, and again only when it changes. With ``owner`` set (a uid), a file owned by
    anyone else is refused too: a path that another user named (a Slurm job's output) may not make
    a privileged reader read someone else's file.
    """

    def __init__(
        self,
        pattern: str,
        *,
        max_line_bytes: int = 1 << 20,
        read_chunk: int = 1 << 20,
        max_poll_bytes: int = 8 << 20,
        close_idle_after: int = 120,
        open_files: OpenFiles | None = None,
    ) -> None:
        self.pattern = pattern
        self.max_line_bytes = max_line_bytes
        self.read_chunk = read_chunk
        self.max_poll_bytes = max(max_poll_bytes, read_chunk)
        self.close_idle_after = close_idle_after
        self.behind = True  # until a poll has read everything that was there
        self.caught_up = False  # True for good once a poll has read everything that was there
        self.open_files = OPEN_FILES if open_files is None else open_files
        self._behind = False
        self.oversize_lines = 0  # total dropped since start
        self._oversize: list[tuple[str, int]] = []
        self._handles: dict[str, FileHandle] = {}
        self._born: dict[str, float] = {}  # path -> its birth time (inf where unknown), for the order of reading
        self._warned: set[str] = set()
        self._matched: bool | None = None  # whether the glob matched anything at its last poll
        self._capped = False
        self.status: dict[str, str | None] = {}
        self.owner: int | None = None  # the uid every file read must belong to, where set

    def uid_of(self, path: str) -> int | None:
        """The owner of the file read at ``path`` now (as it was opened), None before it is."""
        handle = self._handles.get(path)
        return handle.uid if handle is not None else None

    def take_oversize(self) -> list[tuple[str, int]]:
        """``(path, bytes seen)`` for each line dropped for length since the last call."""
        dropped, self._oversize = self._oversize, []
        return dropped

    def close(self) -> None:
        """Close every open file."""
        for handle in self._handles.values():
            for old in handle.retired:
                close_handle(old)
            close_handle(handle)
        self._handles.clear()

    def poll(self) -> list[tuple[str, str]]:
        """``(path, line)`` for every complete line written since the last poll; never raises OSError."""
        return list(chain.from_iterable(self.poll_iter()))

    def poll_iter(self) -> Iterator[list[tuple[str, str]]]:
        """``poll()``'s lines, one list per file read: only one file's lines are held at a time.
        ``behind``, ``caught_up`` and ``status`` are set once the iteration ends."""
        self._behind = False
        status: dict[str, str | None] = {}
        inodes = {handle.inode: path for path, handle in self._handles.items()}
        for path in self._in_order(set(self._matching()) | set(self._handles)):
            if path not in self._handles and self._same_file(path, inodes):
                continue
            out: list[tuple[str, str]] = []
            try:
                reason = self._poll_path(path, out)
            except OSError as exc:
                reason = f"cannot read it: {exc.strerror or exc}"
            if reason is not _GONE:
                status[path] = reason
            handle = self._handles.get(path)
            if handle is not None:
                inodes.setdefault(handle.inode, path)
            if out:
                yield out
        if not glob.has_magic(self.pattern):
            status.setdefault(self.pattern, "does not exist")
        self._set_status(status)
        self.behind = self._behind
        self.caught_up = self.caught_up or not self._behind

    def _in_order(self, paths: set[str]) -> list[str]:
        """The paths, oldest file first (by birth time, which no user can set; then by name): of two
        files that name one run, the one that named it first is read first after a restart too,
        whatever their names."""
        born = {path: self._born.get(path) for path in paths}
        for path, when in born.items():
            if when is None:
                found = birth_time(path)
                born[path] = math.inf if found is None else found
        self._born = born  # type: ignore[assignment]  # every value is a float now
        return sorted(paths, key=lambda path: (born[path], path))

    def _set_status(self, status: dict[str, str | None]) -> None:
        for path, reason in status.items():
            before = self.status.get(path)
            if reason != before:
                if reason:
                    log.warning("cannot follow %s: %s", display_path(path), reason)
                elif path in self.status:
                    log.info("%s can be read again", display_path(path))
        self.status = status

    def _same_file(self, path: str, inodes: dict[tuple[int, int], str]) -> bool:
        """Whether ``path`` names a file another path of this pattern already follows (a symbolic
        link, a hard link): one file is one source."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        other = inodes.get((st.st_dev, st.st_ino))
        if other is None or other == path:
            return False
        self._warn(path, f"{display_path(path)} is the file {display_path(other)}, already followed")
        return True

    def _matching(self) -> list[str]:
        """The paths to follow: the pattern itself where a file has that name, else its matches
        (bounded, see ``expand``); a glob that matches nothing is logged, once until it matches."""
        if is_literal(self.pattern):
            return [self.pattern] if os.path.lexists(self.pattern) else []
        found, capped = expand(self.pattern)
        if capped and not self._capped:
            log.warning("%s matches more than %d files or %d directories: only the first are followed",
                        display_path(self.pattern), MAX_MATCHES, MAX_GLOB_DIRS)
        self._capped = capped
        matched = bool(found)
        if matched != self._matched:
            if not matched:
                log.warning("no file matches %s (yet); looked for again at every poll", display_path(self.pattern))
            elif self._matched is not None:
                log.info("%s matches %d file(s) now", display_path(self.pattern), len(found))
            self._matched = matched
        return found

    def _poll_path(self, path: str, out: list[tuple[str, str]]) -> str | None:
        """Read ``path``; None when it could be read, else why not (or _GONE)."""
        handle = self._handles.get(path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if handle is not None:
                # Deleted, or renamed with no successor yet: finish what the old file holds.
                self._warn(path, f"{display_path(path)} disappeared")
                self.open_files.pin(handle)
                queue = handle.retired + ([handle] if handle.fd is not None else [])
                self._drain(queue, out, self.max_poll_bytes)
                if queue:
                    handle.retired = [old for old in queue if old is not handle]
                    return None
                del self._handles[path]
            return "is a broken symbolic link" if os.path.islink(path) else _GONE

        if handle is not None and handle.fd is None:
            handle = self._wake(handle, st)
            if handle is not None and handle.fd is None:
                return None
        if handle is None or (st.st_dev, st.st_ino) != handle.inode:
            if handle is not None:
                self.open_files.pin(handle)  # opening the successor must not close it
            new, reason = self._open(path, st)
            if new is None:
                return reason
            if handle is not None:  # rotated: read the old file's remaining lines first
                new.retired, handle.retired = handle.retired + [handle], []
            self._handles[path] = handle = new

        budget = self.max_poll_bytes
        if handle.retired:
            budget -= self._drain(handle.retired, out, budget)
            if handle.retired:
                return None

        if st.st_size < handle.offset or (st.st_size > handle.offset and self._rewritten(handle)):
            # truncated (verl 0.9's FileLogger opens its file "wb": a resumed run rewrites it in place,
            # possibly past the old offset before the next poll): start over
            assert handle.fd is not None  # open: _open and _wake open it, add() closes only older handles
            os.lseek(handle.fd, 0, os.SEEK_SET)
            handle.offset, handle.pending, handle.discarding, handle.head = 0, b"", False, b""
        got = 0
        if st.st_size > handle.offset:
            got = self._read(handle, out, min(budget, st.st_size - handle.offset))
            if st.st_size > handle.offset:
                self._behind = True
            self.open_files.add(handle)
        self._warned.discard(path)
        handle.idle_polls = 0 if got else handle.idle_polls + 1
        if handle.idle_polls >= self.close_idle_after:
            close_handle(handle)
        return None

    @staticmethod
    def _rewritten(handle: FileHandle) -> bool:
        """Whether the file no longer starts with the bytes it started with when read: it was
        truncated and written again. Checked only when it grew."""
        assert handle.fd is not None
        return bool(handle.head) and os.pread(handle.fd, len(handle.head), 0) != handle.head

    def _wake(self, handle: FileHandle, st: os.stat_result) -> FileHandle | None:
        """A closed idle handle: still closed if nothing changed, reopened at its offset if the
        same file changed, None (start afresh) if the path now names another file."""
        if (st.st_dev, st.st_ino) != handle.inode:
            del self._handles[handle.path]
            return None
        if st.st_size == handle.offset:
            return handle
        fd = os.open(handle.path, OPEN_FILE_FLAGS)
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != handle.inode:  # replaced between stat and open
            os.close(fd)
            del self._handles[handle.path]
            return None
        os.lseek(fd, handle.offset, os.SEEK_SET)
        handle.fd, handle.idle_polls = fd, 0
        self.open_files.add(handle)
        return handle

    def _drain(self, queue: list[FileHandle], out: list[tuple[str, str]], budget: int) -> int:
        """Read old files to their end, oldest first, removing each finished one from ``queue``.

        Returns the bytes read. An unfinished file stays at the head of ``queue``.
        """
        used = 0
        while queue:
            old = queue[0]
            if old.fd is None:  # closed before it could be pinned: nothing to read it by
                queue.pop(0)
                continue
            size = os.fstat(old.fd).st_size
            used += self._read(old, out, min(budget - used, max(size - old.offset, 0)))
            if old.offset < size:
                self._behind = True
                break
            close_handle(queue.pop(0))
        return used

    def _open(self, path: str, st: os.stat_result) -> tuple[FileHandle | None, str | None]:
        """A handle on the regular file ``path``, or (None, why not). Other kinds of files are
        never opened: a FIFO or a device could block or never end."""
        if not stat.S_ISREG(st.st_mode):
            return None, _not_regular(st.st_mode)
        fd = os.open(path, OPEN_FILE_FLAGS)  # non-blocking, should it have become a FIFO since the stat
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None, _not_regular(st.st_mode)
        if self.owner is not None and st.st_uid != self.owner:
            os.close(fd)
            return None, f"belongs to uid {st.st_uid}, not to uid {self.owner}"
        handle = FileHandle(path, fd, (st.st_dev, st.st_ino), pool=self.open_files, uid=st.st_uid)
        self.open_files.add(handle)
        return handle, None

    def _read(self, handle: FileHandle, out: list[tuple[str, str]], limit: int) -> int:
        """Read up to ``limit`` bytes, appending complete lines to ``out``; return bytes read."""
        total, fd = 0, handle.fd
        assert fd is not None  # callers read open handles only
        while total < limit:
            data = os.read(fd, min(self.read_chunk, limit - total))
            if not data:
                break
            if handle.offset == 0:
                handle.head = data[:HEAD_BYTES]
            total += len(data)
            handle.offset += len(data)
            self._split(handle, data, out)
        return total

    def _split(self, handle: FileHandle, data: bytes, out: list[tuple[str, str]]) -> None:
        if handle.discarding:
            newline = data.find(b"\n")
            if newline < 0:
                return
            handle.discarding = False
            data = data[newline + 1 :]
        cut = data.rfind(b"\n")
        if cut < 0:
            handle.pending += data
            self._check_pending(handle)
            return
        block = handle.pending + data[:cut] if handle.pending else data[:cut]
        handle.pending = data[cut + 1 :]
        self._emit(handle.path, block, out)
        self._check_pending(handle)

    def _check_pending(self, handle: FileHandle) -> None:
        if len(handle.pending) > self.max_line_bytes:
            self._drop(handle.path, len(handle.pending))
            handle.pending, handle.discarding = b"", True

    def _emit(self, path: str, block: bytes, out: list[tuple[str, str]]) -> None:
        limit = self.max_line_bytes
        if len(block) > limit:
            raw_lines = block.split(b"\n")
            if max(map(len, raw_lines)) > limit:
                for raw in raw_lines:
                    if len(raw) > limit:
                        self._drop(path, len(raw))
                    else:
                        out.append((path, raw.decode("utf-8", "replace")))
                return
        out.extend(zip(repeat(path), map(_DECODE, block.split(b"\n"))))

    def _drop(self, path: str, size: int) -> None:
        self.oversize_lines += 1
        self._oversize.append((path, size))

    def _warn(self, path: str, message: str) -> None:
        if path not in self._warned:
            self._warned.add(path)
            log.warning("%s", message)


def _not_regular(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return f"is {kind}, not a regular file"
    return "is not a regular file"
