"""Errors a verl job's log shows, in the lines of any actor (workers' lines included): which kind a
line reports, if any. Kinds: ``cuda_oom`` (CUDA or HIP out of memory), ``nccl_timeout`` (a collective
that timed out), ``segfault``, ``ray_actor_died`` and ``traceback`` (the first line of a Python
traceback). Config rows (``'nccl_timeout': 600,``) and NCCL's own info lines are no errors."""

from __future__ import annotations

import re

KINDS = ("cuda_oom", "nccl_timeout", "segfault", "ray_actor_died", "traceback")
MAX_LINE_CHARS = 300  # of an error line kept for the evidence
_PATTERNS = (
    ("cuda_oom", re.compile(r"(?:CUDA|HIP|cuda|hip)(?: error)?:? out of memory|OutOfMemoryError")),
    ("nccl_timeout", re.compile(r"Watchdog caught collective operation timeout|NCCL[^'\n]{0,200}?\btim(?:ed out|eout)\b(?!')")),
    ("segfault", re.compile(r"Segmentation fault|SIGSEGV")),
    ("ray_actor_died", re.compile(r"ActorDiedError|RayActorError|[Tt]he actor died unexpectedly")),
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
)
_CONFIG_ROW = re.compile(r"['\"]\w+['\"]\s*:")


def error_kind(line: str) -> str | None:
    """The kind of error ``line`` reports, or None."""
    # Cheap tests first: most lines hold none of these words (this runs on every line of a log).
    if not ("emory" in line or "Traceback" in line or "NCCL" in line or "Watchdog" in line or "egment" in line
            or "SIGSEGV" in line or "died" in line or "ActorError" in line):
        return None
    for kind, pattern in _PATTERNS:
        match = pattern.search(line)
        if match and not (kind == "nccl_timeout" and _CONFIG_ROW.search(line)):
            return kind
    return None
