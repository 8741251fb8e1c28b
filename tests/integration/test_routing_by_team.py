"""Pages reach whoever acts, end to end: two teams' runs and a lost GPU, followed by one exporter,
through a real Prometheus with the shipped rules and a real Alertmanager with the shipped config and
a routing table of two teams, each with a webhook of its own.

Team A's run is written by the user the tests run as; team B's by ``nobody`` (the file is given to
``nobody`` before a line is written). ``--owner.teams`` names both teams. A training alert of team A
must reach A's webhook only, B's only B's, and the GPU fault the on-call receivers only.
"""

from __future__ import annotations

import json
import os
import pwd
import threading

import pytest
import yaml

from alerting_stack import AlertingStack
from owner import ME
from servers import wait_until
from verl_exporter import simulate

STEP_SECONDS = 0.2
TIME_SCALE = STEP_SECONDS / 60
ALERT_TIMEOUT = 120
TRAINING_ALERT = "VerlLearningRateTooHigh"


def with_team_routes(config: dict, url: str) -> dict:
    """The shipped config with the routing table filled in: team-a and team-b, each to a webhook."""
    routes = config["route"]["routes"]
    table = [{"matchers": [f'team="{team}"'], "receiver": team} for team in ("team-a", "team-b")]
    routes[-1:-1] = table  # before the catch-all route by severity, after the on-call's
    config["receivers"] += [{"name": team, "webhook_configs": [{"url": f"{url}/{team}", "send_resolved": False}]}
                            for team in ("team-a", "team-b")]
    return config


class TeamStack(AlertingStack):
    def __init__(self, tmp_path):
        if os.geteuid() != 0:
            pytest.skip("giving a run's file to another user (nobody) needs root")
        runs = tmp_path / "runs" / "teams"
        runs.mkdir(parents=True)
        ours, theirs = runs / "a-lr.jsonl", runs / "b-lr.jsonl"
        theirs.touch()
        os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
        teams = tmp_path / "teams.yml"
        teams.write_text(yaml.safe_dump({"team-a": [ME], "team-b": ["nobody"]}))
        self.stop = threading.Event()
        for path in (ours, theirs):
            threading.Thread(target=simulate.write_run, args=(path, "lr-too-high"), daemon=True,
                             kwargs={"fmt": "jsonl", "interval": STEP_SECONDS, "noise": False,
                                     "stop_event": self.stop}).start()
        super().__init__(tmp_path, ["--source", str(runs / "*.jsonl"), "--owner.teams", str(teams),
                                    "--gpu.fake", "gpu-lost:4", "--no-collector.host",
                                    "--source.poll-interval", "0.1"],
                         time_scale=TIME_SCALE, am_config_edit=with_team_routes)

    def alerts_at(self, prefix: str, name: str) -> list[dict]:
        """The alerts called ``name`` among the notifications received on ``prefix``."""
        found = []
        for payload in self.receiver.received(prefix):
            text = json.dumps(payload)
            if name not in text:
                continue
            found += [alert for alert in payload.get("alerts", []) if alert["labels"]["alertname"] == name] or [payload]
        return found

    def close(self):
        self.stop.set()
        super().close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = TeamStack(tmp_path_factory.mktemp("routing"))
    yield stack
    stack.close()


def test_each_teams_training_alert_reaches_that_team_only(stack):
    for team, user, experiment in (("team-a", ME, "a-lr"), ("team-b", "nobody", "b-lr")):
        alerts = wait_until(lambda team=team: stack.alerts_at(f"/{team}", TRAINING_ALERT), timeout=ALERT_TIMEOUT,
                            message=f"{TRAINING_ALERT} at {team}'s webhook")
        labels = alerts[0]["labels"]
        assert (labels["team"], labels["user"], labels["experiment"]) == (team, user, experiment)
        assert all(alert["labels"]["team"] == team for alert in alerts), alerts
    for prefix in ("/pagerduty", "/slack"):  # the on-call hears of neither run's training
        assert not stack.alerts_at(prefix, TRAINING_ALERT)


def test_a_gpu_fault_reaches_the_on_call_and_no_team(stack):
    wait_until(lambda: stack.alerts_at("/pagerduty", "VerlGpuLost"), timeout=ALERT_TIMEOUT,
               message="the page for the lost GPU")
    for team in ("team-a", "team-b"):
        assert not stack.alerts_at(f"/{team}", "VerlGpuLost")


def test_the_runs_series_carry_their_owner_and_team(stack):
    series = stack.query('verl_training_last_step{project="teams"}')
    assert {(s["metric"]["experiment"], s["metric"]["user"], s["metric"]["team"]) for s in series} == {
        ("a-lr", ME, "team-a"), ("b-lr", "nobody", "team-b")}
