"""The shipped systemd unit for Slurm compute nodes: systemd accepts it, and the exporter accepts its
command line."""

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
