"""The background thread that checks the followed runs and captures the evidence of each stall.

A thread, not the scrape: a capture runs subprocesses (py-spy, up to 10 s each) and reads files
and NVML, which no scrape should wait for, and a stall must be caught while nothing scrapes. The
thread starts checking once the sources have read their backlogs (``ready``), then every
``interval`` seconds; at most ``MAX_CAPTURES`` captures per check (the others wait for the next).

The job's stacks and GPUs are captured only for the runs this node's job works for (``node_runs``:
the run named by the flags, or every unfinished run while they are at most ``--node.max-runs``);
the evidence of other runs (a shared log directory) holds their logs and errors only.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable
from urllib.parse import urlencode

from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore

from .. import __version__
from ..sources.open_files import OPEN_FILES, OpenFiles
from .archive import MAX_RUNS, EvidenceArchive
from .gpus import describe_gpus
from .logtail import read_tail
from .report import MAX_BYTES, render
from .stacks import dump_job, find_py_spy, top_frame
from .watch import Stall, StallWatch

if TYPE_CHECKING:
    from verl_exporter.collectors.gpu import GpuCollector
    from verl_exporter.collectors.job_processes import JobSelector

log = logging.getLogger(__name__)
MAX_CAPTURES = 8
NOT_THIS_NODE = ("not captured: this exporter follows more unfinished runs than --node.max-runs (a shared "
                 "log directory), so this node's job and GPUs are not this run's")


class Forensics:
    """Checks runs for stalls (``check``) on its own thread; ``evidence`` serves what it captured."""

    def __init__(self, store: RunStore, *, job: JobSelector | None = None, gpu: GpuCollector | None = None,
                 node_runs: Callable[[], Iterable[RunKey]] = lambda: (),
                 ready: Callable[[], bool] = lambda: True, stall_after: float = 600.0, interval: float = 15.0,
                 directory: str | None = None, retention: int = 50, max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.time, py_spy: Callable[[], str | None] = find_py_spy,
                 open_files: OpenFiles = OPEN_FILES,
                 pids_of_run: Callable[[RunKey], set[int]] | None = None):
        self.watch = StallWatch(store, stall_after=stall_after, clock=clock)
        self.archive = EvidenceArchive(directory, retention=retention, max_bytes=max_bytes)
        self.job = job if job is not None and job.configured else None
        self.gpu = gpu
        self.node_runs = node_runs
        self.ready = ready
        self.interval = interval
        self.max_bytes = max_bytes
        self.clock = clock
        self.py_spy = py_spy
        self.open_files = open_files  # the followers' files: the log tails read those only
        # Under --slurm, the processes of the run's own job (the node runs other users' jobs too): a
        # run's evidence holds its job's stacks and GPUs only, never another job's command lines.
        self.pids_of_run = pids_of_run
        self.host = socket.gethostname()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # run -> (when its latest evidence was captured, its job's top frame then, or "")
        self.captured: dict[RunKey, tuple[float, str]] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="forensics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)  # a capture under way finishes on its own (daemon thread)

    def evidence(self, run: RunKey) -> str | None:
        """The latest evidence of ``run`` (its owner included), None if none."""
        return self.archive.get(run)

    def check(self) -> list[Stall]:
        """One round: find the new stalls and capture each; returns them."""
        mine = _Lazy(lambda: set(self.node_runs()))
        running = self.job.running() if self.job is not None else None
        stalls = self.watch.check(running, node_runs=lambda: mine.get(), limit=MAX_CAPTURES)
        round_ = _Round(self, mine)
        for stall in stalls:
            now = self.clock()
            text = self.capture(stall, round_, now)
            path = self.archive.put(stall.run, text, now, owner=_owner(stall.sources))
            ours = stall.run in mine.get()
            self._remember(stall.run, now, (top_frame(round_.stacks(stall.run)) if ours else None) or "")
            query = urlencode({"project": stall.run.project, "experiment": stall.run.experiment,
                               "user": stall.run.user})
            log.warning("run %s: %s; evidence at /debug/evidence?%s%s", stall.run.named(), stall.why, query,
                        f" and {path}" if path else "")
        return stalls

    def capture(self, stall: Stall, round_: "_Round", now: float) -> str:
        state = self.watch.state(stall.run)
        ours = stall.run in round_.mine.get()
        tails = [read_tail(path, inode=self.open_files.inode(path)) for path in stall.sources]
        return render(stall, state, now=now, stacks=round_.stacks(stall.run) if ours else NOT_THIS_NODE + "\n",
                      gpus=round_.gpus(stall.run) if ours else NOT_THIS_NODE + "\n", tails=tails, host=self.host,
                      version=__version__, max_bytes=self.max_bytes)

    def _remember(self, run: RunKey, moment: float, frame: str) -> None:
        """Keep what the evidence collector serves of the latest capture of at most MAX_RUNS runs."""
        self.captured.pop(run, None)
        self.captured[run] = (moment, frame)
        while len(self.captured) > MAX_RUNS:
            self.captured.pop(next(iter(self.captured)))

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.ready():
            self._stop.wait(min(self.interval, 1.0))
        while not self._stop.is_set():
            try:
                self.check()
            except Exception:  # the thread must go on; the next check tries again
                log.exception("checking the runs for stalls failed")
            self._stop.wait(self.interval)


def _owner(sources: list[str]) -> int | None:
    """The uid owning the run's latest log file, where it can be seen."""
    for path in sources:
        try:
            return os.lstat(path).st_uid
        except OSError:
            continue
    return None


class _Lazy:
    def __init__(self, make: Callable[[], Any]):
        self._make, self._done, self._value = make, False, None

    def get(self) -> Any:
        if not self._done:
            self._value, self._done = self._make(), True
        return self._value


class _Round:
    """What one check captures once for all its runs: the job's stacks and its GPUs (per job, under
    --slurm: those of each run's own job)."""

    def __init__(self, forensics: Forensics, mine: _Lazy):
        self.forensics, self.mine = forensics, mine
        self._processes = _Lazy(lambda: forensics.job.processes() if forensics.job is not None else None)
        self._stacks: dict[frozenset | None, str] = {}
        self._gpus: dict[frozenset | None, str] = {}

    def _of(self, run: RunKey) -> tuple[frozenset | None, list | None]:
        """The processes of ``run``'s job (all the job's, without --slurm), and their pids as a key."""
        processes = self._processes.get()
        if processes is None:
            return None, None
        if self.forensics.pids_of_run is not None:
            own = self.forensics.pids_of_run(run)
            processes = [process for process in processes if process.pid in own]
        return frozenset(process.pid for process in processes), processes

    def stacks(self, run: RunKey) -> str:
        key, processes = self._of(run)
        if processes is None:
            return "no --job.pid or --job.match: the exporter does not know the job's processes\n"
        if key not in self._stacks:
            self._stacks[key] = dump_job(processes, py_spy=self.forensics.py_spy())
        return self._stacks[key]

    def gpus(self, run: RunKey) -> str:
        if self.forensics.gpu is None:
            return "GPU collector off (--no-collector.gpu)\n"
        key, _ = self._of(run)
        if key not in self._gpus:
            self._gpus[key] = describe_gpus(self.forensics.gpu, None if key is None else set(key))
        return self._gpus[key]
