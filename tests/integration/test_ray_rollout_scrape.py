"""The shipped prometheus.yml's "ray" and "rollout" jobs with a real Prometheus.

The config is prometheus/prometheus.yml with its rule files and Alertmanager left out, a 1 s scrape
interval (and timeout), and its file_sd paths moved into the test's folder (relative ones kept).
Two stand-in servers on 127.0.0.1 serve metrics: one listed the way Ray's head node writes
/tmp/ray/prom_metrics_service_discovery.json, one in a rollout file_sd file written like
prometheus/file_sd/rollout.example.json, with the run's labels.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from metrics_server import MetricsServer
from servers import REPO, prom_query, start_prometheus, wait_until

RAY_SD = "/tmp/ray/prom_metrics_service_discovery.json"
RUN = {"project": "gsm8k", "experiment": "grpo", "engine": "vllm"}


def shipped_config(tmp, ray_sd_path) -> dict:
    """prometheus.yml as shipped, its relative file_sd patterns resolved under ``tmp``."""
    config = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["ray"]["file_sd_configs"][0]["files"] == [RAY_SD]
    jobs["ray"]["file_sd_configs"][0]["files"] = [str(ray_sd_path)]
    for job in ("verl", "rollout"):
        for file_sd in jobs[job]["file_sd_configs"]:
            file_sd["files"] = [str(tmp / pattern) for pattern in file_sd["files"]]
    config.pop("rule_files")
    config.pop("alerting")
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    for job in config["scrape_configs"]:
        job.pop("scrape_timeout", None)
    return config


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray-rollout")
    ray = MetricsServer('ray_node_cpu_utilization{ip="127.0.0.1"} 12.5\n')
    rollout = MetricsServer('vllm:num_requests_running{model_name="qwen"} 3\n'
                            'vllm:num_requests_waiting{model_name="qwen"} 1\n')
    ray_sd = tmp / "ray" / "prom_metrics_service_discovery.json"
    ray_sd.parent.mkdir()
    ray_sd.write_text(json.dumps([{"labels": {"job": "ray"}, "targets": [ray.target]}]))
    # The shipped file_sd folder, with one run's rollout file written like the example.
    shutil.copytree(REPO / "prometheus" / "file_sd", tmp / "file_sd")
    example = json.loads((REPO / "prometheus" / "file_sd" / "rollout.example.json").read_text())
    example[0].update(targets=[rollout.target], labels=RUN)
    (tmp / "file_sd" / "rollout").mkdir()
    (tmp / "file_sd" / "rollout" / "gsm8k-grpo.json").write_text(json.dumps(example))
    try:
        with start_prometheus(tmp, shipped_config(tmp, ray_sd)) as prom:
            yield prom
    finally:
        ray.close()
        rollout.close()


def test_ray_metrics_are_scraped_through_rays_discovery_file(prometheus):
    up = wait_until(lambda: prom_query(prometheus, 'up{job="ray"} == 1'), timeout=60, message="Ray's target up")
    assert len(up) == 1
    assert prom_query(prometheus, 'ray_node_cpu_utilization{job="ray"}')


def test_rollout_servers_are_scraped_with_the_runs_labels(prometheus):
    selector = ", ".join(f'{k}="{v}"' for k, v in RUN.items())
    wait_until(lambda: prom_query(prometheus, f'up{{job="rollout", {selector}}} == 1'), timeout=60,
               message="the rollout server's target up with the run's labels")
    running = prom_query(prometheus, f'vllm:num_requests_running{{{selector}}}')
    assert [float(r["value"][1]) for r in running] == [3]


def test_the_example_rollout_file_is_not_scraped(prometheus):
    wait_until(lambda: prom_query(prometheus, 'up{job="rollout"} == 1'), timeout=60, message="the rollout job up")
    status, body = prometheus.get("/api/v1/targets")
    addresses = {t["labels"]["instance"] for t in json.loads(body)["data"]["activeTargets"]}
    example = json.loads((REPO / "prometheus" / "file_sd" / "rollout.example.json").read_text())
    assert not addresses & set(example[0]["targets"])
    assert prom_query(prometheus, 'up{job="rollout", experiment="no-such-run"}') == []
