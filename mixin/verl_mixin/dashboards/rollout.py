"""The run detail dashboard's rollout row: the run's vLLM or SGLang servers beside timing_s/gen.

The figures are the ``project_experiment:verl_rollout_*`` recording rules
(the shipped recording-rules.yml), which read either engine's own metric names from the ``rollout``
scrape job; they are empty for a run whose rollout servers are not scraped
(``actor_rollout_ref.rollout.prometheus.enable=True``, verl 0.6.1 and later).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from .common import GREEN, NEUTRAL, ORANGE, RED, RUN, describe, query, steps, timeseries_panel

KV_CACHE_SATURATED = 0.95  # verl_mixin/rollout.py: VerlGenerationKvCacheBound
SOURCE = ("From the run's rollout servers (the rollout scrape job; vLLM or SGLang metric names, "
          "the shipped recording-rules.yml).")


def recorded(name: str) -> str:
    return f"project_experiment:verl_rollout_{name}{{{RUN}}}"


def rollout_row(dash: db.Dashboard) -> None:
    dash.with_row(db.Row("Rollout engines"))
    dash.with_panel(timeseries_panel(
        "Generation time", describe("verl_timing_gen_seconds",
                                    extra="Compare with the engines' queue and KV cache on its right."),
        "s", steps(NEUTRAL), [query(f"verl_timing_gen_seconds{{{RUN}}}", "timing_s/gen")], width=4))
    dash.with_panel(timeseries_panel(
        "Requests running and waiting",
        f"Sequences the engines generate now, and those queued for a free slot or KV-cache blocks. {SOURCE}",
        "none", steps(NEUTRAL),
        [query(recorded("requests_running:sum"), "running"), query(recorded("requests_waiting:sum"), "waiting")],
        width=5))
    dash.with_panel(timeseries_panel(
        "KV-cache usage",
        f"Share of the KV cache in use on the fullest engine (vllm:kv_cache_usage_perc, sglang:token_usage). "
        f"Red from {KV_CACHE_SATURATED:.0%}: new sequences wait and running ones are preempted. {SOURCE}",
        "percentunit", steps(GREEN, (0.8, ORANGE), (KV_CACHE_SATURATED, RED)),
        [query(recorded("kv_cache_usage_ratio:max"), "KV cache")], width=5, min_value=0, max_value=1))
    dash.with_panel(timeseries_panel(
        "Generation tokens per second", f"Tokens the run's engines generate per second, summed. {SOURCE}",
        "suffix: tokens/s", steps(NEUTRAL), [query(recorded("generation_tokens:rate5m"), "tokens/s")], width=5))
    dash.with_panel(timeseries_panel(
        "Preemptions per second",
        "Requests preempted (vLLM) or retracted (SGLang) for want of KV cache, per second: each is computed "
        f"again from its prompt. Red above 0. {SOURCE}",
        "suffix: /s", steps(GREEN, (0.001, RED)), [query(recorded("preemptions:rate5m"), "preemptions/s")], width=5))
