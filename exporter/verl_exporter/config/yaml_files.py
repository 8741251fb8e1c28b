"""YAML's safe loader without aliases, for every file the exporter reads (its options file, its web
config, a run's config): none needs an alias, and aliases are what build a self-referencing
mapping or an exponential "billion laughs" (gigabytes from a few hundred bytes). The files the project
ships (the catalog, the rule files) are read by libyaml's safe loader where PyYAML has it."""

from __future__ import annotations

from typing import Any

import yaml

# libyaml's safe loader: the same documents as yaml.SafeLoader, about ten times faster.
FAST_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_shipped(text: str) -> Any:
    """A shipped YAML file (the catalog, rule files): safe, and in C where PyYAML was built with libyaml."""
    return yaml.load(text, Loader=FAST_SAFE_LOADER)  # noqa: S506 (a safe loader)


class AliasRefused(yaml.YAMLError):
    """The file uses an alias (``*name``); ``mark`` says where."""

    def __init__(self, mark: yaml.Mark) -> None:
        super().__init__()
        self.mark = mark


class NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that raises AliasRefused at the first alias, before expanding anything."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise AliasRefused(self.peek_event().start_mark)
        return super().compose_node(parent, index)
