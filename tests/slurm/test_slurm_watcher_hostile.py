"""``--slurm`` on a real Slurm cluster (proctrack/linuxproc: a job's processes are known by their
``SLURM_JOB_ID`` alone) against 300 processes of another user claiming made-up job ids, started
before a real job of ``nobody``: the real job is followed at the first look."""

from __future__ import annotations

import os
import pwd
import subprocess

import pytest
from test_slurm_sd_hostile import let_others_in, running, submit

from servers import wait_until
from verl_exporter.schedulers.slurm import SlurmWatcher
from verl_exporter.schedulers.slurm_procs import LocalJob, scan_proc
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making processes of other users takes root")
CLAIMS = 300


@as_root
def test_made_up_job_ids_of_another_user_do_not_delay_a_real_job(slurm, tmp_path, monkeypatch):
    let_others_in(slurm)
    for name, value in slurm.env.items():
        monkeypatch.setenv(name, value)
    claimants = [subprocess.Popen(["sleep", "120"], user="daemon", env={"SLURM_JOB_ID": str(900_000 + index)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for index in range(CLAIMS)]
    job = None
    try:
        job = submit(slurm, b"verl-real")  # nobody's, started after every claimant
        wait_until(lambda: job in running(slurm), timeout=30, message="the real job running")
        # Slurm calls a job running before slurmd has started its script: the look is taken once
        # the job's own process (nobody's) is there to be seen.
        nobody = pwd.getpwnam("nobody").pw_uid
        wait_until(lambda: nobody in scan_proc().get(job, LocalJob()).uids, timeout=30,
                   message="the real job's process on this node")
        watcher = SlurmWatcher(RunStore(default_catalog()), interval=60.0)
        watcher.refresh()  # one look
        assert job in watcher.jobs, f"job {job} not followed at the first look among {CLAIMS} made-up ids"
    finally:
        for process in claimants:
            process.kill()
        for process in claimants:
            process.wait()
        if job is not None:
            subprocess.run(["scancel", job], env=slurm.env, capture_output=True)
