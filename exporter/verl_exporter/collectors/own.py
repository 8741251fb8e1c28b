"""The names the exporter serves itself, read from its collectors: no logged key may take one.

Every family any collector can emit (GPU, host, job, training, exporter, the runner's, and
client_python's ``process_*`` and ``python_*``), whatever the configuration, with every sample
name a family of that name can show (``_total``, ``_created``, ``_info``, ...).
"""

from __future__ import annotations

from functools import lru_cache

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import Metric

# The sample names a family ``N`` can show, by type, in either exposition format; any of them is
# taken, whatever the family's type.
SAMPLE_SUFFIXES = ("", "_total", "_created", "_info", "_count", "_sum", "_bucket", "_gcount", "_gsum")


def own_families() -> list[Metric]:
    """Empty (described) families of every collector, with every optional part switched on."""
    from . import CollectorRunner
    from .exporter import ExporterCollector
    from .gpu import GpuCollector
    from .host import HostCollector
    from .training import TrainingCollector

    families = [
        *GpuCollector.own_families(), *HostCollector.own_families(), *TrainingCollector.own_families(),
        *ExporterCollector().describe(), *CollectorRunner.own_families(),
    ]
    client_python = CollectorRegistry()  # the collectors cli.py registers beside the runner
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=client_python)
    return families + list(client_python.collect())


@lru_cache(maxsize=1)
def own_names() -> frozenset[str]:
    """Every family and sample name the exporter serves itself."""
    names: set[str] = set()
    for family in own_families():
        names.update(family.name + suffix for suffix in SAMPLE_SUFFIXES)
        names.update(sample.name for sample in family.samples)
    return frozenset(names)
