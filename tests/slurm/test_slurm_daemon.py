"""`verl-exporter --slurm` on a real one-node Slurm cluster: batch jobs found without --source,
served with their Slurm identity, and finished or crashed when they end."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from alerting_stack import AlertingStack
from exposition import matching, sample_value
from servers import Server, free_port, wait_until

# A verl-like job: the config print and the total, then one step a second with a Ray prefix.
TRAINER = textwrap.dedent("""\
    import pprint, sys, time
    steps, total = int(sys.argv[1]), int(sys.argv[2])
    prefix = "(TaskRunner pid=4242) "
    config = {"trainer": {"project_name": "slurm-it", "experiment_name": sys.argv[3], "nnodes": 1}}
    for row in pprint.pformat(config).splitlines():
        print(prefix + row)
    print(prefix + f"Total training steps: {total}", flush=True)
    for step in range(1, steps + 1):
        time.sleep(1)
        print(prefix + f"step:{step} - actor/pg_loss:{0.5 / step} - critic/score/mean:0.{step}", flush=True)
    sys.exit(0 if steps == total else 1)
""")


SLURM_ARGS = ["--slurm", "--slurm.poll-interval", "250ms", "--source.poll-interval", "100ms", "--gpu.fake",
              "healthy:2", "--no-forensics"]


@pytest.fixture
def exporter(slurm, tmp_path):
    port = free_port()
    args = [sys.executable, "-m", "verl_exporter", "--web.listen-address", f"127.0.0.1:{port}", *SLURM_ARGS]
    with Server("verl-exporter", args, port, tmp_path / "exporter.log", "/-/ready", env=slurm.env) as server:
        yield server


def submit(slurm, tmp_path, name: str, steps: int, total: int, experiment: str) -> str:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    return slurm.sbatch(None, job_name=name, output=tmp_path / "%x-%j.out", chdir=tmp_path,
                        wrap=f"{sys.executable} {script} {steps} {total} {experiment}")


def metrics(server: Server) -> str:
    status, text = server.get("/metrics")
    assert status == 200
    return text


def test_a_batch_job_is_found_served_and_finished(slurm, exporter, tmp_path):
    job_id = submit(slurm, tmp_path, "verl-grpo", steps=3, total=3, experiment="grpo-done")
    run = {"project": "slurm-it", "experiment": "grpo-done"}
    wait_until(lambda: sample_value(metrics(exporter), "verl_training_last_step", **run), timeout=30,
               message=f"run of job {job_id} served\n{exporter.log()}")
    text = metrics(exporter)
    assert matching(text, "verl_job_info", scheduler="slurm", job_id=job_id, job_name="verl-grpo", user="root",
                    partition="debug", namespace="", pod="", **run) == [1.0]
    assert sample_value(text, "verl_job_running", **run) == 1.0
    assert sample_value(text, "verl_training_total_steps", **run) == 3.0
    slurm.wait_state(job_id, "COMPLETED", timeout=30)
    wait_until(lambda: sample_value(metrics(exporter), "verl_job_running", **run) == 0.0, timeout=20,
               message=f"job {job_id} ended\n{exporter.log()}")
    text = metrics(exporter)
    assert sample_value(text, "verl_training_last_step", **run) == 3.0
    assert sample_value(text, "verl_training_finished", **run) == 1.0
    assert matching(text, "verl_job_info", job_id=job_id, **run) == [1.0]  # still served once ended


def test_a_job_that_stops_early_is_left_crashed(slurm, exporter, tmp_path):
    job_id = submit(slurm, tmp_path, "verl-short", steps=2, total=10, experiment="grpo-crash")
    run = {"project": "slurm-it", "experiment": "grpo-crash"}
    slurm.wait_state(job_id, "FAILED", timeout=30)
    wait_until(lambda: sample_value(metrics(exporter), "verl_job_running", **run) == 0.0, timeout=20,
               message=f"job {job_id} ended\n{exporter.log()}")
    text = metrics(exporter)
    assert sample_value(text, "verl_training_last_step", **run) == 2.0
    assert sample_value(text, "verl_training_total_steps", **run) == 10.0
    assert sample_value(text, "verl_training_finished", **run) == 0.0  # VerlTrainingJobCrashed fires on this
    assert matching(text, "verl_job_info", job_id=job_id, job_name="verl-short", **run) == [1.0]
    [ended] = matching(text, "verl_job_ended_timestamp_seconds", scheduler="slurm", job_id=job_id, state="FAILED",
                       exit_code="1:0", reason="NonZeroExitCode", **run)
    assert ended > 1e9  # when it ended: a Unix time


def test_a_crashed_jobs_page_says_how_slurm_ended_it_and_a_cancel_is_told_not_paged(slurm, tmp_path):
    """Exporter under --slurm -> Prometheus with the shipped rules -> Alertmanager -> the PagerDuty and
    Slack stand-ins: the page of a job that failed before its last step quotes Slurm's end of it; a
    job cancelled with scancel is posted to Slack as a warning and pages nobody."""
    stack = AlertingStack(tmp_path, SLURM_ARGS, time_scale=1 / 30, exporter_env=slurm.env)
    try:
        failed = submit(slurm, tmp_path, "verl-paged", steps=2, total=10, experiment="grpo-paged")
        cancelled = submit(slurm, tmp_path, "verl-cancelled", steps=120, total=200, experiment="grpo-cancelled")
        wait_until(lambda: stack.query('verl_training_last_step{experiment="grpo-cancelled"} >= 2'), timeout=40,
                   interval=0.5, message=f"job {cancelled} stepping\n{stack.exporter.log()}")
        slurm.run("scancel", cancelled)
        slurm.wait_state(failed, "FAILED", timeout=30)

        def sent(path, alert, run):
            return [p for p in stack.receiver.received(path) if alert in json.dumps(p) and run in json.dumps(p)]

        [page, *_] = wait_until(lambda: sent("/pagerduty", "VerlTrainingJobCrashed", "slurm-it/grpo-paged"),
                                timeout=60, interval=0.5, message=f"the page of job {failed}\n{stack.exporter.log()}")
        text = json.dumps(page)
        assert "the run stopped at step 2 of 10: it crashed or was stopped." in text
        assert f"Slurm ended job {failed} as FAILED (NonZeroExitCode), exit code 1:0." in text
        [post, *_] = wait_until(lambda: sent("/slack", "VerlTrainingJobCancelled", "slurm-it/grpo-cancelled"),
                                timeout=60, interval=0.5, message=f"the Slack post of job {cancelled}")
        assert f"Slurm job {cancelled} was cancelled at step" in json.dumps(post)
        assert [p for p in stack.receiver.received("/pagerduty") if "grpo-cancelled" in json.dumps(p)] == []
    finally:
        stack.close()
