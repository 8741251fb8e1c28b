"""The Kubernetes example: the sidecar's flags parse, and ports, paths and job names line up."""

from pathlib import Path

import pytest
import yaml

from verl_exporter.config.options import load_options
from verl_exporter.config.yaml_files import load_shipped
from verl_exporter.http.server import parse_listen_address

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "prometheus" / "kubernetes"


@pytest.fixture(scope="module")
def pod():
    job = load_shipped((K8S / "verl-job-with-exporter.yaml").read_text())
    return job["spec"]["template"]


def container(pod, name):
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def test_sidecar_flags_are_accepted_by_the_exporter(pod):
    settings = load_options(container(pod, "verl-exporter")["args"])
    assert settings.source and settings.job_match


def test_ports_line_up(pod):
    sidecar = container(pod, "verl-exporter")
    _, port = parse_listen_address(load_options(sidecar["args"]).web_listen_address)
    assert sidecar["ports"] == [{"name": "metrics", "containerPort": port}]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    monitor = load_shipped((K8S / "podmonitor.yaml").read_text())
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
    source = load_options(sidecar["args"]).source[0]
    assert source.startswith(root + "/") and source.endswith(".jsonl")  # <root>/<project>/<experiment>.jsonl
    assert pod["spec"]["shareProcessNamespace"] is True  # --job.match sees the trainer's processes
    assert load_options(sidecar["args"]).job_match in " ".join(trainer["command"])


def test_scraped_as_the_job_the_alerts_watch():
    monitor = load_shipped((K8S / "podmonitor.yaml").read_text())
    relabel = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"targetLabel": "job", "replacement": "verl"} in relabel
    rules = "".join(path.read_text() for path in shipped.alert_rule_files())
    assert 'up{job="verl"}' in rules


# -- Every manifest validated offline; the RayJob, its PodMonitor and the PrometheusRule ---------------

import re  # noqa: E402

import k8s_schemas  # noqa: E402
from verl_exporter import shipped  # noqa: E402
from verl_mixin import generate  # noqa: E402
from verl_mixin import kubernetes as rule_generator  # noqa: E402


def documents(path):
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifest(name, kind):
    return next(doc for doc in documents(K8S / name) if doc["kind"] == kind)


def rayjob_pods():
    """(group name, pod template) of the RayJob's head and of every worker group."""
    cluster = manifest("verl-rayjob.yaml", "RayJob")["spec"]["rayClusterSpec"]
    return [("head", cluster["headGroupSpec"]["template"])] + [
        (group["groupName"], group["template"]) for group in cluster["workerGroupSpecs"]]


def expanded_args(container):
    """The container's args with $(VAR) replaced from its env, as the kubelet does."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg) for arg in container["args"]]


def entrypoint_setting(key):
    entrypoint = manifest("verl-rayjob.yaml", "RayJob")["spec"]["entrypoint"]
    return re.search(rf"(?:^|\s){re.escape(key)}=(\S+)", entrypoint)[1]


@pytest.mark.parametrize("path", sorted(K8S.glob("*.y*ml")), ids=lambda p: p.name)
def test_manifest_validates_offline(path):
    docs = documents(path)
    if path.name.endswith(".patch.yaml"):  # a strategic merge patch: check the Job it makes
        docs = [strategic_merge(load_shipped((K8S / "verl-job-with-exporter.yaml").read_text()), docs[0])]
    assert docs
    for doc in docs:
        assert k8s_schemas.problems(doc) == [], f"{path.name}: {doc['kind']}"


def test_validation_catches_what_the_api_server_or_operator_would_refuse():
    job = manifest("verl-rayjob.yaml", "RayJob")
    worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    worker["template"]["spec"]["containers"][1]["ports"][0]["containerPort"] = "9945"
    worker["template"]["spec"]["containers"][1]["args"].append({"--job.match=ray:": None})  # unquoted "ray::"
    del worker["groupName"]
    worker["replicas"] = 5
    found = "\n".join(k8s_schemas.problems(job))
    for expected in ("containerPort: '9945' is not of type 'integer'", "args.4: {'--job.match=ray:': None} is not",
                     "workerGroupSpecs[0].groupName is required", "replicas must lie in"):
        assert expected in found
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": {"name": "x"},
            "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "record": "b", "expr": "up", "for": "10 min"}]},
                                {"name": "g", "rules": [{"record": "r", "expr": "up", "labels": {"n": 1}}]}]}}
    found = "\n".join(k8s_schemas.problems(rule))
    for expected in ("group names must be unique", "exactly one of alert and record", "'10 min' is not a Duration",
                     "labels must map strings to strings"):
        assert expected in found
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replicas": "two"}}
    assert any("'two' is not of type 'integer'" in p for p in k8s_schemas.problems(deployment))


def test_every_rayjob_pod_has_the_exporter_sidecar():
    for group, pod in rayjob_pods():
        sidecar = container(pod, "verl-exporter")
        settings = load_options(expanded_args(sidecar))
        _, port = parse_listen_address(settings.web_listen_address)
        assert sidecar["ports"] == [{"name": "verl-exporter", "containerPort": port}], group
        names = [p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])]
        assert len(names) == len(set(names)) and "metrics" in names, group  # KubeRay's Ray metrics port
        assert pod["spec"]["shareProcessNamespace"] is True, group
        assert pod["spec"]["containers"][0]["name"].startswith("ray-"), group  # KubeRay runs Ray in containers[0]
        assert re.search(settings.job_match, "ray::WorkerDict.actor_rollout_generate_sequences"), group
        # Every exporter, worker or head, names the run the trainer writes.
        assert (settings.project, settings.experiment) == (
            entrypoint_setting("trainer.project_name"), entrypoint_setting("trainer.experiment_name")), group
        assert not any("$(" in arg for arg in expanded_args(sidecar)), group


def test_the_head_exporter_reads_the_logs_every_node_writes():
    job = manifest("verl-rayjob.yaml", "RayJob")
    root = load_shipped(job["spec"]["runtimeEnvYAML"])["env_vars"]["VERL_FILE_LOGGER_ROOT"]
    claim = manifest("verl-rayjob.yaml", "PersistentVolumeClaim")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    assert "'file'" in entrypoint_setting("trainer.logger").replace('"', "'")
    for group, pod in rayjob_pods():  # wherever Ray places the TaskRunner, its log lands on the claim
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        ray = pod["spec"]["containers"][0]
        mount = next(m for m in ray["volumeMounts"] if m["mountPath"] == root)
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"], group
    _, head = rayjob_pods()[0]
    sidecar = container(head, "verl-exporter")
    source = load_options(expanded_args(sidecar)).source
    assert len(source) == 1 and source[0].startswith(root + "/") and source[0].endswith(".jsonl")
    assert {"name": "verl-logs", "mountPath": root, "readOnly": True} in sidecar["volumeMounts"]
    for group, pod in rayjob_pods()[1:]:
        assert load_options(expanded_args(container(pod, "verl-exporter"))).source == (), group


def test_rayjob_podmonitor_scrapes_every_sidecar_as_job_verl_and_keeps_the_run_labels():
    monitor = manifest("podmonitor-rayjob.yaml", "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    endpoints = {e["port"]: e for e in monitor["spec"]["podMetricsEndpoints"]}
    for group, pod in rayjob_pods():
        assert selector.items() <= pod["metadata"]["labels"].items(), group
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert set(endpoints) <= ports, group
        # podmonitor.yaml scrapes the port "metrics" as job verl: it must not select Ray pods.
        other = load_shipped((K8S / "podmonitor.yaml").read_text())["spec"]["selector"]["matchLabels"]
        assert not other.items() <= pod["metadata"]["labels"].items(), group
    exporter = endpoints["verl-exporter"]
    assert exporter["honorLabels"] is True
    assert {"targetLabel": "job", "replacement": "verl"} in exporter["relabelings"]
    assert {"targetLabel": "job", "replacement": "ray"} in endpoints["metrics"]["relabelings"]
    relabeled = {r.get("targetLabel") for e in endpoints.values() for r in e.get("relabelings", [])}
    assert not relabeled & {"project", "experiment"}


def test_prometheusrule_holds_the_groups_of_the_rule_files():
    rule = manifest("prometheusrule.yml", "PrometheusRule")
    files = shipped.rule_files()
    groups = [group for path in files for group in load_shipped(path.read_text())["groups"]]
    assert rule["spec"]["groups"] == groups
    assert sum(len(g["rules"]) for g in groups) > 40


def test_prometheusrule_is_what_the_generator_writes(tmp_path):
    assert (K8S / "prometheusrule.yml").read_text() == rule_generator.prometheus_rule(), "run: make generate"
    assert rule_generator.PROMETHEUS_RULE_FILE not in generate.stale_files(ROOT)
    stale = tmp_path / rule_generator.PROMETHEUS_RULE_FILE
    stale.parent.mkdir(parents=True)
    stale.write_text(rule_generator.prometheus_rule().replace("for: 10m", "for: 11m", 1))
    assert rule_generator.PROMETHEUS_RULE_FILE in generate.stale_files(tmp_path)
    stale.write_text(rule_generator.prometheus_rule())
    assert rule_generator.PROMETHEUS_RULE_FILE not in generate.stale_files(tmp_path)


# --- the secured variant: secured-exporter.yaml and the patch of the Job ---------------------------


def strategic_merge(base, patch, key: str | None = None):
    """Kubernetes' strategic merge for what the patch uses: mappings merged, null deletes, lists of
    mappings merged by ``name`` (volumeMounts by ``mountPath``), other lists replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for name, value in patch.items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = strategic_merge(base.get(name), value, name)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and patch and isinstance(patch[0], dict):
        field = "mountPath" if key == "volumeMounts" else "name"
        merged = list(base)
        for item in patch:
            index = next((i for i, old in enumerate(merged) if old.get(field) == item[field]), None)
            if index is None:
                merged.append(item)
            else:
                merged[index] = strategic_merge(merged[index], item)
        return merged
    return patch


@pytest.fixture(scope="module")
def secured():
    job = load_shipped((K8S / "verl-job-with-exporter.yaml").read_text())
    patched = strategic_merge(job, load_shipped((K8S / "secured-exporter.patch.yaml").read_text()))
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all((K8S / "secured-exporter.yaml").read_text())}
    return patched["spec"]["template"], documents


def test_secured_sidecar_adds_only_the_web_config_flag(pod, secured):
    secured_pod, documents = secured
    sidecar = container(secured_pod, "verl-exporter")
    assert sidecar["args"] == container(pod, "verl-exporter")["args"] + [sidecar["args"][-1]]
    settings = load_options(sidecar["args"])
    directory, _, name = settings.web_config_file.rpartition("/")
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    volumes = {v["name"]: v for v in secured_pod["spec"]["volumes"]}
    secret = volumes[mounts[directory]]["secret"]["secretName"]
    assert secret == documents["Secret"]["metadata"]["name"] and name in documents["Secret"]["stringData"]
    assert mounts["/verl-logs"] == "verl-logs"  # still reads the trainer's logs
    for probe in ("readinessProbe", "livenessProbe"):  # every endpoint asks for the password
        expected = {**container(pod, "verl-exporter")[probe], "tcpSocket": {"port": "metrics"}}
        del expected["httpGet"]
        assert sidecar[probe] == expected


def test_secured_web_config_uses_the_mounted_tls_secret(tmp_path, secured):
    from certs import make_pki
    from verl_exporter.http import web_config

    secured_pod, documents = secured
    sidecar = container(secured_pod, "verl-exporter")
    text = next(iter(documents["Secret"]["stringData"].values()))
    tls = load_shipped(text)["tls_server_config"]
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    volumes = {v["name"]: v for v in secured_pod["spec"]["volumes"]}
    for key, file_name in (("cert_file", "tls.crt"), ("key_file", "tls.key")):  # a kubernetes.io/tls Secret
        directory, _, name = tls[key].rpartition("/")
        assert name == file_name and volumes[mounts[directory]]["secret"]["secretName"] == "verl-exporter-tls"
    pki = make_pki(tmp_path / "pki")
    local = text.replace(tls["cert_file"], str(pki.server_cert)).replace(tls["key_file"], str(pki.server_key))
    (tmp_path / "web-config.yml").write_text(local)
    web = web_config.load(str(tmp_path / "web-config.yml"))
    assert web.tls_context is not None and web.check_password("prometheus", "change-me")


def test_secured_pods_are_scraped_over_https_by_their_own_podmonitor(pod, secured):
    secured_pod, documents = secured
    monitor = documents["PodMonitor"]
    plain = load_shipped((K8S / "podmonitor.yaml").read_text())
    labels = secured_pod["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert not plain["spec"]["selector"]["matchLabels"].items() <= labels.items()  # no plain http scrape left
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["port"] == "metrics"
    assert {"targetLabel": "job", "replacement": "verl"} in endpoint["relabelings"]
    refs = {endpoint["basicAuth"]["username"]["name"], endpoint["basicAuth"]["password"]["name"],
            endpoint["tlsConfig"]["ca"]["secret"]["name"]}
    assert refs == {"verl-exporter-scrape"} and endpoint["tlsConfig"]["serverName"]
    text = (K8S / "secured-exporter.yaml").read_text()
    assert "create secret tls verl-exporter-tls" in text and "create secret generic verl-exporter-scrape" in text
    assert secured_pod["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
