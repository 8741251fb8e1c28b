"""The HTTP server: /metrics (or the configured path), /-/healthy, /-/ready and a landing page."""

from __future__ import annotations

import gzip
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

from . import __version__

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 10


def parse_listen_address(address: str) -> tuple[str, int]:
    """``":9945"``, ``"127.0.0.1:9945"`` or ``"[::1]:9945"`` as (host, port); ValueError if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid listen address {address!r}: want [HOST]:PORT, e.g. :9945")
    return host.strip("[]"), int(port)


def prefer_text_format(accept: str) -> str:
    """The Accept header without its OpenMetrics types when it also takes the text format.

    Serves the Prometheus text format to Prometheus, as node_exporter does: client_python's
    OpenMetrics writer escapes every sample name character by character and takes about twice
    as long for the same samples. A client that accepts only OpenMetrics still gets it.
    """
    parts = [part for part in accept.split(",") if part.split(";")[0].strip() != "application/openmetrics-text"]
    takes_text = any(part.split(";")[0].strip() in ("text/plain", "*/*") for part in parts)
    return ",".join(parts) if takes_text else accept


class ExporterHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, telemetry_path: str,
                 ready: Callable[[], bool]):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        if address[0] == "":
            self.address_family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
        self.registry = registry
        self.telemetry_path = telemetry_path
        self.ready = ready
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _Handler(BaseHTTPRequestHandler):
    server: ExporterHTTPServer
    server_version = f"verl-exporter/{__version__}"
    timeout = REQUEST_TIMEOUT_SECONDS

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == self.server.telemetry_path:
            self._metrics()
        elif path == "/-/healthy":
            self._reply(200, b"OK\n")
        elif path == "/-/ready":
            if self.server.ready():
                self._reply(200, b"OK\n")
            else:
                self._reply(503, b"not ready: still reading the sources' existing lines\n")
        elif path == "/":
            self._reply(200, _landing_page(self.server.telemetry_path), "text/html; charset=utf-8")
        else:
            self._reply(404, b"not found; metrics are at " + self.server.telemetry_path.encode() + b"\n")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _metrics(self) -> None:
        try:
            encoder, content_type = choose_encoder(prefer_text_format(self.headers.get("Accept", "")))
        except Exception:  # client_python cannot read e.g. "version=abc"; promhttp falls back to text too
            encoder, content_type = generate_latest, CONTENT_TYPE_PLAIN_0_0_4
        try:
            body = encoder(self.server.registry)
        except Exception as exc:  # a broken collector must not kill the connection silently
            log.exception("scrape failed")
            self._reply(500, f"scrape failed: {exc}\n".encode())
            return
        headers = {}
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self._reply(200, body, content_type, headers)

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
               headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def _landing_page(path: str) -> bytes:
    return (
        "<html><head><title>verl exporter</title></head><body><h1>verl exporter</h1>"
        f"<p>Version {__version__}</p><ul><li><a href='{path}'>Metrics</a></li>"
        "<li><a href='/-/healthy'>Health</a></li><li><a href='/-/ready'>Readiness</a></li></ul>"
        "</body></html>\n"
    ).encode()


def serve(address: tuple[str, int], registry: CollectorRegistry, telemetry_path: str = "/metrics",
          ready: Callable[[], bool] = lambda: True) -> tuple[ExporterHTTPServer, threading.Thread]:
    """Bind (OSError if the port is taken) and serve in a daemon thread."""
    server = ExporterHTTPServer(address, registry, telemetry_path, ready)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return server, thread
