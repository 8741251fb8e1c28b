"""A Slurm job's output files as a source: the run they hold is named by verl's config print, else
by the job (its name and id); a job's stdout and stderr, two files, feed one run."""

from __future__ import annotations

from typing import Any

from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore

from ..sources import FileState, Source


class JobSource(Source):
    """A source of a job's output file: a run it holds is named by verl's config print, else
    ``default_run`` (the job's name and id)."""

    def __init__(self, pattern: str, store: RunStore, *, default_run: RunKey, both_files: bool = False,
                 owner: int | None = None, **kwargs: Any) -> None:
        super().__init__(pattern, store, **kwargs)
        # The watcher reads as root: only a file of the job's own user, which Slurm creates as that
        # user, not whatever file the user's --output named (another user's log, /etc/shadow).
        self.follower.owner = owner
        self.default_run = default_run
        self.both_files = both_files
        self.siblings: list[JobSource] = []  # the job's other file (stderr apart from stdout)

    @property
    def named(self) -> bool:
        # A job whose stdout and stderr are two files feeds one run from both; its files are Slurm's
        # word, not a glob's match.
        return self.both_files or super().named

    def _new_state(self, path: str) -> FileState:
        state = super()._new_state(path)
        state.run = self.default_run
        return state

    def _sees(self, state: FileState) -> None:
        if not state.named and state.last_step is None and self.siblings:
            # The job's other file named the run (verl prints to stdout, Python's tracebacks go to
            # stderr): this file's lines are that run's, from the first line seen after it did (a
            # line skipped as quiet included).
            for sibling in self.siblings:
                runs = sibling.runs()
                if runs:
                    state.run, state.named = sorted(runs)[0], True
                    break

    def runs(self) -> set[RunKey]:
        """The runs its files hold: named by a config print, or with a step."""
        try:
            states = list(self._files.values())
        except RuntimeError:  # the ingestor thread added a file meanwhile
            return set()
        return {state.run for state in states if state.named or state.last_step is not None}
