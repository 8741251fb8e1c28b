"""The HTTP server: /metrics (or the configured path), /-/healthy, /-/ready, /debug/evidence, /runbook
and a landing page, behind the web config's basic auth. Connections and their limits are
``http_listener``'s and ``http_connection``'s; rendering and bcrypt run on small thread pools, never on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import ipaddress
import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable
from urllib.parse import parse_qs

import h11

from verl_exporter import __version__, shipped
from verl_exporter.exposition import Exposition
from verl_exporter.http.connection import HEADER_TIMEOUT, MAX_HEADERS, WRITE_TIMEOUT
from verl_exporter.http.listener import ConnectionServer
from verl_exporter.http.peer import peer_uid
from verl_exporter.http.web_config import WebConfig
from verl_exporter.store.owners import user_name
from verl_exporter.store.records import RunKey

log = logging.getLogger(__name__)

RENDER_THREADS = 4
AUTH_THREADS = 8  # more than web_config.BCRYPT_SLOTS, so checks past the slots are refused at once
REQUEST_TIMEOUT_SECONDS = HEADER_TIMEOUT  # the former name
EVIDENCE_PATH = "/debug/evidence"
RUNBOOK_PATH = "/runbook"  # the packaged RUNBOOK.md: the default base of every alert's runbook_url


def parse_listen_address(address: str) -> tuple[str, int]:
    """``":9945"``, ``"127.0.0.1:9945"`` or ``"[::1]:9945"`` as (host, port); ValueError if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid listen address {address!r}: want [HOST]:PORT, e.g. :9945")
    return host.strip("[]"), int(port)


@functools.lru_cache(maxsize=64)  # a scraper sends the same header every time
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


class _Batch:
    """Scrapes that wait for one ``encode`` call on the render pool: they join it until it begins,
    and it renders after the last of them arrived (a rendering shared with others is newer still)."""

    def __init__(self, arrived: float):
        self.arrived = arrived
        self.begun = False
        self.lock = threading.Lock()
        self.future: asyncio.Future | None = None

    def join(self, arrived: float) -> bool:
        """Wait for this call too; False once it has begun."""
        with self.lock:
            if not self.begun:
                self.arrived = max(self.arrived, arrived)
            return not self.begun

    def run(self, encode: Callable[..., tuple[bytes, str]]) -> tuple[bytes, str]:
        with self.lock:
            self.begun = True
        return encode(arrived=self.arrived)


class ExporterHTTPServer(ConnectionServer):
    """The exporter's routes and basic auth over ``ConnectionServer``: listens at construction
    (OSError if the address is taken); ``serve_forever()`` serves until ``shutdown()``;
    ``server_close()`` closes the listener. ``web`` may be replaced at any time (a reload): each
    connection reads it once, when it is accepted. ``telemetry_path`` is a path, or a function
    that gives the path in force (the exporter's reloadable ``--web.telemetry-path``)."""

    def __init__(self, address: tuple[str, int], exposition: Exposition, telemetry_path: str | Callable[[], str],
                 ready: Callable[[], bool], web: WebConfig | None = None,
                 evidence: Callable[[RunKey], str | None] | None = None):
        self.exposition = exposition
        self._telemetry_path = telemetry_path if callable(telemetry_path) else (lambda: telemetry_path)
        self.ready = ready
        self.evidence = evidence  # run -> the run's evidence text, None if none; None: off
        # Without basic auth, the evidence (log lines, command lines, stacks) goes to this host's own
        # clients of the run's owner, root or the exporter's own user only (``peer``), unless
        # --forensics.remote says anyone who reaches the port may read it.
        self.evidence_remote = False
        super().__init__(address, web or WebConfig(), HEADER_TIMEOUT, WRITE_TIMEOUT)
        self.render_pool = ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="http-render")
        self._batches: dict[tuple, _Batch] = {}  # (accept, names, gzip) -> the render call not yet begun
        self.auth_pool = ThreadPoolExecutor(AUTH_THREADS, thread_name_prefix="http-auth")

    @property
    def telemetry_path(self) -> str:
        return self._telemetry_path()

    def server_close(self) -> None:
        super().server_close()
        self.render_pool.shutdown(wait=False, cancel_futures=True)
        self.auth_pool.shutdown(wait=False, cancel_futures=True)

    async def answer(self, web: WebConfig, request: h11.Request, method: str,
                     target: str, client: str = "", sock: socket.socket | None = None) -> tuple[int, bytes, list]:
        status, body, content_type, extra = await self._route(web, request, method, target, client, sock)
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), *extra,
                   *web.headers.items()]
        return status, body, headers

    async def _route(self, web: WebConfig, request: h11.Request, method: str,
                     target: str, client: str = "", sock: socket.socket | None = None) -> tuple[int, bytes, str, list]:
        plain = "text/plain; charset=utf-8"
        if request.http_version not in (b"1.0", b"1.1"):
            return 505, b"HTTP version not supported\n", plain, []
        if len(request.headers) > MAX_HEADERS:
            return 431, f"more than {MAX_HEADERS} header fields\n".encode(), plain, []
        if method not in ("GET", "HEAD"):
            return 501, b"only GET and HEAD are served\n", plain, [("Allow", "GET, HEAD")]
        headers = _headers(request)
        if not await self._authorized(web, headers.get("authorization", "")):
            return 401, b"Unauthorized\n", plain, [("WWW-Authenticate", "Basic")]
        path, _, query = target.partition("?")
        if path == self.telemetry_path:
            return await self._metrics(headers, query)
        if path == "/-/healthy":
            return 200, b"OK\n", plain, []
        if path == RUNBOOK_PATH:
            return 200, _runbook(), "text/markdown; charset=utf-8", []
        if path == "/-/ready":
            if self.ready():
                return 200, b"OK\n", plain, []
            return 503, b"not ready: still reading the sources' existing lines\n", plain, []
        if path == EVIDENCE_PATH:
            if not (web.authenticates or self.evidence_remote or _loopback(client)):
                return 403, EVIDENCE_LOCAL_ONLY, plain, []
            return await self._evidence(query, open_to_all=web.authenticates or self.evidence_remote, sock=sock)
        if path == "/":
            return 200, _landing_page(self.telemetry_path), "text/html; charset=utf-8", []
        return 404, b"not found; metrics are at " + self.telemetry_path.encode() + b"\n", plain, []

    async def _authorized(self, web: WebConfig, authorization: str) -> bool:
        if not web.users:
            return True
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        known = web.cached_password(user, password)
        if known is not None:
            return known
        return await asyncio.get_running_loop().run_in_executor(self.auth_pool, web.check_password,
                                                                user, password)

    async def _metrics(self, headers: dict[str, str], query: str) -> tuple[int, bytes, str, list]:
        extra = [("Vary", "Accept, Accept-Encoding")]
        compress = accepts_gzip(headers.get("accept-encoding", ""))
        arrived = self.exposition.clock()
        names = parse_qs(query).get("name[]") if query else None
        try:
            body, content_type = await self._rendered(headers.get("accept", ""), names, compress, arrived)
        except Exception:  # a broken collector must not kill the connection silently
            log.exception("scrape failed")
            return 500, b"scrape failed; see the exporter's log\n", "text/plain; charset=utf-8", extra
        if compress:
            extra.append(("Content-Encoding", "gzip"))
        return 200, body, content_type, extra

    async def _rendered(self, accept: str, names: list[str] | None, compress: bool,
                        arrived: float) -> tuple[bytes, str]:
        """``exposition.encode`` on the render pool, one call for the scrapes that ask for the same
        body while that call has not begun: it renders after the last of them arrived."""
        key = (accept, tuple(names) if names else None, compress)
        batch = self._batches.get(key)
        if batch is None or not batch.join(arrived):
            batch = _Batch(arrived)
            encode = functools.partial(self.exposition.encode, accept, names, compress)
            batch.future = asyncio.get_running_loop().run_in_executor(self.render_pool, batch.run, encode)
            batch.future.add_done_callback(functools.partial(self._rendered_done, key, batch))
            self._batches[key] = batch
        assert batch.future is not None
        return await asyncio.shield(batch.future)  # one scrape that goes away does not cancel the others'

    def _rendered_done(self, key: tuple, batch: _Batch, _: asyncio.Future) -> None:
        if self._batches.get(key) is batch:
            del self._batches[key]

    async def _evidence(self, query: str, open_to_all: bool = False,
                        sock: socket.socket | None = None) -> tuple[int, bytes, str, list]:
        """The evidence captured on a run's stall (forensics), as plain text; behind the same auth.
        A loopback client that did not authenticate gets it only where it runs as the run's owner,
        root or the exporter's own user (its socket's uid, ``peer.peer_uid``)."""
        plain = "text/plain; charset=utf-8"
        args = parse_qs(query, keep_blank_values=True)
        project, experiment, user = (args.get(name, [""])[0] for name in ("project", "experiment", "user"))
        if not project or not experiment:
            return 400, (b"want ?project=P&experiment=E&user=U: the run's trainer.project_name, "
                         b"trainer.experiment_name and owner, as in the metrics' labels\n"), plain, []
        evidence = self.evidence
        if evidence is None:
            return 404, b"no evidence: forensics is off (--no-forensics)\n", plain, []
        loop = asyncio.get_running_loop()
        if not open_to_all:
            uid = await loop.run_in_executor(self.render_pool, peer_uid, sock) if sock is not None else None
            if uid is None or (uid not in (0, os.getuid()) and user_name(uid) != user):
                return 403, EVIDENCE_OWNER_ONLY, plain, []
        text = await loop.run_in_executor(self.render_pool, evidence, RunKey(project, experiment, user))
        if text is None:
            return 404, (f"no evidence for project={project!r} experiment={experiment!r} user={user!r}: the exporter "
                         "has not seen this run stall (or does not follow it)\n").encode("utf-8", "replace"), plain, []
        return 200, text.encode("utf-8", "replace"), plain, [("Cache-Control", "no-store")]

EVIDENCE_LOCAL_ONLY = (b"the evidence holds log lines, command lines and stacks: without basic auth it is "
                       b"served to this host's loopback clients only; set basic_auth_users (or a verified client "
                       b"certificate) in --web.config.file, or --forensics.remote to serve it to anyone who "
                       b"reaches this port\n")


EVIDENCE_OWNER_ONLY = (b"the evidence of a run is served on this host to its owner (user=), root and the "
                       b"exporter's own user only: connect as that user, or authenticate (basic_auth_users or a "
                       b"verified client certificate in --web.config.file)\n")


def _loopback(client: str) -> bool:
    """Whether ``client`` (an address as accepted) is this host's loopback."""
    try:
        address = ipaddress.ip_address(client.strip("[]").partition("%")[0])
    except ValueError:
        return client == ""  # a Unix socket (no address): this host
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _headers(request: h11.Request) -> dict[str, str]:
    """The request's headers by lower-case name (the first of repeated ones)."""
    headers: dict[str, str] = {}
    for name, value in request.headers:
        headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return headers


@functools.lru_cache(maxsize=1)
def _runbook() -> bytes:
    """RUNBOOK.md as shipped in the package, read once."""
    return shipped.runbook().read_bytes()


def _landing_page(path: str) -> bytes:
    return (
        "<html><head><title>verl exporter</title></head><body><h1>verl exporter</h1>"
        f"<p>Version {__version__}</p><ul><li><a href='{path}'>Metrics</a></li>"
        "<li><a href='/-/healthy'>Health</a></li><li><a href='/-/ready'>Readiness</a></li></ul>"
        f"<p>Evidence of a stalled run: {EVIDENCE_PATH}?project=P&amp;experiment=E&amp;user=U</p>"
        "</body></html>\n"
    ).encode()


def serve(address: tuple[str, int], exposition: Exposition, telemetry_path: str | Callable[[], str] = "/metrics",
          ready: Callable[[], bool] = lambda: True,
          web: WebConfig | None = None,
          evidence: Callable[[RunKey], str | None] | None = None,
          evidence_remote: bool = False) -> tuple[ExporterHTTPServer, threading.Thread]:
    """Bind (OSError if the port is taken) and serve ``exposition`` in a daemon thread;
    ``evidence`` answers /debug/evidence (forensics): to loopback clients, to authenticated ones
    (basic auth), or, with ``evidence_remote``, to any."""
    server = ExporterHTTPServer(address, exposition, telemetry_path, ready, web, evidence)
    server.evidence_remote = evidence_remote
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return server, thread
