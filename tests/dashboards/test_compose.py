"""docker-compose.yml, the exporter's Dockerfile and Grafana's provisioning agree with the repository.

No Docker engine runs here, so this checks what can be checked for real: the compose file parses,
every path it mounts exists, its ports match prometheus/prometheus.yml and Grafana's data sources,
images are pinned, the exporter's command line is accepted by the exporter's own flag parser, and
the stack is closed by default (loopback only, no lifecycle API, no default Grafana password).
"""

from __future__ import annotations

import copy
import glob
import os
import re

import pytest
import yaml
from compose_checks import (
    MissingVariable,
    container_to_host,
    exposure_problems,
    image_problems,
    interpolate,
    load_compose,
    mount_problems,
    prometheus_targets,
    published_port_problems,
    raw_compose,
    target_problems,
    url_problems,
)
from dashboard_models import REPO

from verl_exporter import shipped
from verl_exporter.config.options import OptionsError, load_options

STACK_ENV = {"GRAFANA_ADMIN_PASSWORD": "the-users-own-password"}  # what `docker compose up` needs set
COMPOSE = load_compose(env=STACK_ENV)
PROMETHEUS_YML = REPO / "prometheus" / "prometheus.yml"
PROVISIONING = REPO / "grafana" / "provisioning"


def prometheus_config() -> dict:
    if not PROMETHEUS_YML.exists():
        pytest.fail("prometheus/prometheus.yml is missing; docker-compose.yml mounts it")
    return yaml.safe_load(PROMETHEUS_YML.read_text())


def test_compose_has_the_stack():
    assert {"exporter", "exporter-gpu", "prometheus", "alertmanager", "grafana"} <= set(COMPOSE["services"])
    assert COMPOSE["services"]["exporter-gpu"]["profiles"] == ["gpu"]
    assert "profiles" not in COMPOSE["services"]["exporter"]


def test_every_mounted_path_exists():
    assert mount_problems(COMPOSE) == []


def test_a_missing_mount_or_dockerfile_is_reported(tmp_path):
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["grafana"]["volumes"].append("./grafana/no-such-folder:/etc/nothing:ro")
    broken["services"]["exporter"]["build"] = {"context": ".", "dockerfile": "exporter/Dockerfile.missing"}
    assert mount_problems(broken) == [
        "exporter builds from a missing Dockerfile",
        "grafana mounts ./grafana/no-such-folder, which does not exist",
    ]


def test_images_are_pinned_and_every_service_has_a_healthcheck():
    assert image_problems(COMPOSE) == []
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["grafana"]["image"] = "grafana/grafana:latest"
    del broken["services"]["alertmanager"]["healthcheck"]
    assert image_problems(broken) == ["alertmanager: no healthcheck", "grafana: image 'grafana/grafana:latest' "
                                      "is not pinned to a version"]


def test_prometheus_targets_are_services_of_the_stack_on_their_ports():
    prom = prometheus_config()
    assert target_problems(COMPOSE, prom) == []
    targets = dict((where.split(" (")[0], target) for where, target in prometheus_targets(COMPOSE, prom))
    assert targets["job 'verl'"].endswith(":9945") and targets["alerting"].endswith(":9093")


def test_a_port_mismatch_is_reported():
    prom = prometheus_config()
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["exporter"]["command"][0] = "--web.listen-address=:9100"
    broken["services"]["exporter-gpu"]["command"][0] = "--web.listen-address=:9100"
    assert any("nothing listens on 9945" in p for p in target_problems(broken, prom))
    alone = copy.deepcopy(COMPOSE)
    del alone["services"]["alertmanager"]["network_mode"]
    assert any("nothing listens on 9093" in p for p in target_problems(alone, prom))
    alone["services"]["prometheus"]["ports"].append("127.0.0.1:9093:9093")
    assert any("nothing listens on 9093" in p for p in published_port_problems(alone))
    # Docker forwards a published port to the container's address, not to its loopback.
    published = copy.deepcopy(COMPOSE)
    published["services"]["prometheus"]["ports"].append("127.0.0.1:9093:9093")
    assert published_port_problems(published) == [
        "prometheus: publishes 127.0.0.1:9093 but alertmanager listens on loopback only"]


def test_rule_files_of_prometheus_yml_are_mounted():
    for pattern in prometheus_config().get("rule_files", []):
        container_path = os.path.normpath(pattern if pattern.startswith("/") else f"/etc/prometheus/{pattern}")
        host = container_to_host(COMPOSE, "prometheus", container_path)
        assert host is not None, f"{container_path} is not mounted into prometheus"
        assert glob.glob(str(host)), f"rule files {pattern} match nothing ({host})"


def test_alertmanager_config_and_templates_are_mounted():
    command = COMPOSE["services"]["alertmanager"]["command"]
    config_path = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--config.file="))
    host = container_to_host(COMPOSE, "alertmanager", config_path)
    assert host == shipped.alertmanager_config().resolve() and host.is_file()
    am_config = yaml.safe_load(host.read_text())
    for pattern in am_config.get("templates", []):
        templates = container_to_host(COMPOSE, "alertmanager", f"/etc/alertmanager/{pattern}")
        assert templates is not None and glob.glob(str(templates)), pattern
    secret_files = re.findall(r"_file:\s*(\S+)", host.read_text())
    for path in secret_files:  # where secrets are read from is mounted (the files themselves are the user's)
        assert container_to_host(COMPOSE, "alertmanager", path) is not None, path


def test_exporter_commands_are_accepted_by_the_exporter():
    for name in ("exporter", "exporter-gpu"):
        settings = load_options(COMPOSE["services"][name]["command"])
        assert settings.web_listen_address == ":9945"
    demo = load_options(COMPOSE["services"]["exporter"]["command"])
    assert demo.simulate == "lr-too-high" and demo.gpu_fake == "healthy:8"
    gpu = COMPOSE["services"]["exporter-gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert gpu["network_mode"] == COMPOSE["services"]["exporter"]["network_mode"] == "service:prometheus"
    with pytest.raises(OptionsError):
        load_options(["--web.listen-address=:9945", "--simulate.format=yaml"])


def test_grafana_datasources_point_at_the_stack():
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "verl.yml").read_text())["datasources"]
    by_type = {d["type"]: d for d in datasources}
    assert set(by_type) == {"prometheus", "alertmanager"}
    assert url_problems(COMPOSE, "grafana", [d["url"] for d in datasources]) == []
    assert url_problems(COMPOSE, "grafana", ["http://localhost:9091"]) != []
    assert url_problems(COMPOSE, "grafana", ["http://alertmanager:9093"]) != []  # no address of its own
    # $__rate_interval is right only if Grafana knows Prometheus' scrape interval.
    scrape_interval = prometheus_config().get("global", {}).get("scrape_interval", "1m")
    assert by_type["prometheus"]["jsonData"]["timeInterval"] == scrape_interval


def test_grafana_loads_the_generated_dashboards():
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "verl.yml").read_text())["providers"]
    assert len(providers) == 1 and providers[0]["allowUiUpdates"] is False
    host = container_to_host(COMPOSE, "grafana", providers[0]["options"]["path"])
    assert host == shipped.dashboards_dir().resolve()
    assert sorted(p.name for p in host.glob("*.json")) == ["fleet-overview.json", "gpu-nodes.json", "run-detail.json"]
    home = COMPOSE["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert container_to_host(COMPOSE, "grafana", home).is_file()
    for kind in ("datasources", "dashboards"):
        assert container_to_host(COMPOSE, "grafana", f"/etc/grafana/provisioning/{kind}") == (PROVISIONING / kind)


def test_published_ports_are_local_and_served():
    assert published_port_problems(COMPOSE) == []
    published = {int(p.split(":")[-1]) for p in COMPOSE["services"]["prometheus"]["ports"]}
    assert published == {9090, 3000, 9945}  # Alertmanager only on the stack's loopback


def test_the_stack_is_closed_by_default():
    assert exposure_problems(raw_compose()) == []
    assert exposure_problems(merged_compose(raw_compose(), raw_compose(SECURED))) == []
    command = COMPOSE["services"]["alertmanager"]["command"]
    assert "--web.listen-address=127.0.0.1:9093" in command  # Prometheus and Grafana reach it there


def test_an_open_stack_is_reported():
    opened = raw_compose()
    services = opened["services"]
    services["prometheus"]["ports"] = ["9090:9090", "0.0.0.0:9093:9093", {"target": 3000, "published": 3000}]
    services["prometheus"]["command"].append("--web.enable-lifecycle")
    services["alertmanager"]["command"] = [arg for arg in services["alertmanager"]["command"]
                                           if not arg.startswith("--web.listen-address=")]
    env = services["grafana"]["environment"]
    env.update(GF_SECURITY_ADMIN_PASSWORD="admin", GF_AUTH_ANONYMOUS_ENABLED="true")
    assert exposure_problems(opened) == [
        "prometheus: port 9090 is published on every address",
        "alertmanager: port 9093 is published on 0.0.0.0",
        "grafana: port 3000 is published on every address",
        "prometheus: --web.enable-lifecycle on a published port",
        "alertmanager: its API (silences) answers on every address, without a password",
        "grafana: GF_SECURITY_ADMIN_PASSWORD 'admin' is not required from the user",
        "grafana: anonymous access is on",
    ]
    del env["GF_SECURITY_ADMIN_PASSWORD"]
    assert "grafana: no GF_SECURITY_ADMIN_PASSWORD: the admin login is admin/admin" in exposure_problems(opened)
    env["GF_SECURITY_ADMIN_PASSWORD"] = "${GRAFANA_ADMIN_PASSWORD:-admin}"  # a default is no better
    assert "grafana: GF_SECURITY_ADMIN_PASSWORD '${GRAFANA_ADMIN_PASSWORD:-admin}' is not required from the user" \
        in exposure_problems(opened)


def test_compose_refuses_to_start_without_a_grafana_password():
    for env in (None, {"GRAFANA_ADMIN_PASSWORD": ""}):
        with pytest.raises(MissingVariable, match="GRAFANA_ADMIN_PASSWORD"):
            load_compose(env=env)
    assert COMPOSE["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "the-users-own-password"
    assert interpolate("${A?a} ${B-b} ${C:-c} ${D-d}", {"A": "", "B": "", "D": "x"}) == "  c x"


def test_exporter_dockerfile():
    text = (REPO / "exporter" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11\.\d+-slim-\w+$", text, re.M), "base image not pinned to a patch release"
    assert re.search(r"^RUN pip install '?\.(\[forensics\])?'? ", text, re.M), "installs the package (with py-spy)"
    user = re.search(r"^USER (\S+)$", text, re.M)
    assert user and user.group(1) not in ("root", "0")
    assert re.search(r"^EXPOSE 9945$", text, re.M)
    assert "HEALTHCHECK" in text and "/-/healthy" in text
    ignore = (REPO / "exporter" / "Dockerfile.dockerignore").read_text().split()
    copied = re.findall(r"^COPY (.+) \S+$", text, re.M)
    for source in " ".join(copied).split():
        assert f"!{source}" in ignore and (REPO / source).exists(), f"{source} is not in the build context"


# --- the opt-in secured stack: docker-compose.secured.yml on top of docker-compose.yml -------------

SECURED = REPO / "docker-compose.secured.yml"
SECURED_PROMETHEUS_YML = REPO / "prometheus" / "prometheus-secured.example.yml"
WEB_CONFIG_EXAMPLE = REPO / "prometheus" / "web-config.example.yml"
SECRETS_DIR = "/srv/verl-web"  # what a user sets VERL_WEB_CONFIG_DIR to


def merged_compose(base: dict, override: dict) -> dict:
    """``docker compose -f base -f override``: commands replaced, volumes merged by target, other
    mappings merged key by key."""
    merged = copy.deepcopy(base)
    for name, service in override["services"].items():
        target = merged["services"][name]
        for key, value in service.items():
            if key == "volumes":
                def where(volume):
                    return volume.split(":")[1] if isinstance(volume, str) else volume["target"]
                kept = [v for v in target.get("volumes", []) if where(v) not in {where(n) for n in value}]
                target["volumes"] = kept + value
            elif isinstance(value, dict) and isinstance(target.get(key), dict):
                target[key] = {**target[key], **value}
            else:
                target[key] = value
    return merged


@pytest.fixture(scope="module")
def secured():
    env = {**STACK_ENV, "VERL_WEB_CONFIG_DIR": SECRETS_DIR}
    override = load_compose(SECURED, env=env)
    return override, merged_compose(load_compose(env=env), override)


def test_secured_exporters_add_only_the_web_config_flag(secured):
    override, merged = secured
    assert set(override["services"]) == {"exporter", "exporter-gpu", "prometheus"}
    for name in ("exporter", "exporter-gpu"):
        command = merged["services"][name]["command"]
        assert command == COMPOSE["services"][name]["command"] + [command[-1]]
        settings = load_options(command)
        assert settings.web_config_file == "/etc/verl-exporter/web-config.yml"
        host = container_to_host(merged, name, settings.web_config_file)
        assert str(host) == f"{SECRETS_DIR}/web-config.yml"
        assert "9945" in " ".join(merged["services"][name]["healthcheck"]["test"])
        assert "http://" not in " ".join(merged["services"][name]["healthcheck"]["test"])  # it needs a password
    assert mount_problems(merged) == []  # the secrets' directory itself is the user's
    assert merged["services"]["exporter-gpu"]["volumes"][0]["target"] == "/verl-logs"  # the logs stay mounted


def test_secured_prometheus_reads_the_secrets_the_exporter_is_given(secured):
    _, merged = secured
    command = merged["services"]["prometheus"]["command"]
    base = COMPOSE["services"]["prometheus"]["command"]
    assert command[1:] == base[1:] and command[0] == "--config.file=/etc/prometheus/prometheus-secured.example.yml"
    assert container_to_host(merged, "prometheus", command[0].split("=", 1)[1]) == SECURED_PROMETHEUS_YML.resolve()
    job = next(job for job in yaml.safe_load(SECURED_PROMETHEUS_YML.read_text())["scrape_configs"]
               if job["job_name"] == "verl")
    assert job["scheme"] == "https"
    for path in (job["basic_auth"]["password_file"], job["tls_config"]["ca_file"]):
        assert str(container_to_host(merged, "prometheus", path)).startswith(SECRETS_DIR + "/"), path
    assert target_problems(merged, yaml.safe_load(SECURED_PROMETHEUS_YML.read_text())) == []


def test_secured_prometheus_config_differs_only_in_how_verl_is_scraped():
    plain, secured = prometheus_config(), yaml.safe_load(SECURED_PROMETHEUS_YML.read_text())
    for job in secured["scrape_configs"]:
        if job["job_name"] == "verl":
            assert {"scheme", "basic_auth", "tls_config"} <= set(job)
            assert "password" not in job["basic_auth"]  # the password is a file
            for key in ("scheme", "basic_auth", "tls_config"):
                del job[key]
    assert secured == plain


def test_web_config_example_loads(tmp_path):
    """The example, beside a certificate and key, is a valid web config; its comment names the password."""
    from certs import make_pki
    from verl_exporter.http import web_config

    pki = make_pki(tmp_path / "pki")
    for source, name in ((pki.server_cert, "server.crt"), (pki.server_key, "server.key"), (pki.ca, "ca.crt")):
        (tmp_path / name).write_bytes(source.read_bytes())
    example = tmp_path / "web-config.yml"
    example.write_text(WEB_CONFIG_EXAMPLE.read_text())
    web = web_config.load(str(example))
    assert web.tls_context is not None and set(web.users) == {"prometheus"}
    assert web.headers == {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "deny"}
    assert web.check_password("prometheus", "change-me") and '"change-me": replace it' in example.read_text()
    # Its commented mutual-TLS lines work once uncommented.
    example.write_text(example.read_text().replace("  # client_auth_type:", "  client_auth_type:")
                       .replace("  # client_ca_file:", "  client_ca_file:"))
    assert web_config.load(str(example)).tls_context.verify_mode == __import__("ssl").CERT_REQUIRED
