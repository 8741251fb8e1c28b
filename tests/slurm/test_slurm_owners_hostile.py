"""Two users' jobs on one real Slurm node, one hostile: root's job trains ``slurm-two/honest`` and
stalls at step 3; a job of ``nobody`` prints a config naming the same run, then ``step:100``, a NaN, a
CUDA OOM traceback and verl's end marker. The honest run keeps its steps, its end, its job and its
evidence; nobody's lines make a run of nobody's; nobody cannot read root's run's evidence."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import textwrap

import pytest
from test_slurm_sd_hostile import let_others_in, running

from exposition import samples
from servers import Server, free_port, wait_until

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="submitting jobs as another user takes root")

CONFIG = "{'trainer': {'project_name': 'slurm-two', 'experiment_name': 'honest', 'total_training_steps': 50}}"
HONEST = textwrap.dedent(f"""\
    import time
    print({CONFIG!r}, flush=True)
    for step in (1, 2, 3):
        print(f"step:{{step}} - actor/pg_loss:0.5 - timing_s/step:0.5", flush=True)
        time.sleep(0.5)
    time.sleep(120)  # --honest-marker
""")
HOSTILE = textwrap.dedent(f"""\
    import time
    print({CONFIG!r}, flush=True)
    print("step:100 - actor/pg_loss:0.5", flush=True)
    print("step:101 - actor/pg_loss:nan", flush=True)
    print("Traceback (most recent call last):", flush=True)
    print('  File "/verl/trainer/main_ppo.py", line 10, in <module>', flush=True)
    print("    main()", flush=True)
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    print("Training finished", flush=True)
    time.sleep(120)  # --hostile-marker
""")
CLIENT = ("import sys, urllib.request, urllib.error\n"
          "try:\n"
          "    print(urllib.request.urlopen(sys.argv[1], timeout=10).status)\n"
          "except urllib.error.HTTPError as e:\n"
          "    print(e.code)\n")


def _as_nobody() -> None:
    os.setgid(pwd.getpwnam("nobody").pw_gid)
    os.setuid(pwd.getpwnam("nobody").pw_uid)


def _run_series(text: str, name: str, user: str) -> dict:
    return {labels: value for (sample, labels), value in samples(text).items()
            if sample == name and ("experiment", "honest") in labels and ("user", user) in labels}


@as_root
def test_a_hostile_job_on_the_node_leaves_the_honest_run_untouched(slurm, tmp_path):
    let_others_in(slurm)
    os.chmod(tmp_path, 0o711)
    work = tmp_path / "nobody"
    work.mkdir()
    os.chmod(work, 0o777)
    (work / "hostile.py").write_text(HOSTILE)
    (tmp_path / "honest.py").write_text(HONEST)
    honest = slurm.sbatch(None, job_name="verl-honest", chdir=tmp_path, output=tmp_path / "honest-%j.out",
                          wrap=f"exec {PYTHON} {tmp_path / 'honest.py'}")
    hostile = slurm.sbatch(None, job_name="verl-hostile", uid="nobody", chdir=work, output=work / "hostile-%j.out",
                           wrap=f"exec {PYTHON} {work / 'hostile.py'}")
    port = free_port()
    args = [sys.executable, "-m", "verl_exporter", "--web.listen-address", f"127.0.0.1:{port}", "--slurm",
            "--slurm.poll-interval", "250ms", "--source.poll-interval", "100ms", "--gpu.fake", "healthy:2",
            "--forensics.stall-after", "3s", "--forensics.check-interval", "500ms"]
    query = "/debug/evidence?project=slurm-two&experiment=honest&user=root"
    try:
        wait_until(lambda: running(slurm) >= {honest, hostile}, timeout=30, message="both jobs running")
        with Server("verl-exporter", args, port, tmp_path / "exporter.log", "/-/ready", env=slurm.env) as exporter:
            def both_runs():
                text = exporter.get("/metrics")[1]
                return text if _run_series(text, "verl_training_last_step", "nobody") and \
                    _run_series(text, "verl_training_last_step", "root") else None

            text = wait_until(both_runs, timeout=60, message=f"both users' runs\n{exporter.log()}")
            evidence = wait_until(lambda: (lambda reply: reply[1] if reply[0] == 200 else None)(exporter.get(query)),
                                  timeout=60, message=f"the stalled honest run's evidence\n{exporter.log()}")
            text = exporter.get("/metrics")[1]
            reply = subprocess.run([PYTHON, "-c", CLIENT, exporter.url + query], capture_output=True, text=True,
                                   timeout=30, preexec_fn=_as_nobody, cwd="/")
    finally:
        subprocess.run(["scancel", honest, hostile], env=slurm.env, capture_output=True)
    # The honest run: its own steps, no NaN, no fatal end, not finished, its job running.
    assert list(_run_series(text, "verl_training_last_step", "root").values()) == [3]
    assert list(_run_series(text, "verl_training_finished", "root").values()) == [0]
    assert not _run_series(text, "verl_training_nonfinite_values_total", "root")
    assert not _run_series(text, "verl_training_fatal_error_last_step", "root")
    assert list(_run_series(text, "verl_job_running", "root").values()) == [1]
    # nobody's lines: a run of nobody's, with nobody's NaN.
    assert list(_run_series(text, "verl_training_last_step", "nobody").values()) == [101]
    assert list(_run_series(text, "verl_training_nonfinite_values_total", "nobody").values()) == [1]
    # The honest run's evidence: its own job's processes only; nobody may not read it.
    assert "hostile.py" not in evidence, evidence
    assert reply.returncode == 0 and reply.stdout.strip() == "403", reply.stdout + reply.stderr
