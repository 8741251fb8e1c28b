"""Code reaches the packages by importing them: no module outside tests/ edits sys.path (the demo
imports ``verl_mixin`` and its sibling ``stand_in_receiver``; both generators run as modules of the
installed mixin)."""

from __future__ import annotations

import os
import subprocess
import sys

from servers import REPO


def python_files_outside_tests() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
                            capture_output=True, text=True, cwd=REPO, check=True).stdout.split()
    return [path for path in listed if not path.startswith("tests/") and (REPO / path).is_file()]


def test_no_sys_path_insert_outside_tests():
    files = python_files_outside_tests()
    assert "scripts/demo.py" in files and "mixin/verl_mixin/render.py" in files
    offenders = [path for path in files if "sys.path.insert" in (REPO / path).read_text(encoding="utf-8")]
    assert offenders == []


def test_the_generator_runs_as_a_module_of_the_package():
    assert not (REPO / "alerts" / "generate.py").exists()
    result = subprocess.run([sys.executable, "-m", "verl_mixin", "--help"], capture_output=True,
                            text=True, cwd=REPO / "tests", timeout=60)
    assert result.returncode == 0 and "--runbook-url" in result.stdout, result.stderr


def test_the_dashboards_generator_runs_with_nothing_on_the_path():
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "verl_mixin.dashboards", "--help"], capture_output=True,
                            text=True, cwd=REPO / "tests", env=env, timeout=60)
    assert result.returncode == 0 and "--check" in result.stdout, result.stderr


def test_the_mixin_is_one_folder():
    """The catalog, the rule definitions, the dashboard code and the jsonnet entry point sit together."""
    mixin = REPO / "mixin"
    assert {"catalog.yaml", "mixin.libsonnet", "config.libsonnet", "verl_mixin"} <= {p.name for p in mixin.iterdir()}
    assert (mixin / "verl_mixin" / "dashboards" / "__init__.py").is_file()
    assert not (REPO / "grafana" / "verl_dashboards").exists()
    assert not (REPO / "exporter" / "verl_exporter" / "alerting").exists()
