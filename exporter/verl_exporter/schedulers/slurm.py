"""``verl-exporter --slurm``: every Slurm job on this node, found by itself, followed through its output.

Every ``--slurm.poll-interval`` the watcher looks through ``/proc`` for the processes of Slurm jobs
(``SLURM_JOB_ID`` in a process's environment, read with a bound, or a cgroup path holding
``job_<id>``), asks ``scontrol show job -d -o <id>`` once per new job for its name, user, partition,
nodes, GPUs and output files (``StdOut``, ``StdErr``; the patterns Slurm may leave unresolved, ``%j``
``%x`` ``%u`` ``%N`` ``%A`` ``%a`` ``%%`` and the rest, resolved here; relative to ``WorkDir``;
``/dev/null`` is not followed) and follows those files as sources of its own, without ``--source``.

It reads as root, for other users, what other users name, so it believes Slurm's ``UserId`` only
where the job's processes run as that user (a job name can hold `` UserId=root(0)``: scontrol's one
line does not escape it), takes the GPUs and node name only from that user's processes
(``slurm_procs``), and reads only files that user owns (an ``--output`` naming someone else's file,
or a link to one, is refused).

A run in a job's output is named by verl's config print, else ``project`` = the job's name and
``experiment`` = the job's id, and owned by the job's user (``RunKey.user``): a job of another user
whose config print names the same project and experiment writes a run of its own user, which can
never feed, finish or crash this one, nor put its processes in this run's evidence. The owner's team
is the job's Slurm account where ``--owner.teams`` names none (``store.owners``). A file that shows
no verl line is followed but makes no run.

A job of several nodes (verl's Ray-on-Slurm layout: the driver on the batch host, Ray workers started
with ``srun`` on the others) logs on its batch host. That node's watcher serves the run's training
figures; on every other node (its processes' ``SLURMD_NODENAME`` is not the job's ``BatchHost``) the
watcher reads the same files, on the shared file system Slurm clusters write job output to, into a
store of its own that is never served, and only until it has the run's name (the config print at the
top; a job whose output runs a second training after the first is attributed to the first), so that
the node's GPUs, host and processes are attributed to it (``verl_job_info``, ``verl_job_gpu_info``,
``verl_node_run_info``) without a second copy of the training series. A worker that cannot read
the files says so in its log and names no run: its GPUs are then attributed to none.

When a job's processes are gone from the node, its files are read to the end and closed, and each of
its runs that has not finished is decided: finished if it reached its last step (verl's total), or,
for a run whose total is unknown, if Slurm says the job ``COMPLETED`` with exit code 0; otherwise the
run stays unfinished and its ``verl_job_running`` turns 0: the alerts read it as crashed
(``VerlTrainingJobCrashed``, ``VerlTrainingJobExited``). The last ``MAX_ENDED`` ended jobs stay served.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Callable, Iterable, Sequence

from verl_exporter.store.owners import NO_TEAMS, Owners, user_name
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

from ..collectors.job_info import JobEnd, JobRun
from ..sources.open_files import OpenFiles
from ..sources.reader_pool import ReaderPool
from .slurm_jobs import SCONTROL_TIMEOUT, SlurmJob, named_uids, show_job
from .slurm_output import JobSource
from .slurm_procs import LocalJob, job_owner, scan_proc

log = logging.getLogger(__name__)

MAX_ENDED = 64  # ended jobs whose runs are still served (verl_job_info, verl_job_running 0)
END_CHECKS = 3  # looks at an ended job Slurm still calls running before its state is taken as it is
_STILL_ENDING = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "PENDING", "")
# Any user can make processes claim any job ids: at most this many new ids are asked about in a
# look, and an id Slurm does not answer for is asked about again after 1, 2, 4 ... up to MAX_WAIT looks.
MAX_ASKS = 16
MAX_WAIT = 32
# The jobs' files are read on at most this many threads (a few more while reads hang), not one per
# job: the systemd unit's TasksMax=64 must leave room for the scrapes' threads with many jobs on a node.
READER_THREADS = 8
# A read that hangs (a user's FUSE mount, a dead NFS server) stops only its own job's reading (the
# others on its thread move to another), and is waited for at most this long when the job ends.
READ_STOP_TIMEOUT = 5.0


def _fair(asks: list[str], local: dict[str, LocalJob], unanswered: dict[str, tuple[int, int]]) -> list[str]:
    """The ids to ask Slurm about, in turn: ids with a root process first (slurmstepd, the prolog: no
    user can make one claim an id), then one id of each user in turn, each user's least missed
    first. A user whose processes claim a thousand made-up ids delays another user's job by one
    ask per round, not by a thousand."""
    rooted = sorted((job_id for job_id in asks if 0 in local[job_id].uids),
                    key=lambda job_id: unanswered.get(job_id, (0, 0))[1])
    by_user: dict[tuple[int | None, ...], list[str]] = {}
    for job_id in sorted((job_id for job_id in asks if 0 not in local[job_id].uids),
                         key=lambda job_id: unanswered.get(job_id, (0, 0))[1]):
        by_user.setdefault(tuple(sorted(local[job_id].uids, key=lambda uid: -1 if uid is None else uid)),
                           []).append(job_id)
    turns = [job_id for queue in zip_longest(*by_user.values()) for job_id in queue if job_id is not None]
    return rooted + turns


# -- following the jobs --------------------------------------------------------------------------


@dataclass
class _Followed:
    job: SlurmJob
    local: LocalJob
    sources: list[JobSource]
    owner: int | None = None  # the uid its files and its processes' word must belong to; None: not read
    believed: bool = True  # Slurm's line names one user (not a job name's forged UserId=)
    runs: set[RunKey] = field(default_factory=set)  # as last seen (kept once the job ended)
    head: bool = True  # this node is the job's batch host: its runs' figures are served from here
    reader: ReaderPool | None = None  # the threads that read its files
    ended: bool = False
    end_checks: int = 0
    end: JobEnd | None = None  # how and when Slurm ended the job (known on its batch host only)


class SlurmWatcher:
    """Finds the node's Slurm jobs and follows their output; ``rows()`` and ``pids()`` for the
    collectors. ``refresh()`` is one look (the watcher thread calls it every interval)."""

    def __init__(self, store: RunStore, *, proc_root: str = "/proc", scontrol: Callable[[str], str | None] = show_job,
                 interval: Callable[[], float] | float = 10.0, source_interval: float = 0.5,
                 open_files: OpenFiles | None = None, hostname: str | None = None,
                 clock: Callable[[], float] = time.time, own_pid: int | None = None, owners: Owners = NO_TEAMS):
        self.store = store
        self.owners = owners  # the team of each job's user: its Slurm account, where the teams file names none
        # A worker node's copy of its jobs' runs, read only to name them; never served.
        self.worker_store = RunStore(store.catalog)
        self.proc_root = proc_root
        self.scontrol = scontrol
        self.interval = interval if callable(interval) else (lambda: float(interval))
        self.source_interval = source_interval
        self.open_files = open_files
        self.hostname = hostname or socket.gethostname()
        self.clock = clock
        self.own_pid = own_pid
        self.jobs: dict[str, _Followed] = {}
        self._looks = 0
        self._unanswered: dict[str, tuple[int, int]] = {}  # job id: (the look it is asked again at, misses)
        self.ended: OrderedDict[str, _Followed] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self.readers = ReaderPool(READER_THREADS, interval=source_interval)
        # The GPU library's indices of the GPUs a job's processes use (the GPU collector's
        # ``gpus_used_by``): Slurm numbers GPUs in gres.conf's order, which need not be the library's.
        self.gpus_in_use: Callable[[set[int]], tuple[str, ...]] | None = None

    # -- what the collectors read

    def pids(self) -> set[int]:
        with self._lock:
            return {pid for followed in self.jobs.values() for pid in followed.local.pids}

    def pids_of(self, run: RunKey) -> set[int]:
        """The processes on this node of the jobs that hold ``run`` (for its evidence: no other job's)."""
        with self._lock:
            followed = list(self.jobs.values())
        pids: set[int] = set()
        for item in followed:
            if run in item.runs or any(run in source.runs() for source in item.sources):
                pids |= set(item.local.pids)
        return pids

    def node_runs(self) -> set[RunKey]:
        """The runs of the jobs with a live process on this node (for ``verl_node_run_info``)."""
        return {row.run for row in self.rows() if row.running}

    def rows(self) -> list[JobRun]:
        with self._lock:
            followed = [*self.jobs.values(), *self.ended.values()]
        rows = []
        for item in followed:
            if not item.ended:
                for source in item.sources:
                    item.runs |= source.runs()
            job = item.job
            in_use = self.gpus_in_use(item.local.pids) if self.gpus_in_use and not item.ended else ()
            gpus = in_use or item.local.gpus or job.gres_gpus
            for run in sorted(item.runs):
                rows.append(JobRun(run, "slurm", job.job_id, job.job_name, job.partition, gpus=gpus,
                                   running=not item.ended, end=item.end))
        return rows

    # -- the watcher thread

    def sources(self) -> list[JobSource]:
        """The sources of the jobs followed now."""
        with self._lock:
            return [source for followed in self.jobs.values() for source in followed.sources]

    def poll_all(self) -> int:
        """One synchronous round over every job's files (for tests: the readers' threads poll)."""
        return self.readers.poll_all()

    def start(self) -> None:
        self._started = True
        self.readers.start()
        self._thread = threading.Thread(target=self._run, name="verl-exporter-slurm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SCONTROL_TIMEOUT + 5)
        for followed in list(self.jobs.values()):
            self._halt(followed)
        self.readers.stop(READ_STOP_TIMEOUT)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # the watcher must outlive one bad look
                log.exception("looking for Slurm jobs failed")
            self._stop.wait(max(0.05, self.interval()))

    def refresh(self) -> None:
        """One look: follow the jobs that appeared, end those whose processes are gone."""
        local = scan_proc(self.proc_root, self.own_pid)
        self._looks += 1
        added: list[_Followed] = []
        asks: list[str] = []
        for job_id, found in local.items():
            followed = self.jobs.get(job_id)
            if followed is not None:
                if followed.owner is None and followed.believed and job_owner(followed.job.uid, found.uids) is not None:
                    # Its user's processes came (seen first: slurmstepd's, the prolog's, or another
                    # user's claiming its id): follow it now, as Slurm describes it now.
                    new = self._follow(job_id, found)
                    if new is not None:
                        added.append(new)
                        continue
                with self._lock:
                    followed.local = found if followed.owner is None else found.of_user(followed.owner)
                continue
            if job_id in self.ended:
                continue  # a straggler of a job already ended (an epilog, a process being reaped)
            if self._unanswered.get(job_id, (0, 0))[0] <= self._looks:
                asks.append(job_id)
        for job_id in _fair(asks, local, self._unanswered)[:MAX_ASKS]:
            new = self._follow(job_id, local[job_id])
            if new is not None:
                added.append(new)
                self._unanswered.pop(job_id, None)
            else:
                misses = self._unanswered.get(job_id, (0, 0))[1] + 1
                self._unanswered[job_id] = (self._looks + min(2 ** min(misses - 1, 8), MAX_WAIT), misses)
        for job_id in [job_id for job_id in self._unanswered if job_id not in local]:
            del self._unanswered[job_id]
        gone = [followed for job_id, followed in self.jobs.items() if job_id not in local]
        # A worker node reads a job's output only until it has the run's name.
        named = [followed for followed in self.jobs.values() if not followed.head and followed not in gone
                 and any(source.runs() for source in followed.sources)]
        if added or gone or named:
            self._apply(added, gone, named)

    def _follow(self, job_id: str, local: LocalJob) -> _Followed | None:
        text = self.scontrol(job_id) or ""
        # The line of the job asked about: scontrol answers an array's id with all its tasks, and
        # reads "0042" as 42.
        line = next((line for line in text.split("\n") if line.startswith(f"JobId={job_id} ")), "")
        job = SlurmJob.parse(line)
        if job is None:
            return None  # asked again at a later look
        # A job name holding " UserId=root(0)", or a newline before Slurm's own UserId, must not
        # make the job root's while only root's processes (slurmstepd, the prolog) are seen.
        believed = named_uids(text) == ({job.uid} if job.uid is not None else set())
        owner = job_owner(job.uid, local.uids) if believed else None
        if owner is None:
            if believed and local.uids <= {0}:  # slurmstepd or the prolog before the job's tasks: usual
                log.debug("Slurm job %s: only root's processes so far; its user's are waited for", job.job_id)
            else:
                log.warning("Slurm job %s: Slurm says uid %s runs it, its processes here run as %s; its files are "
                            "not read", job.job_id, "unknown" if job.uid is None else job.uid,
                            ", ".join(map(str, sorted(local.uids))) or "unknown users")
            return _Followed(job, local, [], owner=None, believed=believed)
        local = local.of_user(owner)
        paths = job.output_files(self.hostname)
        # The job's runs are its user's (the files it reads are that user's): another job's config
        # print naming the same project and experiment makes a run of that job's user.
        user = user_name(owner)
        self.owners.learn(user, job.account)
        default = self.owners.run(job.job_name or "slurm", job.job_id, user)
        # The node's name in Slurm: its processes' SLURMD_NODENAME, else the short host name.
        head = not job.batch_host or job.batch_host == (local.node or self.hostname.split(".")[0])
        store = self.store if head else self.worker_store
        sources = [JobSource(path, store, default_run=default, both_files=len(paths) > 1, owner=owner,
                             open_files=self.open_files, owners=self.owners) for path in paths]
        for source in sources:
            source.siblings = [other for other in sources if other is not source]
        log.info("following Slurm job %s (%s, user %s)%s: %s", job.job_id, job.job_name, job.user,
                 "" if head else f" as a worker node of batch host {job.batch_host}, for the run's name only",
                 ", ".join(paths) or "no output file")
        reader = self.readers if sources else None
        return _Followed(job, local, sources, owner=owner, head=head, reader=reader)

    def _apply(self, added: list[_Followed], gone: list[_Followed], named: Sequence[_Followed] = ()) -> None:
        """Start reading the new jobs' files, end the gone jobs (their files read to the end first)
        and stop reading for the ``named`` (worker node jobs whose run has its name). A job's files
        are touched here only once its reader has stopped: no two threads read one source."""
        for followed in added:
            with self._lock:
                replaced = self.jobs.get(followed.job.job_id)
                self.jobs[followed.job.job_id] = followed
            if replaced is not None:  # followed before without its files (its user's processes came)
                self._halt(replaced)
            if followed.reader is not None:
                followed.reader.add(followed.sources)
        for followed in gone:
            self._end(followed)
        for followed in named:
            stopped = self._halt(followed)
            for source in followed.sources:
                followed.runs |= source.runs()
                if stopped:  # a hung reader is left its files, to end by itself
                    source.close()
            with self._lock:
                followed.sources, followed.reader = [], None
            log.info("Slurm job %s: its run is %s; no more of its output is read on this node", followed.job.job_id,
                     ", ".join(run.named() for run in sorted(followed.runs)))

    def _halt(self, followed: _Followed) -> bool:
        """Stop reading the job's files; False (and a warning) when its read hangs past READ_STOP_TIMEOUT."""
        if followed.reader is None or followed.reader.remove(followed.sources, READ_STOP_TIMEOUT):
            return True
        log.warning("Slurm job %s: reading its files hangs (%s); the other jobs are read on", followed.job.job_id,
                    ", ".join(source.pattern for source in followed.sources))
        return False

    def _end(self, followed: _Followed) -> None:
        if followed.owner is None:
            # Nothing of it was read; kept among the ended, it would hide the real job with its id
            # from a user who made a process claim the id before the job came.
            with self._lock:
                del self.jobs[followed.job.job_id]
            return
        if self._halt(followed):
            for source in followed.sources:
                source.settle(timeout=2.0)
                followed.runs |= source.runs()
        else:  # its runs are decided on what was read; its hung reader is left to end by itself
            for source in followed.sources:
                followed.runs |= source.runs()
            followed.sources, followed.reader = [], None
        if not followed.head:  # the batch host's watcher decides the runs; here the node's part ended
            self._retire(followed, None)
            return
        state_text = self.scontrol(followed.job.job_id)
        final = SlurmJob.parse(state_text) if state_text else None
        undecided = self._decide(followed, final)
        if undecided and final is not None and final.state in _STILL_ENDING and followed.end_checks < END_CHECKS:
            followed.end_checks += 1
            return  # Slurm has not settled the job's state yet: look again
        for run in undecided:
            log.warning("Slurm job %s ended before run %s finished: counted as crashed", followed.job.job_id,
                        run.named())
        self._retire(followed, final)

    def _retire(self, followed: _Followed, final: SlurmJob | None) -> None:
        """Close the ended job's files and keep it among the last ``MAX_ENDED`` ended jobs."""
        for source in followed.sources:
            source.close()
        with self._lock:
            followed.ended = True
            if final is not None:
                followed.end = JobEnd(final.state, final.exit_code, final.reason, self.clock())
            del self.jobs[followed.job.job_id]
            self.ended[followed.job.job_id] = followed
            while len(self.ended) > MAX_ENDED:
                self.ended.popitem(last=False)
        if followed.head:
            log.info("Slurm job %s ended (%s %s)", followed.job.job_id,
                     final.state if final else "gone from Slurm", final.exit_code if final else "")
        else:
            log.info("Slurm job %s has no process left on this node (a worker node)", followed.job.job_id)

    def _decide(self, followed: _Followed, final: SlurmJob | None) -> list[RunKey]:
        """Finish each run of the ended job that reached its last step (or, with no known total, whose
        job Slurm says completed with exit code 0); the runs left undecided (crashed)."""
        undecided = []
        for run in sorted(followed.runs):
            state = self.store.run(run)
            if state is None or state.finished:
                continue
            step, total = state.last_step, state.total_steps
            reached = step is not None and total is not None and step >= total
            if reached or (total is None and final is not None and final.finished_ok):
                self.store.ingest(Record(run, step or 0, {}, self.clock(), finished=True,
                                         source=state.owner or state.source))
            else:
                undecided.append(run)
        return undecided


def followed_paths(watcher: SlurmWatcher) -> Iterable[str]:
    """The files the watcher follows now (for logs and tests)."""
    return [source.pattern for followed in list(watcher.jobs.values()) for source in followed.sources]
