"""HostCollector with this machine's psutil, a job started by the test, and a scripted psutil."""

import re
import subprocess
import sys
import uuid
from types import SimpleNamespace

import psutil
import pytest

from exposition import samples
from exposition import scrape as scrape_collectors
from servers import wait_until
from verl_exporter.collectors.host import HostCollector
from verl_exporter.collectors.job_processes import JobSelector

JOB_SERIES = ("verl_job_running", "verl_job_processes", "verl_job_resident_memory_bytes",
              "verl_job_cpu_seconds_total", "verl_job_threads", "verl_job_open_fds")


def scrape(collector):
    return samples(scrape_collectors(host=collector))


def value(values, name, **labels):
    return values[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def job_process():
    marker = f"verl-host-test-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)", marker],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"  # the interpreter is up, not still being exec'd
    yield proc, marker
    proc.kill()
    proc.wait()


def test_host_series_have_sane_values():
    values = scrape(HostCollector())
    assert value(values, "verl_exporter_collector_success", collector="host") == 1
    assert value(values, "verl_host_cpus") == psutil.cpu_count()
    assert 0 <= value(values, "verl_host_cpu_utilization_ratio") <= 1
    modes = {dict(labels)["mode"] for name, labels in values if name == "verl_host_cpu_seconds_total"}
    assert {"user", "system", "idle"} <= modes
    assert value(values, "verl_host_cpu_seconds_total", mode="idle") > 0
    total = value(values, "verl_host_memory_total_bytes")
    assert total > value(values, "verl_host_memory_available_bytes") > 0
    assert 0 < value(values, "verl_host_memory_used_bytes") < total
    assert value(values, "verl_host_swap_total_bytes") >= value(values, "verl_host_swap_used_bytes") >= 0
    for load in ("verl_host_load1", "verl_host_load5", "verl_host_load15"):
        assert value(values, load) >= 0
    assert not [key for key in values if key[0].startswith("verl_job_")]


def test_names_avoid_node_exporter_and_client_python_prefixes():
    values = scrape(HostCollector())
    assert not [name for name, _ in values if re.match(r"(node|process|python)_", name)]


@pytest.mark.parametrize("by", ["pid", "regex"])
def test_job_series_for_a_running_job(job_process, by):
    proc, marker = job_process
    job = JobSelector(pid=proc.pid) if by == "pid" else JobSelector(match=re.escape(marker))
    values = scrape(HostCollector(job=job))
    assert value(values, "verl_job_running") == 1
    assert value(values, "verl_job_processes") == 1
    assert value(values, "verl_job_resident_memory_bytes") > 1 << 20
    assert value(values, "verl_job_threads") >= 1
    assert value(values, "verl_job_open_fds") >= 3
    assert value(values, "verl_job_cpu_seconds_total") >= 0


def test_an_exited_job_reports_not_running(job_process):
    proc, _ = job_process
    job = JobSelector(pid=proc.pid, cache_seconds=0)
    collector = HostCollector(job=job)
    assert value(scrape(collector), "verl_job_running") == 1
    proc.kill()
    proc.wait()
    values = wait_until(lambda: (v := scrape(collector))[("verl_job_running", ())] == 0 and v, timeout=10,
                        message="verl_job_running 0")
    assert value(values, "verl_job_processes") == 0
    assert ("verl_job_resident_memory_bytes", ()) not in values
    assert value(values, "verl_exporter_collector_success", collector="host") == 1


class FakeProcess:
    def __init__(self, pid, rss=100, user=1.0, system=0.5, threads=4, fds=10, error=None):
        self.pid, self._error = pid, error
        self._values = (rss, user, system, threads, fds)

    def oneshot(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def memory_info(self):
        if self._error:
            raise self._error
        return SimpleNamespace(rss=self._values[0])

    def cpu_times(self):
        return SimpleNamespace(user=self._values[1], system=self._values[2])

    def num_threads(self):
        return self._values[3]

    def num_fds(self):
        return self._values[4]


class StubJob:
    configured = True

    def __init__(self, processes):
        self._processes = processes

    def processes(self):
        return self._processes


def fake_psutil(cpu_percent=25.0):
    return SimpleNamespace(
        cpu_percent=lambda interval=None: cpu_percent,
        cpu_times=lambda: SimpleNamespace(_asdict=lambda: {"user": 10.0, "idle": 90.0}),
        cpu_count=lambda logical=True: 16,
        getloadavg=lambda: (1.5, 1.0, 0.5),
        virtual_memory=lambda: SimpleNamespace(total=64 << 30, available=48 << 30, used=12 << 30),
        swap_memory=lambda: SimpleNamespace(total=8 << 30, used=1 << 30),
        NoSuchProcess=psutil.NoSuchProcess,
        AccessDenied=psutil.AccessDenied,
    )


def test_values_are_converted_to_ratios_and_bytes():
    values = scrape(HostCollector(psutil_module=fake_psutil(cpu_percent=25.0)))
    assert value(values, "verl_host_cpu_utilization_ratio") == 0.25
    assert value(values, "verl_host_cpus") == 16
    assert value(values, "verl_host_load5") == 1.0
    assert value(values, "verl_host_memory_available_bytes") == 48 << 30
    assert value(values, "verl_host_swap_used_bytes") == 1 << 30
    assert value(values, "verl_host_cpu_seconds_total", mode="user") == 10.0


def test_job_sums_skip_processes_that_exit_while_being_read():
    processes = [FakeProcess(1), FakeProcess(2, error=psutil.NoSuchProcess(2)), FakeProcess(3, rss=50, fds=5),
                 FakeProcess(4, error=psutil.AccessDenied(4))]
    values = scrape(HostCollector(psutil_module=fake_psutil(), job=StubJob(processes)))
    assert value(values, "verl_job_processes") == 3  # the exited one is gone; the hidden one is there
    assert value(values, "verl_job_resident_memory_bytes") == 150
    assert value(values, "verl_job_cpu_seconds_total") == 3.0
    assert value(values, "verl_job_threads") == 8
    assert value(values, "verl_job_open_fds") == 15


def test_job_series_only_with_a_configured_selector():
    values = scrape(HostCollector(psutil_module=fake_psutil(), job=JobSelector()))
    assert not [name for name, _ in values if name in JOB_SERIES]
    values = scrape(HostCollector(psutil_module=fake_psutil(), job=StubJob([])))
    assert value(values, "verl_job_running") == 0
    assert value(values, "verl_job_processes") == 0
