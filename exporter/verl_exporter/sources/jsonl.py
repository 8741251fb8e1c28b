"""Read verl's FileLogger output: one ``{"step": N, "data": {"actor/pg_loss": -0.005, ...}}`` per line,
and flat JSON lines, ``{"step": N, "actor/pg_loss": -0.005, ...}`` (verl-agent and other forks' own
loggers). Which of the two a file holds is found from its first record (``JsonlReader``).

Non-finite values appear as ``NaN``, ``Infinity`` and ``-Infinity`` (Python's json, verl 0.6 and
0.7) or ``null`` (orjson, verl 0.8 on, for NaN and both infinities alike); a step can have several
lines, e.g. validation metrics logged apart from training ones.
"""

from __future__ import annotations

import json
import math
from itertools import islice
from typing import Any

import orjson

from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import DropCounter, ParseError, check_step, clean_text, to_float

_decode = json.JSONDecoder().decode
_FLOAT = {float}
_FLOAT_OR_INT = {float, int}
# Why a value is left out, by its JSON type: the ``dropped`` reasons of parse_jsonl_line (served as
# verl_exporter_values_dropped_total's ``reason``).
DROP_REASONS: dict[type, str] = {str: "not_a_number", dict: "object", list: "list"}  # null is NaN (orjson)
# Keys read of one line (console or JSON), besides the keys the catalog lists: the store keeps far
# fewer (its series cap), and a line of 70,000 keys must not cost 70,000 of everything after it.
MAX_KEYS_PER_LINE = 10_000
TOO_MANY_KEYS = "too_many_keys"  # the ``dropped`` reason of the keys past MAX_KEYS_PER_LINE


def _loads(line: str) -> Any:
    """orjson where it can (4x faster than json here); Python's json for what orjson refuses: the
    NaN and Infinity that json.dumps writes, 1e999, deep nesting, and malformed lines (for its
    error message)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return _decode(line)


FILELOGGER, FLAT = "filelogger", "flat"  # the two shapes of a record


class JsonlReader:
    """Reads one file's lines: its first record decides its shape (``{"step", "data"}`` is verl's
    FileLogger, anything else with an integer ``step`` is flat), and every later line is read so."""

    __slots__ = ("shape",)

    def __init__(self) -> None:
        self.shape: str | None = None

    def parse(self, line: str, dropped: DropCounter | None = None) -> tuple[int, dict[str, float]] | None:
        parsed = _parse(line, dropped, self.shape)
        if parsed is None:
            return None
        step, values, self.shape = parsed
        return step, values


def parse_jsonl_line(line: str, dropped: DropCounter | None = None,
                     shape: str | None = None) -> tuple[int, dict[str, float]] | None:
    """``(step, {key: value})`` for one line; None for a blank line. ``shape``: ``FILELOGGER``,
    ``FLAT``, or None to take the line's own (FileLogger where it has a ``data`` key).

    Raises ParseError for malformed JSON, a missing or non-integer ``step``, a FileLogger ``data``
    that is not an object, or a flat record with no key besides ``step``. ``null`` is read as NaN:
    orjson, verl's serialiser from 0.8, writes NaN and Inf so. Other values that are not numbers
    (strings, lists, objects) are skipped; numeric strings are read as numbers; numbers too large
    for a float become +/-inf.
    """
    parsed = _parse(line, dropped, shape)
    return None if parsed is None else parsed[:2]


def _parse(line: str, dropped: DropCounter | None, shape: str | None) -> tuple[int, dict[str, float], str] | None:
    if not line or line.isspace():
        return None
    try:
        obj = _loads(line)
    except ValueError as exc:
        raise ParseError(f"malformed JSON: {_short(exc)}") from None
    except RecursionError:
        raise ParseError("malformed JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise ParseError(f"expected a JSON object, got {type(obj).__name__}")
    step = obj.get("step")
    if type(step) is float:  # orjson reads integers beyond 64 bits as floats; json does not
        obj = _decode(line)
        step = obj.get("step")
    if type(step) is not int:
        if "step" not in obj:
            raise ParseError("missing step")
        raise ParseError(f"step is not an integer: {_brief(step)}")
    check_step(step)  # beyond 2^53: no float holds it (a ParseError)
    if shape is None:
        shape = FILELOGGER if "data" in obj else FLAT
    if shape == FILELOGGER:
        data = obj.get("data")
        if not isinstance(data, dict):
            if "data" not in obj:
                raise ParseError("missing data")
            raise ParseError(f"data is not an object: {type(data).__name__}")
    else:
        del obj["step"]
        data = obj
        if not data:
            raise ParseError("missing data: a flat record holds no key besides step")
    return step, _values(line, data, dropped), shape


def cap_keys(values: dict, dropped: DropCounter | None) -> dict:
    """``values`` with their first MAX_KEYS_PER_LINE keys and every key the catalog lists after
    them; each other key is counted by ``dropped(TOO_MANY_KEYS)``."""
    if len(values) <= MAX_KEYS_PER_LINE:
        return values
    listed = default_catalog().listed_keys()
    kept = dict(islice(values.items(), MAX_KEYS_PER_LINE))
    kept.update((key, value) for key, value in islice(values.items(), MAX_KEYS_PER_LINE, None) if key in listed)
    if dropped is not None:
        for _ in range(len(values) - len(kept)):
            dropped(TOO_MANY_KEYS)
    return kept


def _values(line: str, data: dict, dropped: DropCounter | None) -> dict[str, float]:
    """The numbers of a record's values, by key; what is no number is counted by ``dropped``."""
    data = cap_keys(data, dropped)
    if "\\u" in line:  # only an escape makes a lone surrogate (orjson refuses them, json not): U+FFFD
        data = {clean_text(key): value for key, value in data.items()}
    kinds = set(map(type, data.values()))
    if kinds <= _FLOAT:
        return data
    if kinds <= _FLOAT_OR_INT:
        try:
            return dict(zip(data, map(float, data.values())))
        except OverflowError:
            pass
    values: dict[str, float] = {}
    for key, value in data.items():
        if type(value) is float:
            values[key] = value
        elif value is None:
            values[key] = math.nan
        elif isinstance(value, (int, str)):
            try:
                values[key] = to_float(value)
            except ParseError:
                pass
        if key not in values and dropped is not None:  # no number: counted by the caller, by reason
            dropped(DROP_REASONS.get(type(value), "not_a_number"))
    return values


def _brief(value: object) -> str:
    if value is None or isinstance(value, (str, float, bool)):
        return repr(value)[:40]
    return f"a JSON {type(value).__name__}"


def _short(exc: ValueError) -> str:
    message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
    return message[:80]
