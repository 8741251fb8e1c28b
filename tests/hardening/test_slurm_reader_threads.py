"""--slurm reads every job's files on a bounded pool of threads: many jobs on a node must not use up
the unit's TasksMax, a read that hangs must stop only its own job, and a thread that cannot start
must not leave jobs unread."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from unit.test_slurm_watcher import Cluster, write_log
from verl_exporter.schedulers import slurm
from verl_exporter.schedulers.slurm import SlurmWatcher
from verl_exporter.schedulers.slurm_output import JobSource
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore


def _node(tmp_path) -> tuple[Cluster, RunStore, SlurmWatcher]:
    cluster = Cluster(tmp_path)
    store = RunStore(default_catalog())
    watcher = SlurmWatcher(store, proc_root=str(cluster.proc), scontrol=cluster.scontrol, hostname="gpu03",
                           own_pid=os.getpid(), interval=0.05, source_interval=0.05)
    return cluster, store, watcher


def _jobs(cluster: Cluster, first: int, count: int) -> list[str]:
    """``count`` running jobs, each with a step in its log (its run: the job's name and id)."""
    ids = [str(job_id) for job_id in range(first, first + count)]
    for job_id in ids:
        write_log(cluster.runs / f"job{job_id}-{job_id}.out", steps=1, config=False)
        cluster.start(job_id, pids=(int(job_id) + 10_000,), name=f"job{job_id}")
    return ids


def _read(store: RunStore, ids: list[str]) -> list[str]:
    """The jobs whose run is in the store with its step."""
    steps = {(state.run.project, state.run.experiment): state.last_step for state in store.snapshot().runs}
    return [job_id for job_id in ids if steps.get((f"job{job_id}", job_id)) == 1]


def _wait(done: Callable[[], bool], seconds: float = 20.0, peak: list[int] | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        if peak is not None:
            peak[0] = max(peak[0], threading.active_count())
        time.sleep(0.01)


def test_sixty_jobs_are_read_by_a_bounded_number_of_threads(tmp_path):
    cluster, store, watcher = _node(tmp_path)
    ids = _jobs(cluster, 100, 60)
    before = threading.active_count()
    peak = [before]
    watcher.start()
    try:
        _wait(lambda: len(_read(store, ids)) == len(ids), peak=peak)
        assert _read(store, ids) == ids and len(watcher.jobs) == 60
        assert peak[0] - before <= slurm.READER_THREADS + 2  # the readers and the watcher's own
    finally:
        watcher.stop()


def test_a_hung_read_stops_only_its_own_job(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(slurm, "READ_STOP_TIMEOUT", 0.5)
    cluster, store, watcher = _node(tmp_path)
    ids = _jobs(cluster, 100, 30)
    hung = str(cluster.runs / "job100-100.out")  # on a mount that stops answering
    released = threading.Event()
    poll = JobSource.poll

    def hanging(source: JobSource) -> int:
        if source.pattern == hung:
            released.wait(60)
            return 0
        return poll(source)

    monkeypatch.setattr(JobSource, "poll", hanging)
    halts: list[tuple[str, bool, float]] = []
    halt = watcher._halt

    def timed(followed) -> bool:
        started = time.monotonic()
        stopped = halt(followed)
        halts.append((followed.job.job_id, stopped, time.monotonic() - started))
        return stopped

    monkeypatch.setattr(watcher, "_halt", timed)
    before = threading.active_count()
    peak = [before]
    watcher.start()
    try:
        _wait(lambda: len(_read(store, ids)) == len(ids) - 1, peak=peak)
        assert _read(store, ids) == ids[1:]  # the jobs that share the hung job's thread are read on
        later = _jobs(cluster, 200, 5)  # jobs that come while the read hangs
        _wait(lambda: len(_read(store, later)) == len(later), peak=peak)
        assert _read(store, later) == later
        assert peak[0] - before <= slurm.READER_THREADS + 3  # a replacement or two, and the watcher

        cluster.end("100", pids=(10_100,), state="FAILED", exit_code="1:0")
        _wait(lambda: "100" in watcher.ended, seconds=10)
        assert "100" in watcher.ended and "reading its files hangs" in caplog.text
        [(_, stopped, took)] = [halt for halt in halts if halt[0] == "100"]
        assert not stopped and 0.5 <= took < 1.5  # left to end by itself after the timeout
        last = _jobs(cluster, 300, 1)
        _wait(lambda: _read(store, last) == last, seconds=10)
        assert _read(store, last) == last  # the watcher goes on
    finally:
        released.set()
        watcher.stop()


def test_jobs_are_read_when_no_more_threads_can_start(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    cluster, store, watcher = _node(tmp_path)
    ids = _jobs(cluster, 100, 20)
    started: list[str] = []
    start = threading.Thread.start

    def limited(thread: threading.Thread) -> None:
        if len(started) >= 3:  # the watcher's thread and two readers, then TasksMax
            raise RuntimeError("can't start new thread")
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", limited)
    watcher.start()
    try:
        _wait(lambda: len(_read(store, ids)) == len(ids))
        assert _read(store, ids) == ids
        assert sum("cannot start" in record.getMessage() for record in caplog.records) == 1
    finally:
        watcher.stop()
