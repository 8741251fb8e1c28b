"""The quiet lines a Source skips (``sources.quiet``): reading a log with them skipped gives exactly
the records, parse errors and dropped values that reading every line in full gives, on mangled
logs (ANSI colours, carriage returns, CRLF, lines cut across reads, NaN and Inf, huge lines) and on
real runs' logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_exporter.sources import RecordsOnly, Source
from verl_exporter.sources import source as source_module
from verl_exporter.sources.errors import WORDS as ERROR_WORDS
from verl_exporter.sources.errors import error_kind
from verl_exporter.sources.fatal import TrainerExit
from verl_exporter.sources.quiet import is_quiet

REAL_RUNS = Path(__file__).resolve().parents[2].parent / "shared"
ACTOR = "\x1b[36m(TaskRunner pid=14640)\x1b[0m "
BAR = "Training Progress:  73%|███████▎  | 319/435 [48:20<21:06, 10.92s/it]"
MANGLED = [
    "plain driver line",
    ACTOR + "list(reward_extra_infos_dict.keys())=[]",
    ACTOR + "{'actor_rollout_ref': {'model': {'path': 'Qwen'}},",
    ACTOR + " 'trainer': {'project_name': 'p', 'experiment_name': 'e', 'total_epochs': 1}}",
    ACTOR + "Total training steps: 40",
    ACTOR + "step:1 - actor/pg_loss:0.019 - critic/score/mean:nan - timing_s/step:12.5",
    ACTOR + "       - actor/entropy:0.5 - perf/throughput:inf",
    ACTOR + "sample text after a continuation",
    ACTOR + "st\x1b[0mep:8 - a:1 - b:2 and step by step",
    ACTOR + "no dash after a step",
    ACTOR + "s\x1b[1mt\x1b]0;x\x07ep:9 - a:3",
    ACTOR + "       - c:4",
    ACTOR + "a dash - after a continuation",
    "(TaskRunner pid=1) step:2 - actor/pg_loss:-inf - actor/ppo_kl:np.float64(0.25)\r",
    "(TaskRunner pid=1) step:3 - a:1 -\rTraining Progress:   1%|          | 3/263 [00:10<1:41:02, 23.10s/it]",
    "(TaskRunner pid=1) local_global_step_folder: /ckpt/global_step_3",
    "(WorkerDict pid=7, ip=10.0.0.1) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate",
    "(WorkerDict pid=7) [rank0]: Watchdog caught collective operation timeout: NCCL",
    "\x1b[33m(raylet)\x1b[0m *** SIGSEGV received at time=1",
    "(TaskRunner pid=1) Traceback (most recent call last):",
    "Traceback (most recent call last):",
    '  File "/verl/trainer/main_ppo.py", line 10, in <module>',
    BAR,
    "[rank0]: " + BAR,
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/verl/trainer/main_ppo.py", line 10, in <module>',
    "    an indented line",
    "RuntimeError: boom",
    BAR,
    "The above exception was the direct cause of the following exception:",
    BAR,
    "Traceback (most recent call last):",
    '  File "/x/train.py", line 3, in <module>',
    "torch.OutOfMemoryError: CUDA out of memory",
    "Error executing job with overrides: []",
    BAR,
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    "ray.exceptions.RayTaskError(ValueError): ray::TaskRunner.run() (pid=1)",
    BAR,
    "ValueError: bad",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "\x1b[31mTrace\x1b[0mback (most recent call last):",
    '  File "/verl/trainer/main_ppo.py", line 10, in <module>',
    "KeyError: 'x'",
    "(TaskRunner pid=1) \x1b[1mFinal\x1b[0m validation metrics: {'val/score': 1.0}",
    "(TaskRunner pid=1) Final validation metrics: {'val/score': 1.0}",
    "(TaskRunner pid=1) Final validation metrics: None",
    "(TaskRunner pid=1) \x1b[1mFinal\x1b[0m validation metrics: None",
    "\x1b[31m\x1b[36m(TaskRunner pid=1)\x1b[0m ray.exceptions.ActorDiedError: The actor died unexpectedly",
    "\x1b]0;title\x07(TaskRunner pid=1) an OSC code before the prefix",
    "(TaskRunner pid=1) " + "x" * 300_000,
    "(TaskRunner pid=1) step:4 - " + " - ".join(f"k{i}:{i}.5" for i in range(3000)),
    "(TaskRunner pid=1) step:x - a:1",
    "(TaskRunner pid=1) step:5 - a:NaN - b:Infinity - c:1e999",
    "(TaskRunner pid=1) [repeated 2x across cluster] step",
    "(TaskRunner pid=1) 'experiment_name': 'renamed'",
    "",
    "(TaskRunner pid=1)",
]


def read(path: Path, skip_quiet: bool, monkeypatch: pytest.MonkeyPatch, cuts: tuple[int, ...] = ()) -> list:
    """Every record (as its repr: NaN equals NaN), parse error and dropped value of the file, read
    by a Source; the file is written in pieces cut at ``cuts`` (a poll after each)."""
    if not skip_quiet:
        monkeypatch.setattr(source_module, "is_quiet", lambda line, trainer_exit: False)
    data = path.read_bytes()
    target = path.with_suffix(".read.log")
    target.write_bytes(b"")
    seen: list = []

    class Store(RecordsOnly):
        def ingest(self, record):
            seen.append(repr(record))

        def parse_error(self, source, reason=""):
            seen.append(("error", reason))

        def values_dropped(self, source, reason, count=1):
            seen.append(("dropped", reason, count))

    source = Source(str(target), Store(), clock=lambda: 2e9)
    start = 0
    for cut in (*cuts, len(data)):
        with target.open("ab") as out:
            out.write(data[start:cut])
        os.utime(target, (1e9, 1e9))  # the records' time: the file's mtime
        start = cut
        source.settle()
    source.close()
    monkeypatch.undo()
    return seen


def same_both_ways(path: Path, monkeypatch: pytest.MonkeyPatch, cuts: tuple[int, ...] = ()) -> list:
    skipped = read(path, True, monkeypatch, cuts)
    assert skipped == read(path, False, monkeypatch, cuts)
    return skipped


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_mangled_log_reads_the_same_with_quiet_lines_skipped(tmp_path, monkeypatch, newline):
    path = tmp_path / "console.log"
    path.write_text(newline.join(MANGLED * 2) + newline, encoding="utf-8")
    seen = same_both_ways(path, monkeypatch)
    assert any("checkpoint_step=3" in str(item) for item in seen)
    assert any("finished=True" in str(item) for item in seen)
    assert any("error='cuda_oom'" in str(item) for item in seen)


@pytest.mark.parametrize("cuts", [(1,), (17, 18, 19), (40, 400, 4000), tuple(range(5, 3000, 97))])
def test_lines_cut_across_reads_read_the_same(tmp_path, monkeypatch, cuts):
    path = tmp_path / "console.log"
    path.write_text("\n".join(MANGLED[:22]) + "\n", encoding="utf-8")
    same_both_ways(path, monkeypatch, cuts)


def test_real_runs_logs_read_the_same(tmp_path, monkeypatch):
    logs = sorted(REAL_RUNS.glob("real-runs*/*/console*.log"))
    if not logs:
        pytest.skip("no real runs' logs beside the checkout")
    read_any: list = []
    for index, log in enumerate(logs):
        copy = tmp_path / str(index) / "console.log"
        copy.parent.mkdir()
        copy.write_bytes(log.read_bytes())
        read_any = same_both_ways(copy, monkeypatch) or read_any
    assert read_any


pieces = st.sampled_from(
    ["step", "step:", "step:7", " - ", "a:1", "b:nan", "c:-inf", ":", "(TaskRunner pid=1) ", "(", ")",
     "\x1b[36m", "\x1b[0m", "\x1b", "\r", "{'", "'}", "_name': '", "project", "Final validation metrics:",
     "Final", "Total training steps: 9", "local_global_step_folder: /c/global_step_2", "       - d:2",
     "Traceback (most recent call last):", '  File "/verl/trainer/main_ppo.py", line 1, in <module>',
     "ValueError: x", "CUDA out of memory", "NCCL timeout", "Segmentation fault", "[rank0]: ", " ", "x",
     "st\x1b[0mep:", "- ", "-", "       - e:3", "Training Progress:  1%|", " 3/263 [00:10<1:41:02, 23.10s/it]",
     "The above exception was the direct cause of the following exception:", "Error executing job with overrides: []",
     "Set the environment variable HYDRA_FULL_ERROR=1",
     "ray.exceptions.RayTaskError(ValueError): ray::TaskRunner.run()", "torch.distributed.elastic.ChildFailedError",
     "    raise ValueError", "\t", "KeyboardInterrupt", "[rank0]:"]
)
lines = st.lists(st.lists(pieces, max_size=8).map("".join), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(lines)
def test_any_mix_of_verl_like_lines_reads_the_same(tmp_path_factory, monkeypatch, text):
    path = tmp_path_factory.mktemp("quiet") / "console.log"
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    same_both_ways(path, monkeypatch)


@given(st.lists(pieces, max_size=12).map("".join))
def test_a_quiet_line_reports_no_error(line):
    if not any(word in line for word in ERROR_WORDS):
        assert error_kind(line) is None
    if is_quiet(line, TrainerExit()):
        assert error_kind(line) is None


def test_which_lines_are_quiet():
    rest, reading = TrainerExit(), TrainerExit()
    reading.feed("Traceback (most recent call last):")
    assert is_quiet(ACTOR + "list(reward_extra_infos_dict.keys())=[]", rest)
    assert is_quiet("(WorkerDict pid=1605, ip=172.26.135.50) [rank-8]: Saving optim to /checkpoints/x", reading)
    assert is_quiet(BAR, rest)
    assert not is_quiet(BAR, reading)  # a line inside the driver's traceback
    assert not is_quiet("\x1b[1m" + BAR, rest)  # ANSI codes may hide a word
    assert not is_quiet("RuntimeError: boom", reading)
    assert not is_quiet("ray.exceptions.RayTaskError(ValueError): ray::TaskRunner.run()", rest)
    assert not is_quiet(ACTOR + "step:3 - a:1", rest)
    assert is_quiet(ACTOR + "Let's break it down step by step", rest)
    assert not is_quiet(ACTOR + "Let's break it down step by step:", rest)
    assert not is_quiet(ACTOR + "st\x1b[0mep:3 - a:1", rest)
    assert not is_quiet(ACTOR + "CUDA out of memory", rest)
    assert not is_quiet(ACTOR + "a\rb", rest)
