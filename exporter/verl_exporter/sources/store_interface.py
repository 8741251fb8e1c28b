"""What a source hands its records to (``Store``; ``store.run_store.RunStore`` is one), and
``RecordsOnly``, the part of it a reader of whole files does without."""

from __future__ import annotations

from typing import Protocol

from verl_exporter.store.records import Record


class Store(Protocol):
    """Where records go, and what a source reports of its files: values that are no number
    (``values_dropped``), why a path cannot be read (``source_state``, None when it can) and a path
    gone (``forget_source``). Sources are named by their display path (``\\xNN`` for bytes that
    are not UTF-8), so a file name can never make the exposition unencodable."""

    def ingest(self, record: Record) -> None: ...

    def parse_error(self, source: str, reason: str) -> None: ...

    def values_dropped(self, source: str, reason: str, count: int = 1) -> None: ...

    def source_state(self, source: str, reason: str | None) -> None: ...

    def forget_source(self, source: str) -> None: ...


class RecordsOnly:
    """The part of ``Store`` a reader of whole files does without: the reports on its files are dropped."""

    def values_dropped(self, source: str, reason: str, count: int = 1) -> None:
        """Not counted."""

    def source_state(self, source: str, reason: str | None) -> None:
        """Not kept."""

    def forget_source(self, source: str) -> None:
        """Nothing to forget."""
