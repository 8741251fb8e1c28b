"""What the stand-in workers report: update metrics, agent-loop timing, rule-based rewards.

The metric keys are the ones each release's dp_actor / dp_critic / fsdp_workers (0.3 to 0.7)
or engine workers (0.8+) log; the values are plausible, and folded by the release's own
append_to_dict, AgentLoopManager._performance_metrics and reduce_metrics.
"""

NONFINITE = {"grpo": {4: float("nan"), 5: float("inf")}}  # run -> step -> actor/grad_norm


def agent_loop_timing(w, out, b):
    """The agent-loop timing dict, computed by the release's AgentLoopManager._performance_metrics."""
    import inspect

    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    class PerSample(dict):
        def __missing__(self, key):
            return 0.0

    samples = []
    for _ in range(b):
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
    """Actor update metrics shaped as that release's dp_actor (or 0.8+ engine loss) logs them.

    0.3: entropy_loss, pg_loss, pg_clipfrac, ppo_kl per micro-batch, kl_loss/kl_coef last value;
    0.4-0.6: pg_clipfrac_lower too, kl_loss/kl_coef per micro-batch; 0.7: pg_loss and kl_loss
    summed over micro-batches (kl_loss 0.0 without a KL loss); 0.8+: the engine loss's metrics.
    """
    from verl.utils.py_functional import append_to_dict

    step = max(w.step, 1)
    grpo = w.run in ("grpo", "agent")
    metrics = {"actor/pg_loss": 0.0, "actor/kl_loss": 0.0} if w.rel[:2] == (0, 7) else {}
    for _ in range(4):
        pg_loss = (-0.02 if grpo else 0.05) + 0.04 * (float(w.rand(1)) - 0.5)
        kl_loss = 0.0005 * step + 0.0002 * float(w.rand(1))
        micro = {}
        if w.rel < (0, 4):
            micro["actor/entropy_loss"] = 0.9 - 0.03 * step + 0.02 * float(w.rand(1))
        if w.rel[:2] == (0, 7):
            metrics["actor/pg_loss"] += pg_loss / 4
            metrics["actor/kl_loss"] += kl_loss / 4 if grpo else 0.0
        else:
            micro["actor/pg_loss"] = pg_loss
        micro["actor/pg_clipfrac"] = 0.0 if grpo else 0.002 + 0.004 * float(w.rand(1))
        micro["actor/ppo_kl"] = (-8e-06 + 2e-06 * (float(w.rand(1)) - 0.5)) if grpo else 1e-4 * float(w.rand(1))
        if w.rel >= (0, 4):
            micro["actor/pg_clipfrac_lower"] = 0.0
        if grpo and w.rel < (0, 4):
            metrics["actor/kl_loss"], metrics["actor/kl_coef"] = kl_loss, 0.001
        elif grpo and w.rel[:2] == (0, 7):
            micro["actor/kl_coef"] = 0.001
        elif grpo and w.rel >= (0, 8):  # unprefixed: the trainer's rename_dict adds actor/
            micro["kl_loss"], micro["kl_coef"] = kl_loss, 0.001
        elif grpo:
            micro["actor/kl_loss"], micro["actor/kl_coef"] = kl_loss, 0.001
        append_to_dict(metrics, micro)
    grad_norm = 0.3 + 0.1 * float(w.rand(1))
    grad_norm = NONFINITE.get(w.run, {}).get(w.step, grad_norm)
    append_to_dict(metrics, {"actor/grad_norm": grad_norm})
    if w.rel >= (0, 8):
        # 0.8+ engine workers return unprefixed loss/grad_norm/lr/perf/mfu; the trainer's
        # rename_dict adds "actor/" and turns actor/mfu into perf/mfu/actor.
        out = {k: v for k, v in metrics.items() if k != "actor/grad_norm"}
        out["loss"] = sum(metrics["actor/pg_loss"]) / 4 + (sum(metrics["kl_loss"]) / 4000 if grpo else 0.0)
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
        # "pred", the extracted answer, is what process_validation_metrics votes on (maj@N)
        wrong = ["B" if float(x) < 0.5 else "C" for x in w.rand(b)]
        pred = ["A" if c else x for c, x in zip(correct.tolist(), wrong)]
        return {"reward_tensor": reward, "reward_extra_info": {"acc": correct.tolist(), "pred": pred}}

    return reward_fn
