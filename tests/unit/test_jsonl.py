"""verl FileLogger lines: ``{"step": N, "data": {...}}``."""

import math
from pathlib import Path

import pytest

from verl_exporter.sources.jsonl import parse_jsonl_line
from verl_exporter.store.records import ParseError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sources"
FILELOGGER = FIXTURES / "verl_grpo_example_gsm8k" / "qwen2_7b_function_rm.jsonl"


def test_filelogger_fixture():
    parsed = [parse_jsonl_line(line) for line in FILELOGGER.read_text().split("\n")]
    assert parsed[-1] is None  # the empty string after the final newline
    records = parsed[:-1]
    assert [step for step, _ in records] == [1, 2, 3, 4, 5, 5]
    step1 = records[0][1]
    assert len(step1) == 31
    assert step1["actor/ppo_kl"] == -8.163164312320433e-06
    assert step1["global_seqlen/min"] == 488923.0 and isinstance(step1["global_seqlen/min"], float)
    assert step1["training/epoch"] == 0.0
    assert math.isnan(records[2][1]["actor/pg_clipfrac_lower"])
    assert records[3][1]["actor/grad_norm"] == math.inf
    assert records[3][1]["critic/advantages/min"] == -math.inf
    # Validation is a separate line at the same step.
    assert records[5][1]["val-core/openai/gsm8k/acc/mean@1"] == 0.8824867323730099
    assert "actor/pg_loss" not in records[5][1]


@pytest.mark.parametrize("line", ["", " ", "\t\r", "\r"])
def test_blank_lines(line):
    assert parse_jsonl_line(line) is None


def test_value_types():
    line = (
        '{"step": 3, "data": {"f": 0.5, "i": 7, "nan": NaN, "inf": Infinity, "ninf": -Infinity, '
        '"big": 1e999, "nbig": -1e999, "bigint": 1' + "0" * 400 + ', "s_num": "1e-3", "s_nan": "nan", '
        '"s_text": "qwen2", "null": null, "list": [1, 2], "obj": {"a": 1}, "flag": true}}\r'
    )
    step, values = parse_jsonl_line(line)
    assert step == 3
    assert math.isnan(values.pop("nan")) and math.isnan(values.pop("s_nan"))
    assert math.isnan(values.pop("null"))
    assert values == {
        "f": 0.5, "i": 7.0, "inf": math.inf, "ninf": -math.inf, "big": math.inf, "nbig": -math.inf,
        "bigint": math.inf, "s_num": 0.001, "flag": 1.0,
    }


def test_orjson_null_is_read_as_nan():
    # verl 0.8+ serialises with orjson, which writes NaN, Inf and -Inf as null.
    step, values = parse_jsonl_line('{"step":1,"data":{"actor/grad_norm":null,"a":1.0}}')
    assert step == 1 and values["a"] == 1.0
    assert math.isnan(values["actor/grad_norm"])


def test_empty_data_is_a_step_without_values():
    assert parse_jsonl_line('{"step": 0, "data": {}}') == (0, {})


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"step": 1, "data": {"a": 1', "malformed JSON"),
        ("{'step': 1, 'data': {}}", "malformed JSON"),
        ('{"step": 1, "data": {}} trailing', "malformed JSON"),
        ("step:1 - a:1", "malformed JSON"),
        ("[" * 100_000, "malformed JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('"text"', "expected a JSON object, got str"),
        ('{"data": {"a": 1}}', "missing step"),
        ('{"step": "1", "data": {}}', "step is not an integer: '1'"),
        ('{"step": 1.0, "data": {}}', "step is not an integer: 1.0"),
        ('{"step": true, "data": {}}', "step is not an integer: True"),
        ('{"step": null, "data": {}}', "step is not an integer: None"),
        ('{"step": [1], "data": {}}', "step is not an integer: a JSON list"),
        ('{"step": 1}', "missing data"),
        ('{"step": 1, "data": [1]}', "data is not an object: list"),
        ('{"step": 1, "data": null}', "data is not an object: NoneType"),
        ('{"step": 1, "data": "a"}', "data is not an object: str"),
    ],
)
def test_malformed_lines(line, reason):
    with pytest.raises(ParseError) as err:
        parse_jsonl_line(line)
    assert str(err.value).startswith(reason)
    assert len(str(err.value)) < 120


def test_message_stays_short_for_a_huge_bad_line():
    with pytest.raises(ParseError) as err:
        parse_jsonl_line('{"step": 1, "data": {"' + "k" * 1_000_000)
    assert len(str(err.value)) < 120
