"""Ingestor: polls every source in turn on a daemon thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol


class Source(Protocol):
    """What the ingestor needs of a source (``sources.Source``): its ``pattern`` (named in the log),
    ``poll()``, whether it is still reading a backlog (``behind``), and for /-/ready ``caught_up``."""

    pattern: str

    def poll(self) -> int: ...

    @property
    def behind(self) -> bool: ...

    @property
    def caught_up(self) -> bool: ...


log = logging.getLogger("verl_exporter.sources")


def poll_sources(sources: list[Source], failing: set[int]) -> tuple[int, bool]:
    """Poll each of ``sources``: the records ingested and whether one is reading a backlog. One
    source failing is logged once (its index kept in ``failing`` until it works again) and does not
    stop the others."""
    total, behind = 0, False
    for index, source in enumerate(sources):
        try:
            total += source.poll()
        except Exception:
            if index not in failing:
                failing.add(index)
                log.exception("polling %s failed", source.pattern)
            continue
        if index in failing:
            failing.discard(index)
            log.warning("polling %s works again", source.pattern)
        behind = behind or source.behind
    return total, behind


class Ingestor:
    """Polls every source in turn on a daemon thread, every ``interval`` seconds, then calls ``tick``.

    While a source is still reading a backlog it polls again at once. One source failing is
    logged and does not stop the others.
    """

    def __init__(self, sources: Iterable[Source], interval: float = 0.5,
                 tick: Callable[[float], None] | None = None) -> None:
        self.sources = list(sources)
        self.interval = interval
        self.tick = tick  # after each round, with the time: the store's clock-driven accounting
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: set[int] = set()

    def poll_all(self) -> int:
        """One synchronous round over every source; return the records ingested."""
        return poll_sources(self.sources, self._failing)[0]

    def start(self) -> None:
        """Start the polling thread (no-op if it is running)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="verl-exporter-ingest", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Ask the thread to finish its round and wait for it, at most ``timeout`` seconds (None: until it has); False
        when it is still in its round (a read that hangs), and is left to end by itself."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_all()
            if self.tick is not None:
                try:
                    self.tick(time.time())
                except Exception:  # noqa: BLE001 - the ledger's accounting must not stop the reading
                    log.exception("the store's tick failed")
            if not any(source.behind for source in self.sources):
                self._stop.wait(self.interval)
