"""verl_job_info in a Kubernetes pod: the identity the downward API hands the sidecar."""

from __future__ import annotations

from pathlib import Path

import yaml

from verl_exporter.collectors.job_info import JobInfoCollector
from verl_exporter.schedulers.kubernetes import ENV, KubernetesPod, KubernetesRuns
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

ROOT = Path(__file__).resolve().parents[2]
POD_ENV = {"VERL_EXPORTER_POD_NAME": "grpo-7b-x2kq9", "VERL_EXPORTER_POD_NAMESPACE": "research",
           "VERL_EXPORTER_POD_UID": "0f1e", "VERL_EXPORTER_JOB_NAME": "grpo-7b", "VERL_EXPORTER_JOB_UID": "9a8b",
           "VERL_EXPORTER_NODE_NAME": "gpu-node-3"}


def test_no_pod_no_job_info():
    assert KubernetesPod.from_env({}) is None
    assert KubernetesPod.from_env({"VERL_EXPORTER_POD_NAME": " "}) is None


def test_every_run_followed_is_the_pods_job():
    store = RunStore(default_catalog())
    store.ingest(Record(RunKey("gsm8k", "grpo-7b"), 1, {"actor/pg_loss": 0.5}, 1.0, source="/l/a.log"))
    rows = KubernetesRuns(KubernetesPod.from_env(POD_ENV), store).rows
    samples = list(JobInfoCollector(rows).collect())
    assert [family.name for family in samples] == ["verl_job_info", "verl_job_gpu_info"]
    assert [s.labels for s in samples[0].samples] == [{
        "project": "gsm8k", "experiment": "grpo-7b", "user": "", "team": "", "scheduler": "kubernetes",
        "job_id": "9a8b", "job_name": "grpo-7b", "partition": "", "namespace": "research", "pod": "grpo-7b-x2kq9"}]
    store.ingest(Record(RunKey("gsm8k", "ppo"), 1, {"actor/pg_loss": 0.5}, 1.0, source="/l/b.log"))
    assert [row.run.experiment for row in rows()] == ["grpo-7b", "ppo"]
    assert [row.run.experiment for row in rows()] == ["grpo-7b", "ppo"]  # unchanged store: the same runs


def test_a_pod_without_a_job_is_its_own_job():
    pod = KubernetesPod.from_env({"VERL_EXPORTER_POD_NAME": "p", "VERL_EXPORTER_POD_NAMESPACE": "ns",
                                  "VERL_EXPORTER_POD_UID": "u1"})
    row = pod.run(RunKey("a", "b"))
    assert (row.job_id, row.job_name, row.pod) == ("u1", "p", "p")


def test_the_example_manifest_hands_the_sidecar_its_identity():
    job = yaml.safe_load((ROOT / "prometheus" / "kubernetes" / "verl-job-with-exporter.yaml").read_text())
    sidecar = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "verl-exporter")
    env = {item["name"]: item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for item in sidecar["env"]}
    assert env["VERL_EXPORTER_POD_NAME"] == "metadata.name"
    assert env["VERL_EXPORTER_POD_NAMESPACE"] == "metadata.namespace"
    assert env["VERL_EXPORTER_POD_UID"] == "metadata.uid"
    assert env["VERL_EXPORTER_JOB_NAME"] == "metadata.labels['batch.kubernetes.io/job-name']"
    assert env["VERL_EXPORTER_JOB_UID"] == "metadata.labels['batch.kubernetes.io/controller-uid']"
    assert env["VERL_EXPORTER_NODE_NAME"] == "spec.nodeName"
    assert set(ENV.values()) <= env.keys()
