"""The logs verl's forks write: flat JSON lines, a job's stdout and stderr as two files, the
trainer's fatal end told from the log alone, wandb's cut lines, and failures before the first step."""

import math
import os

import pytest

from owner import ME
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.sources import Source
from verl_exporter.sources.console import WANDB_LINE_CHARS, parse_console_line
from verl_exporter.sources.errors import error_kind
from verl_exporter.sources.fatal import TrainerExit, fatal_kind
from verl_exporter.sources.jsonl import FLAT, JsonlReader, parse_jsonl_line
from verl_exporter.sources.pairing import job_of, job_stem
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import ParseError, RunKey
from verl_exporter.store.run_store import RunStore

CONFIG_PRINT = ("{'trainer': {'project_name': 'frozen_lake', 'experiment_name': 'ppo-16-32', "
                "'total_epochs': 1}, 'actor_rollout_ref': {'actor': {'ppo_mini_batch_size': 32}}}\n")
STEP = "step:{step} - actor/pg_loss:0.1 - actor/entropy:0.5 - critic/score/mean:0.3\n"
DRIVER_OOM = (
    "Error executing job with overrides: ['trainer.project_name=frozen_lake']\n"
    "Traceback (most recent call last):\n"
    '  File "/home/u/RAGEN/train.py", line 130, in main\n'
    "    run_ppo(config)\n"
    "ray.exceptions.RayTaskError(OutOfMemoryError): \x1b[36mray::TaskRunner.run()\x1b[39m (pid=525973, ip=10.0.0.1)\n"
    '  File "/home/u/verl/workers/fsdp_workers.py", line 720, in compute_log_prob\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.85 GiB.\n"
    "\n"
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")


def served(store: RunStore) -> dict[tuple[str, tuple], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in TrainingCollector(store).collect() for sample in family.samples}


def fatal_series(store: RunStore) -> dict[tuple, float]:
    return {labels: value for (name, labels), value in served(store).items()
            if name == "verl_training_fatal_error_last_step"}


# Flat JSON lines (verl-agent) beside the FileLogger's {"step", "data"}.

def test_a_flat_record_is_read_with_its_odd_keys():
    line = ('{"step": 12, "actor/entropy_loss": 0.91, "episode/webshop_task_score (not success_rate)": 0.06, '
            '"episode/success_rate": 0.4, "note": "text", "nan": null}')
    step, values = parse_jsonl_line(line)
    assert step == 12 and values["actor/entropy_loss"] == 0.91
    assert values["episode/webshop_task_score (not success_rate)"] == 0.06
    assert "note" not in values and math.isnan(values["nan"]) and "step" not in values


def test_a_files_first_record_decides_its_shape():
    flat = JsonlReader()
    assert flat.parse('{"step": 0, "val/success_rate": 0.2}') == (0, {"val/success_rate": 0.2})
    assert flat.shape == FLAT
    # In a flat file, a key named "data" is just a value that is no number.
    dropped = []
    assert flat.parse('{"step": 1, "data": {"a": 1}, "b": 2}', dropped.append) == (1, {"b": 2.0})
    assert dropped == ["object"]
    nested = JsonlReader()
    assert nested.parse('{"step": 1, "data": {"a": 1.5}}') == (1, {"a": 1.5})
    with pytest.raises(ParseError, match="missing data"):
        nested.parse('{"step": 2, "a": 1.5}')  # a FileLogger file stays one


def test_a_flat_record_of_nothing_but_its_step_is_an_error():
    with pytest.raises(ParseError, match="no key besides step"):
        parse_jsonl_line('{"step": 3}')


def test_a_flat_file_is_served_and_counts_no_parse_error(tmp_path):
    folder = tmp_path / "alfworld"
    folder.mkdir()
    log = folder / "grpo.jsonl"
    log.write_text("".join(f'{{"step": {step}, "actor/pg_loss": {step / 10}, "perf/mfu/actor": 2.3}}\n'
                           for step in range(1, 6)))
    store = RunStore(default_catalog())
    Source(str(folder / "*.jsonl"), store).settle()
    snapshot = store.snapshot()
    assert snapshot.parse_errors == {}
    [state] = snapshot.runs
    assert state.run == RunKey("alfworld", "grpo", ME) and state.last_step == 5 and state.steps_ingested == 5
    assert served(store)[("verl_actor_pg_loss", (("experiment", "grpo"), ("project", "alfworld"), ("team", ""),
                                                 ("user", ME)))] == 0.5


# One job, two files.

@pytest.mark.parametrize("stdout, stderr", [
    ("X.out", "X.err"), ("train-1234.out", "train-1234.err"), ("console.log", "console.stderr.log"),
    ("X.stdout.log", "X.stderr.log"), ("X.stdout", "X.stderr"), ("X-stdout.log", "X-stderr.log"),
    ("stdout.log", "stderr.log"), ("X.log", "X.err.log"),
])
def test_a_jobs_stdout_and_stderr_are_one_job(stdout, stderr):
    assert job_stem(stdout) == job_stem(stderr)
    assert job_of(f"/logs/a/{stdout}") == job_of(f"/logs/a/{stderr}") != job_of(f"/logs/b/{stderr}")
    assert job_of(f"/logs/a/{stdout}", 1000) == job_of(f"/logs/a/{stderr}", 1000) != job_of(f"/logs/a/{stderr}", 1001)


@pytest.mark.parametrize("one, other", [("X.log", "Y.err"), ("checkout.log", "check.err"), ("run.log", "run2.err"),
                                        ("e.jsonl", "e.log"), ("e.jsonl", "e.err"), ("e", "e.err")])
def test_other_names_are_other_jobs(one, other):
    assert job_of(f"/logs/{one}") != job_of(f"/logs/{other}")


def write_job(folder, stdout_text: str, stderr_text: str, stdout="job.out", stderr="job.err"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / stdout).write_text(stdout_text)
    (folder / stderr).write_text(stderr_text)


@pytest.mark.parametrize("pattern", ["*", "job.*"])
def test_the_oom_only_in_stderr_feeds_the_run_its_stdout_named(tmp_path, pattern):
    folder = tmp_path / "logs"
    write_job(folder, CONFIG_PRINT + STEP.format(step=0), DRIVER_OOM)
    store = RunStore(default_catalog())
    Source(str(folder / pattern), store).settle()
    run = (("experiment", "ppo-16-32"), ("project", "frozen_lake"), ("team", ""), ("user", ME))
    assert fatal_series(store) == {(*run[:1], ("kind", "cuda_oom"), *run[1:]): 0.0}
    assert served(store)[("verl_training_log_errors_total", (*run[:1], ("kind", "cuda_oom"), *run[1:]))] == 1.0
    assert [state.run for state in store.snapshot().runs] == [RunKey("frozen_lake", "ppo-16-32", ME)]


def test_the_stderr_read_first_still_names_its_run_from_the_path(tmp_path):
    """Before any file of the job named its run, the stderr's fatal end names the path's run:
    ``<folder>/<job stem>``, the one a stdout without a config print would feed too."""
    folder = tmp_path / "logs"
    write_job(folder, STEP.format(step=1), DRIVER_OOM)
    store = RunStore(default_catalog())
    Source(str(folder / "job.err"), store).settle()
    Source(str(folder / "job.out"), store).settle()
    [state] = store.snapshot().runs
    assert state.run == RunKey("logs", "job", ME) and state.last_step == 1


def test_another_jobs_file_cannot_feed_the_run(tmp_path):
    write_job(tmp_path / "ours", CONFIG_PRINT + STEP.format(step=1), "")
    write_job(tmp_path / "theirs", CONFIG_PRINT + STEP.format(step=99), DRIVER_OOM)
    store = RunStore(default_catalog())
    Source(str(tmp_path / "ours" / "*"), store).settle()
    Source(str(tmp_path / "theirs" / "*"), store).settle()
    ours = {state.run: state for state in store.snapshot().runs}[RunKey("frozen_lake", "ppo-16-32", ME)]
    assert ours.last_step == 1 and ours.fatal is None and not ours.log_errors


# The trainer's fatal end.

def feed(lines: str) -> list[str]:
    watch = TrainerExit()
    return [kind for kind in map(watch.feed, lines.replace("\x1b[36m", "").replace("\x1b[39m", "").split("\n"))
            if kind is not None]


def test_a_ray_task_error_out_of_the_trainer_is_its_fatal_end_told_once():
    assert feed(DRIVER_OOM) == ["cuda_oom"]
    assert feed("ray.exceptions.RayTaskError(AssertionError): ray::main_task() (pid=2105103)\n"
                "AssertionError: failed to get register_center_actor") == ["assertion"]


def test_hydra_and_an_uncaught_traceback_of_the_entry_file_are_fatal_ends():
    hydra = ("Error executing job with overrides: []\nTraceback (most recent call last):\n"
             '  File "/x/site-packages/omegaconf/base.py", line 1, in get\n'
             "omegaconf.errors.ConfigAttributeError: Key 'rollout' is not in struct\n\n"
             "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.")
    assert feed(hydra) == ["config"]
    uncaught = ("Traceback (most recent call last):\n"
                '  File "/opt/verl/verl/trainer/main_ppo.py", line 64, in <module>\n    main()\n'
                '  File "/opt/flash_attn/__init__.py", line 3, in <module>\n'
                "ImportError: flash_attn_2_cuda.so: undefined symbol: _ZNK3c10")
    assert feed(uncaught) == ["import_error"]
    torchrun = ("[rank0]: Traceback (most recent call last):\n"
                '[rank0]:   File "/opt/verl/verl/trainer/fsdp_sft_trainer.py", line 500, in <module>\n'
                "[rank0]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error")
    assert feed(torchrun) == ["nccl"]


@pytest.mark.parametrize("lines", [
    # A worker's error, printed with its actor's prefix: the trainer may survive it.
    "(TaskRunner pid=5) ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=5)",
    "(WorkerDict pid=7) Traceback (most recent call last):\n(WorkerDict pid=7) ValueError: bad",
    # Ray's own traceback of a worker (raylet, no prefix), and an unhandled worker error.
    "Traceback (most recent call last):\n"
    '  File "/x/ray/_private/function_manager.py", line 647, in _load_actor_class_from_gcs\n'
    "RuntimeError: Failed to import transformers.models.mistral.modeling_mistral",
    "Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::WorkerDict.actor_rollout_update_actor()",
    "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_compute_log_prob() (pid=9)",
    # RAGEN prints this at every step of healthy runs.
    "Error in reward_fn: 'reward_extra_info'",
    # The user stopped it.
    "Traceback (most recent call last):\n"
    '  File "/opt/verl/verl/trainer/main_ppo.py", line 64, in <module>\nKeyboardInterrupt',
])
def test_what_the_trainer_survives_or_a_user_stop_is_no_fatal_end(lines):
    assert feed(lines) == []


def test_harmless_per_step_errors_are_no_error_lines():
    assert error_kind("Error in reward_fn: 'reward_extra_info'") is None


@pytest.mark.parametrize("exception, message, kind", [
    ("torch.OutOfMemoryError", "", "cuda_oom"), ("RuntimeError", "CUDA out of memory.", "cuda_oom"),
    ("torch.distributed.DistBackendError", "", "nccl"), ("ModuleNotFoundError", "", "import_error"),
    ("ray.exceptions.ActorDiedError", "", "ray_actor_died"), ("FileNotFoundError", "", "file_not_found"),
    ("SafetensorError", "No space left on device", "exception"), ("KeyboardInterrupt", "", None),
])
def test_the_kind_of_a_fatal_end(exception, message, kind):
    assert fatal_kind(exception, message) == kind


def test_a_resumed_run_that_steps_again_is_no_longer_crashed(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    log = folder / "train.log"
    log.write_text(CONFIG_PRINT + STEP.format(step=1) + STEP.format(step=2) + DRIVER_OOM)
    store = RunStore(default_catalog())
    source = Source(str(log), store)
    source.settle()
    assert list(fatal_series(store).values()) == [2.0]
    with log.open("a") as handle:
        handle.write(STEP.format(step=3) + DRIVER_OOM.replace("torch.OutOfMemoryError: CUDA out of memory.",
                                                              "AssertionError: bad batch.")
                     .replace("OutOfMemoryError", "AssertionError"))
    source.settle()
    assert list(fatal_series(store)) == [(("experiment", "ppo-16-32"), ("kind", "assertion"),
                                         ("project", "frozen_lake"), ("team", ""), ("user", ME))]
    assert list(fatal_series(store).values()) == [3.0]
    with log.open("a") as handle:
        handle.write(STEP.format(step=4))
    source.settle()
    assert fatal_series(store) == {}


def test_a_failure_before_step_1_in_a_file_that_names_no_run_makes_the_paths_run(tmp_path):
    folder = tmp_path / "opd-resp16k"
    folder.mkdir()
    log = folder / "output.log"
    log.write_text("Training Progress:   0%|          | 0/55990\n"
                   "(WorkerDict pid=3) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.78 GiB.\n"
                   "(WorkerDict pid=3) Traceback (most recent call last):\n")
    store = RunStore(default_catalog())
    Source(str(folder / "*.log"), store).settle()
    [state] = store.snapshot().runs
    assert state.run == RunKey("opd-resp16k", "output", ME) and state.last_step is None
    assert dict(state.log_errors) == {"cuda_oom": 1}  # the traceback before the run is known stays out


# wandb's output.log.

def test_a_step_line_wandb_cut_is_read_up_to_its_last_whole_pair():
    head = "step:20 - actor/pg_loss:0.5 - "
    pairs = "".join(f"val-aux/aime/score/best@{n}/mean:np.float64(-0.35123) - " for n in range(200))
    line = (head + pairs)[:WANDB_LINE_CHARS - 1] + "7"
    assert len(line) == WANDB_LINE_CHARS
    dropped = []
    step, values = parse_console_line(line, dropped=dropped.append)
    assert step == 20 and values["actor/pg_loss"] == 0.5 and dropped == []
    last = line.rpartition(" - ")[2].partition(":")[0]
    assert last not in values and all(value == -0.35123 for key, value in values.items() if key != "actor/pg_loss")
    filler = WANDB_LINE_CHARS - len("step:1 - b:1 - :0.5")
    assert parse_console_line("step:1 - b:1 - " + "a" * filler + ":0.5")[1] == {"b": 1.0}
    assert parse_console_line("step:1 - b:1 - " + "a" * (filler - 1) + ":0.5")[1] == {"b": 1.0, "a" * (filler - 1): 0.5}


def test_events_of_a_file_of_no_step_are_at_its_modification_time(tmp_path):
    from verl_exporter.history.timeline import read_file
    log = tmp_path / "console.stderr.log"
    log.write_text(DRIVER_OOM)
    os.utime(log, (1_700_000_000, 1_700_000_000))
    timeline = read_file(str(log))
    assert timeline.steps and {step.time for step in timeline.steps} == {1_700_000_000.0}
    assert [record.fatal for step in timeline.steps for record in step.records if record.fatal] == ["cuda_oom"]
