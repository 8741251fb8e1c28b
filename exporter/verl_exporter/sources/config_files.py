"""Config files (hydra's ``.hydra/config.yaml``, ``--run.config``, ``--source.format config``) read
off the ingest path.

A config file is parsed by one daemon thread shared by every source, once per change of the file
(its device, inode, size and modification time), from a bounded read of the file itself (at most
``MAX_CONFIG_CHARS`` bytes of a regular file). A file that changes while it waits is parsed once,
as it is then. So a large or slow config costs its own parse, never the steps of other sources.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable

from verl_exporter.config.bounded_files import FileTooLarge, NotRegularFile, read_regular_file
from verl_exporter.sources.run_config import MAX_CONFIG_CHARS, Scalar, flatten, read_config_text
from verl_exporter.store.records import ParseError

Signature = tuple[int, int, int, int]  # device, inode, size, mtime (ns)
Result = tuple[str, "dict[str, Scalar] | ParseError"]  # (path, flattened config or why not)


def signature(path: str) -> Signature | None:
    """What tells one version of a file from the next; None where it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_config_file(path: str) -> dict[str, Scalar]:
    """The flattened config of the regular file ``path``, read within ``MAX_CONFIG_CHARS`` bytes."""
    try:
        raw = read_regular_file(path, MAX_CONFIG_CHARS)
    except NotRegularFile:
        raise ParseError("config file is not a regular file") from None
    except FileTooLarge:
        raise ParseError(f"config file larger than {MAX_CONFIG_CHARS} characters") from None
    except OSError as exc:
        raise ParseError(f"cannot read the config file: {exc.strerror or exc}") from None
    return flatten(read_config_text(raw.decode("utf-8", "replace")))


class ConfigReader:
    """The thread that parses config files: ``submit(outbox, path)`` asks for ``path`` to be read;
    ``(path, flat config or ParseError)`` lands in ``outbox`` (a deque the source drains)."""

    def __init__(self, read: Callable[[str], dict[str, Scalar]] = read_config_file) -> None:
        self.read = read
        self._jobs: dict[tuple[int, str], deque] = {}  # waiting: one per (outbox, path), in order
        self._busy: set[tuple[int, str]] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, outbox: deque, path: str) -> None:
        with self._cond:
            self._jobs.setdefault((id(outbox), path), outbox)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="verl-exporter-config", daemon=True)
                self._thread.start()
            self._cond.notify()

    def pending(self, outbox: deque) -> bool:
        """Whether a file of ``outbox``'s source waits to be read or is being read."""
        with self._cond:
            return any(key[0] == id(outbox) for key in (*self._jobs, *self._busy))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                key = next(iter(self._jobs))
                outbox = self._jobs.pop(key)
                self._busy.add(key)
            path = key[1]
            try:
                result: dict[str, Scalar] | ParseError = self.read(path)
            except ParseError as exc:
                result = exc
            except Exception as exc:  # never let one file stop the thread
                result = ParseError(f"unreadable config file ({type(exc).__name__})")
            outbox.append((path, result))
            with self._cond:
                self._busy.discard(key)


CONFIG_READER = ConfigReader()
