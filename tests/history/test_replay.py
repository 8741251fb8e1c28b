"""``verl-exporter replay``: each simulated scenario, through a real Prometheus, raises exactly its alerts.

EXPECTED is the one table to update when rules or scenarios change: per (scenario, algorithm,
format), the alerts that fire over a 150-step run (about 2.7 hours at the simulated step time).
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from servers import require_binary
from verl_exporter import simulate
from verl_exporter.cli import main
from verl_exporter.config.durations import parse_duration
from verl_exporter.history import alert_rules, backfill, prometheus, replay
from verl_exporter.history.alert_rules import AlertRule, evaluate

STEPS = 150
STALL_SECONDS = 3600  # a stalled run is replayed until an hour after its last step

EXPECTED: dict[tuple[str, str, str], set[str]] = {
    ("healthy", "ppo", "jsonl"): set(),
    ("healthy", "ppo", "console"): set(),
    ("healthy", "grpo", "jsonl"): set(),
    ("healthy-grpo", "grpo", "console"): set(),
    ("lr-too-high", "ppo", "jsonl"): {"VerlActorGradNormPinned", "VerlLearningRateTooHigh",
                                      "VerlPolicyChangeTooLarge", "VerlPolicyUpdateAggressive",
                                      "VerlScoreNotImproving"},
    ("critic-underfit", "ppo", "jsonl"): {"VerlCriticLearningSlowly", "VerlCriticLossNotDecreasing",
                                          "VerlCriticNotLearning", "VerlCriticValueOffTarget",
                                          "VerlCriticWorseThanConstant"},
    # Without the run's settings (a JSONL file alone) the frozen and conservative checks stay silent.
    ("entropy-collapse", "ppo", "jsonl"): {"VerlEntropyCollapsing", "VerlPrematureConvergence",
                                           "VerlScoreNotImproving"},
    # pg_clipfrac 0.01 is no "conservative" update: healthy real runs clip 0.001-0.005.
    ("entropy-collapse", "ppo", "console"): {"VerlEntropyCollapsing", "VerlPolicyFrozen",
                                             "VerlPrematureConvergence", "VerlScoreNotImproving"},
    ("entropy-collapse", "grpo", "jsonl"): {"VerlEntropyCollapsing", "VerlPrematureConvergence",
                                            "VerlScoreNotImproving"},
    ("truncation", "ppo", "jsonl"): {"VerlResponsesOftenTruncated", "VerlResponsesTruncated"},
    ("stall", "ppo", "jsonl"): {"VerlTrainingStalled"},
    ("nan", "ppo", "console"): {"VerlTrainingNonFinite"},
    # A spike of 12 steps is also 12 steps of a KL over 0.05 and, for PPO, of a critic loss 20 times higher.
    ("grad-spike", "ppo", "jsonl"): {"VerlActorGradNormSpike", "VerlActorPgLossSpike", "VerlCriticVfLossSpike",
                                     "VerlPolicyKlSpike", "VerlPolicyChangeTooLarge", "VerlCriticLossNotDecreasing"},
    ("grad-spike", "grpo", "jsonl"): {"VerlActorGradNormSpike", "VerlActorPgLossSpike", "VerlPolicyKlSpike",
                                      "VerlPolicyChangeTooLarge"},
    ("rollout-mismatch", "grpo", "jsonl"): {"VerlRolloutActorProbsUncorrelated", "VerlRolloutChiSquaredHigh",
                                            "VerlRolloutIsWeightsConcentrated", "VerlRolloutOffPolicyGap",
                                            "VerlRolloutProbsDiffHigh", "VerlRolloutProbsDiffMaxHigh"},
}


def write_scenario(directory: Path, scenario: str, algorithm: str = "ppo", fmt: str = "jsonl") -> Path:
    """A finished simulated run of STEPS steps (a stalled one stops early), as verl writes it."""
    path = directory / "sim" / f"{scenario}-{algorithm}.{'jsonl' if fmt == 'jsonl' else 'log'}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        if fmt == "console":  # verl prints its config and length first: the run's settings are known
            config = simulate.run_config(scenario, algorithm=algorithm, experiment=path.stem, total_steps=STEPS)
            out.write(simulate.format_config(config) + f"{simulate.PREFIX}Total training steps: {STEPS}\n")
        for step, values in simulate.generate_steps(scenario, algorithm=algorithm):
            if step > STEPS:
                break
            line = simulate.format_jsonl(step, values) if fmt == "jsonl" else simulate.format_console(step, values)
            out.write(line + "\n")
        if fmt == "console" and scenario != "stall":
            out.write(f"{simulate.PREFIX}{simulate.FINAL_MARKER} {{}}\n")
    return path


def run_replay(tmp_path: Path, paths: list[Path], until: float | None = None, rules: list[Path] | None = None):
    history = backfill.build([str(path) for path in paths], until=until)
    alerts, _ = replay.replay(history, rules or replay.shipped_rules(), tmp_path, interval=15.0,
                              prometheus=require_binary("prometheus"), promtool=require_binary("promtool"))
    return history, alerts


def test_every_scenario_is_in_the_table():
    assert {scenario for scenario, _, _ in EXPECTED} == set(simulate.SCENARIOS)


@pytest.mark.parametrize("scenario, algorithm, fmt", sorted(EXPECTED), ids=["-".join(key) for key in sorted(EXPECTED)])
def test_scenario_replays_to_its_alerts(tmp_path, scenario, algorithm, fmt):
    path = write_scenario(tmp_path, scenario, algorithm, fmt)
    until = os.stat(path).st_mtime + STALL_SECONDS if scenario == "stall" else None
    _, alerts = run_replay(tmp_path, [path], until)
    fired = {alert.rule.name for alert in alerts if alert.fired}
    assert fired == EXPECTED[scenario, algorithm, fmt]


def test_replay_prints_steps_and_exits_1_on_a_critical_alert(tmp_path, capsys):
    path = write_scenario(tmp_path, "nan")
    assert main(["replay", str(path)]) == 1
    printed = capsys.readouterr().out
    assert "VerlTrainingNonFinite (critical) sim/nan-ppo key=actor/pg_loss" in printed
    assert "A loss or gradient norm of the run is NaN or Inf." in printed
    assert f"firing   step 15 to {STEPS}" in printed  # nan_after
    assert "(3 critical)" in printed  # actor/pg_loss, actor/grad_norm, critic/vf_loss


def test_given_rules_only_and_their_recording_rules(tmp_path, capsys, monkeypatch):
    """--rules replaces the shipped rules; an alert reading a recording rule sees its backfilled values.
    Range queries are cut into chunks (here of 50 evaluations) without changing the result."""
    monkeypatch.setattr(prometheus, "MAX_POINTS", 50)
    rules = tmp_path / "mine.rules.yml"
    rules.write_text(json.dumps({"groups": [{"name": "mine", "interval": "30s", "rules": [
        {"record": "run:clipfrac:doubled", "expr": "2 * verl_actor_pg_clipfrac"},
        {"alert": "VerlClipfracDoubledHigh", "expr": "run:clipfrac:doubled > 1", "for": "10m",
         "labels": {"severity": "warning"}, "annotations": {"summary": "Doubled clip fraction above 1."}},
    ]}]}))
    path = write_scenario(tmp_path, "lr-too-high")
    assert main(["replay", str(path), "--rules", str(rules)]) == 0
    printed = capsys.readouterr().out
    assert "against 1 alerting rules" in printed
    assert "VerlClipfracDoubledHigh (warning) sim/lr-too-high-ppo" in printed
    periods = re.findall(r"^  (pending|firing) +step (\d+) to (\d+) ", printed, flags=re.M)
    assert [(state, int(first)) for state, first, _ in periods][:1] == [("pending", 1)]  # clipfrac ~0.8 from step 1
    assert [state for state, _, _ in periods] == ["pending", "firing"] and periods[-1][2] == str(STEPS)
    assert int(periods[0][2]) in (9, 10)  # 10 minutes of steps of about 64 s


def test_replay_errors_are_one_line(tmp_path, capsys):
    rules = tmp_path / "bad.rules.yml"
    rules.write_text(json.dumps({"groups": [{"name": "bad", "rules": [
        {"alert": "VerlBroken", "expr": "sum(", "labels": {"severity": "info"}}]}]}))
    path = write_scenario(tmp_path, "healthy")
    assert main(["replay", str(path), "--rules", str(rules)]) == 2
    assert "query failed" in capsys.readouterr().err


TIMES = [float(t) for t in range(0, 100, 10)]


def rule(hold: float = 0, keep: float = 0) -> AlertRule:
    return AlertRule("VerlX", "x", 10.0, hold, keep, {"severity": "warning"})


def test_state_machine_fires_after_for_and_drops_a_pending_alert():
    present = {(("a", "1"),): {t: 1.0 for t in (10, 20, 30, 40, 70, 80)}}
    (alert,) = evaluate(rule(hold=20), present, TIMES)
    assert [(p.state, p.start, p.end) for p in alert.periods] == [
        ("pending", 10, 20), ("firing", 30, 40), ("pending", 70, 80)]
    assert alert.fired and alert.labels == {"a": "1", "severity": "warning"}


def test_state_machine_without_for_fires_at_once_and_keep_firing_for_bridges_gaps():
    present = {(("a", "1"),): {t: 1.0 for t in (10, 20, 50)}}
    (alert,) = evaluate(rule(), present, TIMES)
    assert [(p.state, p.start, p.end) for p in alert.periods] == [("firing", 10, 20), ("firing", 50, 50)]
    (kept,) = evaluate(rule(keep=40), present, TIMES)
    assert [(p.state, p.start, p.end) for p in kept.periods] == [("firing", 10, 90)]
    assert evaluate(rule(), {}, TIMES) == []


def test_recorded_series_are_read_fresh_and_only_the_ones_alerts_read_are_backfilled(tmp_path):
    rules = tmp_path / "r.yml"
    rules.write_text(json.dumps({"groups": [
        {"name": "rec", "interval": "30s",
         "rules": [{"record": "run:a:z", "expr": "1"}, {"record": "run:b:z", "expr": "2"}]},
        {"name": "alerts",
         "rules": [{"alert": "VerlA", "expr": 'run:a:z > 1 and run:a:zz{x="1"} and avg_over_time(run:a:z[5m])'}]},
    ]}))
    alerts, recording = alert_rules.load_rules([rules])
    assert [entry["record"] for group in recording for entry in group["rules"]] == ["run:a:z"]
    assert alerts[0].interval == 15.0 and alerts[0].hold == 0
    assert alert_rules.read_fresh(alerts[0].expr, recording) == (
        'last_over_time(run:a:z[30s]) > 1 and run:a:zz{x="1"} and avg_over_time(run:a:z[5m])')
    assert parse_duration("1h30m") == 5400 and parse_duration("0") == 0
    with pytest.raises(ValueError):
        parse_duration("10 minutes")


def test_only_series_the_rules_can_read_are_backfilled():
    keep = alert_rules.referenced(['verl_actor_pg_loss > 1 and on(project) rate(verl_exporter_parse_errors_total[5m])',
                              'abs({__name__=~"verl_(actor_)?rollout_corr_kl"}) > 0.1 or {__name__="verl_x"} > 1'])
    assert keep("verl_actor_pg_loss") and keep("verl_exporter_parse_errors_total")
    assert keep("verl_rollout_corr_kl") and keep("verl_actor_rollout_corr_kl") and keep("verl_x")
    assert not keep("verl_val_aux") and not keep("verl_actor_pg_loss_max") and not keep("verl_actor_rollout_corr_klx")
    history = backfill.History(families={"verl_actor_pg_loss": ("gauge", "Policy loss."),
                                         "verl_val_aux": ("gauge", "Validation.")})
    for name in ("verl_actor_pg_loss", "verl_val_aux"):
        history.series[(name, name, (("project", "p"),))] = [(0.0, 1.0)]
    text = io.StringIO()
    assert backfill.write_openmetrics(history, text, keep=keep) == 1
    assert "verl_actor_pg_loss{" in text.getvalue() and "verl_val_aux" not in text.getvalue()


def test_a_figure_several_alerts_read_is_recorded_once_and_a_simple_one_inlined():
    """A recording rule is inlined into the alerts where it is cheap (at most INLINED_MAX_SELECTORS
    selectors, or read once); a figure of more series that several alerts read is recorded by the
    replay, once, instead of evaluated again at every read."""
    simple = {"record": "run:setting",
              "expr": 'max without(key) (verl_run_config{key="a"}) or (0 * verl_training_last_step + 1)'}
    figure = {"record": "run:figure",
              "expr": "(verl_training_a - verl_training_b) > 0 or 0 * verl_training_last_step + 1"}
    once = {"record": "run:once", "expr": "verl_training_a * verl_training_b * verl_training_c"}
    groups = [{"name": "g", "interval": "15s", "rules": [simple, figure, once]}]
    alerts = [AlertRule("A", "run:setting > 1 and run:figure > 2 and run:once > 0", 15.0, 0.0),
              AlertRule("B", "verl_x > run:figure", 15.0, 0.0)]
    assert alert_rules.selectors(figure["expr"]) == 3 > alert_rules.INLINED_MAX_SELECTORS
    inlined, recorded = alert_rules.inline(alerts, groups)
    assert [entry["record"] for group in recorded for entry in group["rules"]] == ["run:figure"]
    assert "run:setting" not in inlined[0].expr and "verl_run_config" in inlined[0].expr
    assert "run:once" not in inlined[0].expr and "run:figure" in inlined[0].expr and "run:figure" in inlined[1].expr
