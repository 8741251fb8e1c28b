"""The listening side of the HTTP server: one socket, the connections it accepted (at most
``MAX_CONNECTIONS``, and at most half the file descriptor limit: past the cap the oldest quiet one,
that sent nothing, is closed, else the oldest with no request in progress, or the new one refused
when every one has a request in progress), and the large renderings
that unfinished answers hold (at most ``MAX_BODIES_IN_FLIGHT``: the oldest one's slow readers are
dropped). Every connection runs on one asyncio event loop (``http_connection.Connection``)."""

from __future__ import annotations

import asyncio
import resource
import socket
import threading
import time

import h11

from verl_exporter.http.connection import Connection, log
from verl_exporter.http.web_config import WebConfig

MAX_CONNECTIONS = 256
BACKLOG = 1024  # connections the kernel holds until accepted (capped by net.core.somaxconn)
ACCEPT_BURST = 64  # connections accepted in a row before the loop lets the others run
MAX_BODIES_IN_FLIGHT = 4  # distinct renderings held by answers still being written
PINNED_BODY_BYTES = 256 * 1024  # answers smaller than this are not counted in MAX_BODIES_IN_FLIGHT


def _listen(address: tuple[str, int]) -> socket.socket:
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    if address[0] == "":
        family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def connection_cap() -> int:
    """MAX_CONNECTIONS, or half the soft file descriptor limit if that is lower."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        soft = resource.RLIM_INFINITY
    return MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(8, min(MAX_CONNECTIONS, soft // 2))


class ConnectionServer:
    """Listens at construction (OSError if the address is taken); ``serve_forever()`` serves until
    ``shutdown()``; ``server_close()`` closes the listener. ``web`` may be replaced at any time (a
    reload): each connection reads it once, when it is accepted. A subclass answers (``answer``)."""

    def __init__(self, address: tuple[str, int], web: WebConfig, header_timeout: float, write_timeout: float):
        self.web = web
        self.header_timeout, self.write_timeout = header_timeout, write_timeout
        self.max_connections = connection_cap()
        self.socket = _listen(address)
        self.server_address = self.socket.getsockname()
        self.connections: dict[Connection, None] = {}  # oldest first
        self.pinned: dict[int, tuple[bytes, set[Connection]]] = {}  # id(body) -> (body, its writers), oldest first
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Future | None = None
        self._stopping = False
        self._serving = threading.Event()
        self._done = threading.Event()
        self._last_accept_error = 0.0

    def serve_forever(self) -> None:
        self._serving.set()
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._done.set()

    def shutdown(self) -> None:
        """Stop serving and wait until ``serve_forever`` has returned (call from another thread)."""
        self._stopping = True
        if self._serving.is_set() and not self._done.is_set():
            try:
                self._loop.call_soon_threadsafe(self._request_stop)
            except RuntimeError:  # the loop has already closed
                pass
            self._done.wait()

    def server_close(self) -> None:
        self.socket.close()
        if not self._loop.is_running():
            self._loop.close()

    def _request_stop(self) -> None:
        if self._stop is not None and not self._stop.done():
            self._stop.set_result(None)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop = loop.create_future()
        if self._stopping:
            return
        accepting = loop.create_task(self._accept(loop))
        await self._stop
        accepting.cancel()
        for connection in list(self.connections):
            connection.abort()
            if connection.task is not None:
                connection.task.cancel()
        tasks = [connection.task for connection in self.connections if connection.task is not None]
        await asyncio.gather(accepting, *tasks, return_exceptions=True)

    async def _accept(self, loop: asyncio.AbstractEventLoop) -> None:
        accepted = 0
        while True:
            accepted += 1
            if accepted % ACCEPT_BURST == 0:
                await asyncio.sleep(0)  # a full backlog is accepted without a wait: let the others run
            try:
                sock, peer = await loop.sock_accept(self.socket)
            except OSError as exc:  # out of file descriptors or buffers: wait for connections to end
                if time.monotonic() - self._last_accept_error > 10:
                    self._last_accept_error = time.monotonic()
                    log.warning("cannot accept connections: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if len(self.connections) >= self.max_connections and not self._make_room():
                log.debug("refused a connection from %s: %d connections open, all busy", peer[0],
                          len(self.connections))
                sock.close()
                continue
            connection = Connection(self, sock, peer[0], self.web)
            self.connections[connection] = None
            connection.task = loop.create_task(connection.run())

    def _make_room(self) -> bool:
        """Close the oldest quiet connection (``Connection.quiet``), else the oldest without a request
        in progress; False if every one has one. A client that sent a request is not the one closed
        while an idle one is open, however many connect after it."""
        other = None
        for connection in self.connections:
            if connection.busy:
                continue
            if connection.quiet():
                other = connection
                break
            other = other or connection
        if other is None:
            return False
        log.debug("closing an idle connection from %s: %d connections open", other.client, len(self.connections))
        other.abort()
        self.connections.pop(other, None)
        return True

    def pin(self, connection: Connection, body: bytes) -> None:
        """``connection`` writes ``body``; past MAX_BODIES_IN_FLIGHT distinct bodies, the writers of
        the oldest one are dropped, so clients that do not read cannot hold renderings without end."""
        if len(body) < PINNED_BODY_BYTES:
            return
        entry = self.pinned.get(id(body))
        if entry is None:
            while len(self.pinned) >= MAX_BODIES_IN_FLIGHT:
                _, (_, writers) = next(iter(self.pinned.items()))
                for writer in list(writers):
                    log.debug("dropping a slow reader at %s: newer renderings are being written", writer.client)
                    writer.abort()
                    self.unpin(writer, _)
            entry = self.pinned[id(body)] = (body, set())
        entry[1].add(connection)

    def unpin(self, connection: Connection, body: bytes) -> None:
        entry = self.pinned.get(id(body))
        if entry is not None and entry[0] is body:
            entry[1].discard(connection)
            if not entry[1]:
                del self.pinned[id(body)]

    async def answer(self, web: WebConfig, request: h11.Request, method: str,
                     target: str, client: str = "", sock: socket.socket | None = None) -> tuple[int, bytes, list]:
        """The status, body and headers that answer ``request`` (``web``: the connection's web config;
        ``client``: the address it came from; ``sock``: its socket)."""
        raise NotImplementedError
