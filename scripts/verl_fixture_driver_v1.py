"""Run verl 0.9's V1 trainer (the default, `trainer.use_v1: true`) on stand-in workers.

Run inside the release's environment, with TransferQueue installed, by scripts/verl_fixtures.py:

    python verl_fixture_driver_v1.py --release 0.9.1 --run v1-sync --out DIR

What decides what is logged is verl's own: hydra composes its `ppo_trainer.yaml`;
`main_ppo.run_ppo` starts the Ray actor; in it, what `TaskRunnerV1.run` does (config print,
`tq.init` of a real TransferQueue, `get_trainer_cls(trainer.v1.trainer_mode)`, `init()`,
`fit()`, `Tracking.finish`). The trainer's replay buffer, `MetricsAggregator`, `_compute_metrics`
and `Tracking` (console and FileLogger) run unchanged. Stood in for: the GPU worker groups
(they read and write TransferQueue like the engine workers), the LLM servers and weight sync,
and the agent loop's generation and reward; the agent loop's TransferQueue side is verl's
`AgentLoopWorkerTQ` code (`generate_sequences`, `_run_prompt`, `_agent_loop_postprocess`).

The `v1-sync-resumed` run runs twice with the same experiment name: the first attempt fails at step 5 (after
the step-3 checkpoint), the second resumes (`resume_mode=auto`). DIR gets the console of both,
metrics.first.jsonl (the FileLogger file as the first attempt left it) and metrics.jsonl.

The `v1-colocate_async-evictions` run (EVICTIONS) makes the stand-in rollout fail one prompt group in 4
and stall another one in 4, under `max_off_policy_threshold=2`: the replay buffer evicts failed, stale
and (DAPO) no-signal groups and logs each count.
"""

import argparse
import asyncio
import json
import os
import shutil
import sys
import threading
import time

import verl_fixture_stubs
from verl_fixture_driver import Recorder, config_overrides, write_outputs
from verl_fixture_metrics import actor_metrics
from verl_fixture_stubs import Quiet, install_stubs
from verl_fixture_workers import (
    DATA_SOURCES,
    N_GPUS,
    STEPS,
    TRAIN_BATCH,
    VAL_PER_SOURCE,
    FakeTokenizer,
    PromptDataset,
    Workers,
    collate,
    loader_class,
    random_sampler,
)

MODES = {"v1-sync": "sync", "v1-colocate_async": "colocate_async", "v1-separate_async": "separate_async",
         "v1-sync-resumed": "sync", "v1-colocate_async-evictions": "colocate_async"}
FAIL_AT_STEP = 5  # the first attempt of a resumed run dies here
# Runs whose stand-in rollout fails and stalls: from the prompts submitted at step `from_step` on, one
# group in `every` (by dataset index, so the same prompts at each regeneration) has a session that raises
# (verl's _run_prompt marks the group "failure", ReplayBufferAsync evicts it and refills one prompt), and
# one in `every` takes one of `slow_s` seconds (in turn), so that by the time it finishes the trainer is
# more than `max_off_policy_threshold` versions past the step that submitted it (evicted as too stale).
EVICTIONS = {"v1-colocate_async-evictions": {"from_step": 2, "every": 4, "fail": 0, "slow": 2, "slow_s": (5.0, 15.0),
                                             "max_off_policy_threshold": 2}}


def stubs(release):
    """The usual stubs, but the real TransferQueue: the V1 trainer keeps its data there."""
    verl_fixture_stubs.STUBBED[:] = [name for name in verl_fixture_stubs.STUBBED if name != "transfer_queue"]
    install_stubs(release)


def v1_overrides(release, run, resume):
    """The legacy runs' grpo overrides, on the V1 trainer in the run's mode."""
    o = [x for x in config_overrides(release, "grpo") if x != "trainer.use_v1=False"]
    o = [x.replace("experiment_name=grpo-", f"experiment_name={run}-") for x in o]
    o.append(f"trainer.v1.trainer_mode={MODES[run]}")
    o.append("ray_kwargs.ray_init.num_cpus=16")  # TransferQueue's 9 actors ask for a CPU each
    o.append("actor_rollout_ref.rollout.calculate_log_probs=True")
    if MODES[run] == "colocate_async":  # DAPO's group filter: groups whose acc is all 0 or all 1
        o += ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"]
    if run in EVICTIONS:  # drop what spans more than the threshold's weight versions
        o += [f"trainer.v1.sampler.max_off_policy_threshold={EVICTIONS[run]['max_off_policy_threshold']}",
              "trainer.v1.sampler.max_off_policy_strategy=drop"]
    if MODES[run] == "separate_async":
        o += ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=4",
              "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
              "trainer.v1.separate_async.parameter_sync_step=2",
              "trainer.v1.separate_async.hybrid_rollout.enable_switch=True"]
    if resume:
        o = [x for x in o if x != "trainer.resume_mode=disable"] + ["trainer.resume_mode=auto"]
    return o


def compose_config(release, run, resume):
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=v1_overrides(release, run, resume))


# ------------------------------------------------------------------- stand-ins


class Versions:
    """The rollout's weight version: what update_weights last installed."""

    current = 0


class Replicas:
    """Stand-in for LLMServerManager / CheckpointEngineManager / RewardLoopManager. No-ops."""

    reward_loop_worker_handles = []  # rewards are scored in the agent loop (not colocated)
    rollout_replicas = []
    server_addresses = []
    server_handles = []

    def update_weights(self, global_steps=None, *args, **kwargs):
        if global_steps is not None:
            Versions.current = int(global_steps)
        return {}

    def get_replicas(self):
        return []

    @property
    def global_load_balancer(self):
        """The separate-async trainer's Ray actor that routes requests: calls return at once."""
        import ray

        class Call:
            def remote(self, *args, **kwargs):
                return ray.put({})

        class Balancer:
            add_servers = remove_servers = clear_sticky_cache = Call()

        return Balancer()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


class TQWorkerGroup:
    """Actor/ref worker group: reads inputs from TransferQueue and writes outputs back, as
    verl's engine workers do; returns the KVBatchMeta it was given."""

    def __init__(self, w, fail_at=None):
        self.w = w
        self.fail_at = fail_at
        self._dispatch_info = {}

    def _query_dispatch_info(self, role):
        return list(range(N_GPUS))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None

    def _forward(self, batch, **scales):
        import torch
        import transfer_queue as tq
        from tensordict import TensorDict

        time.sleep(0.01)
        ids = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"])
        ids = ids["input_ids"]
        out = {}
        for name, scale in scales.items():
            values = torch.rand(ids.values().shape, generator=self.w.g) * abs(scale)
            values = -values if scale < 0 else values + (0.2 if name == "entropy" else 0.0)
            out[name] = torch.nested.nested_tensor_from_jagged(values, offsets=ids.offsets())
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict(out, batch_size=len(batch.keys)))
        return batch

    def compute_log_prob(self, batch):
        return self._forward(batch, log_probs=-0.8, entropy=1.2)

    def compute_ref_log_prob(self, batch):
        return self._forward(batch, log_probs=-0.8)

    def update_actor(self, batch):
        time.sleep(0.01)
        if self.fail_at is not None and self.w.step >= self.fail_at:
            raise RuntimeError(f"actor update failed at step {self.w.step} (a lost node, say)")
        return {"metrics": actor_metrics(self.w)}


def agent_loop_worker_class():
    """verl's AgentLoopWorkerTQ (the class under its @ray.remote)."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    return AgentLoopWorkerTQ.__ray_metadata__.modified_class


class RolloutStandIn:
    """What AgentLoopWorkerTQ inherits from AgentLoopWorker and its LLM server: one agent-loop
    output per session (prompt ids, response ids, rollout log-probs, the weight versions it was
    generated with), scored by a rule-based reward. verl's AgentLoopWorkerTQ code puts it into
    TransferQueue."""

    def __init__(self, config, w, run=None):
        cls = agent_loop_worker_class()
        self.config = config
        self.w = w
        self.evictions = EVICTIONS.get(run)
        self.background_tasks = set()
        self.reward_loop_worker_handles = []
        self._generate = cls.generate_sequences
        self._run_prompt_impl = cls._run_prompt
        self._postprocess = cls._agent_loop_postprocess
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    # AgentLoopManagerTQ.generate_sequences: dispatch and return without waiting
    def generate_sequences(self, batch):
        asyncio.run_coroutine_threadsafe(self._generate(self, batch), self.loop).result()

    async def _run_prompt(self, *args, **kwargs):
        return await self._run_prompt_impl(self, *args, **kwargs)

    async def _agent_loop_postprocess(self, output, validate, **kwargs):
        return await self._postprocess(self, output, validate, **kwargs)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

        w = self.w
        start = Versions.current
        # the standalone rollout of separate_async generates while the trainer trains: slow enough
        # here that the trainer waits for it and trajectories span weight updates
        slow = self.config.trainer.v1.trainer_mode == "separate_async" and not trajectory["validate"]
        faulty = self.faulty(trajectory, kwargs)
        if faulty == "slow":
            slow_s = self.evictions["slow_s"]
            await asyncio.sleep(slow_s[int(kwargs["index"]) // self.evictions["every"] % len(slow_s)])
        else:
            await asyncio.sleep(0.5 + 3.0 * float(w.rand(1)) if slow else 0.005)
        if faulty == "fail" and kwargs["session_id"] == 1:
            raise RuntimeError(f"rollout request for prompt {int(kwargs['index'])} session 1 failed: "
                               "the LLM server closed the connection")
        r = w.response_length
        length = int(float(w.rand(1)) * (r - 60) + 60)
        if kwargs["session_id"] == 0 and not trajectory["validate"]:
            length = r  # one clipped response per group
        plen = int(float(w.rand(1)) * 160 + 40)
        prompt_ids = [int(x) for x in (w.rand(plen) * 149000 + 100).long()]
        response_ids = [int(x) for x in (w.rand(length) * 149000 + 100).long()]
        logprobs = [-0.8 * float(x) for x in w.rand(length)]
        output = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[1] * length,
            response_logprobs=logprobs,
            num_turns=2,
            metrics=AgentLoopMetrics(generate_sequences=8.0 + 10 * float(w.rand(1))),
            extra_fields={"min_global_steps": start, "max_global_steps": Versions.current},
        )
        return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)

    def faulty(self, trajectory, kwargs):
        """"fail", "slow" or None: what the evictions runs do to this training prompt's sessions."""
        e = self.evictions
        if e is None or trajectory["validate"] or int(kwargs["global_steps"]) < e["from_step"]:
            return None
        share = int(kwargs["index"]) % e["every"]
        return "fail" if share == e["fail"] else "slow" if share == e["slow"] else None

    async def _compute_score(self, outputs, kwargs):
        final = outputs[-1]
        p = 0.45 + 0.05 * max(self.w.step, 0)
        correct = float(float(self.w.rand(1)) < p)
        final.reward_score = correct
        pred = "A" if correct else ("B" if float(self.w.rand(1)) < 0.5 else "C")
        final.extra_fields["reward_extra_info"] = {"acc": correct, "pred": pred}

    async def _compute_teacher_logprobs(self, *args, **kwargs):
        return None

    def _compute_multi_modal_inputs(self, output, input_ids):
        return {}

    def _compute_position_ids(self, input_ids, attention_mask, *args):
        import torch

        return torch.clamp(torch.cumsum(attention_mask, -1) - 1, min=0)


def setup(trainer, w, fail_at):
    """PPOTrainer._setup without GPUs: verl's dataloaders, dump executor and checkpoint loading;
    stand-in worker groups, servers and weight sync."""
    import verl.trainer.ppo.v1.trainer_base as tb

    max_prompt = int(trainer.config.data.max_prompt_length)
    # three times the prompts the steps need: DAPO's group filter refills what it evicts
    train = PromptDataset(TRAIN_BATCH * STEPS * 3, max_prompt, seed=1, sources=DATA_SOURCES[:1], raw=True)
    val = PromptDataset(VAL_PER_SOURCE * len(DATA_SOURCES), max_prompt, seed=2, sources=DATA_SOURCES, raw=True)
    tb.create_rl_dataset = lambda files, data_config, tok, proc, is_train=True, **k: train if is_train else val
    tb.create_rl_sampler = lambda data_config, dataset: random_sampler(dataset)
    tb.StatefulDataLoader = loader_class()
    tb.collate_fn = collate
    trainer.tokenizer, trainer.processor = FakeTokenizer(), None
    trainer._init_dataloader()
    trainer._init_dump_executor()

    class PoolManager:
        resource_pool_dict = {}

        def get_n_gpus(self):
            return N_GPUS

    trainer.resource_pool_manager = PoolManager()
    trainer.ref_in_actor = False
    trainer.actor_rollout_wg = TQWorkerGroup(w, fail_at)
    trainer.ref_policy_wg = TQWorkerGroup(w)
    trainer.reward_loop_manager = Replicas()
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    trainer.llm_server_manager = Replicas()
    trainer.checkpoint_manager = Replicas()
    if trainer.trainer_mode == "separate_async":
        from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

        trainer.standalone_server_manager = Replicas()
        trainer.standalone_checkpoint_manager = Replicas()
        trainer.current_mode = HybridEngineMode.ROLLOUT
    trainer.checkpoint_manager.sleep_replicas()
    trainer._load_checkpoint()


def track_steps(trainer, w):
    """Tell the stand-ins which step the trainer is on (they shape values by it)."""
    original = trainer.step

    def step(*args, **kwargs):
        w.step = int(trainer.global_steps)
        return original(*args, **kwargs)

    trainer.step = step


def run_in_actor(release, run, config, fail_at):
    """The body of verl's TaskRunnerV1.run, with setup() for PPOTrainer._setup."""
    stubs(release)
    from pprint import pprint

    from omegaconf import OmegaConf

    with Quiet():
        import transfer_queue as tq
        import verl.utils.tracking as tracking
        from verl.trainer.ppo.v1 import get_trainer_cls
        from verl.utils.logging_utils import configure_verl_logging
    configure_verl_logging()
    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)
    config.transfer_queue.enable = True
    pprint(OmegaConf.to_container(config, resolve=True))
    OmegaConf.resolve(config)
    recorder = Recorder()
    recorder.install(tracking)
    w = Workers(release, "grpo", config)  # the grpo run's update metrics, NaN and Inf included
    tq.init(config.transfer_queue)
    trainer = None
    error = None
    succeeded = False
    try:
        trainer = trainer_cls(config=config)
        trainer._setup = lambda: setup(trainer, w, fail_at)
        trainer.init()
        track_steps(trainer, w)
        trainer.fit(RolloutStandIn(config, w, run))
        succeeded = True
    except Exception as exc:  # raised again once the result is written, as TaskRunnerV1 lets it go
        error = exc
    finally:
        try:
            tracker = getattr(trainer, "logger", None)
            if tracker is not None:
                tracker.finish(exit_code=0 if succeeded else 1)
        finally:
            tq.close()
    sys.stdout.flush()
    sys.stderr.flush()
    logged = {
        "release": release,
        "project": str(config.trainer.project_name),
        "experiment": str(config.trainer.experiment_name),
        "trainer": f"v1/{config.trainer.v1.trainer_mode}",
        "total_steps": int(getattr(trainer, "total_training_steps", STEPS)),
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
    if error is not None:
        logged["error"] = f"{type(error).__name__}: {error}"
    return logged, error


class TaskRunner:
    """Named like verl's driver actor, so Ray prefixes its lines with (TaskRunner pid=N)."""

    def run(self, config):
        env = os.environ
        fail_at = int(env["VERL_FIXTURE_FAIL_AT"]) if env.get("VERL_FIXTURE_FAIL_AT") else None
        logged, error = run_in_actor(env["VERL_FIXTURE_RELEASE"], env["VERL_FIXTURE_RUN"], config, fail_at)
        with open(env["VERL_FIXTURE_RESULT"], "w") as f:
            json.dump(logged, f)
        if error is not None:
            raise error


def start(config):
    """verl's main_ppo.run_ppo (ray.init with its runtime env, the TaskRunner, ray.get)."""
    import ray

    with Quiet():
        import verl.trainer.main_ppo as main_ppo
    runner_class = ray.remote(num_cpus=1)(TaskRunner)
    main_ppo.run_ppo(config, task_runner_class=runner_class)
    time.sleep(3)  # let Ray forward the actor's last lines before the driver exits
    ray.shutdown()


def attempt(release, run, resume, fail_at):
    """One `python -m verl.trainer.main_ppo` of the run; returns what it logged."""
    result_path = os.path.abspath("result.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    os.environ.update(VERL_FIXTURE_RELEASE=release, VERL_FIXTURE_RUN=run, VERL_FIXTURE_RESULT=result_path,
                      VERL_FIXTURE_FAIL_AT=str(fail_at or ""))
    config = compose_config(release, run, resume)
    try:
        start(config)
    except Exception:  # the TaskRunner's failure, as `python -m verl.trainer.main_ppo` ends with it
        import traceback

        traceback.print_exc()
        import ray

        time.sleep(3)
        ray.shutdown()
    if not os.path.exists(result_path):
        return None, config
    with open(result_path) as f:
        return json.load(f), config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--run", required=True, choices=sorted(MODES))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    resume = args.run.endswith("-resumed")
    os.makedirs(args.out, exist_ok=True)
    os.environ.pop("VERL_FILE_LOGGER_PATH", None)
    os.environ["VERL_FILE_LOGGER_ROOT"] = os.path.abspath("logs")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # TransferQueue uses 8 torch threads and warns at every put and get on a host with fewer
    # physical cores (a real training node has more): as many as this host has.
    import psutil

    os.environ.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + [here])
    stubs(args.release)
    attempts = []
    if resume:
        first, config = attempt(args.release, args.run, True, FAIL_AT_STEP)
        if first is None:
            print("the first attempt wrote no result", file=sys.stderr)
            return 1
        attempts.append(first)
        jsonl = os.path.join("logs", str(config.trainer.project_name), f"{config.trainer.experiment_name}.jsonl")
        shutil.copyfile(jsonl, os.path.join(args.out, "metrics.first.jsonl"))
    logged, config = attempt(args.release, args.run, resume, None)
    if logged is None:
        print(f"verl {args.release} {args.run}: the TaskRunner wrote no result", file=sys.stderr)
        return 1
    if attempts:
        # steps: every Tracking.log of both attempts, in order; jsonl_steps: what the file holds
        logged["first_attempt"] = {"steps": [s["step"] for s in attempts[0]["steps"]],
                                   "jsonl_steps": attempts[0]["jsonl_steps"],
                                   "error": attempts[0].get("error")}
        logged["resumed_from_step"] = logged["steps"][0]["step"]
        logged["steps"] = attempts[0]["steps"] + logged["steps"]
    return write_outputs(args, config, logged)


if __name__ == "__main__":
    sys.exit(main())
