"""Small helpers shared by the hardening tests: read samples, write steps, talk raw HTTP."""

from __future__ import annotations

import json
import socket

from exposition import matching

samples = matching  # values of every sample called ``name`` whose labels include ``labels``


def value(text: str, name: str, **labels) -> float | None:
    """The one matching sample's value, None if there is none."""
    found = samples(text, name, **labels)
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def jsonl(step: int, data: dict) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


def metrics_when(server, predicate, message: str, timeout: float = 20.0) -> str:
    """Scrape ``server`` until ``predicate(text)`` holds; the text that satisfied it."""
    from servers import wait_until

    def ready():
        status, text = server.get("/metrics")
        return text if status == 200 and predicate(text) else None

    return wait_until(ready, timeout=timeout, message=message)


def raw_request(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return received
