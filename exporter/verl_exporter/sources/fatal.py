"""The trainer's own fatal end, told from its log alone (``TrainerExit``, one per file).

The driver process (``main_ppo``, its hydra entry point, or torchrun's launcher of the SFT trainer)
prints its end without Ray's ``(Actor pid=N)`` prefix. Three endings are fatal:

- ``ray.exceptions.RayTaskError(X): ray::TaskRunner.run()`` (or ``ray::main_task()``, verl before
  0.3): the trainer's task raised ``X``, and ``ray.get`` in the driver re-raised it;
- hydra's ``Error executing job with overrides: [...]``, followed by the traceback and
  ``Set the environment variable HYDRA_FULL_ERROR=1 ...``: the run's main function raised;
- an uncaught traceback: its outermost frame is the process's top level (``<module>``, or runpy's
  ``_run_module_as_main``) and one of its frames the trainer's entry file (``verl/trainer/...``,
  ``main_*.py``, ``*trainer*.py``, ``train.py``; torchrun's ``[rankN]:`` prefix removed), ended by its
  exception line; and torchrun's ``ChildFailedError`` (a rank of the SFT trainer died).

Worker tracebacks (prefixed by their actor), tracebacks Ray prints for handled errors, a traceback
logged by a handler that goes on (``logging.exception`` in a retry loop: its outermost frame is the
function that caught it) and a user's ``KeyboardInterrupt`` are not fatal ends.

Inside a traceback, lines of other processes (Ray's prefixed lines, another rank's) and progress
bars are skipped, up to MAX_INTERLEAVED of them. A chained exception (``The above exception was the
direct cause ...``, ``During handling of the above exception ...``) is one end: its kind is the most
specific one (``FATAL_KINDS``' order) that any exception of the chain names, so a CUDA OOM wrapped in
a ``RuntimeError`` or an ``ActorDiedError`` is ``cuda_oom``. Each end is told once, on the line that
shows it is fatal, and again only when a later line of the same end names a more specific kind.
"""

from __future__ import annotations

import re

FATAL_KINDS = ("cuda_oom", "nccl", "import_error", "file_not_found", "config", "assertion", "timeout",
               "ray_actor_died", "exception")  # the most specific first
MAX_INTERLEAVED = 100  # lines of others skipped inside one traceback; past them it is given up

_RANK_PREFIX = re.compile(r"(\[(?:rank|default)\d+\]):\s?")
_RAY_TASK = re.compile(r"RayTaskError\((\w+)\)(?::|\s).*ray::(?:TaskRunner\.run|main_task)\(\)")
_RAY_ERROR = re.compile(r"RayTaskError\((\w+)\)")
_EXCEPTION = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure))(?:\((\w+)\))?(?::(.*))?\Z")
_ENTRY_FILE = re.compile(r'\A\s*File "[^"]*(?:/verl/trainer/[^"]*|/main_\w+\.py|/\w*trainer\w*\.py|/train\.py)"')
_TOP_FRAME = re.compile(r'\A\s*File ".*", line \d+, in (?:<module>|_run_module_as_main)\s*\Z')
_BAR = re.compile(r"\d%\||\d/\d+ \[|(?:it/s|s/it)\]")  # a tqdm bar
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")
_HYDRA_ERROR = "Error executing job with overrides"
_HYDRA_END = "Set the environment variable HYDRA_FULL_ERROR=1"
_BY_CLASS = {
    "OutOfMemoryError": "cuda_oom", "DistBackendError": "nccl", "ImportError": "import_error",
    "ModuleNotFoundError": "import_error", "AssertionError": "assertion", "ActorDiedError": "ray_actor_died",
    "RayActorError": "ray_actor_died", "ActorUnavailableError": "ray_actor_died", "TimeoutError": "timeout",
    "GetTimeoutError": "timeout", "FileNotFoundError": "file_not_found", "ConfigAttributeError": "config",
    "ConfigKeyError": "config", "MissingMandatoryValue": "config", "InterpolationResolutionError": "config",
    "ConfigCompositionException": "config", "ValidationError": "config",
}
_NOT_A_CRASH = ("KeyboardInterrupt", "SystemExit")
_RANK = {kind: rank for rank, kind in enumerate(FATAL_KINDS)}
# A line holding none of these, fed while no traceback is read (``TrainerExit.at_rest``), changes nothing.
WORDS = ("Traceback (most recent call last)", *_CHAINED, _HYDRA_ERROR, "RayTaskError(", "ChildFailedError", _HYDRA_END)


def fatal_kind(exception: str, message: str = "") -> str | None:
    """The kind of a fatal end by its exception's class (dotted or not) and message; None for a stop
    the user asked for (``KeyboardInterrupt``, ``SystemExit``)."""
    name = exception.rpartition(".")[2]
    if name in _NOT_A_CRASH:
        return None
    if "out of memory" in message or name == "OutOfMemoryError":
        return "cuda_oom"
    if "NCCL" in message or "Watchdog caught collective" in message:
        return "nccl"
    return _BY_CLASS.get(name, "exception")


def specific(kind: str | None, other: str) -> str:
    """Of two kinds, the more specific (``FATAL_KINDS``' order)."""
    return other if kind is None or _RANK.get(other, len(_RANK)) < _RANK.get(kind, len(_RANK)) else kind


class TrainerExit:
    """Feeds on one file's lines (ANSI codes already removed); ``feed`` returns the kind of the
    trainer's fatal end on the line that tells it (once per end, or a more specific kind on a
    later line of the same end), else None."""

    __slots__ = ("hydra", "traceback", "owner", "outermost", "top", "entry", "skipped", "after", "chained",
                 "kind", "raised", "end", "told")

    def __init__(self) -> None:
        self.hydra = False  # hydra's error header was printed: its traceback is the run's end
        self.traceback = False  # inside a traceback of the driver
        self.owner = ""  # ... printed by this torchrun rank ("[rank0]"), or by no rank
        self.outermost = False  # ... whose next frame is its outermost
        self.top = False  # ... whose outermost frame is the process's top level: nothing caught it
        self.entry = False  # ... with a frame of the trainer's entry file
        self.skipped = 0  # ... and this many lines of others inside it
        self.after = False  # the last line was an exception line: frames after it go on (Ray's)
        self.chained = False  # a chained exception's header was printed: the next traceback is its
        self.kind: str | None = None  # the most specific kind of the exceptions of the chain
        self.raised = ""  # the class X of its last ``RayTaskError(X)``: X's own line comes after it
        self.end = False  # the chain is a fatal end
        self.told: str | None = None  # the kind told of this end; a new step starts over

    @property
    def at_rest(self) -> bool:
        """No traceback, chained exception or exception line is being read: ``feed`` of a line that
        holds none of ``WORDS`` returns None and changes nothing."""
        return not (self.traceback or self.chained or self.after)

    def step(self) -> None:
        """The run logged a step: a later fatal end is a new one (a resumed run)."""
        self.hydra = self.traceback = self.after = self.chained = self.end = False
        self.kind = self.told = None

    def feed(self, line: str) -> str | None:
        if not line:
            return None
        if line.startswith("("):
            self._skip()  # a Ray actor's line
            return None
        owner = ""
        if line.startswith("["):
            prefix = _RANK_PREFIX.match(line)
            if prefix is None:
                self._skip()
                return None
            owner, line = prefix.group(1), line[prefix.end():]
        if self.traceback and owner != self.owner:
            self._skip()  # another rank's line
            return None
        if line[:1] in (" ", "\t"):
            self._frame(line)
            return None
        self.after = False
        if line.startswith("Traceback (most recent call last)"):
            if not self.chained:
                self.kind, self.raised, self.end = None, "", False  # a new exception, not the cause of the next one
            self.traceback, self.owner, self.outermost, self.top, self.entry = True, owner, True, False, False
            self.skipped, self.chained = 0, False
            return None
        if line.startswith(_CHAINED):
            self.traceback, self.chained = False, True
            return None
        if self.chained and not _BAR.search(line):
            self.chained = False
        if _HYDRA_ERROR in line:
            self.hydra, self.kind, self.told = True, None, None  # a new end, even of the same file
            return None
        if "RayTaskError(" in line:
            return self._ray_task(line)
        if "ChildFailedError" in line and line.startswith("torch.distributed.elastic"):
            self.traceback = False
            return self._tell("exception")
        if _HYDRA_END in line and self.hydra:
            return self._tell(self.kind or "exception")
        if not self.traceback:
            return None
        exception = _EXCEPTION.match(line.rstrip())
        if exception is None:
            if _BAR.search(line):
                self._skip()
                return None
            self.traceback = False
            return None
        self.traceback, self.after = False, True
        name = exception.group(2) or exception.group(1)
        kind = fatal_kind(name, exception.group(3) or "")
        if kind is None:
            return self._tell(None)
        if name.rpartition(".")[2] != self.raised or self.kind in (None, "exception"):
            self.kind = specific(self.kind, kind)  # X's own line after RayTaskError(X) refines only a kind X left open
        return self._tell(self.kind) if self._fatal() else None

    def _frame(self, line: str) -> None:
        """An indented line: a frame of the traceback being read, or one of the traceback Ray prints
        after an exception line (the remote one, or the one inside an ``ActorDiedError``)."""
        frame = line.lstrip().startswith('File "')
        if not self.traceback:
            if not (self.after and frame):
                return
            self.traceback, self.skipped = True, 0
        self.after = False
        if frame:
            if self.outermost:
                self.outermost, self.top = False, _TOP_FRAME.match(line) is not None
            if not self.entry and _ENTRY_FILE.match(line):
                self.entry = True

    def _ray_task(self, line: str) -> str | None:
        """A ``RayTaskError(X)`` line: inside a traceback, the head of the remote one that goes on;
        outside one, the trainer's task's is its end."""
        task = _RAY_TASK.search(line)
        if not self.traceback:
            if task is None:
                return None
            self.kind, self.raised, self.after = None, task.group(1), True  # its remote traceback follows
            kind = fatal_kind(task.group(1), line)
            if kind is None:
                return self._tell(None)
            self.kind = kind
            return self._tell(kind)
        error = _RAY_ERROR.search(line)
        kind = fatal_kind(error.group(1), line) if error is not None else None
        if error is None or kind is None:
            return None
        self.raised = error.group(1)
        self.kind = specific(self.kind, kind)
        return self._tell(self.kind) if self._fatal() or (task is not None and self.top) else None

    def _fatal(self) -> bool:
        """The traceback being read is (part of) the trainer's end."""
        return self.hydra or self.end or (self.top and self.entry)

    def _skip(self) -> None:
        """A line of others: inside a traceback, skipped, up to MAX_INTERLEAVED."""
        if self.traceback:
            self.skipped += 1
            if self.skipped > MAX_INTERLEAVED:
                self.traceback = False

    def _tell(self, kind: str | None) -> str | None:
        if kind is None:
            self.hydra = self.end = False  # the user stopped it: no end to tell after this
            return None
        self.end = True
        if self.told is not None and specific(self.told, kind) == self.told:
            return None
        self.told = kind
        return kind
