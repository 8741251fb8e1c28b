"""The file descriptors the followers hold: one handle per open file, and the pool that caps them."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

OPEN_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
DEFAULT_MAX_OPEN_FILES = 256
MAX_REMEMBERED_FILES = 10_000  # paths whose inode as last opened is remembered (``OpenFiles.inode``)


class OpenFiles:
    """The descriptors every follower holds, at most ``limit`` of them (``--source.max-open-files``).

    Opening one more closes the least recently read file; its follower reopens it by path when it
    grows, checking that the path still names the same inode. Rotated-away and deleted files that
    still have lines to read are pinned: they have no path to be reopened by.
    """

    def __init__(self, limit: int = DEFAULT_MAX_OPEN_FILES) -> None:
        self.limit = max(1, limit)
        self.evictions = 0  # files closed to make room, since start
        self._lru: OrderedDict[int, FileHandle] = OrderedDict()
        self._pinned: set[int] = set()
        self._inodes: OrderedDict[str, tuple[int, int]] = OrderedDict()  # path -> (device, inode) as opened
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._lru) + len(self._pinned)

    def add(self, handle: FileHandle) -> None:
        """``handle`` was just opened (or read): make it the most recent, closing others over the limit."""
        with self._lock:
            key = id(handle)
            self._inodes[handle.path] = handle.inode
            self._inodes.move_to_end(handle.path)
            if len(self._inodes) > MAX_REMEMBERED_FILES:
                self._inodes.popitem(last=False)
            if key in self._pinned:
                return
            self._lru[key] = handle
            self._lru.move_to_end(key)
            while len(self._lru) + len(self._pinned) > self.limit and len(self._lru) > 1:
                _, victim = self._lru.popitem(last=False)
                self.evictions += 1
                close_fd(victim)

    def inode(self, path: str) -> tuple[int, int] | None:
        """(device, inode) of the file a follower last opened at ``path``; None if none did. Readers
        of the same path after the followers (the evidence's log tails) read that file only: a path
        swapped since for a link to another file is not the file the follower was allowed to read."""
        with self._lock:
            return self._inodes.get(path)

    def pin(self, handle: FileHandle) -> None:
        with self._lock:
            if handle.fd is not None:
                self._lru.pop(id(handle), None)
                self._pinned.add(id(handle))

    def forget(self, handle: FileHandle) -> None:
        with self._lock:
            self._lru.pop(id(handle), None)
            self._pinned.discard(id(handle))


OPEN_FILES = OpenFiles()  # shared by every follower unless one is given its own


@dataclass
class FileHandle:
    """One open file being read: where we are and the tail of a line not yet terminated."""

    path: str
    fd: int | None  # None while closed for being idle; reopened when the file changes
    inode: tuple[int, int]
    offset: int = 0
    idle_polls: int = 0
    pending: bytes = b""
    discarding: bool = False  # inside an oversize line: drop bytes up to the next newline
    retired: list[FileHandle] = field(default_factory=list)  # rotated-away files still to finish
    pool: OpenFiles | None = None
    uid: int | None = None  # the file's owner, as it was opened
    head: bytes = b""  # the file's first bytes as read: a file rewritten in place starts otherwise


def close_handle(handle: FileHandle) -> None:
    if handle.pool is not None:
        handle.pool.forget(handle)
    close_fd(handle)


def close_fd(handle: FileHandle) -> None:
    if handle.fd is None:
        return
    try:
        os.close(handle.fd)
    except OSError:
        pass
    handle.fd = None
