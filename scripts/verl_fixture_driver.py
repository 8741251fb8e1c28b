"""Run one verl release's own PPO trainer loop on stand-in workers and record what it logged.

Run inside a release's environment by scripts/verl_fixtures.py (never by the test suite):

    python verl_fixture_driver.py --release 0.9.1 --run grpo --out DIR

Everything that decides what verl logs is the installed release's own code: its
`ppo_trainer.yaml` composed by hydra, `RayPPOTrainer.__init__` (dataloaders, "Total training
steps"), `RayPPOTrainer.fit()` (tqdm bar, timers, KL penalty, advantages, `reduce_metrics`,
`_validate` with `process_validation_metrics`, `compute_data_metrics`,
`compute_timing_metrics`, `compute_throughout_metrics`, "Final validation metrics") and
`Tracking` with the console (and, where the release has it, file) backend, all inside a Ray
actor named like the release's driver. Only the GPU side is stood in for: the worker groups
return real torch tensors (responses, log-probs, values) and, for updates, per-micro-batch
metric dicts with the keys that release's actor and critic log, folded by the release's
`append_to_dict`. Heavy imports the logging path never uses are stubbed (verl_fixture_stubs.py).

The console goes to stdout/stderr (the caller captures it); DIR gets metrics.jsonl (FileLogger),
logged.json (the dicts handed to Tracking.log) and keys.txt.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

from verl_fixture_metrics import reward_fn_for
from verl_fixture_stubs import Quiet, install_bert_padding, install_stubs, release_tuple
from verl_fixture_workers import (
    DATA_SOURCES,
    GRPO_N,
    N_GPUS,
    STEPS,
    TEST_FREQ,
    TRAIN_BATCH,
    VAL_N,
    VAL_PER_SOURCE,
    FakeTokenizer,
    FakeWorkerGroup,
    PromptDataset,
    Workers,
    collate,
    loader_class,
    random_sampler,
)


def plain(value):
    """A logged value as JSON: numpy/torch scalars as numbers, non-finite as strings."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return repr(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, (int, str)) or value is None:
        return value
    return repr(value)


# ----------------------------------------------------------------------------------- config


def config_overrides(release, run):
    """Hydra overrides of the release's ppo_trainer.yaml for one run."""
    rel = release_tuple(release)
    has_file_logger = rel >= (0, 6)
    loggers = "['console','file']" if has_file_logger else "['console']"
    grpo = run in ("grpo", "agent")
    o = [
        "data.train_files=/data/gsm8k/train.parquet",
        "data.val_files=/data/gsm8k/test.parquet",
        f"data.train_batch_size={TRAIN_BATCH}",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        f"actor_rollout_ref.rollout.n={GRPO_N if grpo else 1}",
        "trainer.project_name=verl_fixtures",
        f"trainer.experiment_name={run}-{release}",
        f"trainer.logger={loggers}",
        f"trainer.n_gpus_per_node={N_GPUS}",
        "trainer.nnodes=1",
        f"trainer.test_freq={TEST_FREQ}",
        f"trainer.save_freq={TEST_FREQ}",
        f"trainer.total_training_steps={STEPS}",
        "trainer.total_epochs=1",
        "trainer.resume_mode=disable",
    ]
    o.append(f"actor_rollout_ref.rollout.val_kwargs.n={VAL_N}")
    o.append("actor_rollout_ref.rollout.val_kwargs.do_sample=True")
    if rel >= (0, 5):
        o.append("data.dataloader_num_workers=0")
    if rel >= (0, 9):
        o.append("trainer.use_v1=False")
    if grpo:
        o += [
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.kl_loss_coef=0.001",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        ]
    else:
        o += [
            "algorithm.adv_estimator=gae",
            "critic.model.path=Qwen/Qwen2.5-0.5B-Instruct",
            "critic.ppo_micro_batch_size_per_gpu=2",
        ]
        if rel >= (0, 4):
            o.append("algorithm.use_kl_in_reward=True")
    if run == "agent":
        o += ["actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.enable=True"]
        if rel >= (0, 6):
            o.append("actor_rollout_ref.rollout.agent.num_workers=8")
    return [x for x in o if x]


def compose_config(release, run):
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=config_overrides(release, run))


# ------------------------------------------------------------------------------ the run


class Recorder:
    """Wraps Tracking.log (ground truth) and FileLogger.log (keeps going past its errors)."""

    def __init__(self):
        self.steps = []
        self.file_steps = []
        self.file_errors = []
        self.types = []

    def install(self, tracking_module):
        recorder = self
        tracking_cls = tracking_module.Tracking
        original = tracking_cls.log

        def log(self, data, step, *args, **kwargs):
            recorder.steps.append({"step": int(step), "data": {k: plain(v) for k, v in data.items()}})
            recorder.types.append({k: type(v).__module__ + "." + type(v).__name__ for k, v in data.items()})
            return original(self, data, step, *args, **kwargs)

        tracking_cls.log = log
        file_logger = getattr(tracking_module, "FileLogger", None)
        if file_logger is not None:
            file_original = file_logger.log

            def file_log(self, data, step):
                try:
                    file_original(self, data, step)
                    recorder.file_steps.append(int(step))
                except Exception as exc:  # what the release's own json code raised
                    recorder.file_errors.append({"step": int(step), "error": f"{type(exc).__name__}: {exc}"})
                finally:
                    if hasattr(self, "fp"):
                        self.fp.flush()

            file_logger.log = file_log


def build_trainer(release, run, config, workers):
    import inspect

    import verl.trainer.ppo.ray_trainer as rt

    rt.StatefulDataLoader = loader_class()
    Role = rt.Role
    use_critic = run == "ppo"
    mapping = {Role.ActorRollout: object}
    if use_critic:
        mapping[Role.Critic] = object
    mapping[Role.RefPolicy] = object

    class PoolManager:
        resource_pool_dict = {}

        def get_n_gpus(self):
            return N_GPUS

    max_prompt = int(config.data.max_prompt_length)
    raw = workers.rel >= (0, 7)
    train = PromptDataset(TRAIN_BATCH * STEPS, max_prompt, seed=1, sources=DATA_SOURCES[:1], raw=raw)
    val = PromptDataset(VAL_PER_SOURCE * len(DATA_SOURCES), max_prompt, seed=2, sources=DATA_SOURCES, raw=raw)
    # Releases that build their datasets themselves get these through their module globals.
    rt.RLHFDataset = lambda *a, **k: val if "test" in str(k.get("parquet_files", k.get("data_files", ""))) else train
    rt.collate_fn = collate
    kwargs = dict(
        config=config,
        tokenizer=FakeTokenizer(),
        role_worker_mapping=mapping,
        resource_pool_manager=PoolManager(),
        ray_worker_group_cls=object,
        reward_fn=reward_fn_for(workers),
        val_reward_fn=reward_fn_for(workers),
        train_dataset=train,
        val_dataset=val,
        collate_fn=collate,
        train_sampler=random_sampler(train),
        processor=None,
    )
    accepted = inspect.signature(rt.RayPPOTrainer.__init__).parameters
    trainer = rt.RayPPOTrainer(**{k: v for k, v in kwargs.items() if k in accepted})
    if "train_sampler" in accepted and trainer.train_dataloader is not None:
        pass
    trainer.actor_rollout_wg = FakeWorkerGroup(workers, "actor_rollout")
    trainer.ref_policy_wg = FakeWorkerGroup(workers, "ref")
    if use_critic:
        trainer.critic_wg = FakeWorkerGroup(workers, "critic")
    trainer.async_rollout_mode = workers.agent_loop
    if workers.agent_loop:
        trainer.async_rollout_manager = FakeWorkerGroup(workers, "agent_loop")
    # Managers that init_workers() would create in 0.7+; unknown calls on them are no-ops.
    for name in ("checkpoint_manager", "reward_loop_manager", "llm_server_manager"):
        if getattr(trainer, name, None) is None:
            setattr(trainer, name, FakeWorkerGroup(workers, name))
    return trainer


def track_steps(trainer, workers):
    """Tell the stand-in workers which step the trainer is on (they shape values by it)."""
    original_validate = trainer._validate

    def validate(*a, **k):
        workers.validating = True
        try:
            return original_validate(*a, **k)
        finally:
            workers.validating = False

    trainer._validate = validate
    original_gen = trainer.actor_rollout_wg.generate_sequences

    def gen(prompts):
        if not workers.validating:
            workers.step = int(getattr(trainer, "global_steps", 0))
        return original_gen(prompts)

    trainer.actor_rollout_wg.generate_sequences = gen
    if getattr(trainer, "async_rollout_manager", None) is not None:
        trainer.async_rollout_manager.generate_sequences = gen


def run_in_actor(release, run, config):
    """The body of TaskRunner.run: what the release's main_ppo does, then fit()."""
    install_stubs(release)
    if release_tuple(release)[:2] == (0, 8):
        install_bert_padding()
    from pprint import pprint

    from omegaconf import OmegaConf

    with Quiet():
        import verl.trainer.ppo.ray_trainer  # noqa: F401
        import verl.utils.tracking as tracking

        if run == "agent" or release_tuple(release) >= (0, 7):
            import verl.experimental.agent_loop.agent_loop  # noqa: F401
    if release_tuple(release) >= (0, 4):  # the line main_ppo's TaskRunner.run starts with
        import socket

        print(f"TaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}")
    pprint(OmegaConf.to_container(config, resolve=True))
    OmegaConf.resolve(config)
    recorder = Recorder()
    recorder.install(tracking)
    workers = Workers(release, run, config)
    trainer = build_trainer(release, run, config, workers)
    track_steps(trainer, workers)
    error = None
    try:
        trainer.fit()
    except Exception as exc:
        import traceback

        traceback.print_exc()
        error = f"{type(exc).__name__}: {exc}"
    sys.stdout.flush()
    sys.stderr.flush()
    logged = {
        "release": release,
        "project": str(config.trainer.project_name),
        "experiment": str(config.trainer.experiment_name),
        "total_steps": int(trainer.total_training_steps),
        "steps": recorder.steps,
        "jsonl_steps": recorder.file_steps,
    }
    types = {}
    for step_types in recorder.types:
        for key, name in step_types.items():
            if name != "builtins.float":
                types.setdefault(key, name)
    logged["value_types"] = dict(sorted(types.items()))
    if recorder.file_errors:
        logged["file_logger_errors"] = recorder.file_errors
    if error:
        logged["error"] = error
    return logged


def dump_logged(logged):
    """logged.json with one step per line: small and easy to diff."""
    head = {k: v for k, v in logged.items() if k != "steps"}
    lines = ["{"]
    for k, v in head.items():
        lines.append(f" {json.dumps(k)}: {json.dumps(v)},")
    lines.append(' "steps": [')
    steps = [" " + json.dumps(s) for s in logged["steps"]]
    lines.append(",\n".join(steps))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


class TaskRunner:
    """Named like verl's driver actor, so Ray prefixes its lines with (TaskRunner pid=N).

    Started by the release's own main_ppo.run_ppo, which calls run(config); which release and
    run it is, and where the result goes, come through the environment Ray's workers inherit.
    """

    def run(self, config):
        env = os.environ
        logged = run_in_actor(env["VERL_FIXTURE_RELEASE"], env["VERL_FIXTURE_RUN"], config)
        with open(env["VERL_FIXTURE_RESULT"], "w") as f:
            json.dump(logged, f)


def start(release, config):
    """The release's main_ppo.run_ppo (ray.init with its runtime env, TaskRunner, ray.get)."""
    import inspect

    import ray

    with Quiet():
        import verl.trainer.main_ppo as main_ppo
    runner_class = ray.remote(num_cpus=1)(TaskRunner)
    if "task_runner_class" in inspect.signature(main_ppo.run_ppo).parameters:
        main_ppo.run_ppo(config, task_runner_class=runner_class)
    else:  # before 0.6 run_ppo starts the module's own TaskRunner
        main_ppo.TaskRunner = runner_class
        main_ppo.run_ppo(config)
    time.sleep(3)  # let Ray forward the actor's last lines before the driver exits
    ray.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--run", required=True, choices=["ppo", "grpo", "agent"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # FileLogger writes <root>/<project>/<experiment>.jsonl; copied to DIR/metrics.jsonl after.
    os.environ.pop("VERL_FILE_LOGGER_PATH", None)
    os.environ["VERL_FILE_LOGGER_ROOT"] = os.path.abspath("logs")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    # Ray's workers import this script's sibling modules by name.
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + [here])
    install_stubs(args.release)
    result_path = os.path.abspath("result.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    os.environ.update(VERL_FIXTURE_RELEASE=args.release, VERL_FIXTURE_RUN=args.run,
                      VERL_FIXTURE_RESULT=result_path)
    config = compose_config(args.release, args.run)
    start(args.release, config)
    if not os.path.exists(result_path):
        print(f"verl {args.release} {args.run}: the TaskRunner wrote no result", file=sys.stderr)
        return 1
    with open(result_path) as f:
        logged = json.load(f)
    return write_outputs(args, config, logged)


def write_outputs(args, config, logged: dict) -> int:
    """Write a run's fixture files into ``args.out``: what Tracking logged (logged.json), the
    FileLogger's JSONL as verl wrote it (metrics.jsonl) and the keys logged (keys.txt); 1 where the
    trainer's fit() failed."""
    with open(os.path.join(args.out, "logged.json"), "w") as f:
        f.write(dump_logged(logged))
    jsonl = os.path.join("logs", str(config.trainer.project_name), f"{config.trainer.experiment_name}.jsonl")
    if os.path.exists(jsonl):
        shutil.copyfile(jsonl, os.path.join(args.out, "metrics.jsonl"))
    keys = sorted({k for s in logged["steps"] for k in s["data"]})
    with open(os.path.join(args.out, "keys.txt"), "w") as f:
        f.write("".join(k + "\n" for k in keys))
    if logged.get("error"):
        print(f"verl {args.release} {args.run}: fit() failed: {logged['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
