"""verl console logger lines: ``step:N - key:value - ...`` in every shape verl and Ray print."""

import math
from pathlib import Path

import pytest

from verl_exporter.sources.console import (
    is_finished_line,
    parse_console_continuation,
    parse_console_line,
)
from verl_exporter.store.records import ParseError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sources"


def _steps(path: Path) -> dict[int, dict[str, float]]:
    steps = {}
    for line in path.read_text(encoding="utf-8").split("\n"):
        parsed = parse_console_line(line)
        if parsed is not None:
            assert parsed[0] not in steps
            steps[parsed[0]] = parsed[1]
    return steps


def test_current_verl_output_with_ray_prefixes_ansi_and_noise():
    steps = _steps(FIXTURES / "verl_console.log")
    assert sorted(steps) == [0, 1, 2, 3, 4, 5]
    assert steps[0] == {
        "val-aux/openai/gsm8k/reward/mean@1": 0.49052312357846856,
        "val-core/openai/gsm8k/acc/mean@1": 0.49052312357846856,
        "val-aux/num_turns/min": 2.0,
        "val-aux/num_turns/max": 2.0,
    }
    assert len(steps[1]) == 31  # every key of the np.float64(...) line
    assert steps[1]["global_seqlen/min"] == 488923.0
    assert steps[1]["actor/ppo_kl"] == pytest.approx(-8.163164312320433e-06)
    assert steps[2]["actor/ppo_kl"] == -1.6326328624640866e-05  # full repr, exact
    assert steps[2]["actor/lr"] == 1e-06
    assert math.isnan(steps[3]["actor/pg_clipfrac_lower"])
    assert math.isnan(steps[4]["actor/grad_norm"])
    assert steps[4]["critic/advantages/max"] == math.inf
    assert steps[4]["critic/advantages/min"] == -math.inf
    assert steps[5]["val-core/openai/gsm8k/acc/mean@1"] == 0.8824867323730099


def test_old_three_decimal_output():
    steps = _steps(FIXTURES / "verl_console_old.log")
    assert sorted(steps) == [0, 1, 2]
    assert len(steps[0]) == 24
    assert steps[0]["actor/pg_loss"] == -0.005
    assert steps[0]["critic/vpred_mean"] == -2.056
    assert steps[0]["critic/lr(1e-4)"] == 0.1
    assert steps[0]["actor/lr(1e-6)"] == 0.01
    assert steps[1]["critic/vf_explained_var"] == -0.234
    assert steps[1]["actor/perf/max_memory_allocated_gb"] == 38.214
    assert math.isnan(steps[2]["critic/vf_loss"]) and math.isnan(steps[2]["critic/score/mean"])
    assert steps[2]["actor/pg_loss"] == math.inf and steps[2]["actor/ppo_kl"] == -math.inf


def test_finished_marker_found_once_in_each_fixture():
    for name in ("verl_console.log", "verl_console_old.log"):
        lines = (FIXTURES / name).read_text(encoding="utf-8").split("\n")
        assert sum(is_finished_line(line) for line in lines) == 1, name


@pytest.mark.parametrize(
    "line, expected",
    [
        ("step:0 - actor/pg_loss:-0.005", (0, {"actor/pg_loss": -0.005})),
        ("step:7 - actor/ppo_kl:-8.163164312320433e-06", (7, {"actor/ppo_kl": -8.163164312320433e-06})),
        (
            "step:1 - a:np.float64(0.25) - b:np.float32(0.5) - c:np.int64(3) - d:numpy.float64(-1.5)",
            (1, {"a": 0.25, "b": 0.5, "c": 3.0, "d": -1.5}),
        ),
        ("(TaskRunner pid=222265) step:2 - x:1.5", (2, {"x": 1.5})),
        ("(main_task pid=8918) step:2 - x:1.5", (2, {"x": 1.5})),
        ("(WorkerDict pid=1, ip=10.0.0.1) step:2 - x:1.5", (2, {"x": 1.5})),
        ("(pid=77) step:2 - x:1.5", (2, {"x": 1.5})),
        ("\x1b[36m(TaskRunner pid=1)\x1b[0m step:3 - x:2", (3, {"x": 2.0})),
        ("step:3 - \x1b[31mactor/pg_loss\x1b[0m:\x1b[1m-0.5\x1b[0m", (3, {"actor/pg_loss": -0.5})),
        (
            "step:4 - critic/lr(1e-4):0.1 - val-core/openai/gsm8k/reward/mean@1:0.75 - a.b-c@2:1",
            (4, {"critic/lr(1e-4)": 0.1, "val-core/openai/gsm8k/reward/mean@1": 0.75, "a.b-c@2": 1.0}),
        ),
        ("step:5 - a:-0.005 - b:-1e-05 - c:-3", (5, {"a": -0.005, "b": -1e-05, "c": -3.0})),
        ("step:6 - a:1 [repeated 3x across cluster]", (6, {"a": 1.0})),
        ("step:6 - a:1\r", (6, {"a": 1.0})),
        ("Training Progress:  1%|  | 1/105\rstep:6 - a:1", (6, {"a": 1.0})),
        ("step:8 - ok:True - no:False", (8, {"ok": 1.0, "no": 0.0})),
        ("step:9 - ns:key:0.5", (9, {"ns:key": 0.5})),
        ("  step:10 - a:1  ", (10, {"a": 1.0})),
    ],
)
def test_step_line_shapes(line, expected):
    assert parse_console_line(line) == expected


def test_non_finite_spellings():
    step, values = parse_console_line("step:1 - a:nan - b:NaN - c:inf - d:-inf - e:np.float64(nan) - f:Infinity")
    assert math.isnan(values["a"]) and math.isnan(values["b"]) and math.isnan(values["e"])
    assert values["c"] == math.inf and values["d"] == -math.inf and values["f"] == math.inf


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "Training Progress: step:3/100",
        "saving checkpoint at step:5",
        "Training Progress:   3%|▎         | 3/100 [03:07<1:41:02, 62.50s/it]",
        "(TaskRunner pid=1) local_global_step_folder: /ckpt/global_step_5",
        "(TaskRunner pid=1) Final validation metrics: {'val-core/x/acc/mean@1': 0.5}",
        "stepping:1 - a:1",
        "step :1 - a:1",
        "the step:1 - a:1",
        "(raylet) step:1 - a:1",
    ],
)
def test_lines_that_are_not_steps(line):
    assert parse_console_line(line) is None


@pytest.mark.parametrize(
    "line, reason",
    [
        ("step:abc - a:1", "not an integer"),
        ("step:1.5 - a:1", "not an integer"),
        ("step:3/100 - a:1", "not an integer"),
        ("(TaskRunner pid=1) step: - a:1", "not an integer"),
        ("step:1", "no readable"),
        ("step:1 - a:b - c:d", "no readable"),
        ("step:1 - junk", "no readable"),
        ("step:1 - :2", "no readable"),
    ],
)
def test_step_like_lines_that_cannot_be_read(line, reason):
    with pytest.raises(ParseError, match=reason):
        parse_console_line(line)


def test_one_bad_pair_does_not_lose_the_line():
    assert parse_console_line("step:1 - a:1 - junk - b:np.float64(oops) - c:x - d:2") == (1, {"a": 1.0, "d": 2.0})


def test_continuation_of_a_wrapped_step_line():
    assert parse_console_continuation("       - critic/lr(1e-4):0.100 - a:-1 ") == {"critic/lr(1e-4)": 0.1, "a": -1.0}
    assert parse_console_continuation("(TaskRunner pid=1)        - a:1") == {"a": 1.0}
    assert parse_console_continuation("- not a metric") is None
    assert parse_console_continuation("step:1 - a:1") is None
    assert parse_console_continuation("plain text") is None


def test_finished_line():
    assert is_finished_line("(TaskRunner pid=1) (\"Final validation metrics: {'a': np.float64(0.5)}\")")
    assert is_finished_line("\x1b[36m(TaskRunner pid=1)\x1b[0m Final \x1b[1mvalidation\x1b[0m metrics: {}")
    assert not is_finished_line("Initial validation metrics: {'a': 0.5}")
    assert not is_finished_line("step:1 - a:1")


@pytest.mark.parametrize("line", [
    "(TaskRunner pid=1) step:3 - actor/pg_loss:-0.005 - actor/ppo_kl:-8.163164312320433e-06"
    " - perf/total_num_tokens:98304",
    "step:3 - a:1 - critic/lr(1e-4):0.100 - val-core/openai/gsm8k/acc/mean@1:0.5",
    "step:3 - a:nan - b:inf - c:0.5",
    "step:3 - a:np.float64(0.25) - b:2",
    "step:3 - key:with:colons:0.5 - b:2",
    "step:3 - a:1 - b:True",
])
def test_lazy_parsing_reads_the_same_numbers(line):
    step, lazy_values = parse_console_line(line, lazy=True)
    eager_step, eager_values = parse_console_line(line)
    converted = {key: float(value) for key, value in lazy_values.items()}
    assert step == eager_step and converted.keys() == eager_values.keys()
    for key, value in eager_values.items():
        assert converted[key] == value or (math.isnan(value) and math.isnan(converted[key]))


def test_lazy_parsing_keeps_plain_numbers_as_text_and_falls_back_otherwise():
    assert parse_console_line("step:3 - a:1 - b:-2.5e-06", lazy=True) == (3, {"a": "1", "b": "-2.5e-06"})
    assert parse_console_line("step:3 - a:nan - b:1", lazy=True)[1]["b"] == 1.0  # floats, not text
    assert parse_console_line("step:3 - k:x:0.5 - b:1", lazy=True)[1] == {"k:x": 0.5, "b": 1.0}
