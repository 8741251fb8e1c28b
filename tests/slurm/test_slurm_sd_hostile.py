"""slurm-sd against the names users give their jobs, on a real Slurm cluster: jobs of ``nobody``
whose names hold a line break and a forged squeue line (or ``\\x1e``, U+2028, a node list to
expand), and a name that is not UTF-8; a name that carries another job's own squeue fields. Discovery
lists one group per real job, nobody's own, and the others' jobs as before, each with its own name."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from test_slurm_sd_e2e import start_slurm_sd

from servers import wait_until

FORGED = "99999|root|debug|evil.example.com|verl-x"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="submitting jobs as another user takes root")


def submit(slurm, name: bytes, uid: str = "nobody", *options: bytes) -> str:
    """A job named ``name`` (bytes: any name sbatch takes) of ``uid``; its id."""
    out = subprocess.run([b"sbatch", b"--parsable", b"--uid=" + uid.encode(), b"--chdir=/tmp",
                          b"--output=/dev/null", b"--job-name=" + name, *options, b"--wrap=exec sleep 120"],
                         env=slurm.env, capture_output=True, check=True).stdout
    return out.decode().strip().split(";")[0]


def let_others_in(slurm) -> None:
    """Another user's job runs its script from the cluster's spool, under pytest's root-only folder."""
    folder = slurm.workdir
    while folder != folder.parent:
        os.chmod(folder, os.stat(folder).st_mode | 0o011)
        folder = folder.parent


@as_root
@pytest.mark.parametrize("name", [b"verl-a\n" + FORGED.encode() + b"\nevil[1-5000]",
                                  b"verl-b\x1e" + FORGED.encode() + "\u2028".encode() + FORGED.encode(),
                                  b"verl-\xff\xfe-latin1"], ids=["newline", "separators", "not-utf8"])
def test_a_job_name_cannot_forge_targets_or_blind_discovery(slurm, tmp_path, name):
    let_others_in(slurm)
    hostile = submit(slurm, name)
    real = submit(slurm, b"verl-real", uid="root")  # the node's two CPUs: two jobs at once
    try:
        wait_until(lambda: running(slurm) >= {hostile, real}, timeout=30, message="both jobs running")
        with start_slurm_sd(tmp_path, slurm, "--job.match", "verl-.*", "--partition", "debug") as sd:
            status, body = sd.get("/targets")
            assert status == 200, body
            groups = json.loads(body)
    finally:
        subprocess.run(["scancel", hostile, real], env=slurm.env, capture_output=True)
    # One node, one target: the oldest job whose whole name matches holds it, with its own labels.
    [group] = groups
    assert group["targets"] == [f"{slurm.node}:9945"]
    owner = {hostile: "nobody", real: "root"}
    labels = group["labels"]
    assert labels["slurm_job_id"] in owner and labels["slurm_user"] == owner[labels["slurm_job_id"]]
    if labels["slurm_job_id"] == hostile:
        assert labels["slurm_job_name"] == name.decode("utf-8", "replace")
    else:
        assert labels["slurm_job_name"] == "verl-real" and b"\n" in name  # a name with a line break never matches


@as_root
def test_a_job_name_cannot_take_over_another_jobs_name(slurm, tmp_path):
    """nobody names a job after the older job's own squeue line; squeue lists nobody's job first (the
    older one is niced). Under the default --job.match the older job keeps its name and its node."""
    let_others_in(slurm)
    real = submit(slurm, b"verl-real", "root", b"--nice=100")
    forged = f"{real}|root|debug|{slurm.node}|"
    hostile = submit(slurm, f"x\n{forged}evil\n{forged}verl-real".encode())
    try:
        wait_until(lambda: running(slurm) >= {hostile, real}, timeout=30, message="both jobs running")
        order = subprocess.run(["squeue", "--noheader", "--states=RUNNING", "--format=%i"], env=slurm.env,
                               capture_output=True, text=True).stdout.split()
        assert order.index(hostile) < order.index(real)  # the forged line comes before the real one
        with start_slurm_sd(tmp_path, slurm) as sd:
            status, body = sd.get("/targets")
            assert status == 200, body
            groups = json.loads(body)
    finally:
        subprocess.run(["scancel", hostile, real], env=slurm.env, capture_output=True)
    assert groups == [{"targets": [f"{slurm.node}:9945"], "labels": {
        "slurm_job_id": real, "slurm_user": "root", "slurm_partition": "debug", "slurm_job_name": "verl-real"}}]


def running(slurm) -> set[str]:
    """The ids of the running jobs, whatever bytes their names hold."""
    out = subprocess.run(["squeue", "--noheader", "--states=RUNNING", "--format=%i"], env=slurm.env,
                         capture_output=True).stdout.decode("utf-8", "replace")
    return {line.strip() for line in out.split("\n") if line.strip()}
