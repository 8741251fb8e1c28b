"""Precision of the shipped rules, measured with the real servers: healthy runs stay silent over
their whole life, problem runs still raise their alerts.

Nine simulated runs, one step every 0.2 s, followed by ONE exporter and scraped by ONE Prometheus
(shipped rules, every duration divided by 300, as in test_alerting_e2e) that alerts to ONE
Alertmanager (shipped config). Alerts are per run (``project``/``experiment``), so the runs do not
disturb each other. The healthy runs last ``LIFE`` steps, past every warm-up and every ``for``:

- ``healthy-grpo``: on-policy GRPO (pg_clipfrac ~0.0008, ppo_kl ~-8e-06), console log;
- ``healthy-ppo``: PPO with a critic, console log AND FileLogger JSONL of the same run;
- ``completed-jsonl``: FileLogger JSONL only, its hydra config given with ``--run.config``;
- ``no-validation``: console log of a run without validation (no ``Final validation metrics``).

The problem runs (lr-too-high, critic-underfit, entropy-collapse, nan, stall) must raise theirs.
A ``sleep`` stands for the training job (``--job.pid``); once the healthy runs are done it exits:
the runs short of their last step are crashed (VerlTrainingJobCrashed pages, or
VerlTrainingJobExited where the run's length is unknown), the finished ones stay silent.
"""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from alerting_stack import AlertingStack
from servers import wait_until
from verl_exporter import simulate

STEP_SECONDS = 0.2
TIME_SCALE = STEP_SECONDS / 60
LIFE = 150  # steps: past the 20 warm-up steps, two hours of windows and every 1h ``for``
PROJECT = "precision"
HEALTHY = ("healthy-grpo", "healthy-ppo", "completed-jsonl", "no-validation")
EXPECTED = {
    "lr-too-high": "VerlLearningRateTooHigh",
    "critic-underfit": "VerlCriticNotLearning",
    "entropy-collapse": "VerlEntropyCollapsing",
    "nan": "VerlTrainingNonFinite",
    "stall": "VerlTrainingStalled",
}
TIMEOUT = 90


class Stack(AlertingStack):
    def __init__(self, tmp_path):
        runs = tmp_path / "runs" / PROJECT
        hydra = tmp_path / "outputs" / "completed-jsonl" / ".hydra" / "config.yaml"
        self.stop = threading.Event()
        self.job = subprocess.Popen(["sleep", "600"])  # stands for the training job (--job.pid)
        super().__init__(tmp_path, [
            "--source", str(runs / "*.log"), "--source", str(runs / "*.jsonl"), "--run.config", str(hydra),
            "--job.pid", str(self.job.pid), "--gpu.fake", "healthy:2", "--source.poll-interval", "0.1"],
            time_scale=TIME_SCALE)
        # The runs start once Prometheus scrapes: it must see their first steps (entropy-collapse's high start).
        wait_until(lambda: self.query('up{job="verl"} == 1'), timeout=30, message="Prometheus scraping the exporter")
        healthy = {"interval": STEP_SECONDS, "steps": LIFE}
        problem = {"interval": STEP_SECONDS, "total": 10_000}  # long runs, stopped when the module ends
        self.writers = [
            self._write(runs / "healthy-grpo.log", "healthy-grpo", fmt="console", **healthy),
            self._write(runs / "healthy-ppo.log", "healthy", fmt="console", **healthy),
            # verl's FileLogger buffers: the JSONL of the same run trails its console by a few steps.
            self._write(runs / "healthy-ppo.jsonl", "healthy", fmt="jsonl", delay=2.0, **healthy),
            self._write(runs / "completed-jsonl.jsonl", "healthy", fmt="jsonl", hydra_config=hydra, **healthy),
            self._write(runs / "no-validation.log", "healthy", fmt="console", val_every=0, **healthy),
            self._write(runs / "lr-too-high.log", "lr-too-high", fmt="console", **problem),
            self._write(runs / "critic-underfit.log", "critic-underfit", fmt="console", **problem),
            self._write(runs / "entropy-collapse.log", "entropy-collapse", fmt="console", **problem),
            self._write(runs / "nan.jsonl", "nan", fmt="jsonl", **problem),
            self._write(runs / "stall.jsonl", "stall", fmt="jsonl", **problem),
        ]

    def _write(self, path, scenario, delay=0.0, **kwargs):
        def write():
            if not self.stop.wait(delay):
                simulate.write_run(path, scenario, noise=False, stop_event=self.stop, **kwargs)

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        return thread

    def project_alerts(self) -> list[dict]:
        return self.am_alerts(f'project="{PROJECT}"')

    def close(self):
        self.stop.set()
        self.job.kill()
        self.job.wait()
        super().close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("precision"))
    yield stack
    stack.close()


def firing(stack, experiments) -> dict[str, set[str]]:
    """Alert names that fired (at any evaluation so far) per experiment."""
    selector = "|".join(experiments)
    result = stack.query(f'max_over_time(ALERTS{{experiment=~"{selector}", alertstate="firing"}}[10m])')
    out: dict[str, set[str]] = {}
    for series in result:
        out.setdefault(series["metric"]["experiment"], set()).add(series["metric"]["alertname"])
    return out


def test_problem_runs_raise_their_alerts(stack):
    def all_fired():
        fired = firing(stack, EXPECTED)
        return all(name in fired.get(run, ()) for run, name in EXPECTED.items()) and fired

    wait_until(all_fired, timeout=TIMEOUT, interval=0.5,
               fail=lambda why: pytest.fail(f"{why}: the problem runs' alerts {EXPECTED}; "
                                            f"fired: {firing(stack, EXPECTED)}"))
    # ... and reached Alertmanager
    def in_alertmanager():
        names = {(a["labels"].get("experiment"), a["labels"]["alertname"]) for a in stack.project_alerts()}
        return all(item in names for item in EXPECTED.items())

    wait_until(in_alertmanager, timeout=30, interval=0.5, message="the problem runs' alerts in Alertmanager")


def healthy_runs_ended(stack) -> None:
    """Wait until every healthy run is 8 s past its last step: the stall rule (5 step times + for
    10m = 3 s) had time to fire."""
    selector = "|".join(HEALTHY)
    wait_until(lambda: len(stack.query(f'verl_training_last_step{{experiment=~"{selector}"}} >= {LIFE}'))
               == len(HEALTHY), timeout=TIMEOUT, interval=0.5, message="the healthy runs at their last step")
    wait_until(lambda: len(stack.query(f'time() - verl_training_last_step_timestamp_seconds{{experiment=~"{selector}"}}'
                                       ' > 8')) == len(HEALTHY),
               timeout=TIMEOUT, interval=0.5, message="the healthy runs 8 s past their end")


def assert_healthy_runs_silent(stack) -> None:
    fired = firing(stack, HEALTHY)
    print(f"alerts fired on the healthy runs: {sum(map(len, fired.values()))} {fired}")
    assert fired == {}, fired
    assert [a for a in stack.project_alerts() if a["labels"].get("experiment") in HEALTHY] == []
    assert [p for p in stack.receiver.notifications
            if any(f"{PROJECT}/{run}" in json.dumps(p) for run in HEALTHY)] == []


def test_healthy_runs_raise_no_alert_over_their_whole_life(stack):
    healthy_runs_ended(stack)
    assert_healthy_runs_silent(stack)


def test_the_job_exiting_pages_for_runs_short_of_their_last_step_only(stack):
    healthy_runs_ended(stack)
    stack.job.kill()
    stack.job.wait()

    def exit_alerts():
        names = {(a["labels"].get("experiment"), a["labels"]["alertname"]): a for a in stack.project_alerts()}
        crashed = names.get(("lr-too-high", "VerlTrainingJobCrashed"))
        exited = names.get(("nan", "VerlTrainingJobExited"))
        return crashed and exited and (crashed, exited)

    crashed, exited = wait_until(exit_alerts, timeout=30, interval=0.5, message="the job's exit alerts")
    assert crashed["labels"]["severity"] == "critical" and exited["labels"]["severity"] == "warning"
    assert "run stopped at step" in crashed["annotations"]["description"]
    # The healthy runs had reached their last step: their job's exit is their end, not a crash.
    assert_healthy_runs_silent(stack)


def test_every_healthy_run_finished_and_stays_finished(stack):
    selector = "|".join(HEALTHY)
    wait_until(lambda: len(stack.query(f'verl_training_last_step{{experiment=~"{selector}"}} >= {LIFE}'))
               == len(HEALTHY), timeout=TIMEOUT, interval=0.5, message="the healthy runs at their last step")
    finished = wait_until(lambda: (lambda r: r if len(r) == len(HEALTHY) else None)(
        stack.query(f'verl_training_finished{{experiment=~"{selector}"}} == 1')), timeout=20,
        message="every healthy run finished")
    assert {r["metric"]["experiment"] for r in finished} == set(HEALTHY)
    # The run read from two sources was never reset to unfinished after it finished.
    flips = stack.query('changes(verl_training_finished{experiment="healthy-ppo"}[10m])')
    assert [float(r["value"][1]) for r in flips] == [1.0]
    totals = {r["metric"]["experiment"]: float(r["value"][1])
              for r in stack.query(f'verl_training_total_steps{{experiment=~"{selector}"}}')}
    assert totals == {run: LIFE for run in HEALTHY}


def test_run_settings_are_served_and_unknown_for_runs_without_a_config(stack):
    def setting(experiment, key):
        result = stack.query(f'verl_run_config{{experiment="{experiment}", key="{key}"}}')
        return [float(r["value"][1]) for r in result]

    wait_until(lambda: setting("healthy-grpo", "actor_rollout_ref.actor.ppo_epochs"), timeout=20,
               message="the GRPO run's settings")
    assert setting("healthy-grpo", "data.train_batch_size") == [64.0]
    assert setting("healthy-grpo", "actor_rollout_ref.actor.ppo_mini_batch_size") == [64.0]
    assert setting("completed-jsonl", "actor_rollout_ref.actor.ppo_mini_batch_size") == [64.0]
    assert setting("completed-jsonl", "data.train_batch_size") == [256.0]
    assert setting("nan", "data.train_batch_size") == []
    info = stack.query('verl_run_config_info{experiment="healthy-grpo"}')
    assert [r["metric"]["adv_estimator"] for r in info] == ["grpo"]
    progress = stack.query('project_experiment:verl_training_progress:ratio{experiment="lr-too-high"}')
    assert progress and 0 < float(progress[0]["value"][1]) < 1
    left = stack.query('project_experiment:verl_training_time_left_seconds:estimate{experiment="lr-too-high"}')
    assert left and float(left[0]["value"][1]) > 0
