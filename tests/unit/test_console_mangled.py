"""Console lines as real logs mangle them: carriage returns (tqdm bars drawn over or after a step line),
ANSI codes anywhere, lines wandb cut at WANDB_LINE_CHARS, every Ray prefix, numpy reprs and cut values.
Every byte of a line is read: a step line that shares its line with a bar is never lost.

test_console.py holds the plain shapes; this file the mangled ones, each with the exact step and
values read (or None, or the ParseError), and the same lines read end to end through a Source."""

from __future__ import annotations

import math

import pytest
from record_keeper import RecordCollector

from owner import ME
from verl_exporter.sources import Source
from verl_exporter.sources.console import (
    WANDB_LINE_CHARS,
    carriage_segments,
    parse_console_continuation,
    parse_console_line,
)
from verl_exporter.sources.run_config import parse_total_steps
from verl_exporter.store.records import ParseError, Record, RunKey

BAR = "Training Progress:   0%|          | 3/263 [00:10<1:41:02, 23.10s/it]"
ASCEND = "step:3 - actor/pg_loss:0.01 - global_seqlen/max:1680 -\r" + BAR  # a real Ascend NPU run's line


def read(line: str, lazy: bool = False) -> tuple[tuple[int, dict] | None, list[str]]:
    """(what parse_console_line reads, the reasons of the values it dropped). Lazy values (text) are
    converted as the store converts them; text that is no number stays text."""
    dropped: list[str] = []
    parsed = parse_console_line(line, lazy=lazy, dropped=dropped.append)
    if parsed is not None and lazy:
        parsed = parsed[0], {key: _number(value) for key, value in parsed[1].items()}
    return parsed, dropped


def _number(value: float | str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value


# Carriage returns ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize(
    "line, expected",
    [
        (ASCEND, (3, {"actor/pg_loss": 0.01, "global_seqlen/max": 1680.0})),
        (BAR + "\rstep:4 - a:0.5 - b:-2", (4, {"a": 0.5, "b": -2.0})),
        ("\r" + BAR + "\rstep:4 - a:0.5", (4, {"a": 0.5})),
        ("Loading: 10%\rLoading: 20%\rstep:5 - a:1.5 - b:2\rLoading: 30%\rLoading: 40%", (5, {"a": 1.5, "b": 2.0})),
        ("step:6 - a:1 - b:2\r\n", (6, {"a": 1.0, "b": 2.0})),
        ("step:6 - a:1 - b:2\r\r\n", (6, {"a": 1.0, "b": 2.0})),
        ("step:6 - a:1 - b:2 -\r\n", (6, {"a": 1.0, "b": 2.0})),
        ("step:7 - a:1 - b:2 - ", (7, {"a": 1.0, "b": 2.0})),  # no carriage return: the same bare separator
        ("step:8 - a:1\rstep:9 - a:2", (9, {"a": 2.0})),  # two steps: the last (a Source reads both)
        ("step:x - a:1\rstep:9 - a:2", (9, {"a": 2.0})),  # one segment that reads is enough
        ("(TaskRunner pid=222265) step:3 - a:np.float64(0.25) -\r" + BAR, (3, {"a": 0.25})),
        ("(TaskRunner pid=222265) " + BAR + "\rstep:3 - a:np.int32(7)", (3, {"a": 7.0})),
        ("\x1b[36m(TaskRunner pid=1)\x1b[0m " + BAR + "\r\x1b[1mstep:3\x1b[0m - a:1 -\r\x1b[A" + BAR, (3, {"a": 1.0})),
    ],
)
def test_a_step_line_sharing_its_line_with_progress_bars_is_read_whole(line, expected, lazy):
    assert read(line, lazy) == (expected, [])


@pytest.mark.parametrize("line", [
    BAR + "\r" + BAR.replace("3/263", "4/263"),
    "\r\r\n",
    "(TaskRunner pid=1) \r   \r",
    "Loading: 10%\rsaving checkpoint at step:5\r",
    "step is next\r" + BAR,
])
def test_a_line_of_bars_and_text_only_is_no_step(line):
    assert read(line) == (None, [])


@pytest.mark.parametrize("line, reason", [
    ("step:3 -\r" + BAR, "step 3 has no readable key:value pair"),
    ("step:3 - \r" + BAR, "step 3 has no readable key:value pair"),
    (BAR + "\rstep:x - a:1", "step is not an integer: 'x'"),
    ("step:1 - a:zz\rstep:2 - b:yy", "step 1 has no readable key:value pair"),  # the first error
])
def test_a_step_segment_that_cannot_be_read_is_a_parse_error(line, reason):
    with pytest.raises(ParseError) as error:
        parse_console_line(line)
    assert str(error.value) == reason


@pytest.mark.parametrize(
    "line, segments",
    [
        (ASCEND, ["step:3 - actor/pg_loss:0.01 - global_seqlen/max:1680 -", BAR]),
        ("(TaskRunner pid=222265) step:3 - a:1 -\r" + BAR,
         ["(TaskRunner pid=222265) step:3 - a:1 -", "(TaskRunner pid=222265) " + BAR]),
        ("\x1b[36m(WorkerDict pid=5, ip=10.0.0.1)\x1b[0m a\rb\r(pid=77) c",
         ["\x1b[36m(WorkerDict pid=5, ip=10.0.0.1)\x1b[0m a", "(WorkerDict pid=5, ip=10.0.0.1) b", "(pid=77) c"]),
        ("(main_task pid=1234) \rstep:1 - a:1\r\n", ["(main_task pid=1234) step:1 - a:1"]),
        ("a\r\n", ["a"]),
        ("a\rb\r\r\n", ["a", "b"]),
        ("  \r \r\n", [" "]),  # a blank line stays one line
        ("\x1b[0m\ra", ["a"]),
    ],
)
def test_carriage_segments_carry_the_lines_ray_prefix(line, segments):
    assert carriage_segments(line) == segments


def test_a_continuation_and_the_total_steps_are_read_from_their_segment():
    assert parse_console_continuation("       - a:1 - b:2 -\r" + BAR) == {"a": 1.0, "b": 2.0}
    assert parse_console_continuation(BAR + "\r       - a:1\r       - b:2") == {"a": 1.0, "b": 2.0}
    assert parse_console_continuation(BAR + "\r" + BAR) is None
    assert parse_total_steps("(TaskRunner pid=1) Total training steps: 263\r" + BAR) == 263
    assert parse_total_steps(BAR + "\r(TaskRunner pid=1) Total training steps: 105\r\n") == 105
    assert parse_total_steps("Total training steps: 263 and more\r" + BAR) is None


# ANSI codes ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "line, expected",
    [
        ("step:1 - act\x1b[1mor/pg_loss:0.5", (1, {"actor/pg_loss": 0.5})),
        ("step:1 - a:0.\x1b[0m25 - b:\x1b[31m-\x1b[0m3", (1, {"a": 0.25, "b": -3.0})),
        ("step:1 - a\x1b[0m:\x1b[0m1e-0\x1b[2m6", (1, {"a": 1e-06})),
        ("\x1b[1mstep\x1b[0m:\x1b[1m2\x1b[0m - a:1", (2, {"a": 1.0})),
        ("\x1b[2m\x1b[36m(TaskRunner pid=222265)\x1b[0m step:3 - a:np.float64(\x1b[1m0.5\x1b[0m)", (3, {"a": 0.5})),
        ("\x1b[36m(pid=77)\x1b[0m\x1b[32m step:4 - a:1\x1b[0m", (4, {"a": 1.0})),
        ("\x1b]0;title\x07step:5 - a:1", (5, {"a": 1.0})),  # an OSC sequence (window title)
    ],
)
def test_ansi_codes_inside_a_pair_or_around_the_prefix(line, expected):
    assert read(line) == (expected, [])
    assert read(line, lazy=True) == (expected, [])


# Lines wandb cut -----------------------------------------------------------------------------------------------

HEAD = "step:9 - a:0.5 - b:np.float64(0.25) - z:"


def _line_of(length: int, head: str = HEAD, tail: str = "") -> str:
    """``head`` + digits + ``tail``, ``length`` characters in all."""
    digits = length - len(head) - len(tail)
    assert digits > 0
    return head + "1" * digits + tail


@pytest.mark.parametrize("lazy", [False, True])
def test_a_line_of_exactly_wandbs_limit_loses_its_last_pair_and_no_other_length_does(lazy):
    assert WANDB_LINE_CHARS == 4096
    for length in (WANDB_LINE_CHARS - 1, WANDB_LINE_CHARS + 1):
        digits = length - len(HEAD)
        assert read(_line_of(length), lazy) == ((9, {"a": 0.5, "b": 0.25, "z": float("1" * digits)}), [])
    assert read(_line_of(WANDB_LINE_CHARS), lazy) == ((9, {"a": 0.5, "b": 0.25}), [])
    assert read(_line_of(WANDB_LINE_CHARS) + "\r", lazy) == ((9, {"a": 0.5, "b": 0.25}), [])  # "\r\n"
    # its only pair is not dropped: the line would have none
    only = _line_of(WANDB_LINE_CHARS, head="step:9 - z:")
    assert read(only, lazy) == ((9, {"z": float("1" * (WANDB_LINE_CHARS - 11))}), [])


def test_a_cut_line_that_ends_in_a_bare_separator_keeps_its_last_pair():
    line = _line_of(WANDB_LINE_CHARS, tail=" -")
    assert read(line) == ((9, {"a": 0.5, "b": 0.25, "z": float("1" * (WANDB_LINE_CHARS - len(HEAD) - 2))}), [])


def test_a_cut_line_with_carriage_returns_loses_the_last_pair_of_its_last_segment_only():
    # the bar came first: the step segment is the line's end, which wandb cut
    behind = _line_of(WANDB_LINE_CHARS, head=BAR + "\r" + HEAD)
    assert len(behind) == WANDB_LINE_CHARS
    assert read(behind) == ((9, {"a": 0.5, "b": 0.25}), [])
    # the bar came last: it was cut, the step segment is whole
    ahead = "step:9 - a:0.5 - b:2\r" + "Loading: " + "#" * (WANDB_LINE_CHARS - 30)
    ahead += "x" * (WANDB_LINE_CHARS - len(ahead))
    assert len(ahead) == WANDB_LINE_CHARS
    assert read(ahead) == ((9, {"a": 0.5, "b": 2.0}), [])
    shorter = _line_of(WANDB_LINE_CHARS - 1, head=BAR + "\r" + HEAD)
    assert read(shorter) == ((9, {"a": 0.5, "b": 0.25, "z": float("1" * (WANDB_LINE_CHARS - 1 - len(BAR) - 1
                                                                          - len(HEAD)))}), [])


# Ray prefixes --------------------------------------------------------------------------------------------------

PREFIXES = ["(TaskRunner pid=222265) ", "(main_task pid=1234) ", "(WorkerDict pid=5, ip=10.0.0.1) ", "(pid=77) ",
            "(TaskRunner pid=1, ip=1.2.3.4) ", "(aBcDeFWorkerDict_0:0 WorkerDict pid=31337) "]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("suffix", ["", " [repeated 3x across cluster]", " [repeated 12x across cluster] "])
def test_every_ray_prefix_with_bars_and_the_repeated_suffix(prefix, suffix):
    line = "step:2 - x:1.5 - y:np.int32(7)"
    expected = ((2, {"x": 1.5, "y": 7.0}), [])
    assert read(prefix + line + suffix) == expected
    assert read(prefix + BAR + "\r" + line + suffix) == expected
    assert read(prefix + line + " -\r" + BAR + suffix) == expected
    assert read("\x1b[2m\x1b[36m" + prefix.rstrip() + "\x1b[0m " + line + suffix) == expected


@pytest.mark.parametrize("line", ["(raylet) step:2 - x:1.5", "(TaskRunner pid=1)step?:2 - x:1.5",
                                  "(TaskRunner pid 1) step:2 - x:1.5", "((pid=1)) step:2 - x:1.5"])
def test_what_is_no_ray_prefix_is_not_taken_for_one(line):
    assert read(line) == (None, [])


def test_text_after_the_repeated_suffix_makes_it_no_suffix():
    with pytest.raises(ParseError, match="step 2 has no readable key:value pair"):  # "1.5 [repeated...] x"
        parse_console_line("(TaskRunner pid=1) step:2 - x:1.5 [repeated 3x across cluster] x")
    assert read("(TaskRunner pid=1) step:2 - y:2 - x:1.5 [repeated 3x across cluster] x") == ((2, {"y": 2.0}),
                                                                                              ["not_a_number"])


# numpy reprs and non-finite values -----------------------------------------------------------------------------

NUMPY_LINE = ("step:11 - a:np.float64(0.25) - b:np.int32(7) - c:np.int64(-12345678901) - d:np.float32(1.5)"
              " - e:nan - f:inf - g:-inf - h:np.float64(nan) - i:np.float64(inf) - j:np.float64(-inf) - k:-0.0")


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("mangle", [
    lambda line: line,
    lambda line: BAR + "\r" + line + "\r" + BAR,
    lambda line: "(TaskRunner pid=222265) " + line + " -\r\n",
])
def test_numpy_reprs_and_non_finite_spellings(lazy, mangle):
    (step, values), dropped = read(mangle(NUMPY_LINE), lazy)
    assert step == 11 and dropped == []
    assert sorted(values) == list("abcdefghijk")
    assert (values["a"], values["b"], values["c"], values["d"]) == (0.25, 7.0, -12345678901.0, 1.5)
    assert math.isnan(values["e"]) and math.isnan(values["h"])
    assert values["f"] == values["i"] == math.inf and values["g"] == values["j"] == -math.inf
    assert values["k"] == 0.0 and math.copysign(1.0, values["k"]) == -1.0


# Cut values ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, text", [("step:12 - a:1 - b:1.5e", "1.5e"), ("step:12 - a:1 - b:-", "-")])
def test_a_value_cut_to_number_characters_is_dropped_or_kept_as_text_for_the_store(line, text):
    assert read(line) == ((12, {"a": 1.0}), ["not_a_number"])
    assert read(line, lazy=True) == ((12, {"a": 1.0, "b": text}), [])  # the store counts it when scraped


@pytest.mark.parametrize(
    "line, values, dropped",
    [
        ("step:12 - a:1 - b:", {"a": 1.0}, ["not_a_number"]),
        ("step:12 - a:1 - b:np.float64(", {"a": 1.0}, ["not_a_number"]),
        ("step:12 - a:1 - b:np.float64(0.2", {"a": 1.0}, ["not_a_number"]),  # no ")": cut inside the wrapper
        ("step:12 - a:np.float64(0.5) - b:np.int64(3", {"a": 0.5}, ["not_a_number"]),
        ("step:12 - a:np.float64(0.5) - b:np.float64(0.25)", {"a": 0.5, "b": 0.25}, []),
        ("step:12 - a:1 - b:0.12", {"a": 1.0, "b": 0.12}, []),  # a cut no character shows: read as it is
        ("step:12 - a:1 - bb", {"a": 1.0}, []),  # a key cut before its colon: no pair
        ("step:12 - a:1 - b:0.5 -\r" + BAR, {"a": 1.0, "b": 0.5}, []),
    ],
)
def test_a_pair_with_its_value_cut(line, values, dropped):
    assert read(line) == ((12, values), dropped)
    assert read(line, lazy=True) == ((12, values), dropped)


@pytest.mark.parametrize("line", ["step:12 - a:", "step:12 - a:np.float64(0.2", "step:12 - a:np.float64(0.2\r" + BAR,
                                  "step:12 - a:np.float64(0.25\r" + BAR + "\rb:1"])
def test_a_step_whose_only_pair_is_cut_is_a_parse_error(line):
    with pytest.raises(ParseError, match="step 12 has no readable key:value pair"):
        parse_console_line(line)


# Through a Source: the lines as the tail reads them from a file -------------------------------------------------


LOG = "".join([
    "(TaskRunner pid=222265) {'trainer': {'experiment_name': 'grpo',\r(TaskRunner pid=222265) " + BAR + "\n",
    "(TaskRunner pid=222265)              'project_name': 'gsm8k'}}\n",
    "(TaskRunner pid=222265) Total training steps: 263\r" + BAR + "\r\n",
    ASCEND + "\n",
    BAR + "\rstep:4 - actor/pg_loss:0.02 - global_seqlen/max:1700\r\n",
    "\x1b[36m(TaskRunner pid=222265)\x1b[0m step:5 - actor/pg_loss:np.float64(0.03) -\r" + BAR
    + "\rstep:6 - actor/pg_loss:np.float64(nan) [repeated 2x across cluster]\n",
    "       - critic/score/mean:0.5 -\r" + BAR + "\n",
    "step:x - a:1\r" + BAR + "\n",
    BAR + "\rray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=1, ip=1.2.3.4)\n",
    "(TaskRunner pid=222265) torch.OutOfMemoryError: CUDA out of memory.\r" + BAR + "\n",
])


def _records(tmp_path, text: str) -> tuple[list[Record], list[str]]:
    path = tmp_path / "fallback" / "console.log"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(text.encode())
    store = RecordCollector()
    source = Source(str(path), store)
    source.settle()
    source.close()
    return store.records, store.errors


def _shown(record: Record) -> tuple:
    """A record as (step, {key: value or "nan"}, its event), for exact comparison."""
    values = {key: "nan" if math.isnan(float(value)) else float(value) for key, value in record.values.items()}
    events = {name: getattr(record, name) for name in ("total_steps", "fatal", "error") if getattr(record, name)}
    return record.step, values, events


def test_a_source_reads_every_segment_of_a_line_end_to_end(tmp_path):
    records, errors = _records(tmp_path, LOG)
    assert errors == ["step is not an integer: 'x'"]
    assert {record.run for record in records} == {RunKey("gsm8k", "grpo", ME)}  # the config print named it
    assert [record.run_config for record in records if record.run_config] == [
        {"trainer.experiment_name": "grpo", "trainer.project_name": "gsm8k"}]
    assert [_shown(record) for record in records if not record.run_config] == [
        (0, {}, {"total_steps": 263}),
        (3, {"actor/pg_loss": 0.01, "global_seqlen/max": 1680.0}, {}),
        (4, {"actor/pg_loss": 0.02, "global_seqlen/max": 1700.0}, {}),
        (5, {"actor/pg_loss": 0.03}, {}),
        (6, {"actor/pg_loss": "nan"}, {}),
        (6, {"critic/score/mean": 0.5}, {}),  # the continuation, cut by a bar too
        (6, {}, {"fatal": "cuda_oom"}),  # the driver's line, after a bar
        (6, {}, {"error": "cuda_oom"}),  # an actor's line: no fatal end, an error
    ]


def test_a_bar_in_an_actors_line_is_that_actors_and_a_bar_in_the_drivers_is_the_drivers(tmp_path):
    fatal = "ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=1, ip=1.2.3.4)"
    records, errors = _records(tmp_path, "step:1 - a:1\n(TaskRunner pid=5) " + BAR + "\r" + fatal + "\n")
    assert errors == [] and [_shown(record) for record in records] == [(1, {"a": 1.0}, {}),
                                                                       (1, {}, {"error": "cuda_oom"})]
    records, errors = _records(tmp_path, "step:1 - a:1\n" + fatal + "\r" + BAR + "\n")
    assert errors == [] and [_shown(record) for record in records] == [(1, {"a": 1.0}, {}),
                                                                       (1, {}, {"fatal": "cuda_oom"})]


def test_two_steps_on_one_line_are_both_read_and_crlf_files_read_as_before(tmp_path):
    records, errors = _records(tmp_path, "step:1 - a:1\r\nstep:2 - a:2\rstep:3 - a:3 -\r\n\r\nstep:4 - a:4\r\n")
    assert errors == []
    assert [_shown(record) for record in records] == [(step, {"a": float(step)}, {}) for step in (1, 2, 3, 4)]


def test_a_timeline_reads_the_step_of_a_line_with_bars(tmp_path):
    from verl_exporter.history.timeline import read_file
    path = tmp_path / "fallback" / "console.log"
    path.parent.mkdir()
    path.write_text("step:1 - a:1\n" + ASCEND + "\n" + BAR + "\rstep:4 - a:4\r" + BAR + "\n")
    timeline = read_file(str(path))
    assert [(step.step, [_shown(record) for record in step.records]) for step in timeline.steps] == [
        (1, [(1, {"a": 1.0}, {})]),
        (3, [(3, {"actor/pg_loss": 0.01, "global_seqlen/max": 1680.0}, {})]),
        (4, [(4, {"a": 4.0}, {})]),
    ]
