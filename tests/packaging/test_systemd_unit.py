"""The shipped systemd unit for Slurm compute nodes: systemd accepts it, the exporter accepts its
command line, and its limits leave the exporter its threads, its memory and the host's /tmp."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servers import REPO
from verl_exporter.config.options import load_options

UNIT = REPO / "deploy" / "systemd" / "verl-exporter-slurm.service"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_the_exporter_takes_the_units_command_line():
    argv = shlex.split(unit()["Service"]["ExecStart"])
    assert argv[0] == "/opt/verl-exporter/bin/verl-exporter"  # where docs/slurm.md installs it
    options = load_options(argv[1:])
    assert options.slurm and options.web_listen_address == ":9945"


def test_the_unit_keeps_only_the_capabilities_the_daemon_needs():
    service = unit()["Service"]
    needed = {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}  # other users' /proc/PID/environ and job logs
    assert set(service["CapabilityBoundingSet"].split()) == needed
    assert set(service["AmbientCapabilities"].split()) == needed
    assert service["ProtectSystem"] == "strict" and service["NoNewPrivileges"] == "yes"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"  # SIGHUP reloads the options


def test_the_units_limits_fit_the_exporter():
    service = unit()["Service"]
    # threads: HTTP pools, the bounded pool of readers, hung readers, py-spy captures (see the unit)
    assert int(service["TasksMax"]) >= 256
    high, most = _bytes(service["MemoryHigh"]), _bytes(service["MemoryMax"])
    assert 512 << 20 <= high < most  # reclaimed before it is killed
    options = load_options(shlex.split(service["ExecStart"])[1:])
    store_bytes = options.store_max_runs * options.store_max_series_per_run * 300  # ~300 bytes a series
    assert store_bytes * 4 < high  # the store, a scrape's text of it and the rest fit under MemoryHigh


def test_the_unit_reads_the_hosts_tmp():
    """Jobs that write their logs under /tmp are followed: no private /tmp, the host's read-only."""
    service = unit()["Service"]
    assert service.get("PrivateTmp", "no") == "no"
    assert service["ReadOnlyPaths"] == "/" and service["ProtectSystem"] == "strict"


def _bytes(size: str) -> int:
    """A systemd size (``512M``, ``1G``) in bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)


def test_systemd_verifies_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    # systemd checks that ExecStart names an executable: this checkout's entry point stands in for
    # /opt/verl-exporter's.
    entry = Path(sys.executable).parent / "verl-exporter"
    text = UNIT.read_text().replace("/opt/verl-exporter/bin/verl-exporter", str(entry))
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    done = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken" / UNIT.name
    broken.parent.mkdir()
    broken.write_text(text.replace("Type=simple", "Type=nonesuch"))
    done = subprocess.run([analyze, "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert "nonesuch" in done.stdout + done.stderr  # the check can fail
