"""Evidence on a stall: when a followed run stops making progress, capture once what shows why.

``watch`` finds the stalls (no step for longer than the larger of ``--forensics.stall-after`` and
5 x the run's median step time, no first step an hour after the run's first line, the job's
processes gone before the run finished); ``monitor`` checks on a background thread and captures,
for each stall, the job's Python stacks (``stacks``: py-spy), the end of the run's log files and
the last verl phase they show (``logtail``), the errors its log shows, and the job's GPUs
(``gpus``); ``report`` writes it as capped plain text; ``archive`` keeps it in memory and,
with ``--forensics.dir``, in files with bounded retention. The HTTP server serves it at
``/debug/evidence?project=P&experiment=E``.
"""

from .archive import EvidenceArchive
from .monitor import Forensics
from .watch import Stall, StallWatch

__all__ = ["EvidenceArchive", "Forensics", "Stall", "StallWatch"]
