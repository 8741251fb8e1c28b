"""The Kubernetes example: the sidecar's flags parse, and ports, paths and job names line up."""

from pathlib import Path

import pytest
import yaml

from verl_exporter import config
from verl_exporter.server import parse_listen_address

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "prometheus" / "kubernetes"


@pytest.fixture(scope="module")
def pod():
    job = yaml.safe_load((K8S / "verl-job-with-exporter.yaml").read_text())
    return job["spec"]["template"]


def container(pod, name):
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def test_sidecar_flags_are_accepted_by_the_exporter(pod):
    settings = config.load(container(pod, "verl-exporter")["args"])
    assert settings.source and settings.job_match


def test_ports_line_up(pod):
    sidecar = container(pod, "verl-exporter")
    _, port = parse_listen_address(config.load(sidecar["args"]).web_listen_address)
    assert sidecar["ports"] == [{"name": "metrics", "containerPort": port}]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    monitor = yaml.safe_load((K8S / "podmonitor.yaml").read_text())
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_the_sidecar_reads_where_the_trainer_writes(pod):
    trainer, sidecar = container(pod, "trainer"), container(pod, "verl-exporter")
    root = next(e["value"] for e in trainer["env"] if e["name"] == "VERL_FILE_LOGGER_ROOT")
    mounts = {m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}
    sidecar_mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert root in mounts.values()
    assert sidecar_mounts == mounts
    source = config.load(sidecar["args"]).source[0]
    assert source.startswith(root + "/") and source.endswith(".jsonl")  # <root>/<project>/<experiment>.jsonl
    assert pod["spec"]["shareProcessNamespace"] is True  # --job.match sees the trainer's processes
    assert config.load(sidecar["args"]).job_match in " ".join(trainer["command"])


def test_scraped_as_the_job_the_alerts_watch():
    monitor = yaml.safe_load((K8S / "podmonitor.yaml").read_text())
    relabel = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"targetLabel": "job", "replacement": "verl"} in relabel
    rules = "".join(path.read_text() for path in (ROOT / "alerts").glob("*.rules.yml"))
    assert 'up{job="verl"}' in rules
