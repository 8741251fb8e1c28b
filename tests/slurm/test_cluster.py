"""The test Slurm cluster itself: a batch job runs, writes its --output, and Slurm says where."""

from __future__ import annotations

import pytest

VERL_LINES = [
    "(TaskRunner pid=1) step:1 - actor/pg_loss:0.1 - actor/entropy:0.52 - critic/score/mean:0.25",
    "(TaskRunner pid=1) step:2 - actor/pg_loss:0.09 - actor/entropy:0.5 - critic/score/mean:0.31",
]


def test_batch_job_writes_its_output(slurm, tmp_path):
    output = tmp_path / "verl-%j.log"
    script = "#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in VERL_LINES)
    job_id = slurm.sbatch(script, job_name="verl-grpo", output=output, chdir=tmp_path)
    assert slurm.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=30) == "COMPLETED"
    job = slurm.scontrol_show_job(job_id)
    assert job["JobName"] == "verl-grpo"
    assert job["NodeList"] == slurm.node
    log = tmp_path / f"verl-{job_id}.log"
    assert job["StdOut"] == str(log)  # %j expanded: the path a sidecar would follow
    assert log.read_text().splitlines() == VERL_LINES


def test_running_job_is_in_the_queue_until_cancelled(slurm):
    job_id = slurm.sbatch("#!/bin/sh\nsleep 120\n", job_name="verl-sleeper")
    try:
        slurm.wait_state(job_id, "RUNNING", timeout=30)
        (job,) = [job for job in slurm.squeue() if job["id"] == job_id]
        assert job == {"id": job_id, "name": "verl-sleeper", "user": "root", "partition": "debug",
                       "state": "RUNNING", "nodes": slurm.node}
    finally:
        slurm.run("scancel", job_id)
    assert slurm.wait_state(job_id, "CANCELLED", timeout=30) == "CANCELLED"
    assert job_id not in {job["id"] for job in slurm.squeue()}


def test_a_cluster_that_cannot_start_says_why(tmp_path, monkeypatch):
    import slurm_cluster

    monkeypatch.setattr(slurm_cluster.os, "geteuid", lambda: 1000)
    with pytest.raises(slurm_cluster.SlurmUnavailable, match="not root"):
        with slurm_cluster.slurm_cluster(tmp_path):
            pass


def test_a_daemon_that_fails_gives_its_log_tail(tmp_path, monkeypatch):
    import slurm_cluster

    real_write_conf = slurm_cluster.write_conf

    def broken_conf(workdir, **kwargs):
        path = real_write_conf(workdir, **kwargs)
        path.write_text(path.read_text().replace("SelectType=select/cons_tres", "SelectType=select/nonesuch"))
        return path

    monkeypatch.setattr(slurm_cluster, "write_conf", broken_conf)
    with pytest.raises(slurm_cluster.SlurmUnavailable, match="(?s)slurmctld exited.*select/nonesuch"):
        with slurm_cluster.slurm_cluster(tmp_path / "broken", start_timeout=10):
            pass
