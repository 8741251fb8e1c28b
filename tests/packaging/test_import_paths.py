"""Code reaches the package by importing it: no module outside tests/ edits sys.path (the demo
imports ``verl_exporter.alerting`` and its sibling ``stand_in_receiver``; the dashboards generator
runs with PYTHONPATH=grafana from the Makefile)."""

from __future__ import annotations

import subprocess
import sys

from servers import REPO


def python_files_outside_tests() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
                            capture_output=True, text=True, cwd=REPO, check=True).stdout.split()
    return [path for path in listed if not path.startswith("tests/") and (REPO / path).is_file()]


def test_no_sys_path_insert_outside_tests():
    files = python_files_outside_tests()
    assert "scripts/demo.py" in files and "exporter/verl_exporter/alerting/render.py" in files
    offenders = [path for path in files if "sys.path.insert" in (REPO / path).read_text(encoding="utf-8")]
    assert offenders == []


def test_the_generator_runs_as_a_module_of_the_package():
    assert not (REPO / "alerts" / "generate.py").exists()
    result = subprocess.run([sys.executable, "-m", "verl_exporter.alerting", "--help"], capture_output=True,
                            text=True, cwd=REPO / "tests", timeout=60)
    assert result.returncode == 0 and "--runbook-url" in result.stdout, result.stderr
