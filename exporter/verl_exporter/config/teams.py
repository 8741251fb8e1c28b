"""``--owner.teams``: the operator's map of each team to its users, read within bounds.

::

    rl-research: [alice, bob]
    infra: [carol]

A user in two teams is in the first. The file is read at start (a change needs a restart).
"""

from __future__ import annotations

import yaml

from verl_exporter.config.bounded_files import read_regular_file
from verl_exporter.config.yaml_files import NoAliasLoader

MAX_BYTES = 1 << 20


class TeamsError(ValueError):
    """The teams file cannot be used; the message says why, in one line."""


def load_teams(path: str) -> dict[str, list[str]]:
    """Team -> its users, from the YAML file ``path``."""
    try:
        data = yaml.load(read_regular_file(path, MAX_BYTES), Loader=NoAliasLoader)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise TeamsError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TeamsError(f"{path}: want a mapping of team to a list of users")
    teams: dict[str, list[str]] = {}
    for team, users in data.items():
        if not isinstance(users, list) or not all(isinstance(user, (str, int)) for user in users):
            raise TeamsError(f"{path}: team {str(team)[:64]!r}: want a list of user names")
        teams[str(team)] = [str(user) for user in users]
    return teams
