"""The Prometheus text format of the training families, rendered once per run change.

client_python's text writer formats every label of every sample again on each scrape; with a
thousand runs that is most of a scrape's cost, for output that mostly did not change. Here each
run's samples are rendered (by client_python's own writer, so the bytes are the same) when the
run's store version changes, kept per family, and joined per scrape; an unchanged store is served
from the last join. ``render_text`` is the text encoder that uses it; ``SharedRender`` lets
concurrent scrapes share one rendering. OpenMetrics, ``name[]`` filters and every other collector
still go through client_python unchanged.
"""

from __future__ import annotations

import contextvars
import gzip
import threading
import time
from typing import Callable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from .training import OPTIONAL_FAMILIES, unrenderable

PRERENDER = contextvars.ContextVar("verl_exporter_prerender", default=False)
_HEADER_LINES = 2  # "# HELP" and "# TYPE"


class Part:
    """A piece of the exposition text; a part that stays the same until a run changes keeps its
    gzip member too (gzip members concatenate into one valid stream, RFC 1952)."""

    __slots__ = ("text", "static", "_gzipped")

    def __init__(self, text: bytes, static: bool = False):
        self.text, self.static, self._gzipped = text, static, None

    def gzipped(self) -> bytes:
        if self._gzipped is None:
            self._gzipped = gzip.compress(self.text, compresslevel=1)
        return self._gzipped


class Prerendered(Metric):
    """Families that are already text: what ``render_text`` writes as they are. It has no samples,
    so the runner's renderability check passes (the text was encoded when it was rendered)."""

    def __init__(self, parts: list[Part]):
        super().__init__("verl_training", "Training families, already rendered.", "untyped")
        self.parts = parts


class _One:
    def __init__(self, metric: Metric):
        self.metric = metric

    def collect(self):
        return [self.metric]


def _text(metric: Metric) -> bytes:
    return generate_latest(_One(metric))


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _split(text: bytes) -> tuple[bytes, bytes]:
    """(header, sample lines) of one rendered family."""
    cut = 0
    for _ in range(_HEADER_LINES):
        cut = text.index(b"\n", cut) + 1
    return text[:cut], text[cut:]


class RunRenderCache:
    """The training collector's families as text: per run, per family, reused until the run changes.

    Families come out in the order ``collect()`` gives them: the per-run families, the store's,
    then the logged metrics by name; a per-run family that no run has and that ``collect()`` leaves
    out (finished time, total steps, config) is left out here too.
    """

    def __init__(self, collector):
        self.collector = collector
        self._lock = threading.Lock()
        self._versions: dict = {}  # run -> version rendered
        self._serial: int | None = None  # the store's serial when last rendered
        self._runs: dict = {}  # run -> {family key: sample lines}
        self._headers: dict[str, bytes] = {}  # family key -> header lines
        self._joined: dict[str, bytes] | None = None  # family key -> every run's lines, in run order
        self._blocks: dict[int, Part] = {}  # the unchanged stretches of the output, in order
        self._store_parts: dict[str, tuple[list, Part]] = {}  # the store's families as last rendered
        self._last: tuple[tuple, list[Part]] | None = None  # the store's figures and the parts of them

    def render(self) -> Prerendered:
        with self._lock:
            return Prerendered(self._render())

    def _render(self) -> list[Part]:
        snapshot = self.collector.store.snapshot(known=self._versions, since=self._serial)
        self._serial = snapshot.serial
        if snapshot.versions is None:  # no run changed, none came or went
            snapshot.versions, changed = self._versions, False
        else:
            changed = bool(snapshot.runs) or snapshot.versions.keys() != self._versions.keys()
        for state in snapshot.runs:
            try:
                self._runs[state.run] = self._render_run(state)
            except Exception as exc:  # what one run logged never fails the others' rendering
                self._runs.pop(state.run, None)
                unrenderable(state.run, exc)
        for gone in (self._versions.keys() - snapshot.versions.keys()) if changed else ():
            del self._runs[gone]
        self._versions = snapshot.versions
        if changed or self._joined is None:
            self._joined, self._blocks = self._join(), {}
        inputs = (snapshot.parse_errors, snapshot.values_dropped, snapshot.sources, len(snapshot.versions),
                  snapshot.runs_dropped, snapshot.runs_expired, snapshot.run_cap_reached)
        if not changed and self._last is not None and self._last[0] == inputs:
            return self._last[1]  # nothing changed at all: the parts as they were
        parts = self._parts(snapshot)
        self._last = (inputs, parts)
        return parts

    def _parts(self, snapshot) -> list[Part]:
        families = self.collector._families()
        self.collector.add_store_families(families, snapshot)
        parts: list[Part] = []
        static: list[bytes] = []

        def close_block():
            if static:
                index = len(parts)
                block = self._blocks.get(index)
                if block is None:
                    block = self._blocks[index] = Part(b"".join(static), static=True)
                parts.append(block)
                static.clear()

        for key, family in families.items():
            if key in self._joined:
                static += (self._headers[key], self._joined[key])
            elif key not in OPTIONAL_FAMILIES:
                close_block()
                parts.append(self._store_part(key, family))
        static += (part for key in sorted(k for k in self._joined if k.startswith("verl_"))
                   for part in (self._headers[key], self._joined[key]))
        close_block()
        return parts

    def _store_part(self, key: str, family: Metric) -> Part:
        """The store's families (and per-run ones no run has): rendered again only when their
        samples differ from the last scrape's (a source_up sample per file adds up)."""
        last = self._store_parts.get(key)
        if last is not None and last[0] == family.samples:
            return last[1]
        part = Part(_text(family), static=True)
        self._store_parts[key] = (family.samples, part)
        return part

    def _render_run(self, state) -> dict[str, bytes]:
        rendered = {}
        for key, family in self.collector.run_families(state, logged=False).items():
            header, lines = _split(_text(family))
            self._headers.setdefault(key, header)
            rendered[key] = lines
        rendered.update(self._render_logged(state))
        return rendered

    def _render_logged(self, state) -> dict[str, bytes]:
        """The run's logged series, as client_python's text writer formats them (labels sorted by
        name, values escaped, floats as Go prints them), the run's labels formatted once."""
        from .training import RUN_LABELS

        run = dict(zip(RUN_LABELS, (_escape(state.run.project), _escape(state.run.experiment))))
        plain = ",".join(f'{name}="{run[name]}"' for name in sorted(run))
        lines: dict[str, list[str]] = {}
        for (name, label_values), (resolved, value) in state.series.items():
            spec = resolved.spec
            if spec.label_names:
                labels = {**run, **dict(zip(spec.label_names, map(_escape, label_values)))}
                text = ",".join(f'{label}="{labels[label]}"' for label in sorted(labels))
            else:
                text = plain
            found = lines.get(name)
            if found is None:
                found = lines[name] = []
                if name not in self._headers:
                    header = GaugeMetricFamily(name, spec.full_help(), labels=RUN_LABELS + list(spec.label_names))
                    self._headers[name] = _text(header)
            found.append(f"{name}{{{text}}} {floatToGoString(value)}\n")
        return {name: "".join(found).encode("utf-8") for name, found in lines.items()}

    def _join(self) -> dict[str, bytes]:
        order = sorted(self._runs)
        keys = set().union(*(self._runs[run].keys() for run in order))
        return {key: b"".join([self._runs[run].get(key, b"") for run in order]) for key in keys}


def render_parts(registry) -> list[Part]:
    """``generate_latest(registry)`` in parts, the training families taken from their render cache."""
    token = PRERENDER.set(True)
    try:
        out: list[Part] = []
        for metric in registry.collect():
            if isinstance(metric, Prerendered):
                out += metric.parts
            else:
                out.append(Part(_text(metric)))
        return out
    finally:
        PRERENDER.reset(token)


def render_text(registry) -> bytes:
    """``generate_latest(registry)``, with the training families taken from their render cache."""
    return join(render_parts(registry))


def join(parts: list[Part], compressed: bool = False) -> bytes:
    """The parts as one body; gzipped: the unchanged parts' members as kept, the rest compressed
    anew (one member for each stretch between them)."""
    if not compressed:
        return b"".join(part.text for part in parts)
    out, fresh = [], []
    for part in parts:
        if part.static:
            if fresh:
                out.append(gzip.compress(b"".join(fresh), compresslevel=1))
                fresh = []
            out.append(part.gzipped())
        else:
            fresh.append(part.text)
    if fresh or not out:
        out.append(gzip.compress(b"".join(fresh), compresslevel=1))
    return b"".join(out)


class SharedRender:
    """The text format of ``registry`` for concurrent scrapes: a scrape that arrives while another
    renders waits for the next rendering and shares it, so N scrapers cost about one rendering each
    round, and every answer was rendered after its request arrived."""

    def __init__(self, registry, render: Callable = render_parts, clock: Callable[[], float] = time.monotonic):
        self.registry = registry
        self.render = render
        self.clock = clock
        self._lock = threading.Lock()
        self._parts: list[Part] | None = None
        self._bodies: dict[bool, bytes] = {}
        self._started = float("-inf")

    def __call__(self, compressed: bool = False) -> bytes:
        """The text format (gzipped with ``compressed``), rendered after this call began."""
        arrived = self.clock()
        with self._lock:
            if self._parts is None or self._started < arrived:
                started = self.clock()
                self._parts, self._bodies = None, {}
                self._parts, self._started = self.render(self.registry), started
            body = self._bodies.get(compressed)
            if body is None:
                body = self._bodies[compressed] = join(self._parts, compressed)
            return body
