"""What the HTTP server reads of a request before answering it: its path, whether its body is small
enough to skip, and how any of it is written to a log line."""

from __future__ import annotations

import h11

MAX_BODY_BYTES = 64 * 1024  # of a request body, read and dropped so the connection can serve the next request


def printable(data: bytes | str, limit: int = 200) -> str:
    """``data`` for a log line, cut at ``limit``: control characters (ESC, CR, LF), backslashes and
    non-ASCII escaped, so a client cannot forge log lines or send terminal escapes."""
    text = data.decode("latin-1") if isinstance(data, bytes) else data
    return text[:limit].encode("unicode_escape").decode("ascii")


def small_body(request: h11.Request) -> bool:
    """Whether the request declares a body of at most MAX_BODY_BYTES (none counts), which is read and
    dropped so the connection serves on; a larger or chunked one is not waited for: the answer closes."""
    length = 0
    for name, value in request.headers:
        if name == b"transfer-encoding":
            return False
        if name == b"content-length":
            length = int(value) if value.isdigit() else MAX_BODY_BYTES + 1
    return length <= MAX_BODY_BYTES


def request_path(target: bytes) -> str:
    """The path and query of a request target; an absolute URI (``http://host/metrics``) is
    served as its path, as RFC 9112 asks of a server."""
    text = target.decode("latin-1")
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() in ("http", "https"):
        slash = rest.find("/")
        query = rest.find("?")
        if slash < 0 or 0 <= query < slash:
            return "/" + (rest[query:] if query >= 0 else "")
        return rest[slash:]
    return text
