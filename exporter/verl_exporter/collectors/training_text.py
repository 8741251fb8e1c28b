"""The training families in the text format, rendered once per run change.

client_python's text writer formats every label of every sample again on each scrape; with a
thousand runs that is most of a scrape's cost, for output that mostly did not change. Here each
run's families (the training collector's one table, ``run_families``) are rendered when the run's
store version changes, by client_python's own writer where it is not the hot path so the bytes are
the same, kept per family, and joined per scrape; an unchanged store is served from the last join.
"""

from __future__ import annotations

import threading
from typing import Mapping, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from verl_exporter.store.run_state import RunState, StoreSnapshot
from verl_exporter.store.run_store import RunStore

from .. import schema
from ..exposition import Part, escape, family_text, split_header
from .run_cache import RunCache


class RunTable(Protocol):
    """What the training collector says a run and the store export (its one table)."""

    store: RunStore

    def new_run_families(self) -> Mapping[str, Metric]: ...

    def run_families(self, state: RunState, logged: bool = True) -> Mapping[str, Metric]: ...

    def store_families(self, snapshot: StoreSnapshot) -> Mapping[str, Metric]: ...


class RunText:
    """The training collector's families as text parts: per run, per family, reused until the run
    changes. Families come out in the order ``collect()`` gives them: the per-run families (an
    optional one only where some run has it), the store's, then the logged metrics by name."""

    def __init__(self, collector: RunTable):
        self.collector = collector
        self._lock = threading.Lock()
        self._runs: RunCache[dict[str, bytes]] = RunCache(collector.store, self._render_run)
        self._headers: dict[str, bytes] = {}  # family key -> header lines
        self._joined: dict[str, bytes] | None = None  # family key -> every run's lines, in run order
        self._blocks: dict[int, Part] = {}  # the unchanged stretches of the output, in order
        self._store_parts: dict[str, tuple[list, Part]] = {}  # the store's families as last rendered
        self._last: tuple[tuple, list[Part]] | None = None  # the store's figures and the parts of them

    def parts(self) -> list[Part]:
        with self._lock:
            snapshot, changed = self._runs.update()
            if changed or self._joined is None:
                self._joined, self._blocks = self._join(), {}
                if len(self._headers) > len(self._joined):  # families no run has any more: let go
                    self._headers = {key: header for key, header in self._headers.items() if key in self._joined}
            inputs = (snapshot.parse_errors, snapshot.values_dropped, snapshot.sources, len(snapshot.versions or {}),
                      snapshot.runs_dropped, snapshot.runs_expired, snapshot.run_cap_reached)
            if not changed and self._last is not None and self._last[0] == inputs:
                return self._last[1]  # nothing changed at all: the parts as they were
            parts = self._parts(snapshot)
            self._last = (inputs, parts)
            return parts

    def _parts(self, snapshot: StoreSnapshot) -> list[Part]:
        joined = self._joined or {}
        parts: list[Part] = []
        static: list[bytes] = []

        def close_block() -> None:
            if static:
                index = len(parts)
                block = self._blocks.get(index)
                if block is None:
                    block = self._blocks[index] = Part(b"".join(static), static=True)
                parts.append(block)
                static.clear()

        for key, family in self.collector.new_run_families().items():
            if key in joined:
                static += (self._headers[key], joined[key])
            elif not schema.TRAINING_RUN[key].optional:
                close_block()
                parts.append(self._store_part(key, family))
        for key, family in self.collector.store_families(snapshot).items():
            close_block()
            parts.append(self._store_part(key, family))
        static += (part for key in sorted(k for k in joined if k.startswith("verl_"))
                   for part in (self._headers[key], joined[key]))
        close_block()
        return parts

    def _store_part(self, key: str, family: Metric) -> Part:
        """The store's families (and per-run ones no run has): rendered again only when their
        samples differ from the last scrape's (a source_up sample per file adds up)."""
        last = self._store_parts.get(key)
        if last is not None and last[0] == family.samples:
            return last[1]
        part = Part(family_text(family), static=True)
        self._store_parts[key] = (family.samples, part)
        return part

    def _render_run(self, state: RunState) -> dict[str, bytes]:
        rendered = {}
        for key, family in self.collector.run_families(state, logged=False).items():
            header, lines = split_header(family_text(family))
            self._headers.setdefault(key, header)
            rendered[key] = lines
        rendered.update(self._render_logged(state))
        return rendered

    def _render_logged(self, state: RunState) -> dict[str, bytes]:
        """The run's logged series, as client_python's text writer formats them (labels sorted by
        name, values escaped, floats as Go prints them), the run's labels formatted once."""
        run = dict(zip(schema.RUN, map(escape, state.run.labels)))
        plain = ",".join(f'{name}="{run[name]}"' for name in sorted(run))
        lines: dict[str, list[str]] = {}
        for (name, label_values), (resolved, value) in state.series.items():
            spec = resolved.spec
            if spec.label_names:
                labels = {**run, **dict(zip(spec.label_names, map(escape, label_values)))}
                text = ",".join(f'{label}="{labels[label]}"' for label in sorted(labels))
            else:
                text = plain
            found = lines.get(name)
            if found is None:
                found = lines[name] = []
                if name not in self._headers:
                    header = GaugeMetricFamily(name, spec.full_help(), labels=[*schema.RUN, *spec.label_names])
                    self._headers[name] = family_text(header)
            found.append(f"{name}{{{text}}} {floatToGoString(value)}\n")
        return {name: "".join(found).encode("utf-8") for name, found in lines.items()}

    def _join(self) -> dict[str, bytes]:
        runs = self._runs.in_order()
        keys = set().union(*(run.keys() for run in runs))
        return {key: b"".join([run.get(key, b"") for run in runs]) for key in keys}
