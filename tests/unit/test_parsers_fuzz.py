"""Property tests: parsers raise nothing but ParseError, Source.poll raises nothing at all."""

import functools
import json
import math
import os
import tempfile

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from verl_exporter.sources import RecordsOnly, Source
from verl_exporter.sources.console import carriage_segments, is_finished_line, parse_console_line
from verl_exporter.sources.jsonl import parse_jsonl_line
from verl_exporter.store.records import MAX_STEP, ParseError, clean_text

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that looks like verl output often enough to reach the deep branches.
fragments = st.sampled_from(
    [
        "step:", "step:1", " - ", ":", "-", "nan", "inf", "-inf", "1e999", "np.float64(", ")", "(",
        "(TaskRunner pid=1) ", "\x1b[36m", "\x1b[0m", "\r", "\x00", "{", "}", '"step"', '"data"',
        "[", "]", "NaN", "Infinity", "0.5", "-0.005", "@1", "/", " ", "\ufffd", "[repeated 2x across cluster]",
    ]
)
verlish_text = st.lists(st.one_of(fragments, st.text(max_size=8)), max_size=30).map("".join)
any_text = st.one_of(st.text(), verlish_text)
finite_or_not = st.floats(allow_nan=True, allow_infinity=True)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _parse_or_parse_error(parser, text):
    try:
        return parser(text)
    except ParseError as exc:
        assert str(exc) and len(str(exc)) < 200
        return exc


@FAST
@given(any_text)
def test_console_parser_raises_only_parse_error(text):
    result = _parse_or_parse_error(parse_console_line, text)
    if isinstance(result, tuple):
        step, values = result
        assert isinstance(step, int) and values
        assert all(isinstance(k, str) and isinstance(v, float) for k, v in values.items())
    is_finished_line(text)


@FAST
@given(any_text)
def test_jsonl_parser_raises_only_parse_error(text):
    result = _parse_or_parse_error(parse_jsonl_line, text)
    if isinstance(result, tuple):
        assert isinstance(result[0], int)
        assert all(isinstance(v, float) for v in result[1].values())


@FAST
@given(st.binary(max_size=200))
def test_parsers_on_arbitrary_bytes(raw):
    text = raw.decode("utf-8", "replace")
    _parse_or_parse_error(parse_console_line, text)
    _parse_or_parse_error(parse_jsonl_line, text)
    _parse_or_parse_error(parse_console_line, "step:1 - " + text)


@FAST
@given(st.text(max_size=200))
def test_truncated_json_is_a_parse_error(tail):
    line = json.dumps({"step": 3, "data": {"a": 1.0, "k": tail}})
    for cut in range(0, len(line), max(1, len(line) // 7)):
        result = _parse_or_parse_error(parse_jsonl_line, line[:cut])
        assert result is None or isinstance(result, ParseError)


keys = st.text(min_size=1, max_size=40).filter(
    lambda k: k == k.strip() and " - " not in k and not any(c in k for c in "\r\n\x1b")
)


@FAST
@given(st.integers(min_value=0, max_value=10**9), st.dictionaries(keys, finite_or_not, min_size=1, max_size=8))
def test_console_round_trip(step, values):
    line = f"step:{step} - " + " - ".join(f"{k}:{v!r}" for k, v in values.items())
    parsed_step, parsed = parse_console_line(line)
    assert parsed_step == step and parsed.keys() == values.keys()
    assert all(_same(parsed[k], v) for k, v in values.items())


@FAST
@given(st.integers(-MAX_STEP, MAX_STEP), st.dictionaries(st.text(max_size=40), finite_or_not, max_size=8))
def test_jsonl_round_trip(step, values):
    parsed_step, parsed = parse_jsonl_line(json.dumps({"step": step, "data": values}))
    values = {clean_text(k): v for k, v in values.items()}  # lone surrogates become U+FFFD
    assert parsed_step == step and parsed.keys() == values.keys()
    assert all(_same(parsed[k], v) for k, v in values.items())
    assert all(isinstance(_parse_or_parse_error(parser, line), ParseError) for parser, line in (
        (parse_jsonl_line, json.dumps({"step": MAX_STEP + 1 + abs(step), "data": values})),
        (parse_console_line, f"step:{-MAX_STEP - 1 - abs(step)} - a:1")))


def test_long_keys_huge_numbers_and_a_10_mb_line():
    key = "k" * 10_000
    assert parse_console_line(f"step:1 - {key}:1e999") == (1, {key: math.inf})
    assert parse_jsonl_line(json.dumps({"step": 1, "data": {key: 1}}).replace("1}", "1e999}")) == (1, {key: math.inf})
    huge = "x" * (10 << 20)
    assert parse_console_line(huge) is None
    assert isinstance(_parse_or_parse_error(parse_console_line, "step:1 - " + huge), ParseError)
    assert isinstance(_parse_or_parse_error(parse_jsonl_line, huge), ParseError)
    assert parse_jsonl_line(json.dumps({"step": 1, "data": {"a": 2, "s": huge}})) == (1, {"a": 2.0})


def test_pathological_shapes_stay_linear():
    # A regex that backtracks on these would take hours at this size instead of milliseconds.
    run = 1 << 20
    for line in (" " * run + "]", "(" + " " * run, "\x1b[" + "1" * run, "\x1b]" + "1" * run,
                 "step:1 - a:" + " " * run + "[repeated 2x across cluster]", "step:1 - " + "a:np.float64(" * run):
        result = _parse_or_parse_error(parse_console_line, line)
        assert result is None or isinstance(result, (tuple, ParseError))
        is_finished_line(line)


class CountingStore(RecordsOnly):
    def __init__(self):
        self.records = []
        self.errors = []

    def ingest(self, record):
        self.records.append(record)

    def parse_error(self, source, reason):
        self.errors.append((source, reason))


def _expected_error(parser, text):
    try:
        parser(text)
    except ParseError:
        return True
    return False


@SLOW
@given(st.lists(st.one_of(st.binary(max_size=300), verlish_text.map(str.encode)), min_size=1, max_size=5),
       st.sampled_from(["jsonl", "console"]))
@example(junk=[b"step:\rstep:"], fmt="console")  # two segments: two errors
def test_source_survives_anything_and_reads_the_next_good_line(junk, fmt):
    # Source parses lazily: numbers may stay text until the store converts them (see test_store).
    parser = parse_jsonl_line if fmt == "jsonl" else functools.partial(parse_console_line, lazy=True)
    good = b'{"step": 424242, "data": {"ok": 1}}' if fmt == "jsonl" else b"step:424242 - ok:1"
    lines = [chunk.replace(b"\n", b" ") for chunk in junk]
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, f"run.{'jsonl' if fmt == 'jsonl' else 'log'}")
        with open(path, "wb") as f:
            f.write(b"\n".join(lines) + b"\n" + good + b"\n")
        store = CountingStore()
        source = Source(path, store)
        source.poll()
        source.close()
    texts = [line.decode("utf-8", "replace") for line in lines]
    if fmt == "console":  # a console line with carriage returns is read segment by segment (progress bars)
        texts = [segment for text in texts for segment in (carriage_segments(text) if "\r" in text else [text])]
    expected_errors = sum(_expected_error(parser, text) for text in texts)
    assert len(store.errors) == expected_errors
    assert all(source_path == path for source_path, _ in store.errors)
    assert store.records and store.records[-1].step == 424242
    assert {key: float(value) for key, value in store.records[-1].values.items()} == {"ok": 1.0}


def test_source_drops_a_10_mb_line_and_reads_the_next(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"step": 1, "data": {"s": "' + b"x" * (10 << 20) + b'"}}\n{"step": 2, "data": {"a": 1}}\n')
    store = CountingStore()
    source = Source(str(path), store)
    for _ in range(10):
        source.poll()
        if not source.behind:
            break
    source.close()
    assert [r.step for r in store.records] == [2]
    assert len(store.errors) == 1 and "byte limit" in store.errors[0][1]


def test_a_line_of_two_step_segments_is_two_parse_errors_where_each_is_one():
    """``step:\\rstep:`` is two segments (a bar redrawn over a step line, read as lines of their own),
    and each is an unreadable step line: two errors, and the next good line is read."""
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "run.log")
        with open(path, "wb") as f:
            f.write(b"step:\rstep:\nstep:424242 - ok:1\n")
        store = CountingStore()
        source = Source(path, store)
        source.poll()
        source.close()
    assert len(store.errors) == 2 and store.records[-1].step == 424242
