"""Errors a verl job's log shows, in the lines of any actor (workers' lines included): which kind a
line reports, if any. Kinds: ``cuda_oom`` (CUDA or HIP out of memory), ``nccl_timeout`` (a collective
that timed out), ``segfault``, ``ray_actor_died`` and ``traceback`` (the first line of a Python
traceback). Config rows (``'nccl_timeout': 600,``) and NCCL's own info lines are no errors."""

from __future__ import annotations

import re

KINDS = ("cuda_oom", "nccl_timeout", "segfault", "ray_actor_died", "traceback")
MAX_LINE_CHARS = 300  # of an error line kept for the evidence
_OOM = re.compile(r"(?:CUDA|HIP|cuda|hip)(?: error)?:? out of memory|OutOfMemoryError")
_CONFIG_ROW = re.compile(r"['\"]\w+['\"]\s*:")
NCCL_REACH = 200  # characters from "NCCL" to the word "timeout" / "timed out" of one message
MAX_TIMEOUT_WORDS = 64  # of one line, looked at: a line of nothing but "NCCL 'timeout'" costs no more
# A line holding none of these reports no error (``error_kind`` looks for a kind only where one is found).
WORDS = ("of memory", "OfMemory", "Watchdog", "NCCL", "Segmentation fault", "SIGSEGV", "ActorDiedError",
         "RayActorError", "he actor died unexpectedly", "Traceback (most recent call last)")


def error_kind(line: str) -> str | None:
    """The kind of error ``line`` reports, or None. Runs on every line of a log that is no step: each
    kind is looked for only where a plain substring test finds its words."""
    if ("of memory" in line or "OfMemory" in line) and _OOM.search(line):
        return "cuda_oom"
    if ("Watchdog" in line or "NCCL" in line) and _nccl_timeout(line) and not _CONFIG_ROW.search(line):
        return "nccl_timeout"
    if "Segmentation fault" in line or "SIGSEGV" in line:
        return "segfault"
    if "ActorDiedError" in line or "RayActorError" in line or "he actor died unexpectedly" in line:
        return "ray_actor_died"
    if "Traceback (most recent call last)" in line:
        return "traceback"
    return None


def _word_at(line: str, at: int, word: str) -> bool:
    """``word`` at ``at`` is a whole word and not the end of a quoted key (``'nccl_timeout'``)."""
    end = at + len(word)
    before = line[at - 1] if at else " "
    after = line[end] if end < len(line) else " "
    return not (before.isalnum() or before == "_") and not (after.isalnum() or after in "_'")


def _nccl_timeout(line: str) -> bool:
    """NCCL's watchdog timeout, or "NCCL" and then, within NCCL_REACH characters of the same message
    (no quote or line break between), the word "timeout" or "timed out". Found with ``str.find``,
    at most MAX_TIMEOUT_WORDS words per line: linear in the line, whatever it holds."""
    if "Watchdog caught collective operation timeout" in line:
        return True
    for word in ("timed out", "timeout"):
        start = 0
        for _ in range(MAX_TIMEOUT_WORDS):
            at = line.find(word, start)
            if at < 0:
                break
            start = at + 1
            if not _word_at(line, at, word):
                continue
            window = line[max(0, at - NCCL_REACH - 4):at]
            nccl = window.rfind("NCCL")
            if nccl >= 0 and "'" not in window[nccl:] and "\n" not in window[nccl:]:
                return True
    return False
