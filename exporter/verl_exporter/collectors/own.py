"""The names the exporter serves itself, read from its collectors: no logged key may take one.

Every family the collectors describe with every optional part switched on (a job selector, so the
job's families too), the runner's, and client_python's ``process_*`` and ``python_*``, each with
every sample name a family of that name can show (``_total``, ``_created``, ``_info``, ...).
"""

from __future__ import annotations

from functools import lru_cache

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import Metric

# The sample names a family ``N`` can show, by type, in either exposition format; any of them is
# taken, whatever the family's type.
SAMPLE_SUFFIXES = ("", "_total", "_created", "_info", "_count", "_sum", "_bucket", "_gcount", "_gsum")


class _DescribeOnly:
    """What describe() may read of a store: an empty catalog (the real one may be loading)."""

    def __init__(self):
        from ..catalog import Catalog

        self.catalog = Catalog([], [])


def own_families() -> list[Metric]:
    """The families every collector describes, with every optional part switched on."""
    from ..job import JobSelector
    from . import CollectorRunner
    from .evidence import EvidenceCollector
    from .exporter import ExporterCollector
    from .gpu import GpuCollector
    from .host import HostCollector
    from .node import NodeCollector
    from .training import TrainingCollector

    job = JobSelector(pid=0)  # configured: the job's families are described too; never read here
    collectors = {"gpu": GpuCollector(None, job=job), "host": HostCollector(job=job),
                  "training": TrainingCollector(_DescribeOnly()), "exporter": ExporterCollector(),
                  "node": NodeCollector(None, lambda: (None, None))}
    families = list(CollectorRunner(collectors).describe()) + list(EvidenceCollector(None).describe())
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
