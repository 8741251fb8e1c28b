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
    job = yaml.safe_load((K8S / "verl-job-with-exporter.yaml").read_text())
    patched = strategic_merge(job, yaml.safe_load((K8S / "secured-exporter.patch.yaml").read_text()))
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all((K8S / "secured-exporter.yaml").read_text())}
    return patched["spec"]["template"], documents


def test_secured_sidecar_adds_only_the_web_config_flag(pod, secured):
    secured_pod, documents = secured
    sidecar = container(secured_pod, "verl-exporter")
    assert sidecar["args"] == container(pod, "verl-exporter")["args"] + [sidecar["args"][-1]]
    settings = config.load(sidecar["args"])
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

    from verl_exporter import web_config

    secured_pod, documents = secured
    sidecar = container(secured_pod, "verl-exporter")
    text = next(iter(documents["Secret"]["stringData"].values()))
    tls = yaml.safe_load(text)["tls_server_config"]
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
    plain = yaml.safe_load((K8S / "podmonitor.yaml").read_text())
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
