"""Multi-node Ray on Slurm, the layout of verl's Slurm example, on a real two-node cluster.

The job asks for two nodes with two GPUs each; the batch script starts a Ray-worker stand-in on the
second node with ``srun`` and runs the verl driver on the first (the batch host), which prints the
config and the steps to the job's output. One ``verl-exporter --slurm`` runs inside each node. A real
Prometheus discovers both through ``verl-exporter slurm-sd``, scrapes them and evaluates the shipped
recording rules: the run has four GPUs on two nodes, its training series come from the batch host only, and
both nodes carry the job's Slurm identity.
"""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap

import pytest

from exposition import matching, sample_value, samples
from servers import Server, free_port, prom_query, start_prometheus, wait_until
from verl_exporter import shipped

DRIVER = textwrap.dedent("""\
    import pprint, sys, time
    steps, pause = int(sys.argv[1]), float(sys.argv[2])
    prefix = "(TaskRunner pid=4242) "
    config = {"trainer": {"project_name": "slurm-mn", "experiment_name": "ray-2x2", "nnodes": 2,
                          "n_gpus_per_node": 2}}
    for row in pprint.pformat(config).splitlines():
        print(prefix + row)
    print(prefix + f"Total training steps: {steps}", flush=True)
    for step in range(1, steps + 1):
        time.sleep(pause)
        print(prefix + f"step:{step} - actor/pg_loss:{0.5 / step} - critic/score/mean:0.{step}", flush=True)
""")

# verl's examples/slurm/ray_on_slurm.slurm, with the Ray head and workers as stand-ins that hold their
# node's GPUs as long as the driver runs.
BATCH = textwrap.dedent("""\
    #!/bin/bash
    nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
    for worker in "${{nodes[@]:1}}"; do
        srun --nodes=1 --ntasks=1 -w "$worker" {python} -c 'import time; time.sleep(600)' &
    done
    sleep 1
    {python} {driver} {steps} {pause}
""")

RUN = {"project": "slurm-mn", "experiment": "ray-2x2"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from slurm_cluster import SlurmUnavailable, slurm_cluster

    with contextlib.ExitStack() as stack:
        try:
            yield stack.enter_context(slurm_cluster(tmp_path_factory.mktemp("slurm-nodes"), nodes=2))
        except SlurmUnavailable as exc:
            pytest.skip(f"no two-node Slurm cluster here: {exc}")


@contextlib.contextmanager
def node_exporters(cluster, tmp_path, port: int):
    """One ``verl-exporter --slurm`` inside each node, on ``port`` (as a unit on every node would)."""
    with contextlib.ExitStack() as stack:
        servers = {}
        for node in cluster.nodes:
            args = cluster.on_node(node, [
                sys.executable, "-m", "verl_exporter", "--web.listen-address", f"0.0.0.0:{port}", "--slurm",
                "--slurm.poll-interval", "250ms", "--source.poll-interval", "100ms", "--gpu.fake", "healthy:2",
                "--no-forensics"])
            server = Server(f"verl-exporter on {node}", args, port, tmp_path / f"exporter-{node}.log", "/-/ready",
                            env=cluster.env, host=cluster.address(node))
            servers[node] = stack.enter_context(server)
        yield servers


def metrics(server: Server) -> str:
    status, text = server.get("/metrics")
    assert status == 200
    return text


def test_every_node_of_a_ray_job_attributes_its_gpus_to_the_run(cluster, tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    script = BATCH.format(python=sys.executable, driver=driver, steps=20, pause=1.0)
    port = free_port()
    with node_exporters(cluster, tmp_path, port) as exporters:
        job_id = cluster.sbatch(script, job_name="verl-ray", nodes=2, gres="gpu:2", chdir=tmp_path,
                                output=tmp_path / "ray-%j.out")
        head, worker = exporters["node1"], exporters["node2"]
        wait_until(lambda: sample_value(metrics(head), "verl_training_last_step", **RUN), timeout=30,
                   message=f"the run on the batch host\n{head.log()}")
        wait_until(lambda: matching(metrics(worker), "verl_node_run_info", **RUN), timeout=30,
                   message=f"the worker node working for the run\n{worker.log()}")
        identity = {"scheduler": "slurm", "job_id": job_id, "job_name": "verl-ray", "user": "root",
                    "partition": "debug"}
        for node, server in exporters.items():
            text = metrics(server)
            assert matching(text, "verl_job_info", **identity, **RUN) == [1.0], node
            gpus = {dict(labels)["gpu"] for (name, labels) in samples(text) if name == "verl_job_gpu_info"}
            assert gpus == {"0", "1"}, node  # Slurm's GRES of the job on that node
            assert sample_value(text, "verl_job_running", **RUN) == 1.0, node
            assert sample_value(text, "verl_job_processes") >= 1, node
        assert sample_value(metrics(worker), "verl_training_last_step", **RUN) is None  # served once, by the head

        with _prometheus(cluster, tmp_path, port) as prometheus:
            wait_until(lambda: _value(prometheus, "project_experiment:verl_gpus:count") == 4.0, timeout=60,
                       message="the run's four GPUs on two nodes")
            assert _value(prometheus, "project_experiment:verl_nodes:count") == 2.0
            (series,) = prom_query(prometheus, "verl_job_info")[:1]
            assert series["metric"]["slurm_job_id"] == job_id  # the discovery's labels on the scraped series
            instances = {s["metric"]["instance"] for s in prom_query(prometheus, "verl_job_info")}
            assert instances == {f"node1:{port}", f"node2:{port}"}

        cluster.run("scancel", job_id)
        cluster.wait_state(job_id, "CANCELLED", timeout=30)
        for node, server in exporters.items():
            wait_until(lambda server=server: sample_value(metrics(server), "verl_job_running", **RUN) == 0.0,
                       timeout=30, message=f"job {job_id} ended on {node}\n{server.log()}")
            assert matching(metrics(server), "verl_node_run_info", **RUN) == [], node  # the node is free again
        text = metrics(head)
        assert sample_value(text, "verl_training_finished", **RUN) == 0.0  # cancelled before its last step
        # the batch host says how Slurm ended the job (the crash page quotes it); a worker does not
        assert len(matching(text, "verl_job_ended_timestamp_seconds", job_id=job_id, state="CANCELLED", **RUN)) == 1
        assert matching(text, "verl_job_ended_timestamp_seconds") == matching(
            text, "verl_job_ended_timestamp_seconds", job_id=job_id)
        assert matching(metrics(worker), "verl_job_ended_timestamp_seconds") == []


def _value(prometheus: Server, expr: str) -> float | None:
    result = prom_query(prometheus, f'{expr}{{project="{RUN["project"]}"}}')
    return float(result[0]["value"][1]) if result else None


@contextlib.contextmanager
def _prometheus(cluster, tmp_path, port: int):
    sd_port = free_port()
    sd = Server("slurm-sd", [sys.executable, "-m", "verl_exporter", "slurm-sd", "--web.listen-address",
                             f"127.0.0.1:{sd_port}", "--cache-ttl", "1s", "--exporter-port", str(port)],
                sd_port, tmp_path / "slurm-sd.log", "/-/healthy", env=cluster.env)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": ["recording-rules.yml"],
        "scrape_configs": [{"job_name": "verl-slurm",
                            "http_sd_configs": [{"url": f"{sd.url}/targets", "refresh_interval": "1s"}]}],
    }
    with sd, start_prometheus(tmp_path, json.dumps(config), rule_files=[shipped.recording_rules_file()],
                              command_prefix=cluster.with_hosts([])) as prometheus:
        yield prometheus
