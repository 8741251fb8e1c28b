"""The Python stacks of the job's processes, from ``py-spy dump --pid PID`` (one subprocess each).

py-spy is optional (``pip install 'verl-exporter[forensics]'``): it is looked for next to the
exporter's Python, then on PATH. Every dump has a timeout; at most ``MAX_PROCESSES`` processes are
dumped, ``WORKERS`` at a time, and no new dump starts once ``budget`` seconds have gone. Failures
are one line each, never an exception: py-spy missing, ptrace denied (grouped into one line that
says what to do), a process gone or not Python, a timeout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import psutil

TIMEOUT_SECONDS = 10.0
BUDGET_SECONDS = 60.0
MAX_PROCESSES = 32
WORKERS = 4
MAX_FRAME_CHARS = 200  # of a frame served as a label
MAX_DUMP_CHARS = 24 * 1024
PTRACE_HINT = ("run the exporter as root or give it the SYS_PTRACE capability (docker: cap_add: [SYS_PTRACE]; "
               "Kubernetes: securityContext.capabilities.add: [SYS_PTRACE]), in the job's PID namespace")
MISSING_HINT = ("py-spy is not installed: pip install 'verl-exporter[forensics]' where the exporter runs "
                "to get the stacks")
_DENIED = ("Permission Denied", "Permission denied", "Operation not permitted", "(os error 1)")
_GONE = ("Failed to get process executable name", "No such process", "(os error 3)")
_NOT_PYTHON = ("Failed to find python version", "Failed to find a python interpreter", "not a python")


def find_py_spy() -> str | None:
    """The py-spy next to ``sys.executable`` (the exporter's environment), else the one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def describe(process: Any) -> str:
    """``pid N: command line`` (cut at 200 characters), whatever psutil allows to be seen."""
    try:
        command = " ".join(process.cmdline()) or process.name()
    except Exception:  # psutil's NoSuchProcess, AccessDenied, ZombieProcess
        command = "?"
    return f"pid {process.pid}: {command[:200]}"


def dump_job(processes: list, *, py_spy: str | None, timeout: float = TIMEOUT_SECONDS,
             budget: float = BUDGET_SECONDS, run: Callable[..., Any] | None = None,
             clock: Callable[[], float] = time.monotonic) -> str:
    """The stacks of ``processes`` (psutil Processes) as text, failures summed up at the end;
    ``run`` runs py-spy (``subprocess.run`` unless given)."""
    run = run or subprocess.run
    if not processes:
        return "no live process of the job (it exited, or --job.pid/--job.match match none)\n"
    if py_spy is None:
        return MISSING_HINT + "\n"
    chosen = processes[:MAX_PROCESSES]
    deadline = clock() + budget

    def one(process: psutil.Process) -> tuple[str, str]:
        if clock() > deadline:
            return "budget", ""
        return _dump(py_spy, process.pid, timeout, run)

    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="verl-py-spy") as pool:
        results = list(pool.map(one, chosen))
    out = [f"{len(chosen)} of the job's {len(processes)} processes, with {py_spy}\n"]
    failed: dict[str, list[str]] = {}  # outcome -> pids
    for process, (outcome, text) in zip(chosen, results):
        if outcome == "ok":
            out.append(f"--- {describe(process)}\n{text.rstrip()}\n")
        elif outcome == "error":
            out.append(f"--- {describe(process)}\npy-spy failed: {text}\n")
        else:
            failed.setdefault(outcome, []).append(str(process.pid))
    reasons = {"denied": f"ptrace denied: {PTRACE_HINT}", "gone": "exited before py-spy read it",
               "not_python": "not a Python process", "timeout": f"py-spy took longer than {timeout:g} s",
               "budget": f"not dumped: the {budget:g} s for all dumps were spent"}
    for outcome, pids in failed.items():
        out.append(f"pids {', '.join(pids)}: {reasons[outcome]}\n")
    if len(processes) > len(chosen):
        out.append(f"{len(processes) - len(chosen)} more processes not dumped (at most {MAX_PROCESSES})\n")
    return "".join(out)


def _dump(py_spy: str, pid: int, timeout: float, run: Callable[..., Any]) -> tuple[str, str]:
    """(outcome, text): ``ok`` with the dump, ``error`` with py-spy's first line, or ``denied``,
    ``gone``, ``not_python``, ``timeout``."""
    try:
        done = run([py_spy, "dump", "--pid", str(pid)], capture_output=True, timeout=timeout,
                   env={**os.environ, "RUST_BACKTRACE": "0"}, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    except OSError as exc:
        return "error", f"cannot run {py_spy}: {exc.strerror or exc}"
    stdout = done.stdout.decode("utf-8", "replace")
    if done.returncode == 0:
        return "ok", stdout if len(stdout) <= MAX_DUMP_CHARS else stdout[:MAX_DUMP_CHARS] + "\n[dump cut]"
    text = stdout + done.stderr.decode("utf-8", "replace")
    for outcome, marks in (("denied", _DENIED), ("gone", _GONE), ("not_python", _NOT_PYTHON)):
        if any(mark in text for mark in marks):
            return outcome, ""
    first = next((line.strip() for line in text.splitlines() if line.strip()), f"exit code {done.returncode}")
    return "error", first[:200]


_TOP_FRAME = re.compile(r"^Thread [^\n]*\n {4}(\S[^\n]{0,300})", re.M)


def top_frame(stacks: str) -> str | None:
    """The innermost frame of the first thread of a ``dump_job`` text (``wait_for_allreduce (hung.py:5)``)."""
    match = _TOP_FRAME.search(stacks)
    return match.group(1).strip()[:MAX_FRAME_CHARS] if match else None
