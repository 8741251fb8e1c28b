"""Errors a verl job's log shows, in the lines of any actor (workers' lines included): which kind a
line reports, if any. Kinds: ``cuda_oom`` (CUDA or HIP out of memory), ``nccl_timeout`` (a collective
that timed out), ``segfault``, ``ray_actor_died`` and ``traceback`` (the first line of a Python
traceback). Config rows (``'nccl_timeout': 600,``) and NCCL's own info lines are no errors."""

from __future__ import annotations

import re

KINDS = ("cuda_oom", "nccl_timeout", "segfault", "ray_actor_died", "traceback")
MAX_LINE_CHARS = 300  # of an error line kept for the evidence
_OOM = re.compile(r"(?:CUDA|HIP|cuda|hip)(?: error)?:? out of memory|OutOfMemoryError")
_NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout"
                           r"|NCCL[^'\n]{0,200}?\btim(?:ed out|eout)\b(?!')")
_CONFIG_ROW = re.compile(r"['\"]\w+['\"]\s*:")


def error_kind(line: str) -> str | None:
    """The kind of error ``line`` reports, or None. Runs on every line of a log that is no step: each
    kind is looked for only where a plain substring test finds its words."""
    if ("of memory" in line or "OfMemory" in line) and _OOM.search(line):
        return "cuda_oom"
    if ("Watchdog" in line or "NCCL" in line) and _NCCL_TIMEOUT.search(line) and not _CONFIG_ROW.search(line):
        return "nccl_timeout"
    if "Segmentation fault" in line or "SIGSEGV" in line:
        return "segfault"
    if "ActorDiedError" in line or "RayActorError" in line or "he actor died unexpectedly" in line:
        return "ray_actor_died"
    if "Traceback (most recent call last)" in line:
        return "traceback"
    return None
