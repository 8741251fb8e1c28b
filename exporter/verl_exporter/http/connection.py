"""HTTP connections: HTTP/1.1 parsed by h11 (the protocol library inside uvicorn, hypercorn and
httpx), connections on one asyncio event loop, so a slow or idle client costs a coroutine and its
buffers, not a thread. ``Connection`` reads one client's requests and writes the answers within the
limits below; ``http_listener.ConnectionServer`` listens, accepts and holds the connections, and a
subclass of it answers the requests (``server.ExporterHTTPServer``: the routes and auth).

The limits, all enforced before any credentials are checked:

- request line and headers: ``MAX_HEADER_BYTES`` in all and ``MAX_HEADERS`` fields (431 past
  them); request bodies are never read (a GET's body ends the connection after the answer);
- ``HEADER_TIMEOUT`` from the accept (TLS handshake included), or from the end of the last answer
  on a kept-alive connection, to the end of the request's headers, however slowly bytes arrive;
- ``WRITE_TIMEOUT`` to write one answer; a body is written in ``CHUNK`` pieces, so a client that
  does not read holds a reference to the shared rendering, never a copy of it, and at most
  ``MAX_BODIES_IN_FLIGHT`` distinct renderings are held by unfinished answers (the oldest
  round's laggards are dropped);
- ``MAX_CONNECTIONS`` open at once (and at most half the file descriptor limit): a new
  connection past the cap closes the oldest quiet one (no request in progress and no byte of one
  received: an idle client), else the oldest one that has no request in progress (one still
  sending its request's head or body has none), or is refused when every one has. A client that
  sent its request is not closed to make room while an idle one is open.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from http import HTTPStatus
from typing import Protocol

import h11

from verl_exporter.http.request import MAX_BODY_BYTES, printable, request_path, small_body
from verl_exporter.http.web_config import WebConfig

log = logging.getLogger("verl_exporter.http.server")  # the HTTP server's one log, connections and routes alike

MAX_HEADER_BYTES = 16 * 1024
MAX_HEADERS = 100
HEADER_TIMEOUT = 10.0  # seconds to the end of a request's headers (TLS handshake included)
WRITE_TIMEOUT = 30.0  # seconds to write one answer
CHUNK = 128 * 1024

_TLS_HANDSHAKE = 0x16
_PLAIN_TO_TLS = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
                 b"Client sent an HTTP request to an HTTPS server.\n")


class _Closed(Exception):
    """The connection ended or was dropped (deadline, cap): nothing more to write."""


class Listener(Protocol):
    """What a connection needs of the server that accepted it (``http_listener.ConnectionServer``)."""

    header_timeout: float
    write_timeout: float
    connections: dict[Connection, None]

    async def answer(self, web: WebConfig, request: h11.Request, method: str,
                     target: str, client: str = "", sock: socket.socket | None = None) -> tuple[int, bytes, list]: ...

    def pin(self, connection: Connection, body: bytes) -> None: ...

    def unpin(self, connection: Connection, body: bytes) -> None: ...


class _Protocol(asyncio.StreamReaderProtocol):
    """The stream's protocol; tells its connection that the client sent bytes."""

    def __init__(self, reader: asyncio.StreamReader, connection: Connection):
        super().__init__(reader)
        self._connection = connection

    def data_received(self, data: bytes) -> None:
        self._connection.heard = True
        super().data_received(data)


class Connection:
    """One client connection: its requests read and answered in turn, within the deadlines."""

    def __init__(self, server: Listener, sock: socket.socket, client: str, web: WebConfig):
        self.server, self.sock, self.client, self.web = server, sock, client, web
        self.task: asyncio.Task | None = None
        self.transport: asyncio.Transport | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.busy = False
        self.heard = False  # bytes of a request not yet answered came in (read or not)
        self._running = False
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False

    def quiet(self) -> bool:
        """No request in progress and no byte of one received, read or still in the socket: an idle
        client, the first to close to make room."""
        if self.busy or self.heard:
            return False
        try:
            return not self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return True  # closed or reset: nothing to answer

    # -- deadlines -------------------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._expired = True
        self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        elif self.task is not None:
            if not self._running:
                self.sock.close()  # its task never ran: nothing else closes it
            self.task.cancel()  # still in the TLS handshake or the peek before it

    # -- the connection ---------------------------------------------------------------------------

    async def run(self) -> None:
        self._running = True
        try:
            self._arm(self.server.header_timeout)
            if await self._open():
                await self._serve()
        except asyncio.CancelledError:
            log.debug("connection from %s closed before its request (deadline or connection cap)", self.client)
        except (_Closed, OSError, h11.ProtocolError) as exc:  # ssl.SSLError is an OSError
            if self._expired:
                log.debug("connection from %s dropped: no request within %gs, or an answer not read within %gs",
                          self.client, self.server.header_timeout, self.server.write_timeout)
            else:
                log.debug("connection from %s ended early: %s", self.client, printable(str(exc) or repr(exc)))
        except Exception:
            log.error("connection from %s failed", self.client, exc_info=True)
        finally:
            self._disarm()
            if self.transport is not None:
                self.transport.abort() if self._expired else self.transport.close()
            else:
                self.sock.close()
            self.server.connections.pop(self, None)

    async def _open(self) -> bool:
        """The connection's streams, after the TLS handshake when the web config asks for TLS."""
        loop = asyncio.get_running_loop()
        context = self.web.tls_context
        if context is not None:
            first = await self._peek(loop)
            if first and first[0] != _TLS_HANDSHAKE:  # not a TLS handshake record: answer as Go servers do
                try:
                    self.sock.send(_PLAIN_TO_TLS)
                    self.sock.shutdown(socket.SHUT_WR)
                    for _ in range(4):  # what it sent, read so the close is not a reset that loses the answer
                        if not self.sock.recv(MAX_HEADER_BYTES):
                            break
                except OSError:
                    pass
                return False
            if not first:
                return False
        self.reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES)
        protocol = _Protocol(self.reader, self)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, self.sock, ssl=context,
                ssl_handshake_timeout=self.server.header_timeout if context is not None else None)
        except (ssl.SSLError, ConnectionError, asyncio.TimeoutError) as exc:
            log.debug("TLS handshake with %s failed: %s", self.client, printable(str(exc) or repr(exc)))
            return False
        self.transport = transport
        self.writer = asyncio.StreamWriter(transport, protocol, self.reader, loop)
        return True

    async def _peek(self, loop: asyncio.AbstractEventLoop) -> bytes:
        readable = loop.create_future()

        def wake() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(self.sock.fileno(), wake)
        try:
            await readable
        finally:
            loop.remove_reader(self.sock.fileno())
        try:
            return self.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return b"\x16"  # a spurious wake-up: let the handshake read
        except OSError:
            return b""

    async def _serve(self) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        while True:
            request = await self._next_request(conn)
            if request is None:
                return
            # Busy (not closed to make room) only once its body is in: a client that sends a head
            # announcing a body and then nothing holds no slot the cap must keep.
            complete = small_body(request) and await self._skip_body(conn)
            self.busy = True
            self.heard = bool(conn.trailing_data[0])  # a pipelined request's bytes, if any
            self._disarm()
            method = request.method.decode("ascii", "replace")
            target = request_path(request.target)
            status, body, headers = await self.server.answer(self.web, request, method, target, self.client, self.sock)
            if not complete:  # the rest of a body too large to skip: this connection serves no more
                headers = [*headers, ("Connection", "close")]
            log.debug("%s \"%s %s HTTP/%s\" %d %d", self.client, printable(method), printable(target),
                      printable(request.http_version), status, len(body))
            self._arm(self.server.write_timeout)
            head = conn.send(h11.Response(status_code=status, headers=headers,
                                          reason=HTTPStatus(status).phrase.encode()))
            if method != "HEAD" and len(body) <= CHUNK:  # most answers: one write, one wait
                data = conn.send_with_data_passthrough(h11.Data(data=body)) or []
                self._write(b"".join([head, *data, conn.send(h11.EndOfMessage())]))
            else:
                self._write(head)
                if method != "HEAD":
                    await self._write_body(conn, body)
                self._write(conn.send(h11.EndOfMessage()))
            await self._drain()
            self.busy = False
            if (conn.our_state is not h11.DONE or conn.their_state is not h11.DONE
                    or request.http_version not in (b"1.0", b"1.1")):
                return  # Connection: close, HTTP/1.0, a request body we do not read, an unknown version
            conn.start_next_cycle()

    async def _skip_body(self, conn: h11.Connection) -> bool:
        """Read the request's body (none for a GET) to its end and drop it, under the header deadline;
        False when it is longer than MAX_BODY_BYTES or cannot be read, so the connection closes after
        the answer (a client that reuses it then knows)."""
        assert self.reader is not None
        seen = 0
        try:
            while True:
                event = conn.next_event()
                if isinstance(event, h11.EndOfMessage):
                    return True
                if isinstance(event, h11.Data):
                    seen += len(event.data)
                    if seen > MAX_BODY_BYTES:
                        return False
                elif event is h11.NEED_DATA:
                    data = await self.reader.read(MAX_HEADER_BYTES)
                    if not data:
                        return False
                    conn.receive_data(data)
                else:
                    return False
        except h11.RemoteProtocolError:
            return False

    async def _next_request(self, conn: h11.Connection) -> h11.Request | None:
        """The next request's head, None when the client closed; protocol errors are answered here."""
        assert self.reader is not None
        self._arm(self.server.header_timeout)
        fed = len(conn.trailing_data[0])  # bytes h11 holds for this request: a pipelined one's included
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                await self._refuse(conn, exc)
                return None
            if event is h11.NEED_DATA:
                data = await self.reader.read(MAX_HEADER_BYTES)
                if not data and conn.their_state is not h11.IDLE:
                    return None  # closed mid-request
                fed += len(data)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                # h11 caps a head only while it is incomplete: one that came whole in a single read
                # past the limit is refused here, as one that trickled in is.
                if fed - len(conn.trailing_data[0]) > MAX_HEADER_BYTES:
                    await self._write_simple(431, b"Request Header Fields Too Large\n")
                    return None
                return event
            return None  # ConnectionClosed

    async def _refuse(self, conn: h11.Connection, exc: h11.RemoteProtocolError) -> None:
        """Answer a request h11 cannot parse: 414 for a request line past the limit, 431 for headers."""
        status = exc.error_status_hint
        pending = conn.trailing_data[0]
        if status == 431 and b"\n" not in pending:
            status = 414
        log.debug("%s sent a bad request (%s): %s", self.client, exc, printable(pending.split(b"\n", 1)[0]))
        await self._write_simple(status, f"{HTTPStatus(status).phrase}: {exc}\n".encode())

    async def _write_simple(self, status: int, body: bytes) -> None:
        head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "Content-Type: text/plain; charset=utf-8",
                f"Content-Length: {len(body)}", "Connection: close",
                *(f"{name}: {value}" for name, value in self.web.headers.items())]
        self._arm(self.server.write_timeout)
        self._write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await self._drain()

    def _write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise _Closed("connection closed")
        self.transport.write(data)

    async def _drain(self) -> None:
        assert self.writer is not None
        try:
            await self.writer.drain()
        except ConnectionError as exc:
            raise _Closed(str(exc) or "connection closed") from None

    async def _write_body(self, conn: h11.Connection, body: bytes) -> None:
        self.server.pin(self, body)
        try:
            view = memoryview(body)
            for start in range(0, len(body), CHUNK):
                # Content-Length framing: h11 hands the slice back as is, so the body is never copied
                data = h11.Data(data=view[start:start + CHUNK])  # type: ignore[arg-type]
                for piece in conn.send_with_data_passthrough(data) or ():
                    self._write(piece)
                await self._drain()
        finally:
            self.server.unpin(self, body)
