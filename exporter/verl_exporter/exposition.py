"""The bytes of a scrape: one list of collectors, rendered in the format the client asks for.

The Prometheus text format (plain or gzip) is rendered in parts: a collector that keeps its text
(``text_parts()``, the training collector, which renders each run once per change) hands over
parts; every other collector's families are written by client_python's own writer, so the bytes
are the ones ``generate_latest`` would give. A client that asks for OpenMetrics only, or for some
names (``name[]``), gets client_python's encoders over the same collectors' families (one
collection of the registry below), fed by the same per-run families.

Every path shares its rendering: concurrent requests for the same format and names get one body,
rendered after each of them arrived, so N clients cost about one rendering a round whatever they
ask for.
"""

from __future__ import annotations

import functools
import gzip
import re
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

_HEADER_LINES = 2  # "# HELP" and "# TYPE"


class Part:
    """A piece of the text format; a part that stays the same until a run changes keeps its gzip
    member too (gzip members concatenate into one valid stream, RFC 1952)."""

    __slots__ = ("text", "static", "_gzipped")

    def __init__(self, text: bytes, static: bool = False):
        self.text, self.static = text, static
        self._gzipped: bytes | None = None

    def gzipped(self) -> bytes:
        if self._gzipped is None:
            self._gzipped = gzip.compress(self.text, compresslevel=1)
        return self._gzipped


class _One:
    def __init__(self, metric: Metric):
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


def family_text(metric: Metric) -> bytes:
    """One family in the text format, as client_python writes it: gauges and counters with plain
    names and no timestamps are written here (a scrape writes hundreds), others by client_python."""
    text = _plain_text(metric)
    return text if text is not None else generate_latest(_One(metric))


_PLAIN_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_PLAIN_LABEL = re.compile(r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*\Z")
# What was written for a label set and for a value, in earlier scrapes: most repeat from scrape to
# scrape (a GPU's labels, a counter that did not move). Cleared when full.
_label_texts: dict[tuple[tuple[str, str], ...], str] = {}
_value_texts: dict[float, str] = {}
_CACHED = 20_000


def _value_text(value: float) -> str:
    """``floatToGoString(value)``, remembered; zero and NaN are written afresh (0.0 == -0.0, and no
    NaN equals another)."""
    text = _value_texts.get(value) if value else None
    if text is None:
        text = floatToGoString(value)
        if value and value == value:
            if len(_value_texts) >= _CACHED:
                _value_texts.clear()
            _value_texts[value] = text
    return text


def _plain_text(metric: Metric) -> bytes | None:
    """``generate_latest``'s bytes for a gauge or counter whose names need no escaping and whose
    samples carry no timestamp, else None."""
    kind = metric.type
    if kind not in ("gauge", "counter"):
        return None
    name = metric.name + "_total" if kind == "counter" else metric.name
    if not _PLAIN_NAME.match(name):
        return None
    documentation = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n"]
    special = (metric.name + "_created", metric.name + "_gsum", metric.name + "_gcount")
    names: set[str] = set()
    for sample in metric.samples:
        if sample.name not in names:
            if sample.name in special or not _PLAIN_NAME.match(sample.name):
                return None
            names.add(sample.name)
        if sample.timestamp is not None:
            return None
        labels = sample.labels
        if not labels:
            lines.append(f"{sample.name} {_value_text(sample.value)}\n")
            continue
        key = tuple(labels.items())
        text = _label_texts.get(key)
        if text is None:
            if not all(_PLAIN_LABEL.match(label) for label in labels):
                return None
            text = ",".join(f'{label}="{escape(value)}"' for label, value in sorted(labels.items()))
            if len(_label_texts) >= _CACHED:
                _label_texts.clear()
            _label_texts[key] = text
        lines.append(f"{sample.name}{{{text}}} {_value_text(sample.value)}\n")
    return "".join(lines).encode("utf-8")


def split_header(text: bytes) -> tuple[bytes, bytes]:
    """(``# HELP`` and ``# TYPE`` lines, sample lines) of one rendered family."""
    cut = 0
    for _ in range(_HEADER_LINES):
        cut = text.index(b"\n", cut) + 1
    return text[:cut], text[cut:]


def escape(value: str) -> str:
    """A label value escaped as the text format wants it."""
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value  # most are plain: three searches cost less than three replaces
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def join(parts: list[Part], compressed: bool = False) -> bytes:
    """The parts as one body; gzipped: the unchanged parts' members as kept, the rest compressed
    anew (one member for each stretch between them)."""
    if not compressed:
        return b"".join(part.text for part in parts)
    out: list[bytes] = []
    fresh: list[bytes] = []
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


@runtime_checkable
class RendersText(Protocol):
    """A collector that hands over its families in the text format itself (the collector runner)."""

    def text_parts(self) -> list[Part]: ...


def text_parts(collectors: Iterable) -> list[Part]:
    """The text format of ``collectors``, in order, in parts; client_python's own collectors
    (``collect()`` only) are rendered here."""
    parts: list[Part] = []
    for collector in collectors:
        own = getattr(collector, "text_parts", None)  # what isinstance(collector, RendersText) checks, at less cost
        if callable(own):
            parts += own()
        else:
            parts += (Part(family_text(metric)) for metric in collector.collect())
    return parts


def prefer_text_format(accept: str) -> str:
    """The Accept header without its OpenMetrics types when it also takes the text format.

    Serves the Prometheus text format to Prometheus, as node_exporter does: client_python's
    OpenMetrics writer escapes every sample name character by character and takes about twice
    as long for the same samples. A client that accepts only OpenMetrics still gets it.
    """
    parts = [part for part in accept.split(",") if part.split(";")[0].strip() != "application/openmetrics-text"]
    takes_text = any(part.split(";")[0].strip() in ("text/plain", "*/*") for part in parts)
    return ",".join(parts) if takes_text else accept


@functools.lru_cache(maxsize=64)
def _encoder(accept: str) -> tuple[Callable, str]:
    """(encoder, content type) for an Accept header, as client_python chooses; remembered, since a
    scraper sends the same header every time."""
    try:
        return choose_encoder(prefer_text_format(accept))
    except Exception:  # client_python cannot read e.g. "version=abc"; promhttp falls back to text too
        return generate_latest, CONTENT_TYPE_PLAIN_0_0_4


class NameFilter:
    """The samples of ``families`` (a registry, or a list of collected families) named in
    ``names`` (``?name[]=...``, as client_python's server).

    A family's own name selects all its samples too. Unlike ``restricted_registry``, this also
    finds families that no collector describes up front, such as the training metrics.
    """

    def __init__(self, families: CollectorRegistry | list[Metric], names: Iterable[str]):
        self.families = families
        self.names = set(names)

    def collect(self) -> Iterable[Metric]:
        families = self.families.collect() if isinstance(self.families, CollectorRegistry) else self.families
        for family in families:
            if family.name in self.names:
                yield family
                continue
            samples = [sample for sample in family.samples if sample.name in self.names]
            if samples:
                kept = Metric(family.name, family.documentation, family.type, family.unit)
                kept.samples = samples
                yield kept


class _Collected:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class _Round:
    """One rendering (``value``, begun at ``started``) and the bodies made from it."""

    __slots__ = ("started", "value", "bodies")

    def __init__(self, started: float, value: Any):
        self.started, self.value = started, value
        self.bodies: dict[bool, bytes] = {}


class _Shared:
    """A rendering that requests share: one that began after a request arrived serves it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.round: _Round | None = None

    def get(self, arrived: float, make: Callable[[], tuple[float, Any]]) -> _Round:
        """The current round if it began at or after ``arrived``, else a new one from ``make()``
        (its start time and value); concurrent callers wait for one another's rendering."""
        with self.lock:
            if self.round is None or self.round.started < arrived:
                self.round = None  # the old rendering is not kept while the new one is made
                self.round = _Round(*make())
            return self.round

    def body(self, arrived: float, make: Callable[[], tuple[float, Any]], compressed: bool,
             encode: Callable[[Any, bool], bytes]) -> bytes:
        """The body of a round at least as new as ``arrived``: ``encode(value, compressed)``, once per round."""
        current = self.get(arrived, make)
        with self.lock:
            body = current.bodies.get(compressed)
            if body is None:
                body = current.bodies[compressed] = encode(current.value, compressed)
            return body


class Exposition:
    """What a scrape gets, from ``collectors`` (served in this order).

    ``text(compressed)`` is the text format, rendered after the call began (or after ``arrived``)
    and shared by the scrapes that wait for the same rendering, so N scrapers cost about one
    rendering a round. ``encode(accept, names)`` picks the format as client_python does; the
    OpenMetrics and filtered bodies are shared the same way, keyed by format and names, over one
    shared collection of the registry.
    """

    MAX_SHARED_KEYS = 16  # (format, names) bodies kept; the least recently used is dropped

    def __init__(self, collectors: Iterable, clock: Callable[[], float] = time.monotonic,
                 render: Callable[[list], list[Part]] = text_parts):
        self.collectors = list(collectors)
        self.registry = CollectorRegistry()
        for collector in self.collectors:
            self.registry.register(collector)
        self.clock = clock
        self.render = render
        self._text = _Shared()
        self._families = _Shared()
        self._keys_lock = threading.Lock()
        self._encoded: OrderedDict[tuple, _Shared] = OrderedDict()

    def parts(self) -> list[Part]:
        """The text format in parts, rendered now (not shared)."""
        return self.render(self.collectors)

    def text(self, compressed: bool = False, arrived: float | None = None) -> bytes:
        """The text format (gzipped with ``compressed``), rendered after this call began (or after
        ``arrived``, a time of ``clock``)."""
        arrived = self.clock() if arrived is None else arrived
        return self._text.body(arrived, lambda: (self.clock(), self.render(self.collectors)), compressed, join)

    def families(self, arrived: float | None = None) -> list[Metric]:
        """The registry's families, collected after this call began (or after ``arrived``), shared."""
        arrived = self.clock() if arrived is None else arrived
        return self._families.get(arrived, lambda: (self.clock(), list(self.registry.collect()))).value

    def encode(self, accept: str, names: list[str] | None = None,
               compressed: bool = False, arrived: float | None = None) -> tuple[bytes, str]:
        """(body, content type) for a client that sends ``accept`` and asks for ``names`` (all
        when None); gzipped with ``compressed``; rendered after ``arrived`` (default: now)."""
        arrived = self.clock() if arrived is None else arrived
        encoder, content_type = _encoder(accept)
        if encoder is generate_latest and not names:
            return self.text(compressed, arrived), content_type
        wanted = tuple(sorted(set(names))) if names else None
        shared = self._shared((content_type, wanted))

        def make() -> tuple[float, bytes]:
            collected = self._families.get(arrived, lambda: (self.clock(), list(self.registry.collect())))
            source = NameFilter(collected.value, wanted) if wanted else _Collected(collected.value)
            return collected.started, encoder(source)

        body = shared.body(arrived, make, compressed,
                           lambda value, gz: gzip.compress(value, compresslevel=1) if gz else value)
        return body, content_type

    def _shared(self, key: tuple) -> _Shared:
        with self._keys_lock:
            shared = self._encoded.get(key)
            if shared is None:
                shared = self._encoded[key] = _Shared()
                while len(self._encoded) > self.MAX_SHARED_KEYS:
                    self._encoded.popitem(last=False)
            else:
                self._encoded.move_to_end(key)
            return shared
