"""Malformed, slow and oversized HTTP requests to every endpoint: a clear error status, never a crash."""

import socket
import threading

import pytest
from hardening_helpers import jsonl, metrics_when, raw_request, value

from servers import start_exporter, wait_until

ENDPOINTS = ["/metrics", "/-/healthy", "/-/ready", "/", "/no-such-page"]
CLOSE = b"Host: localhost\r\nConnection: close\r\n"  # one request a connection: read until the server closes
GOOD_STATUS = {"/metrics": 200, "/-/healthy": 200, "/-/ready": 200, "/": 200, "/no-such-page": 404}


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("http")
    run_file = tmp_path / "gsm8k" / "ppo.jsonl"
    run_file.parent.mkdir()
    run_file.write_text(jsonl(1, {"actor/pg_clipfrac": 0.1}))
    with start_exporter(tmp_path, "--source", str(run_file), "--gpu.fake", "healthy:2",
                        "--no-collector.host") as server:
        metrics_when(server, lambda text: value(text, "verl_training_last_step") == 1, "step 1")
        yield server
        assert server.process.poll() is None, f"the exporter died:\n{server.log()}"


def status_line(reply: bytes) -> bytes:
    return reply.split(b"\r\n", 1)[0]


def still_serving(server) -> None:
    for path in ("/-/healthy", "/metrics"):
        status, _ = server.get(path)
        assert status == 200, f"{path} answered {status} after a bad request:\n{server.log()[-3000:]}"


BAD_REQUESTS = {
    # name: (request template with {path}, the status line's expected code)
    "unsupported method": (b"POST {path} HTTP/1.1\r\n" + CLOSE + b"Content-Length: 5\r\n\r\nhello", b"501"),
    "delete": (b"DELETE {path} HTTP/1.1\r\n" + CLOSE + b"\r\n", b"501"),
    "70 kB request line": (b"GET {path}?" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", b"414"),
    "70 kB header": (b"GET {path} HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
    "200 headers": (b"GET {path} HTTP/1.1\r\n" + CLOSE + b"".join(b"X-%d: y\r\n" % i for i in range(200))
                    + b"\r\n", b"431"),
    "unknown HTTP version": (b"GET {path} HTTP/9.9\r\nHost: localhost\r\n\r\n", b"505"),
    # The request target is visible ASCII (RFC 9112); h11 refuses anything else.
    "invalid UTF-8 in the path": (b"GET {path}\xff\xfe HTTP/1.1\r\n" + CLOSE + b"\r\n", b"400"),
    "NUL in the path": (b"GET {path}\x00x HTTP/1.1\r\n" + CLOSE + b"\r\n", b"400"),
    "HTTP/1.1 without Host": (b"GET {path} HTTP/1.1\r\n\r\n", b"400"),
    "not HTTP at all": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 {path}\r\n\r\n", b"400"),
}


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_requests_get_an_error_status_and_the_server_keeps_serving(exporter, path, case):
    template, code = BAD_REQUESTS[case]
    reply = raw_request(exporter.port, template.replace(b"{path}", path.encode()))
    assert status_line(reply).split()[1] == code, reply[:300]
    still_serving(exporter)


ODD_BUT_VALID = {
    "query string with bad percent-escapes": b"GET {path}?x=%ff%zz HTTP/1.1\r\n" + CLOSE + b"\r\n",
    "huge Content-Length on a GET": b"GET {path} HTTP/1.1\r\n" + CLOSE + b"Content-Length: 99999999999\r\n\r\n",
    "unparsable Accept version":
        b"GET {path} HTTP/1.1\r\n" + CLOSE + b"Accept: application/openmetrics-text; version=garbage\r\n\r\n",
    "unparsable text/plain version": b"GET {path} HTTP/1.1\r\n" + CLOSE + b"Accept: text/plain; version=abc\r\n\r\n",
    "Accept full of commas": b"GET {path} HTTP/1.1\r\n" + CLOSE + b"Accept: " + b",;=" * 5000 + b"\r\n\r\n",
    "HEAD": b"HEAD {path} HTTP/1.1\r\n" + CLOSE + b"\r\n",
}


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("case", ODD_BUT_VALID)
def test_odd_requests_get_an_answer(exporter, path, case):
    reply = raw_request(exporter.port, ODD_BUT_VALID[case].replace(b"{path}", path.encode()))
    assert reply.startswith(b"HTTP/1.1 "), f"no HTTP answer to {case}: {reply[:200]!r}"
    assert int(status_line(reply).split()[1]) == GOOD_STATUS[path], reply[:300]
    still_serving(exporter)


def test_metrics_negotiation(exporter):
    """Prometheus' Accept header gets the text format, an OpenMetrics-only client gets OpenMetrics."""
    prometheus_accept = (b"application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                         b"q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    reply = raw_request(exporter.port,
                        b"GET /metrics HTTP/1.1\r\n" + CLOSE + b"Accept: " + prometheus_accept + b"\r\n\r\n")
    assert b"Content-Type: text/plain; version=0.0.4" in reply and not reply.rstrip().endswith(b"# EOF")
    reply = raw_request(exporter.port,
                        b"GET /metrics HTTP/1.1\r\n" + CLOSE
                        + b"Accept: application/openmetrics-text;version=1.0.0\r\n\r\n")
    assert b"Content-Type: application/openmetrics-text" in reply and reply.rstrip().endswith(b"# EOF")


def test_slow_clients_do_not_block_others(exporter):
    """Clients that send half a request and wait, or never read the answer, hold only their own connection."""
    slow = []
    try:
        for index in range(30):
            sock = socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
            sock.sendall(b"GET /metr" if index % 2 else b"GET /metrics HTTP/1.1\r\nAccept: text/plain\r\n")
            slow.append(sock)
        for _ in range(2):
            reader = socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")  # and never reads the reply
            slow.append(reader)
        for path in ENDPOINTS:
            assert exporter.get(path)[0] == GOOD_STATUS[path]
    finally:
        for sock in slow:
            sock.close()
    still_serving(exporter)


def test_a_stalled_request_is_dropped_after_the_request_timeout(monkeypatch):
    """In-process, with a short timeout: the slow connection is closed, the server answers others."""
    from verl_exporter.exposition import Exposition
    from verl_exporter.http import server as server_module

    monkeypatch.setattr(server_module, "HEADER_TIMEOUT", 0.3, raising=False)
    monkeypatch.setattr(getattr(server_module, "_Handler", server_module), "timeout", 0.3, raising=False)
    http, _ = server_module.serve(("127.0.0.1", 0), Exposition([]))
    try:
        port = http.server_address[1]
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /metr")
        closed = threading.Event()

        def wait_for_close():
            try:
                while sock.recv(1024):
                    pass
            except OSError:
                pass
            closed.set()

        threading.Thread(target=wait_for_close, daemon=True).start()
        wait_until(closed.is_set, timeout=10, message="the server to drop a stalled request")
        reply = raw_request(port, b"GET /-/healthy HTTP/1.1\r\n" + CLOSE + b"\r\n")
        assert status_line(reply) == b"HTTP/1.1 200 OK"
        sock.close()
    finally:
        http.shutdown()
        http.server_close()


def test_many_connections_at_once(exporter):
    """More simultaneous connections than the listen backlog: every one is answered."""
    results = []

    def one():
        try:
            results.append(raw_request(exporter.port, b"GET /-/healthy HTTP/1.1\r\n" + CLOSE + b"\r\n"))
        except OSError as exc:
            results.append(repr(exc).encode())

    threads = [threading.Thread(target=one) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 200
    assert all(status_line(reply) == b"HTTP/1.1 200 OK" for reply in results), \
        [reply[:80] for reply in results if not reply.startswith(b"HTTP/1.1 200")][:5]


ACCEPT_ENCODING = {
    # header: whether the answer is gzipped
    "gzip": True,
    "GZIP": True,
    "gzip;q=0": False,
    "gzip; q=0.0": False,
    "gzip;q=0, *": False,
    "*": True,
    "*;q=0": False,
    "identity": False,
    "identity;q=0, gzip;q=0.1": True,
    "gzip;q=0.5, identity": False,
    "br;q=1.0, gzip;q=0.8, *;q=0.1": True,
    "deflate, br": False,
    "gzip;q=abc": False,
    "": False,
}


@pytest.mark.parametrize("accept_encoding", ACCEPT_ENCODING)
def test_accept_encoding_q_values(exporter, accept_encoding):
    reply = raw_request(exporter.port, b"GET /metrics HTTP/1.1\r\n" + CLOSE + b"Accept-Encoding: "
                        + accept_encoding.encode() + b"\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert status_line(reply) == b"HTTP/1.1 200 OK"
    assert (b"Content-Encoding: gzip" in head) is ACCEPT_ENCODING[accept_encoding], head
    assert (body[:2] == b"\x1f\x8b") is ACCEPT_ENCODING[accept_encoding]
    vary = [line for line in head.split(b"\r\n") if line.lower().startswith(b"vary:")]
    assert len(vary) == 1 and b"Accept-Encoding" in vary[0] and b"Accept" in vary[0].split(b":", 1)[1].split(b",")[0]


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_name_filter(exporter):
    """?name[]=... serves only those samples, as client_python's own server does."""
    everything = families(exporter.get("/metrics")[1])
    assert {"verl_actor_pg_clipfrac", "verl_training_last_step", "process_cpu_seconds_total"} <= everything
    status, text = exporter.get("/metrics?name[]=verl_actor_pg_clipfrac&name[]=verl_training_last_step"
                                "&name[]=process_cpu_seconds_total&name[]=no_such_metric")
    assert status == 200
    assert families(text) == {"verl_actor_pg_clipfrac", "verl_training_last_step", "process_cpu_seconds_total"}
    assert value(text, "verl_actor_pg_clipfrac", project="gsm8k") == 0.1
    assert families(exporter.get("/metrics?name[]=no_such_metric")[1]) == set()
    assert families(exporter.get("/metrics?other=1")[1]) == everything


class _Failing:
    def collect(self):
        raise RuntimeError("internal detail /secret/path.jsonl")


def test_a_failed_scrape_answers_a_generic_500_and_logs_the_detail(caplog):
    from verl_exporter.exposition import Exposition
    from verl_exporter.http import server as server_module

    http, _ = server_module.serve(("127.0.0.1", 0), Exposition([_Failing()]))
    try:
        reply = raw_request(http.server_address[1], b"GET /metrics HTTP/1.1\r\n" + CLOSE + b"\r\n")
    finally:
        http.shutdown()
        http.server_close()
    assert status_line(reply) == b"HTTP/1.1 500 Internal Server Error"
    assert reply.partition(b"\r\n\r\n")[2] == b"scrape failed; see the exporter's log\n"
    assert "internal detail /secret/path.jsonl" in caplog.text


class _Big:
    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("verl_test_big", "Many samples.", labels=["i"])
        for index in range(50_000):
            family.add_metric([str(index)], index)
        yield family


def test_a_client_that_drops_mid_response_is_one_debug_line(capfd, caplog):
    """No traceback outside the log format: one debug line per dropped connection."""
    import logging
    import struct

    from verl_exporter.exposition import Exposition
    from verl_exporter.http import server as server_module

    caplog.set_level(logging.DEBUG, logger="verl_exporter.http.server")
    http, _ = server_module.serve(("127.0.0.1", 0), Exposition([_Big()]))
    try:
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", http.server_address[1]), timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # a reset while the server builds its answer
        wait_until(lambda: sum("ended early" in r.getMessage() for r in caplog.records) == 3,
                   message="three dropped connections logged")
        reply = raw_request(http.server_address[1], b"GET /-/healthy HTTP/1.1\r\n" + CLOSE + b"\r\n")
        assert reply.startswith(b"HTTP/1.1 200")
    finally:
        http.shutdown()
        http.server_close()
    dropped = [r for r in caplog.records if "ended early" in r.getMessage()]
    assert all(r.levelname == "DEBUG" and "\n" not in r.getMessage() and not r.exc_info for r in dropped)
    assert "Traceback" not in capfd.readouterr().err


class _GatedExposition:
    """An exposition whose renderings wait for ``gate``; its clock counts the scrapes that arrive."""

    def __init__(self):
        self.gate = threading.Event()
        self.ticks = 0
        self.ticked = threading.Condition()
        self.calls: list[tuple[str, float]] = []

    def clock(self) -> float:
        with self.ticked:
            self.ticks += 1
            self.ticked.notify_all()
            return float(self.ticks)

    def encode(self, accept, names, compressed, arrived):
        self.calls.append((accept, arrived))
        self.gate.wait(10)
        return b"rendered for %s at %g\n" % (accept.encode(), arrived), "text/plain; version=0.0.4; charset=utf-8"


def test_scrapes_waiting_for_a_render_thread_share_one_rendering_made_after_the_last_arrived():
    from verl_exporter.http import server as server_module

    exposition = _GatedExposition()
    http, _ = server_module.serve(("127.0.0.1", 0), exposition)  # type: ignore[arg-type]
    port = http.server_address[1]
    replies: dict[str, list[bytes]] = {}

    def scrape(accept: str) -> None:
        reply = raw_request(port, b"GET /metrics HTTP/1.1\r\n" + CLOSE + f"Accept: {accept}\r\n\r\n".encode())
        replies.setdefault(accept, []).append(reply.partition(b"\r\n\r\n")[2])

    threads = server_module.RENDER_THREADS
    busy = [threading.Thread(target=scrape, args=(f"text/plain;busy={i}",)) for i in range(threads)]
    same = [threading.Thread(target=scrape, args=("text/plain",)) for _ in range(6)]
    try:
        for thread in busy:  # every render thread waits on the gate
            thread.start()
        wait_until(lambda: len(exposition.calls) == server_module.RENDER_THREADS, timeout=10)
        for thread in same:  # six scrapes of one body arrive while no render thread is free
            thread.start()
        with exposition.ticked:
            assert exposition.ticked.wait_for(lambda: exposition.ticks == server_module.RENDER_THREADS + 6, 10)
        exposition.gate.set()
        for thread in busy + same:
            thread.join(10)
    finally:
        exposition.gate.set()
        http.shutdown()
        http.server_close()
    shared = [arrived for accept, arrived in exposition.calls if accept == "text/plain"]
    assert shared == [float(server_module.RENDER_THREADS + 6)]  # one rendering, after the last of the six arrived
    assert replies["text/plain"] == [b"rendered for text/plain at %d\n" % (server_module.RENDER_THREADS + 6)] * 6
