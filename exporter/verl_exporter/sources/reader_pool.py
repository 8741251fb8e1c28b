"""ReaderPool: a bounded number of threads polling a changing set of sources (``--slurm``'s jobs)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .ingestor import Source, poll_sources

log = logging.getLogger("verl_exporter.sources")

HUNG_AFTER = 2.0  # a thread whose poll of one source takes longer is hung: its other sources move away


@dataclass(eq=False)
class _Group:
    """Sources added together (one job's files): always polled by one thread, in turn."""

    sources: list[Source]
    failing: set[int] = field(default_factory=set)


@dataclass(eq=False)
class _Worker:
    groups: list[_Group] = field(default_factory=list)
    current: _Group | None = None  # the group it is polling now
    since: float | None = None  # when that poll began (monotonic)
    hung: bool = False
    thread: threading.Thread | None = None

    @property
    def load(self) -> int:
        return sum(len(group.sources) for group in self.groups)


class ReaderPool:
    """Polls groups of sources on at most ``size`` threads (``size + spare`` while some hang), every
    ``interval`` seconds; a group still reading a backlog is polled again at once.

    Each group is given to the least loaded thread (a new one while fewer than ``size`` run). A thread
    whose poll takes longer than ``hung_after`` gets no new group, and its other groups are moved
    to the others: a source that hangs (a FUSE mount, a dead NFS server) stops only its own group. A
    thread that cannot be started is logged, and its groups are read by the threads that run.
    """

    def __init__(self, size: int = 8, interval: float = 0.5, *, spare: int = 2, hung_after: float = HUNG_AFTER) -> None:
        self.size = max(1, size)
        self.interval = interval
        self.spare = spare
        self.hung_after = hung_after
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)  # a poll ended
        self._stop = threading.Event()
        self._workers: list[_Worker] = []
        self._pending: list[_Group] = []  # groups no thread polls (not started, or none could start)
        self._groups: dict[int, _Group] = {}  # id(source): its group
        self._started = False
        self._start_failed = False
        self._serial = 0

    def add(self, sources: Sequence[Source]) -> None:
        """Poll ``sources`` from now on, together, on one thread."""
        group = _Group(list(sources))
        with self._lock:
            for source in group.sources:
                self._groups[id(source)] = group
            self._rebalance()
            self._place(group)

    def remove(self, sources: Sequence[Source], timeout: float | None = 5.0) -> bool:
        """Stop polling ``sources`` and wait, at most ``timeout`` seconds, until no thread reads them;
        False when a poll of them is still running then (it hangs, and is left to end by itself)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            groups = {self._groups.pop(id(source)) for source in sources if id(source) in self._groups}
            for worker in self._workers:
                worker.groups = [group for group in worker.groups if group not in groups]
            self._pending = [group for group in self._pending if group not in groups]
            while any(worker.current in groups for worker in self._workers):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._done.wait(left)
            self._rebalance()
        return True

    def poll_all(self) -> int:
        """One synchronous round over every source (for tests: the threads poll); the records ingested."""
        with self._lock:
            groups = [group for worker in self._workers for group in worker.groups] + self._pending
        return sum(self._poll(group)[0] for group in groups)

    def start(self) -> None:
        """Start polling on threads (no-op if started)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            self._stop.clear()
            self._rebalance()

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Ask the threads to end and wait for them, at most ``timeout`` seconds; False when one is
        still in a poll (a read that hangs), and is left to end by itself."""
        self._stop.set()
        with self._lock:
            self._started = False
            threads = [worker.thread for worker in self._workers if worker.thread is not None]
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    @property
    def running(self) -> bool:
        with self._lock:
            return any(worker.thread is not None and worker.thread.is_alive() for worker in self._workers)

    # -- under the lock

    def _place(self, group: _Group) -> None:
        """Give ``group`` to the least loaded thread that does not hang, or to a new one."""
        if not self._started:
            self._pending.append(group)
            return
        healthy = [worker for worker in self._workers if not worker.hung]
        target = min(healthy, key=lambda worker: worker.load, default=None)
        if (target is None or target.load) and len(healthy) < self.size and len(self._workers) < self.size + self.spare:
            target = self._spawn() or target
        if target is None:
            self._pending.append(group)
        else:
            target.groups.append(group)

    def _spawn(self) -> _Worker | None:
        worker = _Worker()
        self._serial += 1
        thread = threading.Thread(target=self._run, args=(worker,), name=f"verl-exporter-read-{self._serial}",
                                  daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # the unit's TasksMax, or the system's limit
            if not self._start_failed:
                self._start_failed = True
                log.warning("cannot start a thread to read files (%s): %d running threads read them", exc,
                            len(self._workers))
            return None
        self._start_failed = False
        worker.thread = thread
        self._workers.append(worker)
        return worker

    def _rebalance(self) -> None:
        """Move the groups of threads that hang to the others, and place the groups no thread polls."""
        now = time.monotonic()
        moved: list[_Group] = []
        for worker in self._workers:
            hung = worker.since is not None and now - worker.since > self.hung_after
            if hung and not worker.hung and worker.current is not None:
                log.warning("reading %s hangs; the other files its thread read are read by the others",
                            ", ".join(source.pattern for source in worker.current.sources))
                moved += [group for group in worker.groups if group is not worker.current]
                worker.groups = [group for group in worker.groups if group is worker.current]
            worker.hung = hung
        if self._started:
            moved += self._pending
            self._pending = []
            for group in moved:
                self._place(group)
        else:
            self._pending += moved

    # -- the threads

    def _run(self, worker: _Worker) -> None:
        while not self._stop.is_set():
            with self._lock:
                groups = list(worker.groups)
            behind = False
            for group in groups:
                with self._lock:
                    if group not in worker.groups or self._stop.is_set():
                        continue  # moved away or removed meanwhile
                    worker.current, worker.since = group, time.monotonic()
                try:
                    behind = self._poll(group)[1] or behind
                finally:
                    with self._lock:
                        worker.current, worker.since = None, None
                        self._done.notify_all()
            with self._lock:
                self._rebalance()
                if not worker.groups and sum(not other.hung for other in self._workers) > self.size:
                    self._workers.remove(worker)  # a replacement no longer needed
                    return
            if not behind:
                self._stop.wait(self.interval)
        with self._lock:
            self._workers.remove(worker)
            self._pending += worker.groups  # stopped: read again once started

    def _poll(self, group: _Group) -> tuple[int, bool]:
        """Poll each source of the group; the records ingested and whether one is reading a backlog."""
        return poll_sources(group.sources, group.failing)
