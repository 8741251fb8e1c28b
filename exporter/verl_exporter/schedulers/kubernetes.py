"""The Kubernetes pod the exporter runs in (a sidecar of the training job), from the downward API.

The pod spec hands the exporter its identity as environment variables (see
``prometheus/kubernetes/verl-job-with-exporter.yaml``)::

    VERL_EXPORTER_POD_NAME       metadata.name
    VERL_EXPORTER_POD_NAMESPACE  metadata.namespace
    VERL_EXPORTER_POD_UID        metadata.uid
    VERL_EXPORTER_JOB_NAME       metadata.labels['batch.kubernetes.io/job-name'] (or 'job-name')
    VERL_EXPORTER_JOB_UID        metadata.labels['batch.kubernetes.io/controller-uid'] (or 'controller-uid')
    VERL_EXPORTER_NODE_NAME      spec.nodeName

With ``VERL_EXPORTER_POD_NAME`` set, every run the exporter follows is served with
``verl_job_info{scheduler="kubernetes", job_id=<the Job's uid, else the pod's>, job_name=<the Job,
else the pod>, namespace, pod}`` (``user`` and ``partition`` are empty). Whether the job's
processes run stays with ``--job.match``/``--job.pid`` (``verl_job_running``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore

from ..collectors.job_info import JobRun

ENV = {
    "pod": "VERL_EXPORTER_POD_NAME",
    "namespace": "VERL_EXPORTER_POD_NAMESPACE",
    "pod_uid": "VERL_EXPORTER_POD_UID",
    "job_name": "VERL_EXPORTER_JOB_NAME",
    "job_uid": "VERL_EXPORTER_JOB_UID",
    "node": "VERL_EXPORTER_NODE_NAME",
}


@dataclass(frozen=True)
class KubernetesPod:
    pod: str
    namespace: str = ""
    pod_uid: str = ""
    job_name: str = ""
    job_uid: str = ""
    node: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "KubernetesPod | None":
        """The pod the environment names; None outside a pod that hands its name down."""
        env = os.environ if environ is None else environ
        values = {key: env.get(name, "").strip() for key, name in ENV.items()}
        if not values["pod"]:
            return None
        return cls(**values)

    @property
    def job_id(self) -> str:
        return self.job_uid or self.pod_uid or f"{self.namespace}/{self.pod}"

    def run(self, run: RunKey) -> JobRun:
        return JobRun(run, "kubernetes", self.job_id, self.job_name or self.pod,
                      namespace=self.namespace, pod=self.pod)


class KubernetesRuns:
    """``rows()`` for the job info collector: every run the store follows, as this pod's."""

    def __init__(self, pod: KubernetesPod, store: RunStore):
        self.pod = pod
        self.store = store
        self._versions: dict[RunKey, int] = {}
        self._serial: int | None = None

    def rows(self) -> list[JobRun]:
        snapshot = self.store.snapshot(known=self._versions, since=self._serial)
        if snapshot.versions is not None:
            self._versions, self._serial = snapshot.versions, snapshot.serial
        return [self.pod.run(run) for run in sorted(self._versions)]
