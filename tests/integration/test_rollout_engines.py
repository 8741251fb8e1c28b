"""vLLM and SGLang rollout servers, by their own metric names, through a real Prometheus.

Two stand-in servers answer /metrics with the names and types the engines document (vLLM's
``vllm:`` gauges and counters, SGLang's ``sglang:`` ones); they are listed in a rollout file_sd
file with their run's labels, as prometheus/prometheus.yml's "rollout" job reads them. A third
stand-in serves the head exporter's step timings of three runs (job "verl"). Prometheus evaluates
the shipped recording rules and verl-performance.rules.yml, durations scaled down
(verl_mixin/local.py): the per-run rollout figures must come from either engine, and
VerlGenerationKvCacheBound must fire for the vLLM run (KV cache full) and the SGLang run
(retractions), not for the run whose engine has room.
"""

from __future__ import annotations

import json
import time

import pytest

from metrics_server import MetricsServer
from servers import prom_query, start_prometheus, wait_until
from verl_mixin import local

TIME_SCALE = 1 / 150  # 15 m for -> 6 s, 5 m rate windows -> 2 s, at least MIN_RANGE
MIN_RANGE = 4.0
RUNS = {"vllm-full": "vllm", "sglang-retracting": "sglang", "vllm-roomy": "vllm"}


def vllm(kv_cache: float):
    # vLLM's own names (docs.vllm.ai, "Production Metrics"); counters move on every scrape.
    return lambda: (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="qwen",engine="0"} 256\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="qwen",engine="0"} 31\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{model_name="qwen",engine="0"}} {kv_cache}\n'
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{model_name="qwen",engine="0"}} {time.time() * 1000:.0f}\n'
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{model_name="qwen",engine="0"} 0\n')


def sglang():
    # SGLang's own names (docs.sglang.io, "Production Metrics"; retractions are its preemptions).
    return lambda: (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 64\n'
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 12\n'
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{model_name="qwen",tp_rank="0"} 0.61\n'
        "# TYPE sglang:gen_throughput gauge\n"
        'sglang:gen_throughput{model_name="qwen",tp_rank="0"} 2500\n'
        "# TYPE sglang:generation_tokens_total counter\n"
        f'sglang:generation_tokens_total{{model_name="qwen",tp_rank="0"}} {time.time() * 2500:.0f}\n'
        "# TYPE sglang:num_retracted_requests_total counter\n"
        f'sglang:num_retracted_requests_total{{model_name="qwen",tp_rank="0"}} {time.time() * 2:.0f}\n')


def head_timings() -> str:
    """The head exporter's series of the three runs, each owned by alice of team rl: the engines'
    figures take those owner labels from the run's info."""
    lines = []
    for experiment in RUNS:
        run = f'project="gsm8k",experiment="{experiment}",user="alice",team="rl"'
        lines += [f"verl_timing_gen_seconds{{{run}}} 80", f"verl_timing_step_seconds{{{run}}} 100",
                  f'verl_training_run_info{{{run},source="/logs/{experiment}.log"}} 1']
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rollout-engines")
    servers = {"vllm-full": MetricsServer(vllm(0.99)), "sglang-retracting": MetricsServer(sglang()),
               "vllm-roomy": MetricsServer(vllm(0.4))}
    head = MetricsServer(head_timings())
    (tmp / "rollout").mkdir()
    for experiment, server in servers.items():
        labels = {"project": "gsm8k", "experiment": experiment, "engine": RUNS[experiment]}
        (tmp / "rollout" / f"gsm8k-{experiment}.json").write_text(
            json.dumps([{"targets": [server.target], "labels": labels}]))
    rules = local.write_rules(tmp / "rules", time_scale=TIME_SCALE, min_range=MIN_RANGE)
    rules = [p for p in rules if p.name in ("recording-rules.yml", "verl-performance.rules.yml")]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [p.name for p in rules],
        "scrape_configs": [
            {"job_name": "verl", "static_configs": [{"targets": [head.target]}]},
            {"job_name": "rollout", "file_sd_configs": [{"files": [str(tmp / "rollout" / "*.json")]}]},
        ],
    }
    try:
        with start_prometheus(tmp, config, rule_files=rules) as prom:
            yield prom
    finally:
        for server in [*servers.values(), head]:
            server.close()


def per_run(prom, name: str) -> dict[str, float]:
    return {r["metric"]["experiment"]: float(r["value"][1])
            for r in prom_query(prom, f'project_experiment:verl_rollout_{name}{{project="gsm8k"}}')}


def test_rollout_figures_per_run_from_either_engine(prometheus):
    wait_until(lambda: len(per_run(prometheus, "generation_tokens:rate5m")) == 3
               and len(per_run(prometheus, "preemptions:rate5m")) == 3,
               timeout=60, message="rollout figures of the three runs")
    assert per_run(prometheus, "requests_running:sum") == {"vllm-full": 256, "sglang-retracting": 64, "vllm-roomy": 256}
    assert per_run(prometheus, "requests_waiting:sum") == {"vllm-full": 31, "sglang-retracting": 12, "vllm-roomy": 31}
    assert per_run(prometheus, "kv_cache_usage_ratio:max") == {"vllm-full": 0.99, "sglang-retracting": 0.61,
                                                                "vllm-roomy": 0.4}

    # Rates of the counters, once the (scaled) 5-minute window holds enough scrapes.
    def rates_settled() -> bool:
        tokens = per_run(prometheus, "generation_tokens:rate5m")
        preemptions = per_run(prometheus, "preemptions:rate5m")
        return (tokens["vllm-full"] == pytest.approx(1000, rel=0.3)
                and tokens["sglang-retracting"] == pytest.approx(2500, rel=0.3)
                and preemptions["sglang-retracting"] == pytest.approx(2, rel=0.5))

    wait_until(rates_settled, timeout=60, message="tokens/s and retractions/s of the stand-in engines")
    preemptions = per_run(prometheus, "preemptions:rate5m")
    assert preemptions["vllm-full"] == 0 and preemptions["vllm-roomy"] == 0
    owners = {(r["metric"]["user"], r["metric"]["team"])
              for r in prom_query(prometheus, 'project_experiment:verl_rollout_requests_running:sum')}
    assert owners == {("alice", "rl")}  # the engines' figures carry their run's owner labels


def test_slow_generation_is_explained_by_kv_cache_or_preemptions(prometheus):
    def firing() -> dict[str, dict]:
        return {r["metric"]["experiment"]: r["metric"] for r in prom_query(
            prometheus, 'ALERTS{alertname="VerlGenerationKvCacheBound", alertstate="firing"}')}

    found = wait_until(lambda: firing() if len(firing()) == 2 else None, timeout=90,
                       message="VerlGenerationKvCacheBound for the two saturated runs")
    assert set(found) == {"vllm-full", "sglang-retracting"}
    assert all(labels["job"] == "verl" and labels["severity"] == "info" for labels in found.values())
    assert all((labels["user"], labels["team"]) == ("alice", "rl") for labels in found.values())  # the run's
    status, body = prometheus.get("/api/v1/alerts")
    descriptions = {a["labels"]["experiment"]: a["annotations"]["description"]
                    for a in json.loads(body)["data"]["alerts"]
                    if a["labels"]["alertname"] == "VerlGenerationKvCacheBound"}
    assert "KV-cache usage peaks at 99%" in descriptions["vllm-full"]
    assert "preempt" in descriptions["sglang-retracting"] and "peaks at 61%" in descriptions["sglang-retracting"]
    assert "vllm-roomy" not in descriptions
