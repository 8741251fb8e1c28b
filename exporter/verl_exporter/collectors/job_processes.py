"""Which processes are the training job: a pid and its child tree, command lines matching a regex,
or the pids a scheduler watcher found (``pids``: every Slurm job's processes on the node).

The GPU collector uses the job's pids to sum its GPU memory; the host collector sums its RSS,
CPU time, threads and open files. Processes that exit between two looks are simply dropped.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Callable, Iterable

import psutil


class JobSelector:
    """Finds the job's processes; the answer is cached for ``cache_seconds`` (one scrape)."""

    def __init__(
        self,
        pid: int | None = None,
        match: str | None = None,
        psutil_module: Any = psutil,
        *,
        cache_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        pids: Callable[[], Iterable[int]] | None = None,
    ):
        self.pid = pid
        self.found_pids = pids  # asked at each look: the jobs' processes come and go
        self.pattern = re.compile(match) if match else None
        self._psutil = psutil_module
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._root: Any = None  # the Process for ``pid``, kept so a reused pid is not mistaken for it
        self._cached: list | None = None
        self._cached_at = 0.0

    @property
    def configured(self) -> bool:
        return self.pid is not None or self.pattern is not None or self.found_pids is not None

    def running(self) -> bool:
        return bool(self.processes())

    def pids(self) -> set[int]:
        return {p.pid for p in self.processes()}

    def processes(self) -> list:
        """The job's live processes (roots first, then their children), without duplicates."""
        now = self._clock()
        if self._cached is None or now - self._cached_at >= self.cache_seconds:
            self._cached, self._cached_at = self._find(), now
        return list(self._cached)

    def _find(self) -> list:
        roots = []
        if self.pid is not None:
            root = self._root_process()
            if root is not None:
                roots.append(root)
        if self.pattern is not None:
            roots.extend(self._matching(self.pattern))
        if self.found_pids is not None:
            roots.extend(self._processes(self.found_pids()))
        own = os.getpid()  # never count the exporter, even when it runs as a child of the job
        found: dict[int, Any] = {}
        for root in roots:
            if root.pid == own or not self._alive(root):
                continue
            found.setdefault(root.pid, root)
            for child in self._children(root):
                if self._alive(child):
                    found.setdefault(child.pid, child)
        found.pop(own, None)
        return list(found.values())

    def _root_process(self) -> Any:
        ps = self._psutil
        if self._root is None:
            try:
                self._root = ps.Process(self.pid)
            except (ps.NoSuchProcess, ps.AccessDenied):
                return None
        return self._root

    def _processes(self, pids: Iterable[int]) -> list:
        ps, found = self._psutil, []
        for pid in sorted(set(pids)):
            try:
                found.append(ps.Process(pid))
            except (ps.NoSuchProcess, ps.AccessDenied):
                continue
        return found

    def _matching(self, pattern: re.Pattern[str]) -> list:
        matches = []
        for proc in self._psutil.process_iter(["cmdline"]):
            cmdline = proc.info.get("cmdline") or []
            if pattern.search(" ".join(cmdline)):
                matches.append(proc)
        return matches

    def _children(self, proc: Any) -> list:
        try:
            return proc.children(recursive=True)
        except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
            return []

    def _alive(self, proc: Any) -> bool:
        """Running and not a zombie (an exited child its parent has not reaped yet)."""
        ps = self._psutil
        try:
            return proc.is_running() and proc.status() != ps.STATUS_ZOMBIE
        except ps.NoSuchProcess:
            return False
        except ps.AccessDenied:  # someone else's process: it exists, its state is hidden
            return True
