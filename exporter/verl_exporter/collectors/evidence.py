"""The evidence the exporter captured of stalled runs (``forensics``), for the alerts to quote::

    # HELP verl_evidence_captured_timestamp_seconds Unix time of the latest evidence captured of the run's stop ...
    verl_evidence_captured_timestamp_seconds{project,experiment}
    # HELP verl_evidence_top_frame_info The innermost frame of the job's first thread in that evidence ...
    verl_evidence_top_frame_info{project,experiment,frame} 1

Only runs with evidence have series (at most the 32 latest); the frame only where py-spy read one.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Protocol

from prometheus_client.core import Metric

from verl_exporter.collectors import Collector
from verl_exporter.store.records import RunKey

from .. import schema


class Captures(Protocol):
    """What the collector reads of ``forensics.Forensics`` (which uses the collectors: no import back)."""

    @property
    def captured(self) -> Mapping[RunKey, tuple[float, str]]: ...


class EvidenceCollector(Collector):
    """Reads ``forensics.captured`` (run -> (time, top frame)) at scrape time."""

    def __init__(self, forensics: Captures):
        self.forensics = forensics

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        captured, frames = self._families()
        for run, (moment, frame) in sorted(dict(self.forensics.captured).items()):
            captured.add_metric(list(run.labels), moment)
            if frame:
                frames.add_metric([*run.labels, frame], 1.0)
        return [family for family in (captured, frames) if family.samples]

    @staticmethod
    def _families() -> tuple[schema.Built, schema.Built]:
        return schema.EVIDENCE["captured"].new(), schema.EVIDENCE["top_frame"].new()
