"""The run detail dashboard's rows of verl 0.9's V1 trainer, the async trainers and the rollout engine's
speculative decoding and MoE routing: each is collapsed and repeated over a hidden gate variable, which
finds a value for the real V1 runs that log the row's metrics and none for a legacy trainer's run; every
panel of such a row returns data for a run that has the row, and none for the legacy run.

One exporter follows three runs of verl 0.9.1 (tests/fixtures/verl/0.9.1/): the V1 separate_async run
(its console log), the legacy trainer's GRPO run (its console log), and the V1 colocate_async run's JSON
lines with the keys no fixture logs added at each step (fully_async_policy's, speculative decoding's,
MoE routing's and the replay buffer's reasons that run never met). Debian's Prometheus scrapes it every
second; the variables are filled as Grafana fills them once the run is picked.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from dashboard_models import (
    REPO,
    gated_rows,
    label_values_query,
    load_dashboards,
    substitute,
    variable_query,
    variable_value,
    variables,
)
from test_dashboards_queries import api, run_query

from servers import prom_query, start_exporter, start_prometheus, wait_until
from verl_mixin.dashboards.common import RUN

RUN_DETAIL = load_dashboards()["run-detail.json"]
FIXTURES = REPO / "tests" / "fixtures" / "verl" / "0.9.1"
PROJECT = "verl_fixtures"
SEPARATE, LEGACY, MODES = "v1-separate_async-0.9.1", "grpo-0.9.1", "v1-async-modes"

ROWS = {
    "has_replay_buffer": "Replay buffer (V1 trainer)",
    "has_separate_async": "Async trainer, separate_async",
    "has_fully_async": "Async trainer, fully_async",
    "has_spec_moe": "Rollout engine, speculative decoding and MoE",
}
# The rows each run has; the legacy trainer's run has none.
SHOWN = {SEPARATE: {"has_replay_buffer", "has_separate_async"},
         MODES: {"has_replay_buffer", "has_fully_async", "has_spec_moe"},
         LEGACY: set()}
# The run whose every panel of the row has data (the separate_async run dropped no prompt group).
FULL = {"has_replay_buffer": MODES, "has_separate_async": SEPARATE, "has_fully_async": MODES, "has_spec_moe": MODES}


def added_keys(step: int) -> dict[str, float]:
    """What the V1 colocate_async run gets at ``step`` beyond what it logged."""
    layers = {f"rollout/moe/max_vio/layer_{layer}": 0.1 * layer + 0.01 * step for layer in range(8)}
    return {
        "training/rollout_failure/evicted_samples": 1.0,
        "training/off_policy/evicted_samples": 2.0,
        "training/filter_groups/discarded_surplus_samples": 3.0,
        "fully_async/trainer/idle_ratio": 0.05 * step,
        "fully_async/rollouter/idle_ratio": 0.5 - 0.05 * step,
        "fully_async/monitor/queue/mq_queue_size": 16.0 - step,
        "fully_async/monitor/queue/pending_queue_size": float(step),
        "rollout/spec_accept_rate": 0.6,
        "rollout/spec_accept_length": 2.5,
        **layers,
        "rollout/moe/max_vio/max": max(layers.values()),
        "rollout/moe/max_vio/avg": sum(layers.values()) / len(layers),
    }


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v1-rows")
    sources = []
    for run in ("v1-separate_async", "grpo"):  # copies: the runs' owner is the user of their files
        (tmp / run).mkdir()
        sources.append(shutil.copy(FIXTURES / run / "console.log", tmp / run / "console.log"))
    modes = tmp / PROJECT / f"{MODES}.jsonl"  # named <project>/<experiment>.jsonl
    modes.parent.mkdir()
    with modes.open("w") as out:
        for line in (FIXTURES / "v1-colocate_async" / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            if record["step"] > 0:
                record["data"].update(added_keys(record["step"]))
            out.write(json.dumps(record) + "\n")
    args = [arg for source in [*sources, str(modes)] for arg in ("--source", str(source))]
    with start_exporter(tmp, *args, "--no-collector.gpu") as exporter:
        config = {"global": {"scrape_interval": "1s"},
                  "scrape_configs": [{"job_name": "verl",
                                      "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}]}
        with start_prometheus(tmp, config) as prom:
            wait_until(lambda: len(prom_query(prom, f'verl_training_last_step{{project="{PROJECT}"}}')) == 3,
                       timeout=30, message="the three runs scraped")
            wait_until(lambda: prom_query(prom, "count_over_time(verl_rollout_moe_max_vio[1m]) >= 3"), timeout=30,
                       message="three scrapes of the added keys")
            yield prom


def fill_variables(prom, experiment: str) -> dict[str, str]:
    """The dashboard's variables, as Grafana fills them once the run's project and experiment are picked
    (the finished fixture runs have no node, so ``instance`` has no value either)."""
    values = {"datasource": "prometheus", "project": PROJECT, "experiment": experiment}
    for variable in variables(RUN_DETAIL):
        if variable["name"] not in values:
            selector, label = label_values_query(substitute(variable_query(variable), values))
            found = api(prom, f"/api/v1/label/{label}/values", **{"match[]": selector})
            values[variable["name"]] = variable_value(variable, found, pick_all=False)
    return values


@pytest.fixture(scope="module")
def run_values(prometheus):
    return {experiment: fill_variables(prometheus, experiment) for experiment in SHOWN}


def gated_targets(name: str) -> list:
    return [pytest.param(name, panel["title"], target, id=f"{name}:{panel['title']}:{target['refId']}")
            for panel in gated_rows(RUN_DETAIL)[name]["panels"] for target in panel["targets"]]


def test_the_rows_are_collapsed_and_repeated_over_a_hidden_gate():
    rows = gated_rows(RUN_DETAIL)
    assert {name: row["title"] for name, row in rows.items()} == {name: f"{title}: ${name}"
                                                                  for name, title in ROWS.items()}
    gates = {v["name"]: v for v in variables(RUN_DETAIL) if v["name"] in ROWS}
    for name, row in rows.items():
        assert row["collapsed"] is True and row["panels"], name
        gate = gates[name]
        assert (gate["hide"], gate["multi"], gate["includeAll"]) == (2, True, False), name
        match = re.fullmatch(r'label_values\(\{__name__=~"([^"]+)", (.+)\}, experiment\)', variable_query(gate))
        assert match and match.group(2) == RUN, name  # the picked run, its owner included
        # The gate finds every series the row draws.
        for panel in row["panels"]:
            for series in re.findall(r"\bverl_\w+", " ".join(t["expr"] for t in panel["targets"])):
                assert re.fullmatch(match.group(1), series), f"{name} misses {series} of {panel['title']!r}"
    # Every other row is drawn for every run.
    others = [p for p in RUN_DETAIL["panels"] if p["type"] == "row" and p.get("repeat") not in ROWS]
    assert others and not any(p.get("repeat") or p.get("collapsed") for p in others)


@pytest.mark.parametrize("experiment", sorted(SHOWN))
def test_the_gates_find_the_runs_that_log_the_rows(run_values, experiment):
    values = run_values[experiment]
    assert {name: values[name] for name in ROWS} == {name: experiment if name in SHOWN[experiment] else ""
                                                     for name in ROWS}


@pytest.mark.parametrize("name, title, target", [p for name in ROWS for p in gated_targets(name)])
def test_every_panel_of_a_row_has_data_for_a_run_that_has_it(prometheus, run_values, name, title, target):
    expr = substitute(target["expr"], run_values[FULL[name]])
    assert run_query(prometheus, expr, instant=False), f"{title!r} returned nothing for {FULL[name]}: {expr}"


def test_no_panel_of_the_rows_has_data_for_the_legacy_run(prometheus, run_values):
    found = {panel["title"] for row in gated_rows(RUN_DETAIL).values() for panel in row["panels"]
             for target in panel["targets"]
             if run_query(prometheus, substitute(target["expr"], run_values[LEGACY]), instant=False)}
    assert found == set()
    # while the run itself has data
    assert run_query(prometheus, substitute(f"verl_actor_entropy{{{RUN}}}", run_values[LEGACY]), instant=False)


def test_the_moe_panel_draws_the_most_overloaded_layers(prometheus, run_values):
    panel = next(p for p in gated_rows(RUN_DETAIL)["has_spec_moe"]["panels"] if "top layers" in p["title"])
    series = run_query(prometheus, substitute(panel["targets"][0]["expr"], run_values[MODES]), instant=False)
    assert sorted(int(s["metric"]["layer"]) for s in series) == [3, 4, 5, 6, 7]  # of layers 0-7, the 5 highest
