"""Reading a file the operator names, within bounds: a regular file only, at most ``limit`` bytes.

Opened without blocking, so a FIFO with no writer cannot hold the open up; a FIFO, a device
(``/dev/zero``) or a directory is refused before a byte is read. Errors never quote the content.
"""

from __future__ import annotations

import os
import stat


class NotRegularFile(ValueError):
    """The path is a FIFO, a device, a directory: no regular file."""


class FileTooLarge(ValueError):
    """The file holds more than the limit."""


def read_regular_file(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; OSError when it cannot be
    opened or read, NotRegularFile or FileTooLarge otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile("not a regular file")
        chunks, size = [], 0
        while size <= limit:  # st_size can lie (a file that grows, /proc): count what is read
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise FileTooLarge(f"larger than {limit} bytes")
    return b"".join(chunks)
