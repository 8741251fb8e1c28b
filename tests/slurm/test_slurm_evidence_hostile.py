"""``--slurm`` evidence against a job of ``nobody`` on a real Slurm cluster: the job prints a step,
swaps its output file for a link to a root-only file and stalls, while a root job with a secret on
its command line runs beside it. The stalled run's evidence holds neither."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from test_slurm_sd_hostile import let_others_in, running

from servers import Server, free_port, wait_until

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else (shutil.which("python3") or "python3")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="submitting jobs as another user takes root")

STALLING = textwrap.dedent("""\
    import os, sys, time
    print("{'trainer': {'project_name': 'slurm-it', 'experiment_name': 'nobody-run'}}")
    print("step:1 - actor/pg_loss:0.5", flush=True)
    time.sleep(2)
    out = os.path.join(sys.argv[1], f"verl-{os.environ['SLURM_JOB_ID']}.out")
    os.remove(out)
    os.symlink(sys.argv[2], out)
    time.sleep(120)
""")


@as_root
def test_a_stalled_job_of_nobody_gets_no_secret_file_and_no_other_jobs_stacks(slurm, tmp_path):
    let_others_in(slurm)
    os.chmod(tmp_path, 0o711)  # nobody's job reaches its own folder in here, nothing else
    secret = tmp_path / "secret"
    secret.write_text("root-only: hunter2-in-a-file\n")
    os.chmod(secret, 0o600)
    work = tmp_path / "nobody"
    work.mkdir()
    os.chmod(work, 0o777)
    script = work / "stall.py"
    script.write_text(STALLING)
    os.chmod(script, 0o644)
    hostile = slurm.sbatch(None, job_name="verl-nobody", uid="nobody", chdir=work, output=work / "verl-%j.out",
                           wrap=f"{PYTHON} {script} {work} {secret}")
    root = slurm.sbatch(None, job_name="verl-root", chdir=tmp_path, output=tmp_path / "root-%j.out",
                        wrap=f"exec {sys.executable} -c 'import time; time.sleep(120)' --api-key=hunter2-in-argv")
    port = free_port()
    args = [sys.executable, "-m", "verl_exporter", "--web.listen-address", f"127.0.0.1:{port}", "--slurm",
            "--slurm.poll-interval", "250ms", "--source.poll-interval", "100ms", "--gpu.fake", "healthy:2",
            "--forensics.stall-after", "3s", "--forensics.check-interval", "500ms"]
    try:
        wait_until(lambda: running(slurm) >= {hostile, root}, timeout=30, message="both jobs running")
        with Server("verl-exporter", args, port, tmp_path / "exporter.log", "/-/ready", env=slurm.env) as exporter:
            query = "/debug/evidence?project=slurm-it&experiment=nobody-run&user=nobody"  # the job's user owns its run
            text = wait_until(lambda: (lambda reply: reply[1] if reply[0] == 200 else None)(exporter.get(query)),
                              timeout=60, message=f"the stalled run's evidence\n{exporter.log()}")
    finally:
        subprocess.run(["scancel", hostile, root], env=slurm.env, capture_output=True)
    assert "no step for" in text or "stall" in text
    assert "hunter2" not in text, text
    assert "not the file the log follower read" in text or "cannot read it" in text
