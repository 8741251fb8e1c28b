"""Offline checks of Kubernetes manifests: built-in kinds against the JSON schemas that the
kubernetes-validate package ships (nothing is downloaded), and the custom resources of KubeRay
(RayJob) and the Prometheus Operator (PodMonitor, PrometheusRule) for the fields their CRDs require.

The custom-resource checks follow the operators' API types: ray-operator/apis/ray/v1
(rayjob_types.go, raycluster_types.go) and pkg/apis/monitoring/v1 (podmonitor_types.go,
prometheusrule_types.go). Embedded Kubernetes objects (pod templates, label selectors, object
metadata) are validated against the bundled schema of their own type. Each check returns a list of
problems, empty when the manifest is fine.
"""

from __future__ import annotations

import re

import jsonschema
import kubernetes_validate
from kubernetes_validate import utils
from referencing import Registry, Resource

KUBERNETES_VERSIONS = ("1.28", utils.latest_version())
CUSTOM_KINDS = {("ray.io/v1", "RayJob"), ("monitoring.coreos.com/v1", "PodMonitor"),
                ("monitoring.coreos.com/v1", "PrometheusRule")}
# The Prometheus Operator's Duration type (monitoring/v1 types.go).
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")


def validate_builtin(resource: dict) -> list[str]:
    """A built-in kind (Job, PersistentVolumeClaim, ...) against each version's strict schema."""
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            problems.append(f"{resource['kind']} (Kubernetes {version}): {path}: {exc.message}")
    return problems


def validate_definition(definition: str, data: object, version: str = utils.latest_version()) -> list[str]:
    """``data`` against one definition of the bundled schemas, e.g. ``io.k8s.api.core.v1.PodTemplateSpec``."""
    directory = f"kubernetes-json-schema/v{version}-local-strict"
    definitions = utils.schema_contents(f"{directory}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ Registry()
    schema = {"$schema": definitions["$schema"], "$ref": f"{definitions['$id']}#/$defs/{definition}"}
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [f"{'.'.join(str(p) for p in error.path)}: {error.message}" for error in validator.iter_errors(data)]


def _required(obj: dict, where: str, *fields: str) -> list[str]:
    return [f"{where}.{field} is required" for field in fields if obj.get(field) in (None, "")]


def rayjob_problems(job: dict) -> list[str]:
    problems = _required(job, "RayJob", "metadata", "spec")
    spec = job.get("spec") or {}
    problems += validate_definition("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", job.get("metadata", {}))
    cluster = spec.get("rayClusterSpec")
    if not cluster and not spec.get("clusterSelector"):
        return problems + ["RayJob.spec needs rayClusterSpec (or clusterSelector for an existing cluster)"]
    head = cluster.get("headGroupSpec") or {}
    problems += _required(cluster, "rayClusterSpec", "headGroupSpec")
    problems += _required(head, "headGroupSpec", "template")
    problems += [f"headGroupSpec.template: {p}" for p in
                 validate_definition("io.k8s.api.core.v1.PodTemplateSpec", head.get("template", {}))]
    names = [group.get("groupName") for group in cluster.get("workerGroupSpecs", [])]
    if len(set(names)) != len(names):
        problems.append(f"workerGroupSpecs: groupName must be unique, got {names}")
    for i, group in enumerate(cluster.get("workerGroupSpecs", [])):
        where = f"workerGroupSpecs[{i}]"
        problems += _required(group, where, "groupName", "template")
        problems += [f"{where}.template: {p}" for p in
                     validate_definition("io.k8s.api.core.v1.PodTemplateSpec", group.get("template", {}))]
        low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
        if not low <= group.get("replicas", low) <= high:
            problems.append(f"{where}: replicas must lie in [minReplicas, maxReplicas]")
    return problems


def podmonitor_problems(monitor: dict) -> list[str]:
    spec = monitor.get("spec") or {}
    problems = _required(monitor, "PodMonitor", "metadata", "spec") + _required(spec, "spec", "selector")
    problems += validate_definition("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", monitor.get("metadata", {}))
    problems += [f"spec.selector: {p}" for p in
                 validate_definition("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector", spec.get("selector", {}))]
    for i, endpoint in enumerate(spec.get("podMetricsEndpoints", [])):
        where = f"podMetricsEndpoints[{i}]"
        if not endpoint.get("port") and endpoint.get("targetPort") is None:
            problems.append(f"{where}: port (a container port's name) is required")
        for field in ("interval", "scrapeTimeout"):
            if field in endpoint and not DURATION.match(str(endpoint[field])):
                problems.append(f"{where}.{field}: {endpoint[field]!r} is not a Duration")
        if endpoint.get("scheme", "http") not in ("http", "https"):
            problems.append(f"{where}.scheme must be http or https")
    return problems


def prometheusrule_problems(rule: dict) -> list[str]:
    spec = rule.get("spec") or {}
    problems = _required(rule, "PrometheusRule", "metadata", "spec")
    problems += validate_definition("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", rule.get("metadata", {}))
    names = [group.get("name") for group in spec.get("groups", [])]
    if len(set(names)) != len(names):  # +listType=map, +listMapKey=name
        problems.append("spec.groups: group names must be unique")
    for group in spec.get("groups", []):
        where = f"group {group.get('name')!r}"
        if not group.get("name"):
            problems.append(f"{where}: name must not be empty")
        if "interval" in group and not DURATION.match(str(group["interval"])):
            problems.append(f"{where}.interval: {group['interval']!r} is not a Duration")
        for entry in group.get("rules", []):
            name = entry.get("alert") or entry.get("record")
            if bool(entry.get("alert")) == bool(entry.get("record")):
                problems.append(f"{where}: a rule needs exactly one of alert and record: {entry}")
            if not isinstance(entry.get("expr"), (str, int)) or entry.get("expr") == "":
                problems.append(f"{where} {name}: expr is required")
            if "for" in entry and not DURATION.match(str(entry["for"])):
                problems.append(f"{where} {name}: for {entry['for']!r} is not a Duration")
            for field in ("labels", "annotations"):
                if not all(isinstance(v, str) for v in (entry.get(field) or {}).values()):
                    problems.append(f"{where} {name}: {field} must map strings to strings")
            if entry.get("record") and entry.get("annotations"):
                problems.append(f"{where} {name}: annotations are only valid for alerting rules")
    return problems


CUSTOM_CHECKS = {"RayJob": rayjob_problems, "PodMonitor": podmonitor_problems,
                 "PrometheusRule": prometheusrule_problems}


def problems(resource: dict) -> list[str]:
    """Every problem of one manifest document, built-in or custom."""
    if (resource.get("apiVersion"), resource.get("kind")) in CUSTOM_KINDS:
        return CUSTOM_CHECKS[resource["kind"]](resource)
    return validate_builtin(resource)
