"""The evidence of one stall as plain text, at most ``max_bytes`` (UTF-8).

Sections, in this order: what and why (the run, when, the stall), the run's step clock and
checkpoint, the last verl phase its log shows, the errors the log shows (counts by kind and the
latest lines), the job's GPUs, the job's Python stacks, and the last ``TAIL_LINES`` lines of each
file the run was read from. Each section has its own cap (``CAPS``), so a long one cannot crowd
out the others; what is cut says so.
"""

from __future__ import annotations

import json
import time

from verl_exporter.store.records import RunKey
from verl_exporter.store.run_state import RunState

from .logtail import TAIL_LINES, Tail
from .watch import Stall, duration

MAX_BYTES = 256 * 1024
CAPS = {"head": 8 * 1024, "errors": 16 * 1024, "gpus": 16 * 1024, "stacks": 128 * 1024, "tail": 32 * 1024}
TITLE = "verl-exporter evidence"


def run_line(run: RunKey) -> str:
    """The line that names the run and its owner, quoted as JSON strings (any text is safe there)."""
    owner = f" user={json.dumps(run.user)}" if run.user else ""
    return f"run: project={json.dumps(run.project)} experiment={json.dumps(run.experiment)}{owner}"


def render(stall: Stall, state: RunState | None, *, now: float, stacks: str, gpus: str, tails: list[Tail],
           host: str = "", version: str = "", max_bytes: int = MAX_BYTES) -> str:
    """The evidence document."""
    head = [TITLE, run_line(stall.run),
            f"captured: {timestamp(now)} (host {host or '?'}, verl-exporter {version or '?'})",
            f"why: {stall.why}"]
    head += _run_state(state, now)
    head.append("last phase: " + _phase(tails))
    parts = [cap("\n".join(head) + "\n", CAPS["head"]),
             section(f"errors the log shows: {_counts(state)}", _errors(state), CAPS["errors"]),
             section("GPUs (NVML, at capture)", gpus, CAPS["gpus"]),
             section("stacks (py-spy dump)", stacks, CAPS["stacks"])]
    for tail in tails:
        parts.append(section(_tail_title(tail, now), _tail_text(tail), CAPS["tail"]))
    if not tails:
        parts.append(section("log files", "no file of the run is known\n", CAPS["tail"]))
    return cap("".join(parts), max_bytes)


def section(title: str, body: str, limit: int) -> str:
    """``== title ==`` and its body, at most ``limit`` bytes."""
    if body and not body.endswith("\n"):
        body += "\n"
    return cap(f"\n== {title} ==\n{body}", limit)


def cap(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, the cut marked."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    note = f"\n[cut: {len(data) - limit} more bytes; this part is capped at {limit // 1024} KiB]\n"
    keep = max(0, limit - len(note.encode()))
    return data[:keep].decode("utf-8", "ignore") + note


def timestamp(moment: float | None) -> str:
    if moment is None:
        return "?"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def _run_state(state: RunState | None, now: float) -> list[str]:
    if state is None:
        return ["run state: no longer in the store"]
    lines = []
    if state.last_step is not None:
        lines.append(f"last step: {state.last_step} at {timestamp(state.last_step_time)} "
                     f"({duration(now - state.last_step_time) if state.last_step_time else '?'} ago); "
                     f"steps read {state.steps_ingested}; total steps {state.total_steps or 'unknown'}")
    else:
        lines.append(f"last step: none yet; total steps {state.total_steps or 'unknown'}")
    lines.append(f"first line: {timestamp(state.started_at)}; last line: {timestamp(state.active_at)}")
    checkpoint = state.checkpoint
    if checkpoint is not None:
        if checkpoint.saving:
            lines.append(f"checkpoint: saving step {checkpoint.step} since {timestamp(checkpoint.started)} "
                         f"({duration(now - checkpoint.started)})")
        elif checkpoint.done_step is not None:
            lines.append(f"checkpoint: last saved step {checkpoint.done_step} in "
                         f"{duration(checkpoint.done_seconds)}")
    return lines


def _phase(tails: list[Tail]) -> str:
    """The last phase of the most recently written file that shows one."""
    for tail in sorted(tails, key=lambda t: t.mtime or 0.0, reverse=True):
        found = tail.phase()
        if found is not None:
            return f"{found[0]} (in {tail.path}): {found[1][:300]}"
    return "none: no step, progress, checkpoint, validation or setup line at the end of the run's files"


def _counts(state: RunState | None) -> str:
    if state is None or not (state.log_errors or state.fatal):
        return "none"
    fatal = [f"the trainer's fatal end ({state.fatal[0]}) at step {state.fatal[1]}"] if state.fatal else []
    return ", ".join(fatal + [f"{kind} {count}" for kind, count in sorted(state.log_errors.items())])


def _errors(state: RunState | None) -> str:
    if state is None or not state.error_lines:
        return ""
    return "".join(line.rstrip("\n") + "\n" for line in state.error_lines)


def _tail_title(tail: Tail, now: float) -> str:
    if tail.error is not None:
        return f"{tail.path}: cannot read it ({tail.error})"
    age = duration(now - tail.mtime) if tail.mtime is not None else "?"
    return (f"last {min(TAIL_LINES, len(tail.lines))} lines of {tail.path} "
            f"({tail.size} bytes, written {age} ago)")


def _tail_text(tail: Tail) -> str:
    return "".join(line + "\n" for line in tail.lines[-TAIL_LINES:])
