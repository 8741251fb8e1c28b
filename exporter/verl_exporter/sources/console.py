"""Read verl's console logger output: ``step:N - key:value - key:value ...``.

verl prints one line per step (``concat_dict_to_str``). Older versions format values with three
decimals (``actor/pg_loss:-0.005``), newer ones print the full repr
(``actor/ppo_kl:-8.163164312320433e-06``), and under numpy 2 a value may read ``np.float64(0.25)``.
Ray prefixes worker output with ``(TaskRunner pid=222265) `` and may colour it with ANSI codes.
"""

from __future__ import annotations

import re

from verl_exporter.sources.jsonl import cap_keys
from verl_exporter.sources.step_layout import LAYOUTS
from verl_exporter.store.records import DropCounter, ParseError, check_step

FINISHED_MARKER = "Final validation metrics:"  # ray_trainer prints it after the last step
# wandb's files/output.log keeps at most this many characters of a line: the rest is lost, and the
# last pair of a step line that long may be cut in its key or its value. It is left out where it
# shows the cut (no key, no number, a numpy wrapper left open); one that reads whole is read, as a
# line of that length that nothing cut ends in a whole pair. A cut that leaves a number (0.12 of
# 0.1234) cannot be told from one: it is read.
WANDB_LINE_CHARS = 4096

_SEPARATOR = " - "
# A terminal escape sequence (colours, cursor moves, titles): what the readers strip before reading a line.
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# Ray's decoration of an actor's output: its prefix (``(TaskRunner pid=222265)``) and the note it ends a
# line with when it folded repeated lines into one.
RAY_PREFIX = re.compile(r"\((?:[^()]*?\s)?pid=\d+(?:,[^()]*)?\)\s*")
RAY_REPEATED = re.compile(r"\[repeated \d+x across cluster\]\s*\Z")
# The closing parenthesis is optional: _pairs may already have removed it.
_NUMPY_SCALAR = re.compile(r"(?:np|numpy)\.(?:float|int|uint)\d*\(([^()]*)\)?\Z")
_NUMPY_PREFIXES = (":np.float64(", ":np.float32(", ":np.int64(", ":np.int32(")
_BOOLS = {"True": 1.0, "False": 0.0, "np.True_": 1.0, "np.False_": 0.0}


def parse_console_line(line: str, *, lazy: bool = False,
                       dropped: DropCounter | None = None) -> tuple[int, dict[str, float] | dict[str, str]] | None:
    """``(step, {key: value})`` for a verl step line; None for any other line.

    Raises ParseError for a line that starts with ``step:`` but whose step is not an integer (or
    beyond 2^53) or that has no readable ``key:value`` pair. A line of exactly ``WANDB_LINE_CHARS``
    may be one that wandb cut: its last pair is left out, uncounted, where it shows the cut
    (``_shows_cut``). A line of more than ``MAX_KEYS_PER_LINE`` keys keeps its first ones and the
    catalog's (``cap_keys``). A step line that ends in a bare
    separator (`` -``: a carriage return or a cut came right after it) keeps every pair before it.
    A single unreadable pair is skipped; one with a key but no number is counted by
    ``dropped("not_a_number")``. With ``lazy``, a line whose values are all plain decimal numbers
    keeps them as text, for the store to convert when they are scraped (float() is most of the cost
    of a line). A line with carriage returns is read segment by segment (``carriage_segments``): the
    last step segment read is returned; a Source reads every one of them.
    """
    if "\r" in line:
        return _last_step(carriage_segments(line), lazy, dropped)
    text = content(line).strip()
    if not text.startswith("step:"):
        return None
    cut_by_wandb = len(line) == WANDB_LINE_CHARS
    if text.endswith(" -"):  # nothing after the last separator: the pairs before it are whole
        text, cut_by_wandb = text[:-2], False
    cut = text.find(_SEPARATOR)
    head = text[5:] if cut < 0 else text[5:cut]
    try:
        step = int(head)
    except ValueError:
        raise ParseError(f"step is not an integer: {head[:40]!r}") from None
    check_step(step)
    if cut_by_wandb:
        last = text.rfind(_SEPARATOR)
        if last > cut and _shows_cut(text[last + len(_SEPARATOR):]):
            text = text[:last]
    skipped: list[str] = []
    values = (lazy and _plain_pairs(text)) or (_pairs(text, skip=1, skipped=skipped) if cut >= 0 else {})
    if not values:
        raise ParseError(f"step {step} has no readable key:value pair")  # one error, no dropped values
    _count(skipped, dropped)
    return step, cap_keys(values, dropped)


def carriage_segments(line: str) -> list[str]:
    """The texts a line with carriage returns holds, in order: a tqdm bar redrawn over a step line
    (``step:3 - a:1 -\\rTraining Progress: 1%|...``), or the other way round, hides none of them.

    Each segment is read as a line of its own: one without a Ray prefix gets the line's (it is that
    actor's output); blank ones are left out; a line ending ``\\r`` or ``\\r\\n`` is one segment.
    When wandb may have cut the line (``WANDB_LINE_CHARS``), the last pair of its last segment, if
    that is a step line with more than one pair and the pair shows the cut, is left out here (the
    segment alone is shorter than the cut).
    """
    body = line.rstrip("\r\n")
    if "\r" not in body:
        return [body]
    parts = body.split("\r")
    first = ANSI.sub("", parts[0]) if "\x1b" in parts[0] else parts[0]
    match = RAY_PREFIX.match(first) if first.startswith("(") else None
    prefix = match.group(0) if match else ""
    if len(line.rstrip("\r")) == WANDB_LINE_CHARS:
        parts[-1] = _without_cut_pair(parts[-1])
    segments = []
    for index, part in enumerate(parts):
        plain = ANSI.sub("", part) if "\x1b" in part else part
        own = RAY_PREFIX.match(plain) if plain.startswith("(") else None
        if not (plain[own.end():] if own else plain).strip():
            continue  # nothing but a prefix, blanks or ANSI codes
        segments.append(prefix + part if prefix and index and own is None else part)
    return segments or [parts[-1]]  # a blank line stays one


def _without_cut_pair(segment: str) -> str:
    """A step segment that wandb may have cut, without its last pair where that shows the cut."""
    text = content(segment).rstrip()
    if not text.lstrip().startswith("step:") or text.endswith(" -"):
        return segment
    first, last = segment.find(_SEPARATOR), segment.rfind(_SEPARATOR)
    cut = last > first >= 0 and _shows_cut(content(segment[last + len(_SEPARATOR):]))
    return segment[:last] if cut else segment


def _shows_cut(pair: str) -> bool:
    """Whether the last pair of a line cut at WANDB_LINE_CHARS may have been cut: anything but a value
    that shows its own end (``np.float64(0.25)``, numpy 2's repr). A plain number may be a longer
    one cut short (``0.1234`` cut to ``0.12``): left out, as a wrong number would be served."""
    key, colon, raw = pair.rpartition(":")
    raw = raw.strip()
    if not colon or not key.strip() or not raw:
        return True
    if raw.startswith(("np.", "numpy.")):
        return not raw.endswith(")") or _special_value(raw) is None
    return True


def _last_step(segments: list[str], lazy: bool,
               dropped: DropCounter | None) -> tuple[int, dict[str, float] | dict[str, str]] | None:
    """The last step segment that reads; the first one's ParseError when none does."""
    found, error = None, None
    for segment in segments:
        try:
            parsed = parse_console_line(segment, lazy=lazy, dropped=dropped)
        except ParseError as exc:
            error = error or exc
            continue
        found = parsed or found
    if found is None and error is not None:
        raise error
    return found


def parse_console_continuation(line: str, dropped: DropCounter | None = None) -> dict[str, float] | None:
    """Values of a wrapped step line's continuation (``       - key:value - key:value``), else None.

    Only meaningful right after a step line: some tools and docs wrap verl's long step lines.
    """
    if "\r" in line:  # the values of every continuation segment
        merged: dict[str, float] = {}
        for segment in carriage_segments(line):
            merged.update(parse_console_continuation(segment, dropped) or {})
        return merged or None
    text = content(line).strip()
    if not text.startswith("- "):
        return None
    if text.endswith(" -"):  # a bare separator at its end: the pairs before it are whole
        text = text[:-2]
    skipped: list[str] = []
    values = _pairs(text[2:], skipped=skipped)
    _count(skipped if values else [], dropped)
    return cap_keys(values, dropped) or None


def is_finished_line(line: str) -> bool:
    """True for verl's end-of-training line (``Final validation metrics: {...}``)."""
    if FINISHED_MARKER in line:
        return True
    # ANSI codes may colour the marker's words apart: only a line holding them is cleaned.
    return "\x1b" in line and "Final" in line and FINISHED_MARKER in ANSI.sub("", line)


def content(line: str) -> str:
    """What verl printed: no ANSI codes, no Ray decoration. Carriage returns are the caller's:
    a line that holds them is read by ``carriage_segments``."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    if line.startswith("("):
        prefix = RAY_PREFIX.match(line)
        if prefix:
            line = line[prefix.end() :]
    return without_repeated_note(line)


def without_repeated_note(line: str) -> str:
    """``line`` without Ray's ``[repeated 3x across cluster]`` at its end."""
    if line.endswith("]") or line.endswith("] "):
        start = line.rfind("[repeated ")
        if start >= 0 and RAY_REPEATED.match(line, start):
            return line[:start].rstrip()
    return line


def _pairs(text: str, skip: int = 0, skipped: list[str] | None = None) -> dict[str, float]:
    """``{key: value}`` of ``key:value - key:value ...`` after the first ``skip`` pairs.

    Unreadable pairs are left out; the keys of those with a key but no number go to ``skipped``.
    """
    if ":np." in text:
        if not text.endswith(")"):
            head, _, raw = text.rpartition(":")
            if raw.startswith("np.") and "(" in raw and _SEPARATOR not in raw:
                text = head + ":"  # the last value was cut inside its wrapper: no number
        if text.count(":") == text.count(_SEPARATOR) + 1:  # no ":" inside keys
            text = _unwrap_numpy(text)
    values: dict[str, float] = {}
    for part in text.split(_SEPARATOR)[skip:]:
        key, _, raw = part.rpartition(":")
        try:
            value = float(raw)
        except ValueError:
            special = _special_value(raw.strip())
            if special is None:
                if skipped is not None and key.strip():
                    skipped.append(key)
                continue
            value = special
        key = key.strip()
        if key:
            values[key] = value
    return values


_NUMBER_CHARACTERS = str.maketrans("", "", "0123456789.eE+-")


def _plain_pairs(text: str) -> dict[str, str] | None:
    """``{key: "value"}`` of ``step:N - key:value - ...`` when no key holds a colon, no key or value
    is empty and every value is made of number characters only (no nan, inf or numpy wrapper);
    None otherwise. All splitting happens in C: this is the common line's whole cost. A line with the
    keys of the previous lines is read by their layout's regex (``step_layout``), to the same values."""
    values = LAYOUTS.values(text)
    if values is not None:
        return values
    items = text.replace(_SEPARATOR, ":").split(":")
    if len(items) != 2 * text.count(":"):  # a key holds a colon: pairs would not alternate
        return None
    keys, raws = items[2::2], items[3::2]
    if not raws or "" in raws or "" in keys or "".join(raws).translate(_NUMBER_CHARACTERS):
        return None
    LAYOUTS.read(keys)
    return dict(zip(keys, raws))


def _unwrap_numpy(text: str) -> str:
    """``a:np.float64(0.25) - b:np.int64(3)`` -> ``a:0.25 - b:3``: plain str.replace is far
    cheaper than a regex substitution here, and other spellings are left to ``_special_value``."""
    for prefix in _NUMPY_PREFIXES:
        if prefix in text:
            text = text.replace(prefix, ":")
    text = text.replace(") - ", _SEPARATOR)  # a value's closing parenthesis; keys end in ":"
    return text[:-1] if text.endswith(")") else text


def _count(skipped: list[str], dropped: DropCounter | None) -> None:
    if dropped is not None:
        for _ in skipped:
            dropped("not_a_number")


def _special_value(raw: str) -> float | None:
    """``np.float64(0.25)``, ``np.int64(3)``, ``True``: the numeric value, else None."""
    if raw in _BOOLS:
        return _BOOLS[raw]
    wrapped = _NUMPY_SCALAR.match(raw)
    if wrapped:
        try:
            return float(wrapped.group(1))
        except ValueError:
            return None
    return None
