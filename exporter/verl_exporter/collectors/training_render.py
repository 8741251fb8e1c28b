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
import threading
import time
from typing import Callable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

PRERENDER = contextvars.ContextVar("verl_exporter_prerender", default=False)
_HEADER_LINES = 2  # "# HELP" and "# TYPE"


class Prerendered(Metric):
    """A family that is already text: what ``render_text`` writes as it is. It has no samples, so
    the runner's renderability check passes (the text was encoded when it was rendered)."""

    def __init__(self, text: bytes):
        super().__init__("verl_training", "Training families, already rendered.", "untyped")
        self.text = text


class _One:
    def __init__(self, metric: Metric):
        self.metric = metric

    def collect(self):
        return [self.metric]


def _text(metric: Metric) -> bytes:
    return generate_latest(_One(metric))


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
    out (total steps, config) is left out here too.
    """

    OPTIONAL = ("total_steps", "config", "config_info")

    def __init__(self, collector):
        self.collector = collector
        self._lock = threading.Lock()
        self._versions: dict = {}  # run -> version rendered
        self._runs: dict = {}  # run -> {family key: sample lines}
        self._headers: dict[str, bytes] = {}  # family key -> header lines
        self._joined: dict[str, bytes] | None = None  # family key -> every run's lines, in run order

    def render(self) -> Prerendered:
        with self._lock:
            return Prerendered(self._render())

    def _render(self) -> bytes:
        snapshot = self.collector.store.snapshot(known=self._versions)
        changed = bool(snapshot.runs) or snapshot.versions.keys() != self._versions.keys()
        for state in snapshot.runs:
            self._runs[state.run] = self._render_run(state)
        for gone in self._versions.keys() - snapshot.versions.keys():
            del self._runs[gone]
        self._versions = snapshot.versions
        if changed or self._joined is None:
            self._joined = self._join()
        families = self.collector._families()
        self.collector.add_store_families(families, snapshot)
        out = []
        for key, family in families.items():
            if key in self._joined:
                out += (self._headers[key], self._joined[key])
            elif key not in self.OPTIONAL:
                out.append(_text(family))  # the store's families, and per-run ones no run has
        out += (part for key in sorted(k for k in self._joined if k.startswith("verl_"))
                for part in (self._headers[key], self._joined[key]))
        return b"".join(out)

    def _render_run(self, state) -> dict[str, bytes]:
        rendered = {}
        for key, family in self.collector.run_families(state).items():
            header, lines = _split(_text(family))
            self._headers.setdefault(key, header)
            rendered[key] = lines
        return rendered

    def _join(self) -> dict[str, bytes]:
        order = sorted(self._runs)
        keys = set().union(*(self._runs[run].keys() for run in order))
        return {key: b"".join([self._runs[run].get(key, b"") for run in order]) for key in keys}


def render_text(registry) -> bytes:
    """``generate_latest(registry)``, with the training families taken from their render cache."""
    token = PRERENDER.set(True)
    try:
        out = []
        for metric in registry.collect():
            out.append(metric.text if isinstance(metric, Prerendered) else _text(metric))
        return b"".join(out)
    finally:
        PRERENDER.reset(token)


class SharedRender:
    """The text format of ``registry`` for concurrent scrapes: a scrape that arrives while another
    renders waits for the next rendering and shares it, so N scrapers cost about one rendering each
    round, and every answer was rendered after its request arrived."""

    def __init__(self, registry, render: Callable = render_text, clock: Callable[[], float] = time.monotonic):
        self.registry = registry
        self.render = render
        self.clock = clock
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self._started = float("-inf")

    def __call__(self) -> bytes:
        arrived = self.clock()
        with self._lock:
            if self._body is not None and self._started >= arrived:
                return self._body
            started = self.clock()
            self._body = None
            body = self.render(self.registry)
            self._body, self._started = body, started
            return body
