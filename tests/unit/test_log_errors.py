"""Errors a run's log shows: which lines count as which kind, what the store keeps of them, the
families served, the run's start time, and when a replay times them."""

import os

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from record_keeper import RecordKeeper

from owner import ME
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.history.timeline import read_file
from verl_exporter.sources import Source
from verl_exporter.sources.errors import KINDS, MAX_LINE_CHARS, WORDS, error_kind
from verl_exporter.sources.fatal import TrainerExit
from verl_exporter.sources.quiet import is_quiet
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import ERROR_LINES, RunStore

RUN = RunKey("search", "ppo")


@pytest.mark.parametrize("line, kind", [
    ("(WorkerDict pid=7, ip=10.0.0.2) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.07 GiB",
     "cuda_oom"),
    ("torch.cuda.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB", "cuda_oom"),
    ("RuntimeError: CUDA error: out of memory", "cuda_oom"),
    ("[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600011 milliseconds before timing out.", "nccl_timeout"),
    ("(WorkerDict pid=9) NCCL operation timed out after 1800 s", "nccl_timeout"),
    ("*** SIGSEGV received at time=1734567890 on cpu 3 ***", "segfault"),
    ("Fatal Python error: Segmentation fault", "segfault"),
    ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.", "ray_actor_died"),
    ("(main_task pid=5) Traceback (most recent call last):", "traceback"),
])
def test_error_lines_are_told_by_kind(line, kind):
    assert kind in KINDS
    assert error_kind(line) == kind
    assert any(word in line for word in WORDS)  # what the quiet-line check looks for
    for shown in (line, f"(TaskRunner pid=12) {line}", f"\x1b[36m(TaskRunner pid=12)\x1b[0m {line}"):
        assert not is_quiet(shown, TrainerExit()), shown  # never skipped unread, from any actor


@pytest.mark.parametrize("line", [
    "(TaskRunner pid=1)                        'nccl_timeout': 600,",
    "[I ProcessGroupNCCL.cpp:852] [PG 0 Rank 0] ProcessGroupNCCL initialization options: size: 1, TIMEOUT(ms): 600000",
    "step:3 - perf/max_memory_allocated_gb:43.2 - perf/max_memory_reserved_gb:50.1",
    "(WorkerDict pid=2) INFO memory profiling: the current vLLM instance can use total_gpu_memory (79.1GiB)",
    "Training Progress:   0%|          | 0/58 [07:16<?, ?it/s]",
])
def test_ordinary_lines_are_no_errors(line):
    assert error_kind(line) is None


def _served(store):
    registry = CollectorRegistry()
    registry.register(TrainingCollector(store))
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in generate_latest(registry).decode().splitlines()
            if line.startswith(("verl_training_log_errors_total", "verl_training_started_timestamp_seconds"))}


def test_the_store_counts_errors_by_kind_keeps_the_latest_lines_and_no_step():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 0, {}, time=50.0, run_config={"trainer.project_name": "search"}))
    for index in range(ERROR_LINES + 5):
        store.ingest(Record(RUN, 0, {}, time=60.0 + index, error="traceback", line=f"Traceback {index}"))
    store.ingest(Record(RUN, 0, {}, time=99.0, error="cuda_oom", line="CUDA out of memory"))
    state = store.snapshot().runs[0]
    assert state.last_step is None and state.last_step_time is None, "an error is no step"
    assert len(state.error_lines) == ERROR_LINES and state.error_lines[-1] == "CUDA out of memory"
    assert _served(store) == {
        'verl_training_log_errors_total{experiment="ppo",kind="cuda_oom",project="search",team="",user=""}': 1.0,
        'verl_training_log_errors_total{experiment="ppo",kind="traceback",project="search",team="",user=""}': 25.0,
        'verl_training_started_timestamp_seconds{experiment="ppo",project="search",team="",user=""}': 50.0,
    }


def test_a_console_source_reads_errors_from_any_actor_bounded_and_without_colours(tmp_path):
    log = tmp_path / "run.log"
    long = "x" * 5000
    log.write_text("\x1b[36m(WorkerDict pid=3)\x1b[0m torch.OutOfMemoryError: CUDA out of memory. " + long + "\n"
                   "(TaskRunner pid=1) step:1 - actor/pg_loss:0.1\n")
    keep = RecordKeeper()
    Source(str(log), keep, project="search", experiment="ppo").poll()
    error, step = keep.records
    assert error.error == "cuda_oom" and step.step == 1 and step.error is None
    assert error.line.startswith("(WorkerDict pid=3) torch.OutOfMemoryError") and "\x1b" not in error.line
    assert len(error.line) <= MAX_LINE_CHARS


def test_replay_times_an_error_after_the_step_before_it(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("step:1 - timing_s/step:100\n(WorkerDict pid=3) Fatal Python error: Segmentation fault\n"
                   "step:2 - timing_s/step:100\n")
    os.utime(log, (10000.0, 10000.0))
    first, error, second = read_file(str(log)).steps
    assert error.event and error.records[0].error == "segfault"
    assert (first.time, error.time, second.time) == (9900.0, 9900.001, 10000.0)


def test_errors_before_the_run_is_known_name_no_run_of_their_own(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("(WorkerDict pid=3) Traceback (most recent call last):\n"
                   "(TaskRunner pid=1) {'trainer': {'project_name': 'search', 'experiment_name': 'ppo', "
                   "'logger': ['console']},\n"
                   "(TaskRunner pid=1)  'actor_rollout_ref': {'actor': {'clip_ratio': 0.2}}}\n"
                   "(WorkerDict pid=3) torch.OutOfMemoryError: CUDA out of memory.\n")
    keep = RecordKeeper()
    Source(str(log), keep).poll()
    assert [(record.run, record.error) for record in keep.records if record.run_config is None] == [
        (RunKey(RUN.project, RUN.experiment, ME), "cuda_oom")]
    named = RecordKeeper()
    Source(str(log), named, project="search", experiment="ppo").poll()
    assert [record.error for record in named.records if record.run_config is None] == ["traceback", "cuda_oom"]
