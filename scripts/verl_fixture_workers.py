"""Stand-in worker groups for one verl release's trainer: real torch tensors, fake GPUs.

What they return is shaped like what that release's rollout, actor, critic and reference
workers return; the trainer loop that consumes it is the release's own.
"""

import time

from verl_fixture_metrics import actor_metrics, agent_loop_timing, critic_metrics, reward_fn_for
from verl_fixture_stubs import release_tuple

STEPS = 6
TEST_FREQ = 3
N_GPUS = 8
TRAIN_BATCH = 8  # prompts per step
VAL_PER_SOURCE = 4  # prompts per validation data source
VAL_N = 4  # samples per validation prompt
GRPO_N = 4
DATA_SOURCES = ["openai/gsm8k", "lighteval/MATH"]


class FakeTokenizer:
    eos_token_id = 151645
    pad_token_id = 151643
    padding_side = "left"

    def decode(self, ids, skip_special_tokens=True):
        kept = [int(i) for i in ids if not (skip_special_tokens and int(i) == self.pad_token_id)]
        return " ".join(str(i) for i in kept[:8])

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

    def save_checkpoint(self, local_path=None, *args, **kwargs):
        """Creates the folder, as the real workers do; the trainer saves its own state there."""
        import os

        self.calls["save_checkpoint"] = self.calls.get("save_checkpoint", 0) + 1
        if isinstance(local_path, str):
            os.makedirs(local_path, exist_ok=True)

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
        if w.rel >= (0, 6) and not w.validating:
            # the rollout's own log-probs (vLLM's calculate_log_probs), which 0.6+ compare with
            # the actor's (training/rollout_probs_diff_*, rollout_corr/*)
            batch["rollout_log_probs"] = -w.rand(b, r) * 0.8 * resp_mask
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
        timing = {"generate_sequences": 20.0 + 5 * float(w.rand(1))}
        if w.rel < (0, 6):  # fsdp_workers + the vLLM sharding manager's reshard timer
            timing["reshard"] = 0.8 + 0.2 * float(w.rand(1))
        else:  # 0.6 fsdp_workers: topk_reduce_ratio_min_max over ranks
            timing["generation_timing/max"] = 21.0 + float(w.rand(1))
            timing["generation_timing/min"] = 18.0 + float(w.rand(1))
            timing["generation_timing/topk_ratio"] = 0.9 + 0.1 * float(w.rand(1))
        return timing

    # --- forward passes
    def compute_log_prob(self, data):
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
