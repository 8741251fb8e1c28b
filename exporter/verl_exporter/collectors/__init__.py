"""Runs every collector at scrape time and reports on each one, the node_exporter way.

Emits::

    # HELP verl_exporter_collector_success Whether the collector succeeded on this scrape (1) or failed (0).
    # TYPE verl_exporter_collector_success gauge
    verl_exporter_collector_success{collector="gpu"} 1.0
    # HELP verl_exporter_collector_duration_seconds How long the collector took on this scrape.
    # TYPE verl_exporter_collector_duration_seconds gauge
    verl_exporter_collector_duration_seconds{collector="gpu"} 0.0012

A collector that raises, or hands over a family that could not be rendered (text UTF-8 cannot
encode, a value no float holds), loses only its own metrics for that scrape; the others are still
served. A collector can also report a failure without raising by setting ``last_error`` to a message.
Every collector subclasses ``Collector``; ``verl_exporter.app.COLLECTORS`` says which are built.
"""

from __future__ import annotations

import logging
import time
from itertools import chain
from operator import attrgetter
from typing import Callable, Iterable

from prometheus_client.core import Metric

from .. import schema
from ..exposition import Part, family_text

log = logging.getLogger(__name__)

_NAME, _LABELS, _VALUE, _TIMESTAMP = map(attrgetter, ("name", "labels", "value", "timestamp"))


class Collector:
    """What the runner runs. ``collect()`` and ``describe()`` give the families; ``last_error`` is
    None, or why this scrape failed without raising; ``text_parts()`` is the families in the text
    format (the training collector keeps its own, rendered once per change of a run)."""

    last_error: str | None = None

    def collect(self) -> Iterable[Metric]:
        raise NotImplementedError

    def describe(self) -> Iterable[Metric]:
        raise NotImplementedError

    def text_parts(self) -> list[Part]:
        return [Part(family_text(family)) for family in _families(self)]


class CollectorRunner:
    """Wraps named collectors; register this one object on the registry."""

    def __init__(self, collectors: dict[str, Collector], clock: Callable[[], float] = time.perf_counter):
        self.collectors = dict(collectors)
        self._clock = clock
        self._failing: set[str] = set()

    def describe(self) -> Iterable[Metric]:
        for collector in self.collectors.values():
            yield from collector.describe()
        yield from self._status_families()

    def collect(self) -> Iterable[Metric]:
        return self._run(_families)

    def text_parts(self) -> list[Part]:
        """What ``collect()`` gives, in the text format: a collector that keeps its text
        (``text_parts()``) hands over its parts, the others' families are rendered here."""
        return self._run(_parts)

    def _run(self, produce: Callable) -> list:
        """``produce(collector)`` of every collector, then the report on each; a collector that
        fails gives nothing but its report."""
        out: list = []
        success, duration = {}, {}
        for name, collector in self.collectors.items():
            started = self._clock()
            try:
                produced = produce(collector)
                error = collector.last_error
            except Exception as exc:  # one collector must never fail the scrape
                produced, error = [], f"{type(exc).__name__}: {exc}"
            duration[name] = self._clock() - started
            success[name] = 0.0 if error else 1.0
            self._log_change(name, error)
            out += produced
        status = self._status_families(success, duration)
        return out + (status if produce is _families else [Part(family_text(family)) for family in status])

    def _log_change(self, name: str, error: str | None) -> None:
        """Log once when a collector starts failing and once when it recovers, not every scrape."""
        if error and name not in self._failing:
            self._failing.add(name)
            log.error("collector %s failed: %s", name, error)
        elif not error and name in self._failing:
            self._failing.discard(name)
            log.info("collector %s recovered", name)

    @staticmethod
    def _status_families(success: dict | None = None, duration: dict | None = None) -> list[Metric]:
        ok, took = schema.RUNNER["success"].new(), schema.RUNNER["duration"].new()
        if success is not None and duration is not None:
            for name, value in success.items():
                ok.add_metric([name], value)
                took.add_metric([name], duration[name])
        return [ok, took]


def _families(collector: Collector) -> list[Metric]:
    families = list(collector.collect())
    check_renderable(families)
    return families


def _parts(collector: Collector) -> list[Part]:
    return collector.text_parts()


def check_renderable(families: list[Metric]) -> None:
    """Raise what rendering would raise, before the HTTP layer renders: a string UTF-8 cannot encode
    (a lone surrogate), a value or timestamp that is no float (an int beyond 1.8e308). Loops in C:
    a scrape's samples are many."""
    texts: list[str] = []
    for family in families:
        samples = family.samples
        texts += (family.name, family.documentation, family.unit)
        texts += map(_NAME, samples)
        labels = list(map(_LABELS, samples))
        texts += chain.from_iterable(labels)
        texts += chain.from_iterable(map(dict.values, labels))
        sum(map(float, map(_VALUE, samples)))
        sum(map(float, set(map(_TIMESTAMP, samples)) - {None}))
    "".join(texts).encode("utf-8")
