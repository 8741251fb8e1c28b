"""Who owns a run, and the owner's team: the ``user`` and ``team`` labels of every run's series.

A run's owner is the user who owns the file that named it (the file's uid, as the file was opened),
or the user of the scheduler's job that wrote it (Slurm creates a job's output as its user). The
owner is part of the run's identity (``RunKey.user``): another user's file that names the same
project and experiment makes a run of its own, and can never feed, finish, rename or crash this one.

The team (``RunKey.team``, what the shipped Alertmanager routes training alerts by) is, in this
order: the owner's team in ``--owner.teams`` (a YAML map of team to its users), the Slurm account of
the owner's latest job, the Kubernetes namespace of the pod the exporter runs in, else "". Both
labels are bounded: by the users of the node and the teams the operator lists.
"""

from __future__ import annotations

import functools
import os
import pwd
import threading
from collections.abc import Mapping

from verl_exporter.store.records import RunKey, clean_text

MAX_LABEL_CHARS = 64  # a user, account or team name; longer ones are cut
MAX_LEARNED = 10_000  # users whose Slurm account is remembered


def user_name(uid: int | None) -> str:
    """The name of ``uid`` (the passwd entry), else the uid as text; "" for None."""
    return "" if uid is None else _name_of(uid)


@functools.lru_cache(maxsize=MAX_LEARNED)
def _name_of(uid: int) -> str:
    try:
        return clean_text(pwd.getpwuid(uid).pw_name)[:MAX_LABEL_CHARS]
    except (KeyError, OverflowError):
        return str(uid)


def file_owner(path: str) -> int | None:
    """The uid that owns ``path`` (not following a last link), None when it cannot be told."""
    try:
        return os.lstat(path).st_uid
    except (OSError, ValueError):
        return None


class Owners:
    """The team of each owner: ``teams`` (team -> its users) first, then what a scheduler told
    (``learn``: a Slurm job's account), then ``default_team`` (a Kubernetes pod's namespace)."""

    def __init__(self, teams: Mapping[str, list[str]] | None = None, default_team: str = ""):
        self.by_user: dict[str, str] = {}
        for team, users in (teams or {}).items():
            for user in users:
                self.by_user.setdefault(str(user), str(team)[:MAX_LABEL_CHARS])
        self.default_team = default_team[:MAX_LABEL_CHARS]
        self._learned: dict[str, str] = {}
        self._lock = threading.Lock()

    def team_of(self, user: str) -> str:
        team = self.by_user.get(user)
        if team is not None:
            return team
        with self._lock:
            learned = self._learned.get(user)
        return learned if learned is not None else self.default_team

    def learn(self, user: str, team: str) -> None:
        """A scheduler's word on ``user``'s team (a Slurm job's account); the teams file wins."""
        if not user or not team:
            return
        with self._lock:
            if user in self._learned or len(self._learned) < MAX_LEARNED:
                self._learned[user] = clean_text(team)[:MAX_LABEL_CHARS]

    def run(self, project: str, experiment: str, user: str) -> RunKey:
        """The run of these names owned by ``user``, with the owner's team."""
        return RunKey(project, experiment, user, self.team_of(user))


NO_TEAMS = Owners()
