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
`append_to_dict`. Heavy imports the logging path never uses are stubbed (STUBBED below).

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

# Top-level packages that verl imports but the logging path does not use. They are replaced by
# empty modules whose attributes are inert classes (and `is_*` functions that return False).
STUBBED = [
    "transformers", "vllm", "sglang", "liger_kernel", "megatron", "peft",
    "accelerate", "datasets", "torchdata", "wandb", "pylatexenc", "PIL", "transfer_queue",
    "uvicorn", "fastapi", "starlette", "openai", "aiohttp", "regex",
]
# flash_attn too, before 0.8: those releases import it unconditionally. 0.8+ fall back to torch
# code for unpad_input and friends when it is missing, and need that fallback here.
STUBBED_BEFORE_0_8 = ["flash_attn"]

STEPS = 6
TEST_FREQ = 3
N_GPUS = 8
TRAIN_BATCH = 8  # prompts per step
VAL_PER_SOURCE = 4  # prompts per validation data source
VAL_N = 4  # samples per validation prompt
GRPO_N = 4
DATA_SOURCES = ["openai/gsm8k", "lighteval/MATH"]
NONFINITE = {"grpo": {4: float("nan"), 5: float("inf")}}  # run -> step -> actor/grad_norm


def install_stubs(release):
    """Make imports of STUBBED packages succeed with inert modules (idempotent)."""
    import importlib.abc
    import importlib.machinery
    import types

    if any(getattr(f, "_verl_fixture_stub", False) for f in sys.meta_path):
        return
    stubbed = set(STUBBED) | (set(STUBBED_BEFORE_0_8) if release_tuple(release) < (0, 8) else set())

    class _Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Meta(name, (_Stub,), {})

    class _Stub(metaclass=_Meta):
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            return _Stub()

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Stub()

        def __bool__(self):
            return False

        def __iter__(self):
            return iter(())

    class _Module(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = (lambda *a, **k: False) if name.startswith("is_") else _Meta(name, (_Stub,), {})
            setattr(self, name, value)
            return value

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        _verl_fixture_stub = True

        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in stubbed:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = _Module(spec.name)
            module.__path__ = []
            module.__version__ = "0.0.0"
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())


def install_bert_padding():
    """flash_attn.bert_padding in plain torch, for 0.8 (which imports it with no fallback).

    The padding helpers only move tokens between padded (batch, seqlen, ...) and packed
    (total_tokens, ...) layouts; written here from their documented behaviour.
    """
    import types

    import torch

    def index_first_axis(tensor, indices):
        return tensor.reshape(-1, *tensor.shape[2:])[indices] if tensor.dim() > 2 else tensor.reshape(-1)[indices]

    def unpad_input(hidden_states, attention_mask, unused_mask=None):
        seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
        indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
        cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
        flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
        return flat[indices], indices, cu_seqlens, int(seqlens.max()), seqlens

    def pad_input(hidden_states, indices, batch, seqlen):
        out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], dtype=hidden_states.dtype)
        out[indices] = hidden_states
        return out.reshape(batch, seqlen, *hidden_states.shape[1:])

    def rearrange(tensor, pattern, **sizes):
        raise NotImplementedError(f"rearrange({pattern!r}) is not needed by the logging path")

    package = types.ModuleType("flash_attn")
    package.__path__ = []
    module = types.ModuleType("flash_attn.bert_padding")
    module.index_first_axis, module.unpad_input = index_first_axis, unpad_input
    module.pad_input, module.rearrange = pad_input, rearrange
    package.bert_padding = module
    sys.modules["flash_attn"], sys.modules["flash_attn.bert_padding"] = package, module


class _Quiet:
    """Silence file descriptors 1 and 2 (import-time warnings about stubbed engines)."""

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        os.close(self.saved[0])
        os.close(self.saved[1])
        return False


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


def release_tuple(release):
    return tuple(int(p) for p in release.split(".")[:3] if p.isdigit())


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
        "trainer.save_freq=-1",
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
    from hydra import compose, initialize_config_dir

    import verl

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=config_overrides(release, run))


# ----------------------------------------------------------------------- stand-in workers


class FakeTokenizer:
    eos_token_id = 151645
    pad_token_id = 151643
    padding_side = "left"

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in list(ids)[:8])

    def batch_decode(self, batch, skip_special_tokens=True):
        return [self.decode(ids) for ids in batch]


class PromptDataset:
    """Items shaped like RLHFDataset's: left-padded prompt tensors plus reward metadata."""

    truncation = "error"

    def __init__(self, size, max_prompt_length, seed, sources, raw=False):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(size):
            length = int(torch.randint(40, min(200, max_prompt_length), (1,), generator=g))
            ids = torch.full((max_prompt_length,), FakeTokenizer.pad_token_id, dtype=torch.long)
            ids[-length:] = torch.randint(100, 150000, (length,), generator=g)
            mask = torch.zeros(max_prompt_length, dtype=torch.long)
            mask[-length:] = 1
            pos = torch.clamp(torch.cumsum(mask, 0) - 1, min=0)
            source = sources[i % len(sources)]
            meta = {
                "data_source": source,
                "reward_model": {"style": "rule", "ground_truth": str(i % 97)},
                "extra_info": {"split": "train", "index": i},
                "index": i,
            }
            if raw:  # 0.7+: the agent loop tokenizes; one dummy tensor keeps DataProto.batch
                question = f"Question {i}: what is {i} + {i % 7}? Let's think step by step."
                meta.update(raw_prompt=[{"role": "user", "content": question}],
                            dummy_tensor=torch.tensor([0], dtype=torch.uint8),
                            tools_kwargs={}, interaction_kwargs={})
                self.items.append(meta)
                continue
            self.items.append(
                {
                    "input_ids": ids,
                    "attention_mask": mask,
                    "position_ids": pos,
                    "raw_prompt_ids": ids[-length:].tolist(),
                    **meta,
                }
            )

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def loader_class():
    """A StatefulDataLoader stand-in: torch's DataLoader in-process, with a no-op state."""
    import torch.utils.data

    class Loader(torch.utils.data.DataLoader):
        def __init__(self, *args, **kwargs):
            kwargs["num_workers"] = 0
            super().__init__(*args, **kwargs)

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    return Loader


def random_sampler(dataset):
    """What verl's create_rl_sampler builds with data.shuffle=True and seed 1."""
    import torch.utils.data

    return torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(1))


def collate(items):
    """Stack tensors, keep the rest as object arrays (what verl's rl_dataset.collate_fn does)."""
    import numpy as np
    import torch

    out = {}
    for key in items[0]:
        values = [item[key] for item in items]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            out[key] = arr
    return out


class Workers:
    """State shared by the stand-in worker groups of one run: step counter, random source."""

    def __init__(self, release, run, config):
        import torch

        self.release, self.run, self.config = release, run, config
        self.rel = release_tuple(release)
        self.g = torch.Generator().manual_seed(1234)
        self.step = 0  # trainer step being computed (1-based once training starts)
        self.validating = False
        self.response_length = int(config.data.max_response_length)
        # 0.7+ always roll out through the agent loop (single-turn unless the run is "agent")
        self.agent_loop = run == "agent" or self.rel >= (0, 7)

    def tokenize(self, b):
        """Left-padded prompt ids and mask for b prompts (what the agent loop's tokenizer makes)."""
        import torch

        p = int(self.config.data.max_prompt_length)
        lengths = (self.rand(b) * 160 + 40).long()
        mask = (torch.arange(p)[None, :] >= (p - lengths)[:, None]).long()
        ids = torch.randint(100, 150000, (b, p), generator=self.g)
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, FakeTokenizer.pad_token_id))
        return ids, mask

    def rand(self, *shape):
        import torch

        return torch.rand(*shape, generator=self.g)

    def mfu(self):
        return 0.31 + 0.02 * float(self.rand(1))

    def micro(self, center, spread, count=4):
        """Per-micro-batch values around center, as a worker appends them."""
        return [center + spread * (float(self.rand(1)) - 0.5) for _ in range(count)]


class FakeWorkerGroup:
    """One stand-in worker group (actor/rollout, critic, ref). Unknown calls are no-ops."""

    def __init__(self, workers, role):
        self.w = workers
        self.role = role
        self.world_size = N_GPUS
        self.calls = {}
        self._dispatch_info = {}

    def _query_dispatch_info(self, role):
        return list(range(N_GPUS))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def noop(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return None

        return noop

    # --- rollout
    def generate_sequences(self, prompts):
        import numpy as np
        import torch

        from verl import DataProto

        w = self.w
        time.sleep(0.02)
        if prompts.batch is not None and "input_ids" in prompts.batch.keys():
            input_ids = prompts.batch["input_ids"]
            attn = prompts.batch["attention_mask"]
        else:  # 0.8+: the agent loop tokenizes raw prompts itself
            input_ids, attn = w.tokenize(len(prompts))
        b = input_ids.shape[0]
        r = w.response_length
        lengths = (w.rand(b) * (r - 60) + 60).long()
        lengths[0] = r  # one clipped response per batch
        n = int(w.config.actor_rollout_ref.rollout.n)
        if w.rel < (0, 5) and not w.validating and n > 1:
            # before 0.5 the rollout itself samples n responses per prompt
            prompts = prompts.repeat(repeat_times=n, interleave=True)
            input_ids, attn = prompts.batch["input_ids"], prompts.batch["attention_mask"]
            b = input_ids.shape[0]
            lengths = (w.rand(b) * (r - 60) + 60).long()
            lengths[0] = r
        if w.run == "agent" and not w.validating and b > 2:
            lengths[-1] = 0  # one aborted agent sample
        responses = torch.randint(100, 150000, (b, r), generator=w.g)
        resp_mask = (torch.arange(r)[None, :] < lengths[:, None]).long()
        responses = torch.where(resp_mask.bool(), responses, torch.full_like(responses, FakeTokenizer.pad_token_id))
        full_mask = torch.cat([attn, resp_mask], dim=1)
        pos = torch.clamp(torch.cumsum(full_mask, 1) - 1, min=0)
        batch = {
            "prompts": input_ids,
            "responses": responses,
            "input_ids": torch.cat([input_ids, responses], dim=1),
            "attention_mask": full_mask,
            "position_ids": pos,
        }
        non_tensor = {}
        meta = {}
        if w.agent_loop:
            batch["response_mask"] = resp_mask
            if w.run == "agent":
                turns = (w.rand(b) * 4).long().numpy().astype(np.int32) + 2
            else:  # the single-turn agent loop: prompt and answer
                turns = np.full(b, 2, dtype=np.int32)
            if w.rel >= (0, 6):
                mm = np.empty(b, dtype=object)
                mm[:] = [{} for _ in range(b)]
                non_tensor["multi_modal_inputs"] = mm
            non_tensor["__num_turns__"] = turns
            if w.rel >= (0, 9) and w.run == "agent":
                # read by 0.9's compute_data_metrics from an agent's extra fields
                non_tensor["tool_call_counts"] = (turns // 2).astype(np.int32)
        out = DataProto.from_dict(tensors=batch, non_tensors=non_tensor or None, meta_info=meta)
        if w.rel >= (0, 8):  # the agent loop's reward loop scores each sample as it finishes
            result = reward_fn_for(w)(out, return_dict=True)
            out.batch["rm_scores"] = result["reward_tensor"]
            for key, values in result["reward_extra_info"].items():
                out.non_tensor_batch[key] = np.array(values)
            out.meta_info["reward_extra_keys"] = list(result["reward_extra_info"])
        out.meta_info["timing"] = self._gen_timing(out, b)
        return out

    def _gen_timing(self, out, b):
        w = self.w
        if w.agent_loop:
            return agent_loop_timing(w, out, b)
        return {
            "generate_sequences": 20.0 + 5 * float(w.rand(1)),
            "generation_timing/max": 21.0 + float(w.rand(1)),
            "generation_timing/min": 18.0 + float(w.rand(1)),
            "generation_timing/topk_ratio": 0.9 + 0.1 * float(w.rand(1)),
        }

    # --- forward passes
    def compute_log_prob(self, data):
        import torch

        from verl import DataProto

        time.sleep(0.01)
        if not isinstance(data, DataProto):  # 0.8+ engine workers: no-padding TensorDicts
            return self._engine_out(data, log_probs=-0.8, entropy=1.2, metrics={"mfu": self.w.mfu()})
        shape = data.batch["responses"].shape
        tensors = {
            "old_log_probs": -self.w.rand(*shape) * 0.8,
            "entropys": self.w.rand(*shape) * 1.2 + 0.2,
        }
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})

    def compute_ref_log_prob(self, data):
        from verl import DataProto

        time.sleep(0.01)
        if not isinstance(data, DataProto):
            return self._engine_out(data, log_probs=-0.8)
        old = data.batch["old_log_probs"]
        return DataProto.from_dict(tensors={"ref_log_prob": old - 0.002 * self.w.rand(*old.shape)})

    def compute_values(self, data):
        from verl import DataProto

        time.sleep(0.01)
        shape = data.batch["responses"].shape
        return DataProto.from_dict(tensors={"values": self.w.rand(*shape) * 0.6 - 0.1})

    def infer_batch(self, data):
        """0.8+ critic forward: values, as a future."""
        time.sleep(0.01)
        return _Ready(self._engine_out(data, values=0.6))

    def train_mini_batch(self, data):
        """0.8+ critic update: its metrics, as a future."""
        time.sleep(0.01)
        return _Ready(self._engine_out(data, metrics=critic_metrics(self.w)))

    def _engine_out(self, data, metrics=None, **scales):
        """A TensorDict of nested tensors laid out like data["input_ids"] (what engines return)."""
        import torch

        import verl.utils.tensordict_utils as tu

        ids = data["input_ids"]
        tensors = {}
        for name, scale in scales.items():
            values = torch.rand(ids.values().shape, generator=self.w.g) * abs(scale)
            values = -values if scale < 0 else values
            tensors[name] = torch.nested.nested_tensor_from_jagged(values, offsets=ids.offsets())
        return tu.get_tensordict(tensor_dict=tensors, non_tensor_dict={"metrics": metrics} if metrics else None)

    # --- updates
    def update_critic(self, data):
        from verl import DataProto

        time.sleep(0.01)
        return DataProto(meta_info={"metrics": critic_metrics(self.w)})

    def update_actor(self, data):
        from verl import DataProto

        time.sleep(0.01)
        if not isinstance(data, DataProto):
            return self._engine_out(data, metrics=actor_metrics(self.w))
        return DataProto(meta_info={"metrics": actor_metrics(self.w)})


class _Ready:
    """A finished future (what worker groups return for non-blocking calls)."""

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def agent_loop_timing(w, out, b):
    """The agent-loop timing dict, computed by the release's AgentLoopManager._performance_metrics."""
    import inspect

    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    class PerSample(dict):
        def __missing__(self, key):
            return 0.0

    samples = []
    for i in range(b):
        s = PerSample(
            generate_sequences=8.0 + 10 * float(w.rand(1)),
            tool_calls=1.5 * float(w.rand(1)) if w.run == "agent" else 0.0,
            compute_score=0.05 + 0.05 * float(w.rand(1)),
            num_preempted=int(float(w.rand(1)) < 0.2),
        )
        samples.append(s)
    metrics = [samples[: b // 2], samples[b // 2 :]]
    fn = AgentLoopManager._performance_metrics
    params = list(inspect.signature(fn).parameters)
    return fn(None, metrics, out) if params[0] == "self" else fn(metrics, out)


def actor_metrics(w):
    """Per-micro-batch actor metrics as that release's dp_actor/fsdp_workers log them."""
    from verl.utils.py_functional import append_to_dict

    step = max(w.step, 1)
    grpo = w.run in ("grpo", "agent")
    metrics = {}
    for _ in range(4):
        micro = {}
        if w.rel < (0, 6):
            micro["actor/entropy_loss"] = 0.9 - 0.03 * step + 0.02 * float(w.rand(1))
        micro["actor/pg_loss"] = (-0.02 if grpo else 0.05) + 0.04 * (float(w.rand(1)) - 0.5)
        micro["actor/pg_clipfrac"] = (0.0 if grpo else 0.002 + 0.004 * float(w.rand(1)))
        micro["actor/ppo_kl"] = (-8e-06 + 2e-06 * (float(w.rand(1)) - 0.5)) if grpo else 1e-4 * float(w.rand(1))
        if w.rel >= (0, 4):
            micro["actor/pg_clipfrac_lower"] = 0.0
        if grpo:
            micro["actor/kl_loss"] = 0.0005 * step + 0.0002 * float(w.rand(1))
            micro["actor/kl_coef"] = 0.001
        append_to_dict(metrics, micro)
    grad_norm = 0.3 + 0.1 * float(w.rand(1))
    grad_norm = NONFINITE.get(w.run, {}).get(w.step, grad_norm)
    append_to_dict(metrics, {"actor/grad_norm": grad_norm})
    if w.rel >= (0, 8):
        # 0.8+ engine workers return unprefixed loss/grad_norm/lr/perf/mfu; the trainer's
        # rename_dict adds "actor/" and turns actor/mfu into perf/mfu/actor.
        out = {k: v for k, v in metrics.items() if k != "actor/grad_norm"}
        out["loss"] = sum(metrics["actor/pg_loss"]) / 4
        out["grad_norm"] = metrics["actor/grad_norm"][0]
        out["lr"] = 1e-06
        out["perf/max_memory_allocated_gb"] = 41.2 + 0.3 * float(w.rand(1))
        out["perf/max_memory_reserved_gb"] = 58.5 + 0.2 * float(w.rand(1))
        out["perf/cpu_memory_used_gb"] = 212.0 + 2 * float(w.rand(1))
        out["mfu"] = w.mfu()
        return out
    metrics["perf/mfu/actor"] = 0.31 + 0.02 * float(w.rand(1))
    metrics["perf/max_memory_allocated_gb"] = 41.2 + 0.3 * float(w.rand(1))
    metrics["perf/max_memory_reserved_gb"] = 58.5 + 0.2 * float(w.rand(1))
    metrics["perf/cpu_memory_used_gb"] = 212.0 + 2 * float(w.rand(1))
    metrics["actor/lr"] = 1e-06
    return metrics


def critic_metrics(w):
    """Per-micro-batch critic metrics as that release's dp_critic/fsdp_workers log them."""
    from verl.utils.py_functional import append_to_dict

    step = max(w.step, 1)
    metrics = {}
    for _ in range(4):
        append_to_dict(
            metrics,
            {
                "critic/vf_loss": 0.4 / step + 0.05 * float(w.rand(1)),
                "critic/vf_clipfrac": 0.1 * float(w.rand(1)),
                "critic/vpred_mean": 0.1 * step + 0.05 * float(w.rand(1)),
            },
        )
    append_to_dict(metrics, {"critic/grad_norm": 2.0 + float(w.rand(1))})
    if w.rel >= (0, 8):
        out = {k: v for k, v in metrics.items() if k != "critic/grad_norm"}
        out["loss"] = sum(metrics["critic/vf_loss"]) / 4
        out["grad_norm"] = metrics["critic/grad_norm"][0]
        out["lr"] = 1e-05
        out["perf/max_memory_allocated_gb"] = 30.1 + 0.3 * float(w.rand(1))
        out["perf/max_memory_reserved_gb"] = 44.0 + 0.2 * float(w.rand(1))
        out["perf/cpu_memory_used_gb"] = 212.0 + 2 * float(w.rand(1))
        out["mfu"] = 0.28 + 0.02 * float(w.rand(1))
        return out
    metrics["perf/mfu/critic"] = 0.28 + 0.02 * float(w.rand(1))
    metrics["critic/lr"] = 1e-05
    return metrics


def reward_fn_for(w):
    """A rule-based reward: 1.0 at the last response token for correct answers, plus `acc`."""
    import torch

    def reward_fn(data, return_dict=False):
        responses = data.batch["responses"]
        b, r = responses.shape
        if "response_mask" in data.batch.keys():
            mask = data.batch["response_mask"]
        else:
            mask = data.batch["attention_mask"][:, -r:]
        lengths = mask.sum(-1).long()
        p = 0.45 + 0.05 * max(w.step, 0)
        correct = (w.rand(b) < p).float()
        reward = torch.zeros(b, r)
        idx = torch.clamp(lengths - 1, min=0)
        reward[torch.arange(b), idx] = correct
        if not return_dict:
            return reward
        return {"reward_tensor": reward, "reward_extra_info": {"acc": correct.tolist()}}

    return reward_fn


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

    with _Quiet():
        import verl.trainer.ppo.ray_trainer  # noqa: F401
        import verl.utils.tracking as tracking

        if run == "agent" or release_tuple(release) >= (0, 7):
            import verl.experimental.agent_loop.agent_loop  # noqa: F401
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
    return {
        "steps": recorder.steps,
        "file_steps": recorder.file_steps,
        "file_errors": recorder.file_errors,
        "total_steps": int(trainer.total_training_steps),
        "error": error,
        "types": recorder.types,
    }


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
    """Named like verl's driver actor, so Ray prefixes its lines with (TaskRunner pid=N)."""

    def run(self, release, run, config):
        return run_in_actor(release, run, config)


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

    install_stubs(args.release)
    import ray

    config = compose_config(args.release, args.run)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN",
                                       "VLLM_LOGGING_LEVEL": "WARN"}})
    runner = ray.remote(num_cpus=1)(TaskRunner).remote()
    result = ray.get(runner.run.remote(args.release, args.run, config))
    time.sleep(3)  # let Ray forward the actor's last lines before the driver exits
    ray.shutdown()

    logged = {
        "release": args.release,
        "project": str(config.trainer.project_name),
        "experiment": str(config.trainer.experiment_name),
        "total_steps": result["total_steps"],
        "steps": result["steps"],
        "jsonl_steps": result["file_steps"],
    }
    types = {}
    for step_types in result["types"]:
        for k, t in step_types.items():
            if t != "builtins.float":
                types.setdefault(k, t)
    logged["value_types"] = dict(sorted(types.items()))
    if result["file_errors"]:
        logged["file_logger_errors"] = result["file_errors"]
    if result["error"]:
        logged["error"] = result["error"]
    with open(os.path.join(args.out, "logged.json"), "w") as f:
        f.write(dump_logged(logged))
    jsonl = os.path.join("logs", str(config.trainer.project_name), f"{config.trainer.experiment_name}.jsonl")
    if os.path.exists(jsonl):
        shutil.copyfile(jsonl, os.path.join(args.out, "metrics.jsonl"))
    keys = sorted({k for s in result["steps"] for k in s["data"]})
    with open(os.path.join(args.out, "keys.txt"), "w") as f:
        f.write("".join(k + "\n" for k in keys))
    if result["error"]:
        print(f"verl {args.release} {args.run}: fit() failed: {result['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
