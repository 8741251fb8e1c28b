"""Step statistics: each served over the run's own steps, only once its window is full."""

from __future__ import annotations

import math
import statistics

import pytest

from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore
from verl_exporter.store.step_windows import STATS, WATCHED, StepWindow

RUN = RunKey("gsm8k", "steps")


def window_of(values: list[float]) -> StepWindow:
    window = StepWindow()
    for step, value in enumerate(values, start=1):
        window.add(step, value)
    return window


def test_each_statistic_over_its_own_steps():
    values = [float(v) for v in range(1, 26)]  # steps 1..25
    window = window_of(values)
    assert window.stat("recent_min") == 23 and window.stat("recent_max") == 25
    assert window.stat("window_median") == statistics.median(values[-10:])
    assert window.stat("window_mean") == pytest.approx(sum(values[-10:]) / 10)
    assert window.stat("prior_mean") == pytest.approx(sum(values[-20:-10]) / 10)
    assert window.stat("prior_stddev") == pytest.approx(statistics.pstdev(values[-20:-10]))
    assert window.stat("early_median") == statistics.median(values[:10])
    assert (window.stat("run_max"), window.stat("run_min")) == (25, 1)


@pytest.mark.parametrize("stat", sorted(STATS))
def test_a_statistic_is_absent_until_its_window_is_full(stat):
    needed = STATS[stat]
    assert window_of([1.0] * (needed - 1)).stat(stat) is None or needed == 1
    expected = {"prior_stddev": 0.0, "early_mad": 0.0, "zero_streak": 0.0}.get(stat, 1.0)
    if stat in ("zero_before", "steps_before"):
        assert window_of([0.0] * 8 + [1.0] + [0.0] * 5).stat(stat) == (8.0 if stat == "zero_before" else 9.0)
        expected = float(needed) if stat == "steps_before" else 0.0
    assert window_of([1.0] * needed).stat(stat) == expected


def test_zeros_are_counted_in_a_streak_and_as_the_run_s_share_before_it_one_by_one_or_in_bulk():
    values = [0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0004, 3.0, 1.0, 0.0, 5.0, 0.0, -0.0001, 0.0]
    single, bulk = window_of(values), StepWindow()
    bulk.add_all(list(range(1, 6)), values[:5])
    bulk.add_all(list(range(6, len(values) + 1)), values[5:])
    for window in (single, bulk):
        assert window.stat("zero_streak") == 3.0  # 0.0, -0.0001, 0.0: under half of 0.001
        assert (window.stat("zero_before"), window.stat("steps_before")) == (6.0, 11.0)  # 0, 0, 0, 0, 0.0004, 0
    single.add(len(values), 7.0)  # a second value of the latest step ends the streak ...
    assert single.stat("zero_streak") == 0.0
    single.add(len(values), 0.0)  # ... and a third puts it back
    assert single.stat("zero_streak") == 3.0


def test_the_early_spread_is_the_scaled_median_absolute_deviation_of_the_first_ten_steps():
    window = window_of([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 100.0, 50.0])
    assert window.stat("early_mad") == pytest.approx(1.4826 * 2.5)  # the outlier of step 10 counts as one


def test_a_second_value_of_a_step_replaces_the_first_and_non_finite_values_are_left_out():
    window = StepWindow()
    window.add(1, 5.0)
    window.add(1, 2.0)  # validation logged at the same step: one step, its last value
    window.add(2, math.nan)
    window.add(3, math.inf)
    window.add(4, 3.0)
    assert list(window.last) == [2.0, 3.0]
    assert window.early == [2.0, 3.0]


def test_the_store_serves_them_in_base_units_for_any_spelling_and_text_values():
    store = RunStore(default_catalog())
    for step in range(1, 11):  # an old spelling, as text; milliseconds per token in seconds per step
        store.ingest(Record(RUN, step, {"actor/entropy_loss": str(1.0 / step), "timing_s/step": "30"},
                            time=60.0 * step))
    families = {family.name: family for family in TrainingCollector(store).collect()}
    recent = {s.labels["metric"]: s.value for s in families["verl_training_recent_max"].samples}
    assert recent["verl_actor_entropy"] == pytest.approx(1 / 8)
    assert recent["verl_timing_step_seconds"] == 30.0
    median = {s.labels["metric"]: s.value for s in families["verl_training_window_median"].samples}
    assert median["verl_actor_entropy"] == pytest.approx(statistics.median(1 / s for s in range(1, 11)))
    assert "verl_training_prior_mean" not in families or not families["verl_training_prior_mean"].samples


def test_only_the_declared_statistics_of_each_watched_metric_are_served():
    store = RunStore(default_catalog())
    for step in range(1, 25):
        store.ingest(Record(RUN, step, {"critic/score/max": 1.0, "actor/pg_clipfrac": 0.1}, time=float(step)))
    served = {(family.name.removeprefix("verl_training_"), sample.labels["metric"])
              for family in TrainingCollector(store).collect() if family.name.startswith("verl_training_")
              for sample in family.samples if "metric" in sample.labels}
    assert served == {(stat, name) for name in ("verl_critic_score_max", "verl_actor_pg_clipfrac")
                      for stat in WATCHED[name]}


def test_adding_many_steps_at_once_is_adding_them_one_by_one():
    points = [(step, math.sin(step) * 10) for step in range(1, 80)] + [(79, 2.5), (80, math.nan), (81, 7.0)]
    points += [(step, math.cos(step)) for step in range(82, 90)]
    one, many = StepWindow(), StepWindow()
    for step, value in points:
        one.add(step, value)
    many.add_all([step for step, _ in points[:30]], [value for _, value in points[:30]])
    many.add_all([step for step, _ in points[30:82]], [value for _, value in points[30:82]])
    many.add_all([step for step, _ in points[82:]], [value for _, value in points[82:]])  # the whole-batch path
    assert list(one.last) == list(many.last) and one.early == many.early
    for stat in STATS:
        assert one.stat(stat) == pytest.approx(many.stat(stat)), stat


def test_the_watched_statistics_are_what_the_shipped_rules_read():
    """Every statistic served is read by a shipped rule, and every one a rule reads is served."""
    import re

    from verl_exporter import shipped

    text = "".join(path.read_text() for path in [*shipped.alert_rule_files(), shipped.recording_rules_file()])
    read = set()
    for stat, op, name in re.findall(r'verl_training_(\w+)\{metric(=~?)"([^"]+)"\}', text):
        names = [metric for metric in WATCHED if re.fullmatch(name, metric)] if op == "=~" else [name]
        assert names, f"no watched metric matches {name}"
        read |= {(stat, metric) for metric in names}
    served = {(stat, metric) for metric, stats in WATCHED.items() for stat in stats}
    assert read - served == set(), "rules read statistics the exporter does not serve"
    assert served - read == set(), "statistics served that no rule reads (take them out of WATCHED)"
