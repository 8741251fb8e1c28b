"""slurm-sd end to end: a real Slurm cluster runs a verl-like job, ``verl-exporter slurm-sd`` lists
its node, a real Prometheus discovers it through ``http_sd_configs`` and scrapes the exporter that
follows the job's log; the job is cancelled and the target goes."""

from __future__ import annotations

import json
import subprocess
import sys

from servers import Server, free_port, prom_query, start_exporter, start_prometheus, wait_until

LINE = "(TaskRunner pid=1) step:1 - actor/pg_loss:0.1 - actor/entropy:0.52 - critic/score/mean:0.25"


def start_slurm_sd(tmp_path, slurm, *args: str) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "verl_exporter", "slurm-sd", "--web.listen-address", f"127.0.0.1:{port}",
           "--cache-ttl", "1s", *args]
    return Server("slurm-sd", cmd, port, tmp_path / "slurm-sd.log", "/-/healthy", env=slurm.env)


def active_targets(prometheus: Server, job: str) -> list[dict]:
    status, body = prometheus.get("/api/v1/targets?state=active")
    assert status == 200, body
    return [target for target in json.loads(body)["data"]["activeTargets"] if target["labels"]["job"] == job]


def test_prometheus_discovers_a_running_job_and_drops_it_when_cancelled(slurm, tmp_path):
    output = tmp_path / "verl-%j.log"
    job_id = slurm.sbatch(None, wrap=f"echo '{LINE}'; exec sleep 120", job_name="verl-grpo-sd", output=output,
                          chdir=tmp_path)
    try:
        slurm.wait_state(job_id, "RUNNING", timeout=30)
        log = tmp_path / f"verl-{job_id}.log"
        assert slurm.scontrol_show_job(job_id)["StdOut"] == str(log)
        # the sidecar of the job's node: the exporter following the job's output (the node is this
        # machine, whose name resolves to 127.0.0.1, where the exporter listens)
        with start_exporter(tmp_path, "--source", str(log), "--project", "math", "--experiment", "grpo-sd",
                            "--no-collector.gpu", "--source.poll-interval", "0.1") as exporter, \
                start_slurm_sd(tmp_path, slurm, "--exporter-port", str(exporter.port), "--job.match", "verl-.*") as sd:
            config = {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{"job_name": "verl-slurm",
                                    "http_sd_configs": [{"url": f"{sd.url}/targets", "refresh_interval": "1s"}]}],
            }
            with start_prometheus(tmp_path, config) as prometheus:
                (target,) = wait_until(lambda: active_targets(prometheus, "verl-slurm"), timeout=30,
                                       message="the job's node discovered")
                labels = target["labels"]
                assert labels["instance"] == f"{slurm.node}:{exporter.port}"
                assert {name: labels[name] for name in ("slurm_job_id", "slurm_job_name", "slurm_user",
                                                        "slurm_partition")} == {
                    "slurm_job_id": job_id, "slurm_job_name": "verl-grpo-sd", "slurm_user": "root",
                    "slurm_partition": "debug"}
                # scraped: the job's own training metrics carry its Slurm labels
                (sample,) = wait_until(lambda: prom_query(prometheus, f'verl_actor_pg_loss{{slurm_job_id="{job_id}"}}'),
                                       timeout=30, message="the job's metrics scraped")
                assert float(sample["value"][1]) == 0.1
                assert sample["metric"]["slurm_job_name"] == "verl-grpo-sd"

                slurm.run("scancel", job_id)
                slurm.wait_state(job_id, "CANCELLED", timeout=30)
                wait_until(lambda: not active_targets(prometheus, "verl-slurm"), timeout=30,
                           message="the cancelled job's target dropped")
            assert sd.get("/targets") == (200, "[]\n")
    finally:
        subprocess.run(["scancel", job_id], env=slurm.env, capture_output=True)


def test_jobs_whose_name_does_not_match_are_not_listed(slurm, tmp_path):
    job_id = slurm.sbatch(None, wrap="exec sleep 120", job_name="not-verl")
    try:
        slurm.wait_state(job_id, "RUNNING", timeout=30)
        with start_slurm_sd(tmp_path, slurm, "--job.match", "verl-.*", "--partition", "debug") as sd:
            assert sd.get("/targets") == (200, "[]\n")
        with start_slurm_sd(tmp_path, slurm, "--partition", "debug") as sd:
            status, body = sd.get("/targets")
            assert status == 200
            assert {"targets": [f"{slurm.node}:9945"],
                    "labels": {"slurm_job_id": job_id, "slurm_user": "root", "slurm_partition": "debug",
                               "slurm_job_name": "not-verl"}} in json.loads(body)
    finally:
        slurm.run("scancel", job_id, check=False)
