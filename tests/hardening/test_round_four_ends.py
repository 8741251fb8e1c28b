"""Hostile input, round four: the trainer's fatal end told from its log. A traceback a handler
logged while the trainer went on (L1), lines of other processes inside a real crash's traceback
(L2), and chained exceptions (L3). Each test fails on the code before its fix, but the guards
marked as such."""

from __future__ import annotations

import pytest

from verl_exporter.sources import Source
from verl_exporter.sources.fatal import MAX_INTERLEAVED, TrainerExit
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore

CONFIG_PRINT = ("{'trainer': {'project_name': 'gsm8k', 'experiment_name': 'ppo', 'total_epochs': 1}, "
                "'actor_rollout_ref': {'actor': {'ppo_mini_batch_size': 32}}}\n")
STEP = "step:{step} - actor/pg_loss:0.1 - critic/score/mean:0.3\n"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
UNCAUGHT_HEAD = ("Traceback (most recent call last):\n"
                 '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
                 '  File "/opt/verl/verl/trainer/main_ppo.py", line 64, in <module>\n'
                 "    main()\n"
                 '  File "/opt/verl/verl/trainer/main_ppo.py", line 40, in main\n'
                 "    run_ppo(config)\n")
UNCAUGHT_OOM = UNCAUGHT_HEAD + '  File "/opt/torch/cuda/memory.py", line 10, in empty_cache\n' + OOM
LOGGED_CUDA_ERROR = (
    "ERROR:verl.trainer.ppo.ray_trainer:step failed, retrying it\n"
    "Traceback (most recent call last):\n"
    '  File "/opt/verl/verl/trainer/ppo/ray_trainer.py", line 1012, in fit\n'
    "    metrics = self._train_step(batch)\n"
    '  File "/opt/verl/verl/trainer/ppo/ray_trainer.py", line 940, in _train_step\n'
    "    torch.cuda.synchronize()\n"
    '  File "/opt/torch/cuda/__init__.py", line 792, in synchronize\n'
    "    return torch._C._cuda_synchronize()\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call.\n")
LOGGED_NCCL = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/opt/verl/verl/trainer/fsdp_sft_trainer.py", line 520, in fit\n'
    "[rank0]:     loss = self.training_step(data)\n"
    '[rank0]:   File "/opt/torch/distributed/distributed_c10d.py", line 2288, in all_reduce\n'
    "[rank0]:     work = group.allreduce([tensor], opts)\n"
    "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error\n")
HYDRA = "Error executing job with overrides: ['trainer.project_name=gsm8k']\n"
HYDRA_END = "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"


def told(text: str) -> list[str]:
    """The kinds a TrainerExit tells over ``text``'s lines."""
    watch = TrainerExit()
    return [kind for kind in map(watch.feed, text.split("\n")) if kind is not None]


def fatal_after(tmp_path, *writes: str) -> list:
    """The run's ``fatal`` after each of ``writes`` is appended to one log and read."""
    log = tmp_path / "train.log"
    log.write_text("")
    store = RunStore(default_catalog())
    source = Source(str(log), store)
    seen = []
    for text in writes:
        with log.open("a") as handle:
            handle.write(text)
        source.settle()
        seen.append([state.fatal for state in store.snapshot().runs])
    source.close()
    return seen


# --- L1: a traceback a handler logged, the trainer going on ---------------------------------------

@pytest.mark.parametrize("logged", [LOGGED_CUDA_ERROR, LOGGED_NCCL], ids=["cuda-error", "torchrun-nccl"])
def test_a_traceback_a_handler_logged_is_no_fatal_end(logged):
    """``logging.exception`` in a retry loop prints the driver's traceback from the function that
    caught it; the trainer goes on. Only an uncaught traceback starts at the process's top level."""
    assert told(logged) == []
    assert told(UNCAUGHT_OOM) == ["cuda_oom"]


def test_a_logged_traceback_between_steps_never_pages(tmp_path):
    """Read between the traceback and the next step (a scrape there paged), and after it."""
    seen = fatal_after(tmp_path, CONFIG_PRINT + STEP.format(step=1) + STEP.format(step=2),
                       LOGGED_CUDA_ERROR, STEP.format(step=3))
    assert seen == [[None], [None], [None]]


def test_a_logged_traceback_in_the_jobs_stderr_does_not_stay_a_fatal_end(tmp_path):
    """The job's stderr holds the logged traceback, its stdout the steps before and after it: read
    after the stdout, it was the run's fatal end at its last step, and stayed one."""
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "job.out").write_text(CONFIG_PRINT + "".join(STEP.format(step=step) for step in range(1, 5)))
    (folder / "job.err").write_text(LOGGED_CUDA_ERROR + LOGGED_CUDA_ERROR)
    store = RunStore(default_catalog())
    Source(str(folder / "job.*"), store).settle()
    assert [(state.last_step, state.fatal) for state in store.snapshot().runs] == [(4, None)]


def test_the_real_crash_after_a_logged_traceback_is_told_with_its_own_kind():
    assert told(LOGGED_CUDA_ERROR + UNCAUGHT_OOM) == ["cuda_oom"]


def test_guard_an_uncaught_end_is_told_at_once_and_a_later_step_clears_it(tmp_path):
    """A detector cannot wait for the end of the output: an uncaught end is told on its line, and
    the run stepping again (a resumed run in the same log) clears it."""
    seen = fatal_after(tmp_path, CONFIG_PRINT + STEP.format(step=1) + STEP.format(step=2),
                       UNCAUGHT_OOM, STEP.format(step=3), UNCAUGHT_OOM)
    assert seen == [[None], [("cuda_oom", 2)], [None], [("cuda_oom", 3)]]


# --- L2: other processes' lines inside a real crash's traceback -----------------------------------

BAR = "Training Progress:  40%|####      | 2/5 [00:30<00:45, 15.00s/it]"
INTERLEAVED = {
    "tqdm-bar": BAR,
    "tqdm-bar-no-total": "Training Progress: 7it [00:01,  4.12it/s]",
    "ray-worker": "(pid=123) INFO worker.py:1 a line of a worker",
    "ray-actor": "(WorkerDict pid=7, ip=10.0.0.1) kwargs: {'n': 1}",
}


@pytest.mark.parametrize("where", ["between-frames", "before-the-exception-line"])
@pytest.mark.parametrize("other", list(INTERLEAVED), ids=list(INTERLEAVED))
def test_a_line_of_another_process_inside_a_crash_does_not_hide_it(tmp_path, other, where):
    line = INTERLEAVED[other] + "\n"
    head, frame = UNCAUGHT_HEAD, '  File "/opt/torch/cuda/memory.py", line 10, in empty_cache\n'
    crash = head + line + frame + OOM if where == "between-frames" else head + frame + line + OOM
    assert told(crash) == ["cuda_oom"]
    assert fatal_after(tmp_path, CONFIG_PRINT + STEP.format(step=1), crash) == [[None], [("cuda_oom", 1)]]


def test_another_ranks_lines_inside_a_ranks_crash_do_not_hide_it():
    crash = ("[rank0]: Traceback (most recent call last):\n"
             '[rank0]:   File "/opt/verl/verl/trainer/fsdp_sft_trainer.py", line 800, in <module>\n'
             "[rank1]: Traceback (most recent call last):\n"
             '[rank1]:   File "/opt/verl/verl/trainer/fsdp_sft_trainer.py", line 800, in <module>\n'
             "[rank0]:     main()\n"
             "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
             '[rank0]:   File "/opt/torch/distributed/distributed_c10d.py", line 2288, in all_reduce\n'
             "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970\n")
    assert told(crash) == ["nccl"]


def test_the_lines_skipped_inside_a_traceback_are_bounded():
    """Past MAX_INTERLEAVED lines of others, the traceback is given up: an exception line much later
    is not taken for its end."""
    head, frame = UNCAUGHT_HEAD, '  File "/opt/torch/cuda/memory.py", line 10, in empty_cache\n'
    assert told(head + frame + (BAR + "\n") * MAX_INTERLEAVED + OOM) == ["cuda_oom"]
    assert told(head + frame + (BAR + "\n") * (MAX_INTERLEAVED + 1) + OOM) == []


# --- L3: chained exceptions --------------------------------------------------------------------

DIRECT = "\nThe above exception was the direct cause of the following exception:\n\n"
DURING = "\nDuring handling of the above exception, another exception occurred:\n\n"
INNER_OOM = ("Traceback (most recent call last):\n"
             '  File "/opt/verl/verl/workers/fsdp_workers.py", line 700, in compute_log_prob\n'
             "    output = self.actor.compute_log_prob(data)\n" + OOM)
INNER_VALUE = ("Traceback (most recent call last):\n"
               '  File "/opt/verl/verl/utils/dataset/rl_dataset.py", line 200, in __getitem__\n'
               "    row = self.rows[index]\n"
               "KeyError: 'prompt'\n")
OUTER_RUNTIME = UNCAUGHT_HEAD + "RuntimeError: compute_log_prob failed on rank 3\n"
OUTER_ACTOR_DIED = UNCAUGHT_HEAD + "ray.exceptions.ActorDiedError: The actor died unexpectedly.\n"
OUTER_OOM = UNCAUGHT_OOM


@pytest.mark.parametrize("hydra", [False, True], ids=["uncaught", "hydra"])
@pytest.mark.parametrize("chain", [
    INNER_OOM + DIRECT + OUTER_RUNTIME,  # the OOM first, the wrapper that names nothing last
    INNER_OOM + DIRECT + OUTER_ACTOR_DIED,
    INNER_OOM + DURING + OUTER_RUNTIME,
    INNER_VALUE + DURING + OUTER_OOM,  # the OOM last
    INNER_VALUE + DIRECT + OUTER_OOM,
], ids=["oom-then-runtime", "oom-then-actor-died", "oom-during-runtime", "keyerror-during-oom",
        "keyerror-then-oom"])
def test_a_chained_exception_is_told_by_the_most_specific_kind_it_names(tmp_path, chain, hydra):
    text = HYDRA + chain + HYDRA_END if hydra else chain
    assert told(text)[-1:] == ["cuda_oom"]
    assert fatal_after(tmp_path, CONFIG_PRINT + STEP.format(step=1), text) == [[None], [("cuda_oom", 1)]]


def test_the_oom_inside_an_actor_died_error_is_its_kind():
    """Ray prints the traceback of an actor's failed creation inside its ``ActorDiedError``."""
    crash = (HYDRA + "Traceback (most recent call last):\n"
             '  File "/opt/verl/verl/trainer/main_ppo.py", line 40, in main\n'
             "    run_ppo(config)\n"
             "ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=525973, ip=10.0.0.1)\n"
             '  File "/opt/verl/verl/trainer/main_ppo.py", line 200, in run\n'
             "    trainer.init_workers()\n"
             "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
             "ray::WorkerDict.__init__() (pid=529263, ip=10.0.0.1)\n"
             '  File "/opt/verl/verl/workers/fsdp_workers.py", line 120, in __init__\n'
             "    self.model = build(config)\n" + OOM + HYDRA_END)
    assert told(crash)[-1:] == ["cuda_oom"]


def test_guard_a_chain_that_names_one_kind_keeps_it_and_a_user_stop_is_none():
    assert told(INNER_VALUE + DIRECT + OUTER_RUNTIME) == ["exception"]
    stopped = UNCAUGHT_HEAD + "KeyboardInterrupt\n"
    assert told(INNER_OOM + DURING + stopped) == []
