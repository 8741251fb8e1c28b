"""The HTTP server: /metrics (or the configured path), /-/healthy, /-/ready, /debug/evidence and a landing page."""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qs

from . import __version__, shipped
from .exposition import Exposition
from .web_config import WebConfig

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 10
EVIDENCE_PATH = "/debug/evidence"
RUNBOOK_PATH = "/runbook"  # the packaged RUNBOOK.md: the default base of every alert's runbook_url


def parse_listen_address(address: str) -> tuple[str, int]:
    """``":9945"``, ``"127.0.0.1:9945"`` or ``"[::1]:9945"`` as (host, port); ValueError if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid listen address {address!r}: want [HOST]:PORT, e.g. :9945")
    return host.strip("[]"), int(port)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header prefers gzip to identity, q-values (RFC 9110) honoured.

    ``gzip;q=0`` refuses gzip, ``*`` stands for every coding not named, identity is acceptable
    unless refused, and gzip wins ties.
    """
    weights: dict[str, float] = {}  # coding -> q-value
    for part in accept_encoding.split(","):
        coding, *params = (item.strip() for item in part.split(";"))
        quality = 1.0
        for param in params:
            name, _, number = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = min(max(float(number), 0.0), 1.0)
                except ValueError:
                    quality = 0.0
        if coding:
            weights.setdefault(coding.lower(), quality)
    star = weights.get("*")
    gzip_q = weights.get("gzip", weights.get("x-gzip", star if star is not None else 0.0))
    identity_q = weights.get("identity", star if star is not None else 1.0)
    return gzip_q > 0 and gzip_q >= identity_q


class ExporterHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], exposition: Exposition, telemetry_path: str,
                 ready: Callable[[], bool], web: WebConfig | None = None,
                 evidence: Callable[[str, str], str | None] | None = None):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        if address[0] == "":
            self.address_family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
        self.exposition = exposition
        self.telemetry_path = telemetry_path
        self.ready = ready
        self.web = web or WebConfig()  # replaced whole on reload; each connection reads it once
        self.evidence = evidence  # (project, experiment) -> the run's evidence text, None if none; None: off
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def finish_request(self, request, client_address) -> None:
        """Serve one connection on its own thread; with TLS, the handshake happens here too."""
        web = self.web
        if web.tls_context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(REQUEST_TIMEOUT_SECONDS)
        try:
            first = request.recv(1, socket.MSG_PEEK)
            if first and first != b"\x16":  # not a TLS handshake record: answer as Go servers do
                request.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
                return
            request = web.tls_context.wrap_socket(request, server_side=True)
        except OSError as exc:  # ssl.SSLError included: a bad or missing client certificate, a timeout
            log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
            return
        try:
            super().finish_request(request, client_address)
        finally:
            request.close()

    def handle_error(self, request, client_address) -> None:
        """A client that goes away mid-request is one debug line; anything else is logged in full."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("connection from %s ended early: %s", client_address[0], exc)
        else:
            log.error("request from %s failed", client_address[0], exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: ExporterHTTPServer
    server_version = f"verl-exporter/{__version__}"
    timeout = REQUEST_TIMEOUT_SECONDS

    def do_GET(self) -> None:
        if not self._authorized():
            self._reply(401, b"Unauthorized\n", headers={"WWW-Authenticate": "Basic"})
            return
        path, _, query = self.path.partition("?")
        if path == self.server.telemetry_path:
            self._metrics(query)
        elif path == "/-/healthy":
            self._reply(200, b"OK\n")
        elif path == RUNBOOK_PATH:
            self._reply(200, _runbook(), "text/markdown; charset=utf-8")
        elif path == "/-/ready":
            if self.server.ready():
                self._reply(200, b"OK\n")
            else:
                self._reply(503, b"not ready: still reading the sources' existing lines\n")
        elif path == EVIDENCE_PATH:
            self._evidence(query)
        elif path == "/":
            self._reply(200, _landing_page(self.server.telemetry_path), "text/html; charset=utf-8")
        else:
            self._reply(404, b"not found; metrics are at " + self.server.telemetry_path.encode() + b"\n")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _authorized(self) -> bool:
        web = self.server.web
        if not web.users:
            return True
        scheme, _, credentials = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return bool(sep) and web.check_password(user, password)

    def _metrics(self, query: str) -> None:
        headers = {"Vary": "Accept, Accept-Encoding"}
        compress = accepts_gzip(self.headers.get("Accept-Encoding", ""))
        try:
            body, content_type = self.server.exposition.encode(self.headers.get("Accept", ""),
                                                               parse_qs(query).get("name[]"), compress)
        except Exception:  # a broken collector must not kill the connection silently
            log.exception("scrape failed")
            self._reply(500, b"scrape failed; see the exporter's log\n", headers=headers)
            return
        if compress:
            headers["Content-Encoding"] = "gzip"
        self._reply(200, body, content_type, headers)

    def _evidence(self, query: str) -> None:
        """The evidence captured on a run's stall (forensics), as plain text; behind the same auth."""
        args = parse_qs(query, keep_blank_values=True)
        project, experiment = (args.get(name, [""])[0] for name in ("project", "experiment"))
        if not project or not experiment:
            self._reply(400, b"want ?project=P&experiment=E: the run's trainer.project_name and "
                             b"trainer.experiment_name, as in the metrics' labels\n")
            return
        if self.server.evidence is None:
            self._reply(404, b"no evidence: forensics is off (--no-forensics)\n")
            return
        text = self.server.evidence(project, experiment)
        if text is None:
            self._reply(404, f"no evidence for project={project!r} experiment={experiment!r}: the exporter "
                             "has not seen this run stall (or does not follow it)\n".encode("utf-8", "replace"))
            return
        self._reply(200, text.encode("utf-8", "replace"), headers={"Cache-Control": "no-store"})

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

    def end_headers(self) -> None:
        for name, value in self.server.web.headers.items():  # on every answer, errors included
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args) -> None:
        log.debug("%s %s", self.address_string(), format % args)


@functools.lru_cache(maxsize=1)
def _runbook() -> bytes:
    """RUNBOOK.md as shipped in the package, read once."""
    return shipped.runbook().read_bytes()


def _landing_page(path: str) -> bytes:
    return (
        "<html><head><title>verl exporter</title></head><body><h1>verl exporter</h1>"
        f"<p>Version {__version__}</p><ul><li><a href='{path}'>Metrics</a></li>"
        "<li><a href='/-/healthy'>Health</a></li><li><a href='/-/ready'>Readiness</a></li></ul>"
        f"<p>Evidence of a stalled run: {EVIDENCE_PATH}?project=P&amp;experiment=E</p>"
        "</body></html>\n"
    ).encode()


def serve(address: tuple[str, int], exposition: Exposition, telemetry_path: str = "/metrics",
          ready: Callable[[], bool] = lambda: True,
          web: WebConfig | None = None,
          evidence: Callable[[str, str], str | None] | None = None) -> tuple[ExporterHTTPServer, threading.Thread]:
    """Bind (OSError if the port is taken) and serve ``exposition`` in a daemon thread;
    ``evidence`` answers /debug/evidence (forensics)."""
    server = ExporterHTTPServer(address, exposition, telemetry_path, ready, web, evidence)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return server, thread
