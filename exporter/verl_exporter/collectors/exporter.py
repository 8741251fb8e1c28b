"""Facts about the exporter itself.

Emits::

    # HELP verl_exporter_build_info The exporter's version and Python version; always 1.
    # TYPE verl_exporter_build_info gauge
    verl_exporter_build_info{python_version="3.11.7",version="0.1.0"} 1.0
"""

from __future__ import annotations

import platform
from typing import Iterable

from prometheus_client.core import Metric

from verl_exporter.collectors import Collector

from .. import __version__, schema


class ExporterCollector(Collector):
    def describe(self) -> Iterable[Metric]:
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        info = schema.EXPORTER["build_info"].new()
        info.add_metric([__version__, platform.python_version()], 1.0)
        yield info
