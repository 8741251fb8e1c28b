"""VerlGpuStraggler's guards each hold a case of straggler.test.yml: without the guard, its case fails.

Each case of straggler.test.yml whose name starts with ``GUARD -`` stays silent only because of that
guard; here the shipped rules are copied with the guard taken out (or loosened) and promtool runs that
case alone against them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from unittest import mock

import pytest
import yaml

import step_series
from servers import require_binary
from verl_exporter import shipped
from verl_mixin import nodes, render

TESTS = Path(__file__).resolve().parent
TEST_FILE = TESTS / "straggler.test.yml"


def filled(text: str) -> str:
    return render.filled(text, render.default_catalog())


def _window(text: str) -> str:  # the GPU's mean over one minute instead of ten
    return text.replace(f"avg_over_time(verl_gpu_utilization_ratio[{nodes.STRAGGLER_WINDOW}])",
                        "avg_over_time(verl_gpu_utilization_ratio[1m])")


def _drop(fragment: str):
    return lambda text: text.replace(" " + filled(fragment), "").replace("\n" + filled(fragment), "")


def _ratio(text: str) -> str:  # a GPU at 0.5 of a median of 0.9 counts with 0.6
    ratio = nodes.THRESHOLDS["straggler_ratio"]
    return text.replace(f"group_left() ({ratio:g} * ", "group_left() (0.6 * ")


def _sole_run(text: str) -> str:  # every node of the run, also one shared with another run
    return text.replace(filled(nodes.SOLE_RUN), filled(nodes.NODES))


# guard (the case's name starts with it) -> the change of the rule files' text that removes it
GUARDS = {
    "window": _window,
    "median": _drop(nodes.STRAGGLER_BUSY_RUN),
    "stepping": _drop(nodes.STRAGGLER_STEPPING),
    "ratio": _ratio,
    "sole run": _sole_run,
}


def one_line_rule_files() -> dict[str, str]:
    """The shipped rule files with every expression on one line, so that a guard is dropped as text."""
    with mock.patch.object(render, "LINE_WIDTH", 10**9):
        texts = render.rule_files()
        texts[render.RECORDING_RULES_FILE] = render.recording_rules()
    assert set(texts) == {path.name for path in shipped.rule_files()}
    return texts


def run_case(tmp_path: Path, prefix: str, change=lambda text: text) -> subprocess.CompletedProcess:
    rules = tmp_path / render.RULES_DIR
    rules.mkdir(parents=True)
    for name, text in one_line_rule_files().items():
        (rules / name).write_text(change(text))
    tests = yaml.safe_load(TEST_FILE.read_text())
    tests["tests"] = [case for case in tests["tests"] if case["name"].startswith(prefix)]
    assert len(tests["tests"]) == 1, prefix
    folder = tmp_path / "tests" / "alerts"
    folder.mkdir(parents=True)
    (folder / TEST_FILE.name).write_text(yaml.safe_dump(tests))
    step_series.expand(folder / TEST_FILE.name, folder)  # the step statistics the exporter would serve
    return subprocess.run([require_binary("promtool"), "test", "rules", TEST_FILE.name], cwd=folder,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_each_guard_holds_its_case(tmp_path, guard):
    shipped_text = "".join(one_line_rule_files().values())
    assert GUARDS[guard](shipped_text) != shipped_text, f"the {guard} guard is not in the shipped rules"
    assert run_case(tmp_path / "as-shipped", f"{guard} -").returncode == 0
    result = run_case(tmp_path / "without", f"{guard} -", GUARDS[guard])
    assert result.returncode != 0, f"the {guard} case passes without its guard:\n{result.stdout}"
    # The alert's case fails, or (sole run) the per-GPU recording rule itself: a node of two runs makes
    # its join many-to-many, and the error would silence the rule for every run.
    assert any(name in result.stdout + result.stderr for name in ("VerlGpuStraggler", nodes.RUN_GPU_BUSY))
