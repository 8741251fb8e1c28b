"""The simulated verl run: scenario values, keys, formats, timings and the writers."""

from __future__ import annotations

import ast
import itertools
import json
import math
import random
import re
import subprocess
import sys
import threading
import time

import pytest
import yaml

from verl_exporter import simulate
from verl_exporter.simulate import (
    SCENARIOS,
    format_console,
    format_jsonl,
    generate_steps,
    is_validation,
    noise_lines,
    scale_timings,
    step_values,
    validation_values,
    write_file,
    write_run,
)

STEP_LINE = re.compile(r"^\(TaskRunner pid=1234\) step:(\d+)((?: - [^ :]+:\S+)+)$")
PPO_KEYS = {
    "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/entropy",
    "actor/grad_norm", "actor/lr", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff",
    "critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/vf_explained_var", "critic/grad_norm",
    "critic/lr", "perf/total_num_tokens", "perf/time_per_step", "perf/throughput", "perf/mfu/actor",
    "perf/mfu/critic", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb",
    "training/global_step", "training/epoch",
    *(f"critic/{group}/{stat}" for group in ("score", "rewards", "advantages", "returns", "values")
      for stat in ("mean", "max", "min")),
    *(f"{group}/{stat}" for group in ("response_length", "prompt_length")
      for stat in ("mean", "max", "min", "clip_ratio")),
    *(f"timing_s/{phase}" for phase in ("gen", "ref", "values", "adv", "update_critic", "update_actor", "step")),
    *(f"timing_per_token_ms/{phase}" for phase in ("gen", "ref", "values", "adv", "update_critic", "update_actor")),
}
CRITIC_ONLY = {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/vf_explained_var",
               "critic/grad_norm", "critic/lr", "critic/values/mean", "critic/values/max", "critic/values/min",
               "timing_s/values", "timing_s/update_critic", "timing_per_token_ms/values",
               "timing_per_token_ms/update_critic", "perf/mfu/critic"}


def training(scenario, n, **kwargs):
    """The first n training steps of a scenario, as a list of value dicts."""
    items = generate_steps(scenario, **kwargs)
    return [values for _, values in itertools.islice((i for i in items if not is_validation(i[1])), n)]


def series(rows, key, start=1):
    return [row[key] for row in rows[start - 1:]]


def parse_console(line):
    match = STEP_LINE.match(line)
    assert match, line
    pairs = (pair.split(":", 1) for pair in match.group(2).split(" - ")[1:])
    return int(match.group(1)), {key: float(value) for key, value in pairs}


# Scenarios ------------------------------------------------------------------------------------------------


def test_scenarios_are_described_and_unknown_ones_are_refused():
    assert set(SCENARIOS) == {"healthy", "healthy-grpo", "lr-too-high", "critic-underfit", "entropy-collapse",
                              "truncation", "stall", "nan", "grad-spike", "rollout-mismatch"}
    assert all(SCENARIOS.values())
    with pytest.raises(ValueError, match="unknown scenario"):
        generate_steps("exploding")  # refused at the call, not at the first next()
    with pytest.raises(ValueError, match="unknown algorithm"):
        generate_steps("healthy", algorithm="dpo")


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_healthy_stays_in_the_guides_healthy_ranges(seed):
    rows = training("healthy", 150, seed=seed)
    assert all(0.1 <= v <= 0.2 for v in series(rows, "actor/pg_clipfrac"))
    assert all(0.002 <= v <= 0.006 for v in series(rows, "actor/ppo_kl"))
    assert all(v >= 0 for v in series(rows, "critic/vf_explained_var", start=21))
    assert series(rows, "critic/vf_explained_var")[0] < 0
    assert series(rows, "critic/vf_explained_var")[-1] > 0.75
    grad = series(rows, "actor/grad_norm")
    assert all(0.3 <= v <= 0.9 for v in grad) and len(set(grad)) > 100  # never near the clip value 1.0
    score = series(rows, "critic/score/mean")
    assert score[0] < 0.25 and score[-1] > 0.7 and sum(score[-10:]) > sum(score[40:50]) > sum(score[:10])
    entropy = series(rows, "actor/entropy")
    assert entropy[0] > 0.75 and 0.4 < entropy[-1] < 0.5
    vf_loss = series(rows, "critic/vf_loss")
    assert vf_loss[0] > 10 and vf_loss[-1] < 1
    late = rows[-1]
    assert abs(late["critic/vpred_mean"] - late["critic/returns/mean"]) < 0.1
    assert abs(rows[0]["critic/vpred_mean"] - rows[0]["critic/returns/mean"]) > 1
    for row in rows:
        assert abs(row["critic/advantages/mean"]) < 0.05
        assert 2.0 < row["critic/advantages/max"] < 2.6 and -2.6 < row["critic/advantages/min"] < -2.0
        assert row["response_length/clip_ratio"] < 0.05
        assert 130 < row["perf/throughput"] < 160 and 0.3 < row["perf/mfu/actor"] < 0.4
        assert 58 < row["timing_s/step"] < 72
        assert row["timing_s/gen"] < 0.5 * row["timing_s/step"]
        assert row["timing_s/update_actor"] < 0.4 * row["timing_s/step"]


def test_lr_too_high_pins_grad_norm_and_crosses_kl_and_clip_thresholds():
    rows = training("lr-too-high", 60)
    assert all(v == 1.0 for v in series(rows, "actor/grad_norm"))
    assert all(v > 0.05 for v in series(rows, "actor/ppo_kl"))
    assert all(v > 0.5 for v in series(rows, "actor/pg_clipfrac"))
    assert all(0.4 < v < 0.6 for v in series(rows, "actor/pg_loss"))
    assert all(v < 0.01 for v in series(rows, "critic/score/mean"))


def test_critic_underfit_keeps_negative_explained_variance_and_high_loss():
    rows = training("critic-underfit", 60)
    assert all(v < 0 for v in series(rows, "critic/vf_explained_var"))
    assert all(40 < v < 50 for v in series(rows, "critic/vf_loss"))
    assert rows[-1]["critic/vf_loss"] > 0.9 * rows[0]["critic/vf_loss"]  # not decreasing
    for row in rows:
        assert row["critic/returns/mean"] - row["critic/vpred_mean"] > 5


def test_entropy_collapse_drops_within_ten_steps_and_score_stalls():
    rows = training("entropy-collapse", 60)
    entropy = series(rows, "actor/entropy")
    assert entropy[0] > 0.55 and entropy[10] <= 0.06 and all(v < 0.04 for v in entropy[20:])
    assert all(v < 0.001 for v in series(rows, "actor/ppo_kl", start=21))
    assert all(v < 0.05 for v in series(rows, "actor/pg_clipfrac", start=21))
    score = series(rows, "critic/score/mean")
    assert abs(sum(score[50:60]) / 10 - sum(score[20:30]) / 10) < 0.03


def test_truncation_clips_most_responses_at_the_maximum_length():
    for row in training("truncation", 30):
        assert row["response_length/clip_ratio"] > 0.5
        assert row["response_length/max"] == 256.0
        assert row["response_length/mean"] > 0.98 * row["response_length/max"]


def test_stall_stops_yielding_after_stall_after_steps():
    steps = [step for step, values in generate_steps("stall", stall_after=7, val_every=5) if not is_validation(values)]
    assert steps == list(range(1, 8))
    assert len([1 for _ in generate_steps("stall")]) == 20 + 2  # default: 20 steps, validation at 10 and 20


def test_nan_turns_losses_non_finite_from_nan_after():
    rows = training("nan", 20, nan_after=12)
    for step, row in enumerate(rows, start=1):
        broken = step >= 12
        assert math.isnan(row["actor/pg_loss"]) == broken and math.isnan(row["actor/grad_norm"]) == broken
        assert (row["critic/vf_loss"] == math.inf) == broken
        assert math.isfinite(row["critic/score/mean"])


# Keys and consistency -------------------------------------------------------------------------------------


def test_ppo_logs_verl_ppo_keys():
    assert set(step_values("healthy", 3)) == PPO_KEYS


def test_grpo_has_no_critic_keys_but_a_kl_loss():
    keys = set(step_values("healthy", 3, algorithm="grpo"))
    assert not keys & CRITIC_ONLY
    assert {"actor/kl_loss", "actor/kl_coef", "critic/score/mean", "critic/advantages/mean"} <= keys
    assert keys == PPO_KEYS - CRITIC_ONLY - {"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"} | {
        "actor/kl_loss", "actor/kl_coef"}


def test_healthy_grpo_is_on_policy_grpo_whatever_the_algorithm_asked():
    rows = training("healthy-grpo", 150)
    assert not set(rows[0]) & CRITIC_ONLY and "actor/kl_loss" in rows[0]
    assert all(0.0004 <= v <= 0.0012 for v in series(rows, "actor/pg_clipfrac"))
    assert all(-1.2e-05 <= v <= -4e-06 for v in series(rows, "actor/ppo_kl"))
    assert series(rows, "critic/score/mean")[-1] > 0.6
    config = simulate.run_config("healthy-grpo", algorithm="ppo")
    actor = config["actor_rollout_ref"]["actor"]
    assert actor["ppo_epochs"] == 1 and actor["ppo_mini_batch_size"] == config["data"]["train_batch_size"]
    assert config["algorithm"]["adv_estimator"] == "grpo"
    ppo = simulate.run_config("healthy")
    assert ppo["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] < ppo["data"]["train_batch_size"]


def test_a_console_run_prints_its_config_and_total_first_as_verl_does(tmp_path):
    path = tmp_path / "gsm8k" / "grpo.log"
    write_run(path, "healthy-grpo", fmt="console", steps=3, interval=0, noise=False)
    lines = path.read_text().splitlines()
    first_step = next(i for i, line in enumerate(lines) if STEP_LINE.match(line))
    assert lines[first_step - 1] == "(TaskRunner pid=1234) Total training steps: 3"
    printed = "\n".join(line.removeprefix("(TaskRunner pid=1234) ") for line in lines[:first_step - 1])
    config = ast.literal_eval(printed)
    assert config["trainer"]["project_name"] == "gsm8k" and config["trainer"]["experiment_name"] == "grpo"
    assert config["trainer"]["total_training_steps"] == 3


def test_a_run_without_validation_prints_no_final_line_and_hydra_config_is_written(tmp_path):
    path, hydra = tmp_path / "p" / "novalid.log", tmp_path / ".hydra" / "config.yaml"
    write_run(path, fmt="console", steps=12, interval=0, val_every=0, hydra_config=hydra)
    text = path.read_text()
    assert "Final validation" not in text and "val-core" not in text
    assert "Total training steps: 12" in text
    config = yaml.safe_load(hydra.read_text())
    assert config["trainer"]["test_freq"] == -1 and config["trainer"]["experiment_name"] == "novalid"
    unbounded = simulate.run_config("healthy")
    assert simulate.total_steps(unbounded) == simulate.STEPS_PER_EPOCH * unbounded["trainer"]["total_epochs"]


def test_validation_is_a_separate_tuple_at_the_same_step():
    items = list(itertools.islice(generate_steps("healthy", val_every=3), 8))
    assert [(step, is_validation(values)) for step, values in items] == [
        (1, False), (2, False), (3, False), (3, True), (4, False), (5, False), (6, False), (6, True)]
    assert set(items[3][1]) == set(simulate.VAL_KEYS)
    assert not any(is_validation(v) for _, v in itertools.islice(generate_steps("healthy", val_every=0), 30))


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
@pytest.mark.parametrize("scenario", ["healthy", "truncation"])
def test_timings_tokens_and_throughput_are_consistent(scenario, algorithm):
    for step in (1, 17, 90):
        v = step_values(scenario, step, algorithm=algorithm)
        phases = [value for key, value in v.items() if key.startswith("timing_s/") and key != "timing_s/step"]
        overhead = v["timing_s/step"] - sum(phases)
        assert 0 < overhead < 0.05 * v["timing_s/step"]
        assert v["perf/time_per_step"] == v["timing_s/step"]
        prompt = v["prompt_length/mean"] * simulate.SAMPLES
        response = v["response_length/mean"] * simulate.SAMPLES
        assert v["perf/total_num_tokens"] == pytest.approx(prompt + response)
        assert v["timing_per_token_ms/gen"] == pytest.approx(v["timing_s/gen"] * 1000 / response)
        assert v["timing_per_token_ms/ref"] == pytest.approx(v["timing_s/ref"] * 1000 / v["perf/total_num_tokens"])
        assert v["perf/throughput"] == pytest.approx(
            v["perf/total_num_tokens"] / (v["perf/time_per_step"] * simulate.N_GPUS))
        assert v["training/global_step"] == step


def test_same_seed_same_run_other_seed_other_run():
    first = list(itertools.islice(generate_steps("healthy", seed=3), 25))
    assert first == list(itertools.islice(generate_steps("healthy", seed=3), 25))
    assert first != list(itertools.islice(generate_steps("healthy", seed=4), 25))


def test_scale_timings_makes_the_step_take_the_given_seconds():
    values = step_values("healthy", 5)
    scaled = scale_timings(values, 2.0)
    assert scaled["timing_s/step"] == 2.0 and scaled["perf/time_per_step"] == 2.0
    factor = 2.0 / values["timing_s/step"]
    assert scaled["timing_s/gen"] == pytest.approx(values["timing_s/gen"] * factor)
    assert scaled["timing_per_token_ms/update_actor"] == pytest.approx(
        values["timing_per_token_ms/update_actor"] * factor)
    assert scaled["perf/throughput"] == pytest.approx(scaled["perf/total_num_tokens"] / (2.0 * simulate.N_GPUS))
    assert scaled["actor/pg_loss"] == values["actor/pg_loss"] and values["timing_s/step"] != 2.0  # input untouched
    no_timing = validation_values("healthy", 10)
    assert scale_timings(no_timing, 2.0) == no_timing
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError):
            scale_timings(values, bad)


# Formats ----------------------------------------------------------------------------------------------------


def test_jsonl_is_verl_file_logger_shape_and_round_trips_non_finite_values():
    values = step_values("nan", 16)
    line = format_jsonl(16, values)
    assert "\n" not in line
    back = json.loads(line)
    assert back["step"] == 16 and set(back) == {"step", "data"}
    assert math.isnan(back["data"]["actor/pg_loss"]) and back["data"]["critic/vf_loss"] == math.inf
    assert back["data"]["critic/score/mean"] == values["critic/score/mean"]


def test_console_full_style_keeps_full_precision():
    values = step_values("healthy", 4)
    step, back = parse_console(format_console(4, values))
    assert step == 4 and back == values
    assert " - training/global_step:4 - " in format_console(4, values)  # ints print as ints


def test_console_old_style_prints_three_decimals():
    values = step_values("nan", 20)
    line = format_console(20, values, style="old", prefix="")
    assert line.startswith("step:20 - ") and "actor/pg_loss:nan" in line and "critic/vf_loss:inf" in line
    _, back = parse_console("(TaskRunner pid=1234) " + line)
    assert all(re.fullmatch(r"-?\d+\.\d{3}|nan|inf", text.split(":", 1)[1]) for text in line.split(" - ")[1:])
    assert back["actor/entropy"] == round(values["actor/entropy"], 3)


def test_console_numpy_style_and_bad_style():
    line = format_console(2, {"actor/entropy": 0.25, "training/global_step": 2}, style="numpy")
    assert line.endswith("step:2 - actor/entropy:np.float64(0.25) - training/global_step:2")
    with pytest.raises(ValueError, match="style"):
        format_console(2, {"a": 1.0}, style="fancy")


def test_noise_lines_look_like_ray_output_but_are_never_step_lines():
    rng = random.Random(5)
    lines = [line for step in range(1, 40) for line in noise_lines(rng, step, 100)]
    assert all("\n" not in line for line in lines)
    assert any("step:7/100" in line for line in lines) and any("INFO" in line for line in lines)
    assert any("Warning" in line for line in lines)
    assert not any(STEP_LINE.match(line) or " - actor/" in line for line in lines)
    assert noise_lines(random.Random(1), 3) == noise_lines(random.Random(1), 3)


# Writers ----------------------------------------------------------------------------------------------------


def test_write_run_jsonl_writes_steps_validations_and_final_validation(tmp_path):
    path = tmp_path / "deep" / "run.jsonl"
    assert write_run(path, steps=12, interval=0) == 12
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [*range(1, 11), 10, 11, 12, 12]
    assert is_validation(records[10]["data"]) and is_validation(records[-1]["data"])
    assert records[0]["data"]["timing_s/step"] > 30  # interval 0: the simulated timings are kept
    assert write_run(path, steps=2, interval=0) == 2  # appends
    assert len(path.read_text().splitlines()) == 14 + 3


def test_write_run_console_ends_with_verl_final_line(tmp_path):
    path = tmp_path / "run.log"
    write_run(path, fmt="console", steps=10, interval=0, style="old")
    lines = path.read_text().splitlines()
    step_lines = [parse_console(line) for line in lines if STEP_LINE.match(line)]
    assert [step for step, _ in step_lines] == [*range(1, 11), 10]
    assert len(lines) > len(step_lines) + 10  # noise between steps
    assert lines[-1].startswith("(TaskRunner pid=1234) Final validation metrics: {")
    final = ast.literal_eval(lines[-1].split("metrics: ", 1)[1])
    assert final == validation_values("healthy", 10)


def test_write_run_scales_timings_to_the_interval(tmp_path):
    path = tmp_path / "run.jsonl"
    write_run(path, steps=2, interval=0.01, noise=False)
    first = json.loads(path.read_text().splitlines()[0])["data"]
    assert first["timing_s/step"] == 0.01 and first["perf/time_per_step"] == 0.01


def test_write_run_refuses_bad_arguments(tmp_path):
    for kwargs in ({"fmt": "csv"}, {"style": "fancy"}, {"interval": -1}, {"algorithm": "dpo"}):
        with pytest.raises(ValueError):
            write_run(tmp_path / "x.jsonl", steps=1, **kwargs)
    with pytest.raises(ValueError):
        write_run(tmp_path / "x.jsonl", "unknown", steps=1)


def wait_for(predicate, deadline_s=10.0):
    deadline = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.01)


class WatchingEvent(threading.Event):
    """A stop event whose waits return at once, noting the timeout and how many lines were on disk."""

    def __init__(self, path):
        super().__init__()
        self.path, self.waits = path, []

    def wait(self, timeout=None):
        self.waits.append((timeout, len(self.path.read_text().splitlines())))
        return self.is_set()


def test_write_run_waits_the_interval_between_steps_with_each_step_on_disk(tmp_path):
    path = tmp_path / "run.jsonl"
    event = WatchingEvent(path)
    assert write_run(path, steps=4, interval=2.5, stop_event=event, val_every=2) == 4
    assert event.waits == [(2.5, 1), (2.5, 3), (2.5, 4)]  # validation lines follow their step at once


def test_write_run_returns_when_the_stop_event_is_set(tmp_path):
    path, stop = tmp_path / "run.jsonl", threading.Event()
    thread = threading.Thread(target=write_run, args=(path,), kwargs={"interval": 0.01, "stop_event": stop})
    thread.start()
    wait_for(lambda: path.exists() and len(path.read_text().splitlines()) >= 3)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    stop.clear()
    assert write_run(path, steps=5, interval=0, stop_event=threading.Event()) == 5
    stopped = threading.Event()
    stopped.set()
    assert write_run(tmp_path / "none.jsonl", steps=5, interval=0, stop_event=stopped) == 0


def test_stalled_run_keeps_running_without_writing(tmp_path):
    path, stop = tmp_path / "run.log", threading.Event()
    thread = threading.Thread(target=write_run, args=(path, "stall"),
                              kwargs={"fmt": "console", "interval": 0, "stop_event": stop, "stall_after": 4})
    thread.start()
    wait_for(lambda: path.exists() and "step:4 - " in path.read_text())
    size = path.stat().st_size
    thread.join(0.2)
    assert thread.is_alive() and path.stat().st_size == size
    assert "Final validation" not in path.read_text()
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    # With a step budget the hang lasts as long as the missing steps would have (zero here).
    assert write_run(tmp_path / "b.jsonl", "stall", steps=30, interval=0) == 20


def test_write_file_stops_at_target_bytes_or_steps(tmp_path):
    path = tmp_path / "big.log"
    written = write_file(path, "healthy", "console", steps=None, target_bytes=200_000)
    size = path.stat().st_size
    assert written > 10 and 200_000 <= size < 200_000 + 20_000
    assert write_file(path, "healthy", "jsonl", steps=3) == 3  # replaces the file
    assert len(path.read_text().splitlines()) == 4  # three steps and the last step's validation
    assert write_file(path, "healthy", "jsonl", steps=50, target_bytes=10) == 1
    with pytest.raises(ValueError):
        write_file(path, "healthy", "jsonl", steps=None)


def test_main_lists_scenarios_and_writes_a_run(tmp_path, capsys):
    assert simulate.main(["--list-scenarios"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in SCENARIOS)
    out = tmp_path / "x" / "run.jsonl"
    assert simulate.main(["--output", str(out), "--steps", "3", "--interval", "0", "--algorithm", "grpo"]) == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert "critic/vf_loss" not in first["data"] and "actor/kl_loss" in first["data"]
    for argv in (["--steps", "3"], ["--output", str(out), "--interval", "-1"], ["--scenario", "nope"]):
        with pytest.raises(SystemExit):
            simulate.main(argv)


def test_module_runs_as_a_script():
    done = subprocess.run([sys.executable, "-m", "verl_exporter.simulate", "--list-scenarios"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "entropy-collapse" in done.stdout
