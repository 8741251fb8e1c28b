"""The run's settings and length, as verl and hydra write them.

- Before its first step verl prints its resolved config: ``pprint`` of a nested dict, one line per
  row, each under the Ray prefix of the printing actor (``(TaskRunner pid=222265) {'actor_rollout_ref':
  {'actor': {'clip_ratio': 0.2,`` ...; verl 0.3 printed it from ``main_task``). ``ConfigPrint``
  gathers those lines and reads them as the Python literal they are.
- Then ``Total training steps: N`` (``parse_total_steps``).
- hydra writes the same config, as YAML, to ``.hydra/config.yaml`` in the run's output folder;
  ``--run.config`` may name such a file or a saved print (``read_config_text``).

The config is handed on flattened to dotted keys (``actor_rollout_ref.actor.clip_ratio``); the
store keeps the settings the catalog lists. Everything is bounded: a print longer than
``MAX_CONFIG_LINES`` lines or ``MAX_CONFIG_CHARS`` characters is a ParseError, like one that
cannot be read.
"""

from __future__ import annotations

import ast
import re

import yaml

from verl_exporter.records import ParseError
from verl_exporter.sources.console import _ANSI, _RAY_PREFIX, _content

MAX_CONFIG_LINES = 10_000
MAX_CONFIG_CHARS = 2 << 20
MAX_LEAVES = 20_000
Scalar = float | int | str | bool | None

_TOTAL_STEPS = re.compile(r"Total training steps: (\d+)\s*$")
_REFERENCE = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")  # an OmegaConf interpolation of another setting
_NAMES = ("trainer.project_name", "trainer.experiment_name")
# How a row of a pprint-ed dict starts: a key or string, a bracket, a number, or a constant.
# Python's warnings print "path:line: SomeWarning: message" and then the warning's source line,
# indented; stderr can land inside the config print (verl 0.6 warns about the critic there).
_WARNING = re.compile(r"\S+:\d+: \w*Warning: ")
_ROW = re.compile(r"""['"{}\[\]()\d.+:-]|(?:True|False|None|inf|nan)\b""")


def parse_total_steps(line: str) -> int | None:
    """N of verl's ``Total training steps: N`` line; None for any other line."""
    if "Total training steps:" not in line:
        return None
    match = _TOTAL_STEPS.search(_content(line).rstrip())
    return int(match.group(1)) if match else None


def _prefix(line: str) -> str:
    """The Ray prefix of a line (``(TaskRunner pid=222265)``), or ""."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    match = _RAY_PREFIX.match(line) if line.startswith("(") else None
    return match.group(0).strip() if match else ""


class ConfigPrint:
    """verl's config print being read, line by line, from its first line (``{'...``) on.

    Only lines under the first line's Ray prefix belong to it (other actors' output may come in
    between). ``feed`` returns whether the line was taken and, on the last line, the config. A line
    under the prefix that cannot be a row of the print (``step:1 - ...``) is not taken and marks
    the print ``broken``: it ended before its closing bracket. A Python warning (and its source
    line) printed in the middle is not taken either, and the print goes on.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.parts: list[str] = []
        self.chars = 0
        self.depth = 0
        self.broken = False
        self._in_warning = False

    @classmethod
    def start(cls, line: str) -> "ConfigPrint | None":
        """A new print if ``line`` opens one (a dict literal at the start of what verl printed)."""
        if not _content(line).lstrip().startswith("{'"):
            return None
        return cls(_prefix(line))

    def feed(self, line: str) -> tuple[bool, dict | None]:
        """(taken, config once complete). Raises ParseError when the print is too long, or complete
        but unreadable, or not a dict."""
        if _prefix(line) != self.prefix:
            return False, None
        text = _content(line).strip()
        if self._in_warning and not _ROW.match(text):  # the warning's source line
            self._in_warning = False
            return False, None
        self._in_warning = bool(self.parts) and _WARNING.match(text) is not None
        if self._in_warning:
            return False, None
        if not text and self.parts:  # Ray split a row where pprint wrote it piece by piece
            return True, None
        if self.parts and not _ROW.match(text):
            self.broken = True
            return False, None
        self.parts.append(text)
        self.chars += len(text)
        if len(self.parts) > MAX_CONFIG_LINES or self.chars > MAX_CONFIG_CHARS:
            raise ParseError(f"config print longer than {MAX_CONFIG_LINES} lines or {MAX_CONFIG_CHARS} characters")
        self.depth = _depth(text, self.depth)
        if self.depth > 0:
            return True, None
        return True, read_literal("\n".join(self.parts))


def _depth(text: str, depth: int) -> int:
    """Bracket depth after ``text``, brackets inside quoted strings not counted."""
    quote, escaped = "", False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
    return depth


class _SpecialFloats(ast.NodeTransformer):
    """pprint writes float('inf') and float('nan') as the bare names ``inf`` and ``nan``."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("inf", "nan"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


def read_literal(text: str) -> dict:
    """The dict a Python literal (a config print) holds; ParseError if it is none."""
    try:
        tree = _SpecialFloats().visit(ast.parse(text, mode="eval"))
        value = ast.literal_eval(tree)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        raise ParseError(f"config print is not a Python literal ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise ParseError(f"config print is a {type(value).__name__}, not a dict")
    return value


def read_config_text(text: str) -> dict:
    """A config file's dict: hydra's YAML, or a saved config print (a Python dict literal)."""
    if len(text) > MAX_CONFIG_CHARS:
        raise ParseError(f"config file larger than {MAX_CONFIG_CHARS} characters")
    if text.lstrip().startswith("{'"):
        return read_literal(text)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParseError(f"config file is not valid YAML ({type(exc).__name__})") from None
    except RecursionError:
        raise ParseError("config file nested too deeply") from None
    if not isinstance(value, dict):
        raise ParseError(f"config file holds a {type(value).__name__}, not a mapping")
    return value


def flatten(config: dict) -> dict[str, Scalar]:
    """``{"a.b.c": value}`` for every scalar of a nested config (lists left out), at most
    ``MAX_LEAVES``; hydra's ``${a.b}`` references to other settings resolved."""
    flat: dict[str, Scalar] = {}
    stack: list[tuple[str, dict]] = [("", config)]
    while stack and len(flat) < MAX_LEAVES:
        prefix, node = stack.pop()
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                stack.append((name + ".", value))
            elif value is None or isinstance(value, (bool, int, float, str)):
                flat[name] = value
    for name, value in list(flat.items()):
        flat[name] = _resolve(flat, value)
    return flat


def _resolve(flat: dict[str, Scalar], value: Scalar, hops: int = 5) -> Scalar:
    """``${other.key}`` -> that setting's value (following a few hops); anything else unchanged."""
    while hops and isinstance(value, str):
        match = _REFERENCE.fullmatch(value.strip())
        if not match or match.group(1) not in flat:
            break
        value, hops = flat[match.group(1)], hops - 1
    return value


def run_names(flat: dict[str, Scalar]) -> tuple[str, str] | None:
    """(trainer.project_name, trainer.experiment_name) of a flattened config, if both are set."""
    names = [flat.get(key) for key in _NAMES]
    if all(isinstance(name, (str, int)) and not isinstance(name, bool) and str(name) for name in names):
        return str(names[0]), str(names[1])
    return None


def is_verl_config(flat: dict[str, Scalar]) -> bool:
    """A flattened dict that looks like verl's config (it has a trainer section)."""
    return any(key.startswith("trainer.") for key in flat)
