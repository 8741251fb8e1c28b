"""The second folder's logs as a new user meets them: every verl-agent JSON-lines file read with
its steps, wandb's cut lines read up to the cut, a log without steps replayed at its file's times,
and verl's SFT trainer served without RL alerts while a NaN loss still pages."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from real_runs import REAL_RUNS_2, available_runs, replay_files, require_run
from servers import require_binary
from verl_exporter.history.timeline import read_file
from verl_exporter.sources.console import WANDB_LINE_CHARS

VERL_AGENT = [run for run in available_runs(REAL_RUNS_2) if (REAL_RUNS_2 / run / "metrics.jsonl").is_file()]
WANDB = ["opd-grpo-qwen2.5-3b-kl0.001-49steps-improving", "opd-grpo-qwen2.5-3b-nokl-160steps-length-growth-val-up",
         "opd-grpo-qwen2.5-3b-teacher-kl-40steps-flat"]
SFT = "opd-sft-qwen2.5-3b-multiturn-372steps-complete"


def test_the_second_folder_has_its_json_lines_runs():
    if not REAL_RUNS_2.is_dir():
        pytest.skip(f"no real-run logs at {REAL_RUNS_2}")
    assert len(VERL_AGENT) == 3, VERL_AGENT


@pytest.mark.parametrize("run", VERL_AGENT or ["(none)"])
def test_every_verl_agent_file_is_read_with_its_steps(run):
    if run == "(none)":
        pytest.skip(f"no verl-agent logs at {REAL_RUNS_2}")
    folder = require_run(run)
    timeline = read_file(str(folder / run / "metrics.jsonl"))
    steps = [step for step in timeline.steps if not step.event]
    assert len(steps) >= 295 and [step for step in timeline.steps if step.errors] == []
    keys = set().union(*(record.values for step in steps for record in step.records))
    assert {"actor/entropy_loss", "critic/score/mean", "timing_s/step"} <= keys
    assert steps[-1].step == 300 and timeline.method == "file modification time and timing_s/step"


@pytest.mark.parametrize("run", WANDB)
def test_wandbs_cut_lines_are_read_up_to_the_cut(run):
    folder = require_run(run)
    log = folder / run / "console.log"
    cut = {int(match.group(1)): line for line in log.read_text(encoding="utf-8").split("\n")
           if len(line) == WANDB_LINE_CHARS and (match := re.match(r"step:(\d+) ", line))}
    assert cut, f"{run} has no line wandb cut"
    timeline = read_file(str(log))
    for step in timeline.steps:
        assert step.errors == [], (step.step, step.errors)
        if step.step in cut and not step.event:
            keys = set().union(*(record.values for record in step.records))
            whole = cut[step.step].rpartition(" - ")[0]
            assert keys and all(f"{key}:" in whole for key in keys), step.step
            assert cut[step.step].rpartition(" - ")[2].partition(":")[0] not in keys


def test_a_log_without_steps_replays_at_its_files_time(tmp_path):
    run = "opd-grpo-qwen2.5-3b-resp16k-oom-step1"
    folder = require_run(run)
    log = folder / run / "console.log"
    day = time.strftime("%Y-%m-%d", time.gmtime(log.stat().st_mtime))
    printed = subprocess.run(
        [sys.executable, "-m", "verl_exporter", "replay", str(log), "--prometheus", require_binary("prometheus"),
         "--promtool", require_binary("promtool")], capture_output=True, text=True, timeout=300)
    assert printed.returncode == 1, printed.stderr  # 1: an alert would have fired
    assert "VerlTrainingOutOfMemory (critical)" in printed.stdout and "before the first step" in printed.stdout
    assert f"({day}T" in printed.stdout and "1970" not in printed.stdout


def test_the_sft_trainers_log_with_a_nan_loss_still_pages(tmp_path):
    folder = require_run(SFT)
    lines = (folder / SFT / "console.log").read_text(encoding="utf-8").split("\n")
    at = next(index for index, line in enumerate(lines) if line.startswith("step:200 "))
    lines[at] = re.sub(r"train/loss:[^ ]+", "train/loss:nan", lines[at])
    log = tmp_path / "sft" / "console.log"
    log.parent.mkdir()
    log.write_text("\n".join(lines[: at + 20]) + "\n", encoding="utf-8")
    (tmp_path / "work").mkdir()
    replayed = replay_files([str(log)], tmp_path / "work")
    loud = {name for name, severity in replayed.fired.items() if severity in ("warning", "critical")}
    assert loud == {"VerlTrainingNonFinite"}, replayed.fired
