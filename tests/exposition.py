"""Reading Prometheus exposition text in tests, and scraping collectors through the runner."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from verl_exporter.collectors import CollectorRunner


def scrape(**collectors) -> str:
    """The text a registry holding these named collectors (behind a CollectorRunner) serves."""
    registry = CollectorRegistry()
    registry.register(CollectorRunner(collectors))
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(name, ((label, value), ...)): value} of every sample, labels sorted; a label whose value is
    empty is left out, as Prometheus reads it (a run of no known owner: ``user=""``, ``team=""``)."""
    return {
        (sample.name, tuple(sorted((name, value) for name, value in sample.labels.items() if value))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def matching(text: str, name: str, **labels) -> list[float]:
    """Values of every sample called ``name`` whose labels include ``labels``."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]


def sample_value(text: str, name: str, **labels) -> float | None:
    """The first matching sample's value, or None."""
    found = matching(text, name, **labels)
    return found[0] if found else None
