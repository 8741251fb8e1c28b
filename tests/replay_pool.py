"""Replays started with the session, in worker processes at a lower priority, beside the other tests.

A test module whose tests read many replays (the real runs, every tempo, every regime) defines
``background_replays(root: Path) -> dict[key, (function, args)]``: each replay its tests will read, a
call of a module-level function with picklable arguments, its files written under ``root``.
``conftest.py`` submits the replays of every collected module that defines it as soon as the tests
are collected, and moves those modules' tests to the end of the session: the replays run while the
other tests (most of them waiting on real servers) do. ``results(module)`` waits for a module's
replays: key -> what the function returned. A replay that raised raises again there, in each test
that reads it, with the worker's traceback as its cause.

The workers run at nice ``NICE`` (so do Prometheus and promtool, their children): a test that times
a server gets the CPU first. ``VERL_REPLAY_WORKERS`` sets how many run at once (default 3: on 2 CPUs
the foreground leaves about a third idle).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

NICE = 10
WORKERS = int(os.environ.get("VERL_REPLAY_WORKERS", "3"))


def _lower_priority() -> None:
    os.nice(NICE)


class ReplayPool:
    """The session's background replays, by module name and key."""

    def __init__(self, workers: int = WORKERS):
        self.root = Path(tempfile.mkdtemp(prefix="verl-replays-"))
        self.executor: ProcessPoolExecutor | None = None
        self.workers = workers
        self.submitted: dict[str, dict[Any, Future]] = {}
        self.planning_errors: dict[str, BaseException] = {}

    def submit_module(self, name: str, plan: Callable[[Path], dict[Any, tuple[Callable, tuple]]]) -> None:
        """Plan and submit a module's replays; an error while planning is kept for its tests to raise."""
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        try:
            jobs = plan(folder)
        except BaseException as exc:  # a skip (no real runs, no prometheus) or a bug: the tests say which
            self.planning_errors[name] = exc
            return
        if self.executor is None and jobs:
            self.executor = ProcessPoolExecutor(self.workers, initializer=_lower_priority)
        self.submitted[name] = {key: self.executor.submit(function, *args)  # type: ignore[union-attr]
                                for key, (function, args) in jobs.items()}

    def results(self, name: str) -> dict[Any, Any]:
        """The module's replays, each waited for: key -> result (raises a planning error or a replay's)."""
        if name in self.planning_errors:
            raise self.planning_errors[name]
        return {key: future.result() for key, future in self.submitted.get(name, {}).items()}

    def close(self) -> None:
        if self.executor is not None:
            for futures in self.submitted.values():
                for future in futures.values():
                    future.cancel()
            self.executor.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.root, ignore_errors=True)


POOL: ReplayPool | None = None


def results(module: str) -> dict[Any, Any]:
    """The background replays of ``module`` (its ``__name__``); planned here, in the foreground, where the
    session did not submit them (the module run on its own with ``-p no:...`` or imported elsewhere)."""
    global POOL
    if POOL is None:
        POOL = ReplayPool()
    if module not in POOL.submitted and module not in POOL.planning_errors:
        import importlib

        POOL.submit_module(module, importlib.import_module(module).background_replays)
    return POOL.results(module)
