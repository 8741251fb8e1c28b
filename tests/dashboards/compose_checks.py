"""Static checks of docker-compose.yml against the files it mounts and the configs that name its ports.

No Docker engine is needed: each function returns a list of problems (empty when all is well), so the
tests can show a broken file is caught too.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import yaml
from dashboard_models import REPO

# Port each service listens on inside the stack, and where that is decided.
IMAGE_PORTS = {"prometheus": 9090, "alertmanager": 9093, "grafana": 3000}
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
PINNED_IMAGE = re.compile(r"^[\w./-]+:v?\d+\.\d+\.\d+[\w.-]*$")


class MissingVariable(ValueError):
    """A ``${VAR:?message}`` (or ``${VAR?message}``) whose variable is not set: compose refuses to start."""


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?message}`` and
    ``${VAR?message}`` with the given env (default: none set)."""
    env = env or {}

    def replace(match: re.Match) -> str:
        name, colon, kind, word = match.groups()
        value = env.get(name)
        unset = value is None or (colon == ":" and value == "")
        if kind == "?" and unset:
            raise MissingVariable(f"{name}: {word}")
        return (word or "") if kind == "-" and unset else (value or "")

    return re.sub(r"\$\{(\w+)(?:(:?)([-?])([^}]*))?\}", replace, text).replace("$$", "$")


def load_compose(path: Path = REPO / "docker-compose.yml", env: dict[str, str] | None = None) -> dict:
    return yaml.safe_load(interpolate(path.read_text(encoding="utf-8"), env))


def raw_compose(path: Path = REPO / "docker-compose.yml") -> dict:
    """The compose file as written, its ``${...}`` left as they are."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def mounts(service: dict) -> list[dict]:
    """Bind mounts of a service as {source, target, may_be_missing}; named volumes are left out.

    Only a long-syntax bind with ``create_host_path: true`` may be missing (Docker creates the
    directory); short syntax would also create one, which hides a missing file, so it must exist.
    """
    found = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                found.append({"source": source, "target": target, "may_be_missing": False})
        elif volume.get("type") == "bind":
            found.append({"source": volume["source"], "target": volume["target"],
                          "may_be_missing": bool(volume.get("bind", {}).get("create_host_path", False))})
    return found


def host_path(source: str, root: Path = REPO) -> Path:
    return (root / source).resolve() if not source.startswith("/") else Path(source)


def mount_problems(compose: dict, root: Path = REPO) -> list[str]:
    """Every repository path a service mounts exists, and so does every Dockerfile it builds from.

    Absolute host paths (a run's log directory) belong to the host and are not checked.
    """
    problems = []
    for name, service in compose["services"].items():
        for mount in mounts(service):
            if mount["source"].startswith("/") or mount["may_be_missing"]:
                continue
            if not host_path(mount["source"], root).exists():
                problems.append(f"{name} mounts {mount['source']}, which does not exist")
        build = service.get("build")
        if build:
            context = root / build.get("context", ".")
            if not (context / build.get("dockerfile", "Dockerfile")).is_file():
                problems.append(f"{name} builds from a missing Dockerfile")
    return problems


def container_to_host(compose: dict, service: str, container_path: str, root: Path = REPO) -> Path | None:
    """The repository path a service sees at ``container_path``, through its bind mounts."""
    for mount in sorted(mounts(compose["services"][service]), key=lambda m: -len(m["target"])):
        target = mount["target"].rstrip("/")
        if container_path == target or container_path.startswith(target + "/"):
            return host_path(mount["source"], root) / container_path[len(target):].lstrip("/")
    return None


def network_owner(compose: dict, service: str) -> str:
    """The service whose network namespace ``service`` lives in (``network_mode: service:X``)."""
    mode = compose["services"][service].get("network_mode", "")
    return mode.split(":", 1)[1] if mode.startswith("service:") else service


def listen_address(name: str, service: dict) -> tuple[str, int | None]:
    """Address and port a service listens on: its ``--web.listen-address`` flag, else its image's
    default port on every address ("")."""
    host, port = "", IMAGE_PORTS.get(name)
    for arg in service.get("command", []) or []:
        match = re.match(r"--web\.listen-address=(.*):(\d+)$", str(arg))
        if match:
            host, port = match.group(1), int(match.group(2))
    return host, port


def listen_port(name: str, service: dict) -> int | None:
    """Port a service listens on: its ``--web.listen-address`` flag, else its image's default."""
    return listen_address(name, service)[1]


def listeners(compose: dict) -> dict[str, dict[int, list[str]]]:
    """For each network namespace (by owning service): port -> services listening on it."""
    found: dict[str, dict[int, list[str]]] = {}
    for name, service in compose["services"].items():
        port = listen_port(name, service)
        if port is not None:
            found.setdefault(network_owner(compose, name), {}).setdefault(port, []).append(name)
    return found


def reach_problem(compose: dict, client: str, target: str) -> str | None:
    """Why ``client`` cannot reach ``host:port`` in the stack, or None if a service listens there."""
    host, _, port = target.rpartition(":")
    if host in ("localhost", "127.0.0.1"):
        owner = network_owner(compose, client)
    elif host in compose["services"] and network_owner(compose, host) == host:
        owner = host
    else:
        return f"{target}: {host} is not a service with its own address in docker-compose.yml"
    if int(port) not in listeners(compose).get(owner, {}):
        return f"{target}: nothing listens on {port} in the network of {owner}"
    return None


def prometheus_targets(compose: dict, prometheus_config: dict) -> list[tuple[str, str]]:
    """(where, host:port) of every static and file_sd target of prometheus.yml, and of its Alertmanagers."""
    found = []
    for job in prometheus_config.get("scrape_configs", []):
        for static in job.get("static_configs", []):
            found += [(f"job {job['job_name']!r}", t) for t in static.get("targets", [])]
        for file_sd in job.get("file_sd_configs", []):
            for pattern in file_sd.get("files", []):
                host = container_to_host(compose, "prometheus", f"/etc/prometheus/{pattern}")
                for path in sorted(glob.glob(str(host))) if host else []:
                    for group in yaml.safe_load(Path(path).read_text()) or []:
                        found += [(f"job {job['job_name']!r} ({Path(path).name})", t) for t in group["targets"]]
    for alertmanager in prometheus_config.get("alerting", {}).get("alertmanagers", []):
        for static in alertmanager.get("static_configs", []):
            found += [("alerting", t) for t in static.get("targets", [])]
    return found


def target_problems(compose: dict, prometheus_config: dict) -> list[str]:
    """Every target of prometheus.yml (scrape, file_sd, alerting) is a service of the stack on its port."""
    targets = prometheus_targets(compose, prometheus_config)
    problems = [f"{where}: {problem}" for where, target in targets
                if (problem := reach_problem(compose, "prometheus", target))]
    if not any(where.startswith("alerting") for where, _ in targets):
        problems.append("prometheus.yml sends alerts to no Alertmanager")
    return problems


def url_problems(compose: dict, client: str, urls: list[str]) -> list[str]:
    """``http://host:port`` URLs used by ``client`` (Grafana's data sources) reach a service of the stack."""
    problems = []
    for url in urls:
        match = re.match(r"https?://([\w.-]+:\d+)", url)
        problem = reach_problem(compose, client, match.group(1)) if match else f"{url}: no host:port"
        if problem:
            problems.append(problem)
    return problems


def published_ports(service: dict) -> list[tuple[str, int]]:
    """(host address, container port) of each port a service publishes; "" is every address."""
    found = []
    for published in service.get("ports", []):
        if isinstance(published, dict):
            found.append((str(published.get("host_ip", "")), int(published["target"])))
            continue
        parts = str(published).split("/")[0].rsplit(":", 2)
        found.append((parts[0] if len(parts) == 3 else "", int(parts[-1])))
    return found


def published_port_problems(compose: dict) -> list[str]:
    """Ports are published on 127.0.0.1 by namespace owners, and something that Docker can reach
    (not on the container's loopback) listens on each."""
    problems = []
    for name, service in compose["services"].items():
        for host_ip, container_port in published_ports(service):
            published = f"{host_ip}:{container_port}" if host_ip else str(container_port)
            if host_ip != "127.0.0.1":
                problems.append(f"{name}: {published} is not bound to 127.0.0.1")
            if network_owner(compose, name) != name:
                problems.append(f"{name}: publishes {published} but shares another service's network")
            elif container_port not in listeners(compose).get(name, {}):
                problems.append(f"{name}: publishes {published} but nothing listens on {container_port}")
            else:
                for listener in listeners(compose)[name][container_port]:
                    if listen_address(listener, compose["services"][listener])[0] in LOOPBACK:
                        problems.append(f"{name}: publishes {published} but {listener} listens on loopback only")
    return problems


def published_on(compose: dict, name: str) -> list[str]:
    """The host addresses where the port of service ``name`` is published ("": every address)."""
    port = listen_port(name, compose["services"][name])
    owner = compose["services"][network_owner(compose, name)]
    return [host_ip for host_ip, container_port in published_ports(owner) if container_port == port]


def environment(service: dict) -> dict[str, str]:
    """A service's environment, from either compose syntax (mapping or ``NAME=value`` list)."""
    env = service.get("environment", {}) or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {name: "" if value is None else str(value) for name, value in env.items()}


def exposure_problems(compose: dict) -> list[str]:
    """The stack is closed by default. Give it the file as written (``raw_compose``):

    - Prometheus, Alertmanager and Grafana are published on loopback only, if at all;
    - a published Prometheus has no lifecycle or admin API (POST /-/quit, /-/reload, deleting series);
    - Alertmanager's API (silences) listens on the stack's loopback, or asks for a password
      (``--web.config.file``);
    - Grafana's admin password must be given (``${VAR:?message}``, or a ``__FILE`` secret), and
      there is no anonymous access.
    """
    problems = []
    services = compose["services"]
    for name in IMAGE_PORTS:
        if name in services:
            port = listen_port(name, services[name])
            problems += [f"{name}: port {port} is published on {host_ip or 'every address'}"
                         for host_ip in published_on(compose, name) if host_ip not in LOOPBACK]
    if "prometheus" in services and published_on(compose, "prometheus"):
        for flag in ("--web.enable-lifecycle", "--web.enable-admin-api"):
            if flag in (services["prometheus"].get("command") or []):
                problems.append(f"prometheus: {flag} on a published port")
    alertmanager = services.get("alertmanager")
    if alertmanager is not None:
        command = [str(arg) for arg in alertmanager.get("command") or []]
        if (listen_address("alertmanager", alertmanager)[0] not in LOOPBACK
                and not any(arg.startswith("--web.config.file=") for arg in command)):
            problems.append("alertmanager: its API (silences) answers on every address, without a password")
    grafana = services.get("grafana")
    if grafana is not None:
        env = environment(grafana)
        password = env.get("GF_SECURITY_ADMIN_PASSWORD")
        if password is None and "GF_SECURITY_ADMIN_PASSWORD__FILE" not in env:
            problems.append("grafana: no GF_SECURITY_ADMIN_PASSWORD: the admin login is admin/admin")
        elif password is not None and not re.fullmatch(r"\$\{\w+:?\?[^}]*\}", password):
            problems.append(f"grafana: GF_SECURITY_ADMIN_PASSWORD {password!r} is not required from the user")
        if env.get("GF_AUTH_ANONYMOUS_ENABLED", "false").lower() != "false":
            problems.append("grafana: anonymous access is on")
    return problems


def image_problems(compose: dict) -> list[str]:
    """Every image is pinned to a version (no ``latest``, no bare name) and every service has a healthcheck."""
    problems = []
    for name, service in compose["services"].items():
        image = service.get("image", "")
        if "build" not in service and not PINNED_IMAGE.match(image):
            problems.append(f"{name}: image {image!r} is not pinned to a version")
        if not service.get("healthcheck", {}).get("test"):
            problems.append(f"{name}: no healthcheck")
    return problems
