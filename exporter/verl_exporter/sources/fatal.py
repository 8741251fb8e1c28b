"""The trainer's own fatal end, told from its log alone (``TrainerExit``, one per file).

The driver process (``main_ppo``, its hydra entry point, or torchrun's launcher of the SFT trainer)
prints its end without Ray's ``(Actor pid=N)`` prefix. Three endings are fatal:

- ``ray.exceptions.RayTaskError(X): ray::TaskRunner.run()`` (or ``ray::main_task()``, verl before
  0.3): the trainer's task raised ``X``, and ``ray.get`` in the driver re-raised it;
- hydra's ``Error executing job with overrides: [...]``, followed by the traceback and
  ``Set the environment variable HYDRA_FULL_ERROR=1 ...``: the run's main function raised;
- an uncaught traceback whose outermost frame is the trainer's entry file (``verl/trainer/...``,
  ``main_*.py``, ``*trainer*.py``, ``train.py``; torchrun's ``[rankN]:`` prefix removed), ended by its
  exception line; and torchrun's ``ChildFailedError`` (a rank of the SFT trainer died).

Worker tracebacks (prefixed by their actor), tracebacks Ray prints for handled errors and a user's
``KeyboardInterrupt`` are not fatal ends. Each end is told once: the kind of its exception, one of
``FATAL_KINDS``.
"""

from __future__ import annotations

import re

FATAL_KINDS = ("cuda_oom", "nccl", "import_error", "assertion", "ray_actor_died", "timeout", "config",
               "file_not_found", "exception")

_RANK_PREFIX = re.compile(r"\[(?:rank|default)\d+\]:\s?")
_RAY_TASK = re.compile(r"RayTaskError\((\w+)\)(?::|\s).*ray::(?:TaskRunner\.run|main_task)\(\)")
_EXCEPTION = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure))(?:\((\w+)\))?(?::(.*))?\Z")
_ENTRY_FILE = re.compile(r'\A\s*File "[^"]*(?:/verl/trainer/[^"]*|/main_\w+\.py|/\w*trainer\w*\.py|/train\.py)"')
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


class TrainerExit:
    """Feeds on one file's lines (ANSI codes already removed); ``feed`` returns the kind of the
    trainer's fatal end on the line that tells it, once per end, else None."""

    __slots__ = ("hydra", "traceback", "entry", "told")

    def __init__(self) -> None:
        self.hydra = False  # hydra's error header was printed: its traceback is the run's end
        self.traceback = False  # inside a traceback of the driver
        self.entry = False  # ... whose outermost frame is the trainer's entry file
        self.told = False  # this end was told; a new step starts over

    def step(self) -> None:
        """The run logged a step: a later fatal end is a new one (a resumed run)."""
        self.hydra = self.traceback = self.entry = self.told = False

    def feed(self, line: str) -> str | None:
        if not line or line.startswith("(") or (line[0] in " \t" and not self.traceback):
            return None  # a Ray actor's line, or an indented line outside a traceback
        if line.startswith("["):
            prefix = _RANK_PREFIX.match(line)
            if prefix is None:
                return None
            line = line[prefix.end():]
        if self.traceback and line[:1] in (" ", "\t"):
            if not self.entry and line.lstrip().startswith("File ") and _ENTRY_FILE.match(line):
                self.entry = True
            return None
        if line.startswith("Traceback (most recent call last)"):
            self.traceback, self.entry = True, False
            return None
        if _HYDRA_ERROR in line:
            self.hydra = True
            return None
        if "RayTaskError(" in line:
            task = _RAY_TASK.search(line)
            if task is not None:
                return self._tell(fatal_kind(task.group(1), line))
        if "ChildFailedError" in line and line.startswith("torch.distributed.elastic"):
            return self._tell("exception")
        if _HYDRA_END in line and self.hydra:
            return self._tell("exception")
        if self.traceback:
            self.traceback = False
            exception = _EXCEPTION.match(line.rstrip())
            if exception is not None and (self.hydra or self.entry):
                return self._tell(fatal_kind(exception.group(2) or exception.group(1), exception.group(3) or ""))
        return None

    def _tell(self, kind: str | None) -> str | None:
        if kind is None:
            self.hydra = False  # the user stopped it: no end to tell after this
            return None
        if self.told:
            return None
        self.told = True
        return kind
