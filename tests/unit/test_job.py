"""JobSelector against real processes started by the tests."""

import os
import re
import subprocess
import sys
import uuid

import psutil
import pytest

from servers import wait_until
from verl_exporter.collectors.job_processes import JobSelector

SLEEPER = "import time; time.sleep(60)"
PARENT = (
    "import subprocess, sys, time; "
    f"child = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
    "time.sleep(60)"
)


@pytest.fixture
def spawn():
    """Start ``python -c CODE extra-args...``; everything started is killed afterwards."""
    started = []

    def start(code, *args):
        proc = subprocess.Popen([sys.executable, "-c", code, *args])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            child.kill()
        proc.kill()
        proc.wait()


class ManualClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_pid_selects_the_process_and_its_child_tree(spawn):
    parent = spawn(PARENT)
    job = JobSelector(pid=parent.pid, cache_seconds=0)
    wait_until(lambda: len(job.processes()) == 2, timeout=20, message="the job's child process")
    pids = job.pids()
    assert parent.pid in pids
    (child,) = pids - {parent.pid}
    assert psutil.Process(child).ppid() == parent.pid
    assert job.running() and job.configured


def test_regex_selects_matching_command_lines_and_their_children_but_not_us(spawn):
    marker = f"verl-job-{uuid.uuid4().hex}"
    parent = spawn(PARENT, marker)
    spawn(SLEEPER, "unrelated")
    job = JobSelector(match=re.escape(marker), cache_seconds=0)
    wait_until(lambda: len(job.processes()) == 2, timeout=20, message="the matching process and its child")
    assert parent.pid in job.pids()
    everything = JobSelector(match="python|pytest", cache_seconds=0)
    assert os.getpid() not in everything.pids()


def test_an_exited_job_is_not_running(spawn):
    proc = spawn(SLEEPER)
    job = JobSelector(pid=proc.pid, cache_seconds=0)
    assert job.running()
    proc.kill()
    wait_until(lambda: not job.running(), timeout=10, message="the killed job to count as exited")
    proc.wait()
    assert job.processes() == []


def test_an_unreaped_zombie_is_not_running(spawn):
    proc = spawn(SLEEPER)
    job = JobSelector(pid=proc.pid, cache_seconds=0)
    proc.kill()  # not waited for: it stays a zombie until reaped
    wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE, timeout=10, message="a zombie")
    assert not job.running()


def test_a_pid_that_never_existed_is_not_running():
    unused = max(psutil.pids()) + 100_000
    assert JobSelector(pid=unused).processes() == []
    assert not JobSelector(pid=unused).running()


def test_an_unconfigured_selector_selects_nothing():
    job = JobSelector()
    assert not job.configured
    assert job.processes() == []


def test_answers_are_cached_for_a_moment(spawn):
    proc = spawn(SLEEPER)
    clock = ManualClock()
    job = JobSelector(pid=proc.pid, cache_seconds=5, clock=clock)
    assert job.running()
    proc.kill()
    proc.wait()
    assert job.running()  # still the cached answer
    clock.now = 5
    assert not job.running()
