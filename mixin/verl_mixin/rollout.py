"""The rollout engines (vLLM, SGLang) of a run: recording rules and the alert that explains a slow
generation phase.

The engines' own metrics reach Prometheus through the ``rollout`` scrape job
(prometheus/prometheus.yml), whose file_sd targets carry the run's ``project`` and ``experiment``
labels; the rules join them to the run on those two labels and take the run's owner labels (``user``,
``team``) from the run itself. Metric names are the engines' own:

| what | vLLM | SGLang |
| --- | --- | --- |
| requests running | ``vllm:num_requests_running`` | ``sglang:num_running_reqs`` |
| requests waiting | ``vllm:num_requests_waiting`` | ``sglang:num_queue_reqs`` |
| KV-cache usage (0-1) | ``vllm:kv_cache_usage_perc`` (1) | ``sglang:token_usage`` |
| generated tokens | ``vllm:generation_tokens_total`` | ``sglang:generation_tokens_total`` (2) |
| preemptions | ``vllm:num_preemptions_total`` | ``sglang:num_retracted_requests_total`` (retractions) |

(1) ``vllm:gpu_cache_usage_perc`` before V1. (2) And ``sglang:gen_throughput``, tokens/s.
"""

from __future__ import annotations

import re

from verl_exporter.store.catalog import default_catalog

from .model import PER_STEP_INTERVAL, Alert, Group, sub

RATE = "5m"
# The engines' targets name their run by project and experiment (the rollout job's file_sd labels):
# their figures are summed per run name, then given the run's owner labels from the run itself.
BY_RUN = "by (project, experiment)"
TO_RUN = (" * on(project, experiment) group_right()"
          " group by (project, experiment, user, team) (verl_training_run_info)")
ENGINE_RUNNING = "sum ${BY_RUN} (vllm:num_requests_running) or sum ${BY_RUN} (sglang:num_running_reqs)"
ENGINE_WAITING = "sum ${BY_RUN} (vllm:num_requests_waiting) or sum ${BY_RUN} (sglang:num_queue_reqs)"
# The fullest engine of the run; the newer vLLM name wins where an engine serves both.
ENGINE_KV_CACHE = "max ${BY_RUN} (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc or sglang:token_usage)"
ENGINE_GENERATION = ("sum ${BY_RUN} (rate(vllm:generation_tokens_total[${RATE}]))"
                     " or sum ${BY_RUN} (rate(sglang:generation_tokens_total[${RATE}]))"
                     " or sum ${BY_RUN} (sglang:gen_throughput)")
ENGINE_PREEMPTIONS = ("sum ${BY_RUN} (rate(vllm:num_preemptions_total[${RATE}]))"
                      " or sum ${BY_RUN} (rate(sglang:num_retracted_requests_total[${RATE}]))")
RUNNING, WAITING, KV_CACHE, GENERATION, PREEMPTIONS = (
    f"({expr}){TO_RUN}" for expr in (ENGINE_RUNNING, ENGINE_WAITING, ENGINE_KV_CACHE, ENGINE_GENERATION,
                                     ENGINE_PREEMPTIONS))
# Its numbers are the catalog's table ``rules.rollout`` (``${rollout:NAME}``).
THRESHOLDS = default_catalog().rules["rollout"]

RECORDED = {
    "project_experiment:verl_rollout_requests_running:sum": RUNNING,
    "project_experiment:verl_rollout_requests_waiting:sum": WAITING,
    "project_experiment:verl_rollout_kv_cache_usage_ratio:max": KV_CACHE,
    "project_experiment:verl_rollout_generation_tokens:rate5m": GENERATION,
    "project_experiment:verl_rollout_preemptions:rate5m": PREEMPTIONS,
}


def recording_rules() -> list[dict]:
    """One series per run and figure, whichever engine the run uses."""
    return [{"name": "verl-rollout-engines",
             "rules": [{"record": name, "expr": expr} for name, expr in RECORDED.items()]}]


def _quoted(expr: str) -> str:
    """``expr`` (an engines' figure) for a description's ``query``, restricted to the alert's run name."""
    expr = re.sub(r"\b((?:vllm|sglang):[a-z_]+)\b(?![{:])", r"\1{project=%q,experiment=%q}", expr)
    return "{{ with printf `" + expr + "`" + " $labels.project $labels.experiment" * (expr.count("%q") // 2) \
        + " | query }}"


KV_NOW = _quoted(ENGINE_KV_CACHE) + " KV-cache usage peaks at {{ . | first | value | humanizePercentage }}.{{ end }}"
PREEMPTED_NOW = (_quoted(sub("(${PREEMPTIONS}) > 0", PREEMPTIONS=ENGINE_PREEMPTIONS))
                 + ' The engines preempt {{ . | first | value | printf "%.3g" }}'
                 " requests/s.{{ end }}")

ROLLOUT = Group(name="verl-rollout", file="verl-performance.rules.yml", title="Rollout engines", alerts=(
    Alert(
        name="VerlGenerationKvCacheBound", severity="info",
        expr="verl_timing_gen_seconds / verl_timing_step_seconds > ${timing_s/step:gen_share}"
        " and on(project, experiment, user, team) ((${KV_CACHE}) >= ${rollout:kv_cache_saturated}"
        " or (${PREEMPTIONS}) > ${rollout:preemptions_per_second})", for_="15m",
        summary="Generation is slow because the rollout engines' KV cache is full or they preempt requests.",
        description="Run ${RUN}: generation (timing_s/gen) takes ${PERCENT} of the step while its rollout engines are "
        "out of KV cache." + KV_NOW + PREEMPTED_NOW,
        meaning="Generation dominates the step (as VerlGenerationBottleneck) and the run's vLLM or SGLang servers "
        "(scraped by the `rollout` job, `actor_rollout_ref.rollout.prometheus.enable=True`) have their KV "
        "cache at least ${rollout:kv_cache_saturated} full, or preempt (vLLM) or retract (SGLang) running "
        "requests: sequences wait for cache blocks, and preempted ones are computed again from their prompt.",
        fix="Give the engines more KV cache: raise `actor_rollout_ref.rollout.gpu_memory_utilization` (e.g. "
        "0.5 -> 0.7, if the trainer's memory allows), or `actor_rollout_ref.rollout.tensor_model_parallel_size`; "
        "or admit fewer sequences at once: lower `actor_rollout_ref.rollout.max_num_seqs` or "
        "`max_num_batched_tokens`.",
        guide="11.2",
    ),
), training=True, interval=PER_STEP_INTERVAL)

GROUPS = (ROLLOUT,)
