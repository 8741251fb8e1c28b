"""The run's settings and length, as verl and hydra write them.

- Before its first step verl prints its resolved config: ``pprint`` of a nested dict, one line per
  row, each under the Ray prefix of the printing actor (``(TaskRunner pid=222265) {'actor_rollout_ref':
  {'actor': {'clip_ratio': 0.2,`` ...; verl 0.3 printed it from ``main_task``). ``ConfigPrint``
  joins the lines under that prefix into one text and reads it as the Python literal it is. Ray may
  cut a row anywhere (a lone ``,``, a value on the next line, the middle of a string), glue another
  actor's output to its end, and put the actor's other output (warnings, log lines) between rows.
- Then ``Total training steps: N`` (``parse_total_steps``).
- hydra writes the same config, as YAML, to ``.hydra/config.yaml`` in the run's output folder;
  ``--run.config`` may name such a file or a saved print (``read_config_text``).

The config is handed on flattened to dotted keys (``actor_rollout_ref.actor.clip_ratio``); the
store keeps the settings the catalog lists. Everything is bounded: a print longer than
``MAX_CONFIG_LINES`` lines, ``MAX_CONFIG_CHARS`` characters or ``MAX_CONFIG_ITEMS`` items (rows and
commas: what parsing costs) is a ParseError, like one that cannot be read.
"""

from __future__ import annotations

import ast
import re
from collections import deque

import yaml

from verl_exporter.config.yaml_files import AliasRefused, NoAliasLoader
from verl_exporter.sources.console import ANSI, RAY_PREFIX, carriage_segments, content, without_repeated_note
from verl_exporter.store.records import MAX_STEP, ParseError, clean_text

MAX_CONFIG_LINES = 10_000
MAX_CONFIG_CHARS = 256 << 10  # 3 times the largest config print of the real runs (84 kB, verl 0.4 GPG)
MAX_CONFIG_ITEMS = 20_000  # rows and items (lines and commas) of a config: what parsing costs (real: < 3,000)
MAX_CONFIG_NODES = 50_000  # mappings and leaves a config may hold (flatten stops there)
MAX_LEAVES = 20_000
MAX_NAME_CHARS = 1024  # of a project or experiment name
MAX_SKIPPED_LINES = 100  # lines of the printing actor in a row that are no part of its print
MAX_DEPTH = 100  # brackets open at once (Python reads no literal nested 200 deep)
Scalar = float | int | str | bool | None

_TOTAL_STEPS = re.compile(r"Total training steps: (\d+)\s*$")
_REFERENCE = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")  # an OmegaConf interpolation of another setting
_NAMES = ("trainer.project_name", "trainer.experiment_name")
# Outside its strings a pprint row holds brackets, punctuation, digits and a few names; the actor's
# other output (a warning, a log line, a source line) holds other names or characters.
_PLAIN = re.compile(r"[\s{}\[\]():,.+\-\d]*")
_BRACKET = re.compile(r"[{}\[\]()]")
_CLOSER = {"{": "}", "[": "]", "(": ")"}
_NAME = re.compile(r"[A-Za-z_]\w*")
_CONSTANTS = ("True", "False", "None", "inf", "nan")
_STRING_REST = {quote: re.compile(rf"[^{quote}\\]*(?:\\.[^{quote}\\]*)*") for quote in "'\""}
_TAIL = re.compile(r"[\w.]*\Z")
_AFTER_PRINT = ("step:", "Total training steps:")  # verl's own lines after the print


def parse_total_steps(line: str) -> int | None:
    """N of verl's ``Total training steps: N`` line; None for any other line; ParseError beyond 2^53."""
    if "Total training steps:" not in line:
        return None
    if "\r" in line:  # a progress bar drawn before or after it on the same line
        found = [segment for segment in carriage_segments(line) if "Total training steps:" in segment]
        return parse_total_steps(found[-1]) if found else None
    match = _TOTAL_STEPS.search(content(line).rstrip())
    if not match:
        return None
    digits = match.group(1)
    if len(digits) > 16 or int(digits) > MAX_STEP:
        raise ParseError(f"Total training steps of {len(digits)} digits, beyond 2^53")
    return int(digits)


def _split(line: str) -> tuple[str, str]:
    """(Ray prefix or "", what the actor printed on the line): ANSI codes, tqdm redraws before a
    carriage return and Ray's ``[repeated Nx across cluster]`` removed, the row's indentation kept."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    line = line.rstrip("\r\n")
    prefix = _prefix(line)
    if "\r" in line:
        line = line.rpartition("\r")[2]
        prefix = _prefix(line) or prefix
    if prefix and line.startswith(prefix):
        line = line[len(prefix) + 1:] if line[len(prefix):len(prefix) + 1] == " " else line[len(prefix):]
    return prefix, without_repeated_note(line)


def _prefix(line: str) -> str:
    """The Ray prefix a line starts with (``(TaskRunner pid=222265)``), or ""."""
    match = RAY_PREFIX.match(line) if line.startswith("(") else None
    return match.group(0).rstrip() if match else ""


class ConfigPrint:
    """verl's config print being read, line by line, from its first line (``{'...``) on.

    Only lines under the first line's Ray prefix belong to it, joined as they are (a row Ray cut
    in two reads whole again). ``feed`` returns whether the line was taken and, on the line that
    closes the outermost bracket, the config. A line under the prefix that cannot go on the print
    (a warning, a log line) is not taken; a row followed by another actor's prefix is taken up to
    that prefix. A line of verl's that comes after the print (``step:``, ``Total training steps:``)
    or ``MAX_SKIPPED_LINES`` lines in a row not taken mark the print ``broken``: it ended before its
    closing bracket.

    A row lost from the log may leave a bracket open. pprint indents each row under the bracket it
    belongs to, so at a row of the top-level dict the brackets still open inside it are closed in a
    second reading; that reading is the config if it reads where it closes.
    """

    def __init__(self, prefix: str, top_row: str) -> None:
        self.prefix = prefix
        self.top_row = top_row  # how a row of the top-level dict starts: its indentation and quote
        self.parts: list[str] = []
        self.lines = 0
        self.chars = 0
        self.items = 0
        self.quote = ""  # the string literal the text so far ends in
        self.opened: list[str] = []  # the brackets open at its end
        self.tail = ""  # the end of the text so far that the next line may finish (a cut name or escape)
        self.item_ended = False  # the text so far ends with a comma
        self.skipped = 0
        self.broken = False
        self.repairs: dict[int, str] | None = {}  # part index -> closers the second reading puts there
        self.lost = 0  # brackets the second reading closed

    @classmethod
    def start(cls, line: str) -> "ConfigPrint | None":
        """A new print if ``line`` opens one (a dict literal at the start of what verl printed)."""
        prefix, text = _split(line)
        body = text.lstrip()
        if not body.startswith("{'") or _piece(text, "", []) is None:
            return None
        return cls(prefix, " " * (len(text) - len(body) + 1) + "'")

    def feed(self, line: str) -> tuple[bool, dict | None]:
        """(taken, config once complete). Raises ParseError when the print is too long, or complete
        but unreadable, or not a dict."""
        prefix, text = _split(line)
        if prefix != self.prefix:
            return False, None
        self.lines += 1
        self.chars += len(text)
        self.items += 1 + text.count(",")
        if self.lines > MAX_CONFIG_LINES or self.chars > MAX_CONFIG_CHARS or self.items > MAX_CONFIG_ITEMS:
            raise ParseError(f"config print longer than {MAX_CONFIG_LINES} lines, {MAX_CONFIG_CHARS} characters "
                             f"or {MAX_CONFIG_ITEMS} items")
        text = self.tail + text
        read = _piece(text, self.quote, self.opened)
        if read is None:
            self.skipped += 1
            self.broken = self.skipped > MAX_SKIPPED_LINES or text.lstrip().startswith(_AFTER_PRINT)
            return False, None
        piece, quote, opened = read
        if (self.repairs is not None and self.item_ended and len(self.opened) > self.lost + 1
                and text.startswith(self.top_row)):
            closers = "".join(_CLOSER[b] for b in reversed(self.opened[self.lost + 1:]))
            self.repairs[len(self.parts)] = closers + ","  # after the row's own comma: "{'a': 1,},"
            self.lost = len(self.opened) - 1
        self.parts.append(piece[len(self.tail):])
        repaired = self._repaired(piece) if self.lost else None
        if repaired is not None:
            return True, repaired
        self.quote, self.opened, self.tail = quote, opened, _tail(piece, quote)
        if piece.strip():
            self.skipped = 0
            self.item_ended = not quote and piece.rstrip().endswith(",")
        if opened:
            return True, None
        return True, read_literal("".join(self.parts).strip())

    def _repaired(self, piece: str) -> dict | None:
        """The second reading's config if it closes at the end of ``piece`` (the last part) and reads.
        It is tried once: closed anywhere else (inside a row Ray cut after a comma) or unreadable,
        only the first reading goes on."""
        outer = self.opened[:1] + self.opened[self.lost + 1:]  # what the second reading has open
        stop = _scan(piece, self.quote, outer)[0]
        if outer:
            return None
        repairs, self.repairs, self.lost = self.repairs or {}, None, 0
        if piece[stop:].strip():
            return None
        parts = self.parts[:-1] + [piece[len(self.tail):stop]]
        try:
            return read_literal("".join(repairs.get(i, "") + part for i, part in enumerate(parts)).strip())
        except ParseError:
            return None


def _piece(text: str, quote: str, opened: list[str]) -> tuple[str, str, list[str]] | None:
    """(the part of ``text`` that goes on the print, the string literal and brackets open after it)
    for a print read so far to ``quote`` and ``opened``; None when ``text`` is other output."""
    after = list(opened)
    stop, after_quote, valid = _scan(text, quote, after)
    if not valid:
        cut = text.rfind("(", 0, stop + 1)
        glued = RAY_PREFIX.match(text, cut) if cut >= 0 else None
        if glued is None or glued.end() <= stop:
            return None
        after = list(opened)  # another actor's output glued to the row: the row ends at its prefix
        stop, after_quote, valid = _scan(text[:cut], quote, after)
    return text[:stop], after_quote, after


def _scan(text: str, quote: str, opened: list[str]) -> tuple[int, str, bool]:
    """Read ``text`` on from inside string ``quote`` (or none) with the brackets ``opened`` (kept up
    to date): (where reading stopped, quote, valid). It stops where the outermost bracket closes or
    at the first character that no pprint row holds (valid False). A text that goes on a string cut
    short must close it: other output in between has no reason to."""
    i, end, carried = 0, len(text), bool(quote)
    while i < end:
        if quote:
            rest = _STRING_REST[quote].match(text, i)
            assert rest is not None  # the pattern matches the empty string
            i = rest.end()
            if i == end or text[i] == "\\":  # cut inside the string, perhaps after a backslash
                return (0, quote, False) if carried else (end, quote, True)
            quote, i, carried = "", i + 1, False
            continue
        plain = _PLAIN.match(text, i)
        assert plain is not None  # the pattern matches the empty string
        j = plain.end()
        for bracket in _BRACKET.finditer(text, i, j):
            if bracket.group() in _CLOSER:
                if len(opened) == MAX_DEPTH:
                    return bracket.start(), quote, False
                opened.append(bracket.group())
            else:
                if opened:
                    opened.pop()
                if not opened:
                    return bracket.end(), "", True
        if j == end:
            break
        if text[j] in "'\"":
            quote, i = text[j], j + 1
            continue
        name = _NAME.match(text, j)
        if name is None:
            return j, quote, False
        word, i = name.group(0), name.end()
        cut_short = i == end and any(constant.startswith(word) for constant in _CONSTANTS)
        exponent = word in ("e", "E") and text[j - 1:j].isdigit()
        if word not in _CONSTANTS and not cut_short and not exponent:
            return j, quote, False
    return end, quote, True


def _tail(piece: str, quote: str) -> str:
    """What the next line may finish: an escape cut after its backslash inside a string, or the
    last characters of a name or number."""
    if quote:
        return "\\" if (len(piece) - len(piece.rstrip("\\"))) % 2 else ""
    tail = _TAIL.search(piece, max(0, len(piece) - 6))
    assert tail is not None  # the pattern matches the empty string at the end
    return tail.group(0)


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
    if text.count("\n") + text.count(",") > MAX_CONFIG_ITEMS:  # parsing costs per item: bounded first
        raise ParseError(f"config file of more than {MAX_CONFIG_ITEMS} items (lines and commas)")
    if text.lstrip().startswith("{'"):
        return read_literal(text)
    try:
        value = yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 (a SafeLoader that refuses aliases)
    except AliasRefused:
        raise ParseError("config file uses YAML aliases (*name), which are not read") from None
    except yaml.YAMLError as exc:
        raise ParseError(f"config file is not valid YAML ({type(exc).__name__})") from None
    except RecursionError:
        raise ParseError("config file nested too deeply") from None
    if not isinstance(value, dict):
        raise ParseError(f"config file holds a {type(value).__name__}, not a mapping")
    return value


def flatten(config: dict) -> dict[str, Scalar]:
    """``{"a.b.c": value}`` for every scalar of a nested config (lists left out), at most
    ``MAX_LEAVES`` (and ``MAX_CONFIG_NODES`` mappings and values visited); hydra's ``${a.b}``
    references to other settings resolved."""
    flat: dict[str, Scalar] = {}
    queue: deque[tuple[str, dict]] = deque([("", config)])  # shallow settings first
    nodes = 0
    while queue and len(flat) < MAX_LEAVES and nodes < MAX_CONFIG_NODES:
        prefix, node = queue.popleft()
        nodes += 1 + len(node)
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                queue.append((name + ".", value))
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
        return clean_text(str(names[0])[:MAX_NAME_CHARS]), clean_text(str(names[1])[:MAX_NAME_CHARS])
    return None


def is_verl_config(flat: dict[str, Scalar]) -> bool:
    """A flattened dict that looks like verl's config (it has a trainer section)."""
    return any(key.startswith("trainer.") for key in flat)
