"""Real processes for tests: the exporter, Prometheus, Alertmanager, node_exporter, on free loopback ports.

Each ``start_*`` returns a :class:`Server` whose ``url`` answers once it is ready; use them as
context managers (or call ``stop``) so no process outlives its test. Logs go to a file under the
test's tmp dir and are printed when a server fails to start.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], object], timeout: float = 20.0, interval: float = 0.1,
               message: str = "condition", fail: Callable[[str], object] = pytest.fail) -> object:
    """Poll ``condition`` until it returns something truthy; after ``timeout`` s call ``fail``
    with the reason (by default: fail the test)."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = condition()
            if result:
                return result
        except Exception as exc:  # the thing being waited for may not be up yet
            last_error = exc
        time.sleep(interval)
    fail(f"timed out after {timeout:g}s waiting for {message}" + (f" (last error: {last_error})" if last_error else ""))


def http_get(url: str, timeout: float = 5.0, context=None, headers: dict | None = None) -> tuple[int, str]:
    """GET ``url``; ``context`` is an ssl.SSLContext for https, ``headers`` extra request headers."""
    try:
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; `make test` installs Debian's prometheus packages")
    return path


class Server:
    def __init__(self, name: str, args: list[str], port: int, log_path: Path, ready_path: str,
                 env: dict | None = None, cwd: Path | None = None, context=None, headers: dict | None = None,
                 host: str = "127.0.0.1"):
        self.name = name
        self.port = port
        self.context, self.headers = context, headers  # for https and basic auth
        self.url = f"{'https' if context else 'http'}://{host}:{port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})}, cwd=cwd or REPO)
        try:
            wait_until(lambda: self._ready(ready_path), timeout=30, message=f"{name} at {self.url}{ready_path}")
        except BaseException:
            self.stop()
            print(f"--- {name} log ---\n{self.log()}")
            raise

    def _ready(self, path: str) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
        return http_get(self.url + path, timeout=2, context=self.context, headers=self.headers)[0] == 200

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.url + path, context=self.context, headers=self.headers)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_exporter(tmp_path: Path, *args: str, ready_path: str = "/-/ready", context=None,
                   headers: dict | None = None, env: dict | None = None) -> Server:
    """``python -m verl_exporter`` on a free port with the given extra flags (``context`` and
    ``headers``: how to reach one with a web config, TLS and basic auth; ``env``: its environment)."""
    port = free_port()
    cmd = [sys.executable, "-m", "verl_exporter", "--web.listen-address", f"127.0.0.1:{port}", *args]
    return Server("verl-exporter", cmd, port, tmp_path / f"exporter-{port}.log", ready_path,
                  context=context, headers=headers, env=env)


def start_prometheus(tmp_path: Path, config: dict | str, *, rule_files: list[Path] = (),
                     extra_args: list[str] = (), command_prefix: list[str] = ()) -> Server:
    """A real Prometheus with ``config`` (dict or YAML text); ``rule_files`` are copied beside it;
    ``command_prefix`` runs it under a wrapper (a mount namespace with a hosts file of its own)."""
    binary = require_binary("prometheus")
    port = free_port()
    workdir = tmp_path / f"prometheus-{port}"
    workdir.mkdir()
    for rule_file in rule_files:
        shutil.copy(rule_file, workdir / Path(rule_file).name)
    text = config if isinstance(config, str) else json.dumps(config)
    (workdir / "prometheus.yml").write_text(text)
    cmd = [*command_prefix, binary, f"--config.file={workdir / 'prometheus.yml'}",
           f"--storage.tsdb.path={workdir / 'data'}",
           f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", *extra_args]
    return Server("prometheus", cmd, port, workdir / "prometheus.log", "/-/ready", cwd=workdir)


def start_alertmanager(tmp_path: Path, config_path: Path, *, extra_args: list[str] = ()) -> Server:
    """A real Alertmanager (Debian's prometheus-alertmanager) with ``config_path``."""
    binary = require_binary("prometheus-alertmanager")
    port = free_port()
    workdir = tmp_path / f"alertmanager-{port}"
    workdir.mkdir()
    cmd = [binary, f"--config.file={config_path}", f"--storage.path={workdir / 'data'}",
           f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", *extra_args]
    return Server("alertmanager", cmd, port, workdir / "alertmanager.log", "/-/ready", cwd=workdir)


def start_node_exporter(tmp_path: Path, *extra_args: str) -> Server:
    """Debian's prometheus-node-exporter on a free port."""
    binary = require_binary("prometheus-node-exporter")
    port = free_port()
    cmd = [binary, f"--web.listen-address=127.0.0.1:{port}", *extra_args]
    return Server("node_exporter", cmd, port, tmp_path / f"node-exporter-{port}.log", "/metrics")


def prom_query(prometheus: Server, expr: str) -> list[dict]:
    """Run an instant query; the result vector (empty list if no data)."""
    status, body = prometheus.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    data = json.loads(body)
    if status != 200 or data.get("status") != "success":
        raise AssertionError(f"query {expr!r} failed: {status} {body[:500]}")
    return data["data"]["result"]
