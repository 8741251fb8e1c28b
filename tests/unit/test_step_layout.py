"""Step lines read by a remembered layout (``sources.step_layout``) give exactly what splitting them
gives, whatever their keys hold (spaces, dashes, "e", regex characters), and a line that is not of the
layout is split as before."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_exporter.sources import console
from verl_exporter.sources.console import parse_console_line
from verl_exporter.sources.step_layout import MAX_KEYS, MAX_LAYOUTS, StepLayouts

key_text = st.lists(st.sampled_from(["a", "/", "_", " ", "-", "- ", " -", "e", "E", "1", ".", "+", "(", ")", "*",
                                     "\\", "é", "[", "$", "np.float64("]), min_size=1, max_size=6).map("".join)
number_text = st.text(alphabet="0123456789.eE+-", min_size=1, max_size=8)
NUMBER_CHARACTERS = "0123456789.eE+-"
no_number = st.one_of(st.text(alphabet=NUMBER_CHARACTERS + "nx :()", max_size=4).filter(
    lambda text: text.strip(NUMBER_CHARACTERS)),
    st.sampled_from(["", "nan", "inf", "np.float64(1)", "1 ", "1:2", "x", "1n"]))


def line(step: int, keys: list[str], values: list[str]) -> str:
    return f"step:{step}" + "".join(f" - {key}:{value}" for key, value in zip(keys, values))


def split(text: str):
    """What the line reads to with no layout known (the splitting path alone)."""
    console.LAYOUTS = StepLayouts()
    return console._plain_pairs(text)


@pytest.fixture(autouse=True)
def fresh_layouts(monkeypatch):
    monkeypatch.setattr(console, "LAYOUTS", StepLayouts())


@settings(max_examples=400, deadline=None)
@given(st.lists(key_text, min_size=1, max_size=8), st.data())
def test_a_line_of_a_known_layout_reads_as_split(keys, data):
    first = line(1, keys, data.draw(st.lists(number_text, min_size=len(keys), max_size=len(keys))))
    layouts = StepLayouts()
    console.LAYOUTS = layouts
    learned = console._plain_pairs(first), console._plain_pairs(first)  # the second sight compiles it
    other_keys = keys if data.draw(st.booleans()) else data.draw(
        st.lists(key_text, min_size=len(keys), max_size=len(keys)))
    values = data.draw(st.lists(number_text, min_size=len(keys), max_size=len(keys)))
    if data.draw(st.booleans()):  # one value that is no number
        values[data.draw(st.integers(0, len(keys) - 1))] = data.draw(no_number)
    text = line(data.draw(st.integers(0, 10**6)), other_keys, values)
    fast = layouts.values(text)
    console.LAYOUTS = layouts
    read = console._plain_pairs(text)
    assert read == split(text)
    assert learned[0] == learned[1] == split(first)
    if fast is not None:
        assert fast == read


def test_the_layout_is_used_and_validation_lines_find_their_own():
    layouts = StepLayouts()
    train, validation = ["actor/pg_loss", "critic/score/mean"], ["actor/pg_loss", "critic/score/mean", "val/x"]
    for keys in (train, validation, train, validation):  # each compiled when read again
        layouts.read(keys)
    assert layouts.values(line(3, train, ["0.5", "-1e-3"])) == {"actor/pg_loss": "0.5", "critic/score/mean": "-1e-3"}
    assert layouts.values(line(4, validation, ["1", "2", "3"])) == dict(zip(validation, "123"))
    assert layouts.values(line(5, train, ["0.5", "nan"])) is None  # not number characters: split as before
    assert layouts.values(line(5, ["actor/pg_loss", "other"], ["1", "2"])) is None
    assert layouts.values(" " + line(5, train, ["1", "2"])) is None


def test_layouts_are_bounded():
    layouts = StepLayouts()
    for index in range(MAX_LAYOUTS + 5):
        keys = [f"k{index}", "x"]
        layouts.read(keys)
        layouts.read(keys)
    assert len(layouts._known) == MAX_LAYOUTS
    wide = [f"k{index}" for index in range(MAX_KEYS + 1)]
    other = StepLayouts()
    other.read(wide)
    other.read(wide)
    assert not other._known


def test_step_lines_read_the_same_through_a_layout():
    keys = ["actor/pg_loss", "critic/vf_loss", "timing_s/step", "a - b", "-c", "d -"]
    values = ["-0.5", "1e-3", "2", "3", "4"]
    lines = [f"(TaskRunner pid=1) {line(step, keys, [str(step), *values])}" for step in range(1, 6)]
    read = [parse_console_line(text, lazy=True) for text in lines]
    for text, got in zip(lines, read):
        console.LAYOUTS = StepLayouts()
        assert got == parse_console_line(text, lazy=True)
