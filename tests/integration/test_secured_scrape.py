"""A real Prometheus scrapes an exporter that serves TLS, asks for a client certificate and a
password: up is 1 with the right settings, 0 with a wrong password, no client certificate or plain
HTTP. Certificates are made at test time."""

from __future__ import annotations

import base64
import json
import ssl

import pytest

from certs import PASSWORD, make_pki, password_hash, write_web_config
from servers import prom_query, start_exporter, start_prometheus, wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("secured")
    pki = make_pki(tmp_path / "pki")
    web = write_web_config(tmp_path / "web-config.yml", {
        "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
                              "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)},
        "basic_auth_users": {"prometheus": password_hash()},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    })
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    auth = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()}
    (tmp_path / "password").write_text(PASSWORD + "\n")
    (tmp_path / "wrong-password").write_text("not the password\n")

    def job(name: str, password_file: str = "password", client_cert: bool = True, scheme: str = "https") -> dict:
        tls = {"ca_file": str(pki.ca)}
        if client_cert:
            tls.update(cert_file=str(pki.client_cert), key_file=str(pki.client_key))
        return {"job_name": name, "scheme": scheme, "scrape_interval": "1s", "scrape_timeout": "1s",
                "basic_auth": {"username": "prometheus", "password_file": str(tmp_path / password_file)},
                "tls_config": tls, "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}

    with start_exporter(tmp_path, "--web.config.file", str(web), "--gpu.fake", "healthy:1", "--no-collector.host",
                        context=context, headers=auth) as exporter:
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": [
            job("verl"),
            job("wrong-password", password_file="wrong-password"),
            job("no-client-cert", client_cert=False),
            job("plain-http", scheme="http"),
        ]}
        with start_prometheus(tmp_path, config) as prometheus:
            yield prometheus, exporter


def up(prometheus) -> dict[str, float]:
    return {sample["metric"]["job"]: float(sample["value"][1]) for sample in prom_query(prometheus, "up")}


def test_prometheus_scrapes_the_secured_exporter(stack):
    prometheus, exporter = stack
    wait_until(lambda: len(up(prometheus)) == 4, timeout=30, message="a scrape of every job")
    assert up(prometheus) == {"verl": 1, "wrong-password": 0, "no-client-cert": 0, "plain-http": 0}
    gpus = wait_until(lambda: prom_query(prometheus, 'verl_gpu_info{job="verl"}'), message="GPU metrics stored")
    assert len(gpus) == 1
    assert prom_query(prometheus, 'verl_gpu_info{job!="verl"}') == []
    assert exporter.process.poll() is None and "Traceback" not in exporter.log()


def test_why_the_other_jobs_fail(stack):
    prometheus, _ = stack
    _, body = prometheus.get("/api/v1/targets")
    errors = {target["labels"]["job"]: target["lastError"] for target in json.loads(body)["data"]["activeTargets"]}
    assert errors["verl"] == ""
    assert "401" in errors["wrong-password"]
    assert errors["no-client-cert"] and errors["plain-http"]
    assert "400" in errors["plain-http"]
