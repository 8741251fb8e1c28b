"""The preview renderer's data handling (the drawing itself needs matplotlib, a docs-only tool)."""

from __future__ import annotations

import dashboard_models  # noqa: F401  (puts grafana/ on the import path)
import pytest

from verl_mixin.dashboards import fleet
from verl_mixin.dashboards.preview import colour_for, fill_variables, format_value, merge_table

STEPS = [{"color": "orange", "value": None}, {"color": "green", "value": 0.05}, {"color": "red", "value": 0.3}]


def test_values_are_formatted_in_their_unit():
    assert format_value(0.125, "percentunit") == "12.5%"
    assert format_value(45.2 * (1 << 30), "bytes") == "45.2 GiB"
    assert format_value(600, "s") == "10.0 min"
    assert format_value(13340, "watt") == "13.3 kW"
    assert format_value(4583, "suffix: tokens/s/GPU") == "4583 tokens/s/GPU"
    assert format_value(float("nan"), "none") == "NaN"


def test_colours_follow_the_threshold_steps():
    assert [colour_for(v, STEPS) for v in (0.01, 0.05, 0.2, 0.8)] == ["#FF9830", "#73BF69", "#73BF69", "#F2495C"]


def test_table_rows_merge_per_run():
    a = {"metric": {"project": "p", "experiment": "a"}, "value": [0, "3"]}
    b = {"metric": {"project": "p", "experiment": "b"}, "value": [0, "0.5"]}
    headers, rows = merge_table([("Last step", [a, b]), ("Score mean", [b])])
    assert headers == ["project", "experiment", "Last step", "Score mean"]
    assert rows == [["p", "a", 3.0, None], ["p", "b", 0.5, 0.5]]


def test_table_rows_merge_on_any_labels_with_label_cells_from_a_query():
    """The owners' table (user and team), with its largest part of waste a label query's cell."""
    alice = {"metric": {"user": "alice", "team": "t"}, "value": [0, "7"]}
    part = {"metric": {"user": "alice", "team": "t", "bucket": "stalled"}, "value": [0, "5"]}
    headers, rows = merge_table([("Badput", [alice]), (None, [part])], ("user", "team", "bucket"))
    assert headers == ["user", "team", "bucket", "Badput"]
    assert rows == [["alice", "t", "stalled", 7.0]]


class FakePrometheus:
    def get(self, path, **params):
        return {"/api/v1/label/project/values": ["gsm8k", "math"],
                "/api/v1/label/experiment/values": ["ppo", "grpo"],
                "/api/v1/label/team/values": ["research"],
                "/api/v1/label/user/values": ["alice", "bob"]}[path]


def test_variables_take_all_the_chosen_value_or_the_first():
    dashboard = fleet.build()
    assert fill_variables(FakePrometheus(), dashboard) == {"datasource": "prometheus", "team": ".*", "user": ".*",
                                                           "project": ".*", "experiment": ".*", "gpu_hour_price": "0"}
    assert fill_variables(FakePrometheus(), dashboard, {"project": "math"})["project"] == "math"
    assert fill_variables(FakePrometheus(), dashboard, {"gpu_hour_price": "2.5"})["gpu_hour_price"] == "2.5"
    with pytest.raises(RuntimeError, match="not one of"):
        fill_variables(FakePrometheus(), dashboard, {"project": "nope"})
