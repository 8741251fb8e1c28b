"""Evidence on a stall, with real processes: a hung Python job whose py-spy dump names the function
it hangs in, and a job that prints a CUDA out-of-memory traceback and exits, behind basic auth."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import bcrypt
import pytest

from exposition import sample_value
from owner import ME
from servers import http_get, start_exporter, wait_until
from verl_exporter.forensics.stacks import find_py_spy

HUNG_JOB = """
import sys
import time


def wait_for_allreduce():
    while True:
        time.sleep(3600)


open(sys.argv[1], "w").close()
wait_for_allreduce()
"""

# Writes two steps, waits for the go file, then prints an out-of-memory traceback and exits 1.
CRASHING_JOB = """
import os
import sys
import time

log, go = sys.argv[1], sys.argv[2]
prefix = f"(WorkerDict pid={os.getpid()}) "
with open(log, "a") as handle:
    for step in (1, 2):
        handle.write(f"(TaskRunner pid={os.getpid()}) step:{step} - actor/pg_loss:0.25 - timing_s/step:0.5\\n")
while not os.path.exists(go):
    time.sleep(0.05)
with open(log, "a") as handle:
    handle.write(prefix + "Traceback (most recent call last):\\n")
    handle.write(prefix + '  File "/opt/trainer/update.py", line 88, in update_policy\\n')
    handle.write(prefix + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. "
                 "GPU 0 has a total capacity of 79.19 GiB of which 1.12 GiB is free.\\n")
sys.exit(1)
"""


@pytest.fixture(scope="module")
def py_spy() -> str:
    """py-spy, where it may trace another process of the same user; else the test is skipped."""
    binary = find_py_spy()
    if binary is None:
        pytest.fail("py-spy is not installed; the test extra installs it (pip install -e '.[test]')")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        done = subprocess.run([binary, "dump", "--pid", str(sleeper.pid)], capture_output=True, timeout=20,
                              env={**os.environ, "RUST_BACKTRACE": "0"})
    finally:
        sleeper.kill()
        sleeper.wait()
    if done.returncode != 0:
        pytest.skip(f"py-spy may not trace processes here (ptrace not permitted?): "
                    f"{(done.stdout + done.stderr).decode(errors='replace').strip()[:200]}")
    return binary


def evidence_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("evidence-*.txt")) if directory.exists() else []


def test_a_hung_job_its_stack_names_where_it_hangs(tmp_path, py_spy):
    log, marker, evidence_dir = tmp_path / "train.log", tmp_path / "started", tmp_path / "evidence"
    log.write_text("".join(f"(TaskRunner pid=4242) step:{n} - actor/pg_loss:0.1 - timing_s/step:0.1\n"
                           for n in (1, 2, 3))
                   + "Training Progress:   3%|          | 3/100 [00:01<00:30, 3.1it/s]\n")
    an_hour_ago = time.time() - 3600
    os.utime(log, (an_hour_ago, an_hour_ago))  # its last step is an hour old
    (tmp_path / "hung.py").write_text(HUNG_JOB)
    job = subprocess.Popen([sys.executable, str(tmp_path / "hung.py"), str(marker)])
    try:
        wait_until(marker.exists, message="the job to start")
        with start_exporter(tmp_path, "--source", str(log), "--project", "gsm8k", "--experiment", "hung",
                            "--job.pid", str(job.pid), "--gpu.fake", "healthy:2", "--source.poll-interval", "0.1",
                            "--forensics.stall-after", "1s", "--forensics.check-interval", "200ms",
                            "--forensics.dir", str(evidence_dir)) as exporter:
            path = f"/debug/evidence?project=gsm8k&experiment=hung&user={ME}"
            text = wait_until(lambda: (r := exporter.get(path))[0] == 200 and r[1], message="evidence")
            assert "why: no step for 1h" in text and "since step 3" in text
            assert "last phase: progress (in " in text and "3/100" in text
            assert f"--- pid {job.pid}: " in text and "wait_for_allreduce (hung.py:" in text
            assert "\ngpu 0 NVIDIA H100 80GB HBM3 GPU-" in text and "\ngpu 1 " in text
            assert "step:3 - actor/pg_loss:0.1" in text
            [written] = evidence_files(evidence_dir)
            assert written.read_text() == text
            metrics = exporter.get("/metrics")[1]  # what the alerts quote of it
            assert 'verl_evidence_top_frame_info{experiment="hung",frame="wait_for_allreduce (hung.py:' in metrics
            assert ('verl_evidence_captured_timestamp_seconds{experiment="hung",project="gsm8k",team="",'
                    f'user="{ME}"}}') in metrics
            time.sleep(1.0)
            assert len(evidence_files(evidence_dir)) == 1  # once per stall
            with log.open("a") as handle:  # a step ends the stall; the next is captured again
                handle.write("(TaskRunner pid=4242) step:4 - actor/pg_loss:0.1 - timing_s/step:0.1\n")
            wait_until(lambda: len(evidence_files(evidence_dir)) == 2, message="the second stall's evidence")
            assert "since step 4" in exporter.get(path)[1]
            assert exporter.get(f"/debug/evidence?project=gsm8k&experiment=other&user={ME}")[0] == 404
            assert exporter.get("/debug/evidence?project=gsm8k")[0] == 400
    finally:
        job.kill()
        job.wait()


def test_a_job_that_runs_out_of_memory_and_exits(tmp_path):
    log, go = tmp_path / "train.log", tmp_path / "go"
    log.touch()
    hashed = bcrypt.hashpw(b"change-me", bcrypt.gensalt(rounds=4)).decode()
    web_config = tmp_path / "web-config.yml"
    web_config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    auth = {"Authorization": "Basic " + base64.b64encode(b"prometheus:change-me").decode()}
    (tmp_path / "crash.py").write_text(CRASHING_JOB)
    job = subprocess.Popen([sys.executable, str(tmp_path / "crash.py"), str(log), str(go)])
    try:
        with start_exporter(tmp_path, "--source", str(log), "--project", "gsm8k", "--experiment", "oom",
                            "--job.pid", str(job.pid), "--no-collector.gpu", "--source.poll-interval", "0.1",
                            "--forensics.check-interval", "200ms", "--web.config.file", str(web_config),
                            headers=auth) as exporter:
            run = {"project": "gsm8k", "experiment": "oom", "user": ME}
            wait_until(lambda: (t := exporter.get("/metrics")[1]) and sample_value(t, "verl_job_running") == 1
                       and sample_value(t, "verl_training_last_step", **run) == 2, message="steps 1 and 2")
            time.sleep(0.5)  # a few checks see the job running
            go.touch()
            assert job.wait(10) == 1
            path = f"/debug/evidence?project=gsm8k&experiment=oom&user={ME}"
            text = wait_until(lambda: (r := exporter.get(path))[0] == 200 and r[1], message="evidence")
            assert "why: the job's processes exited after step 2, before the run finished" in text
            assert "== errors the log shows: cuda_oom 1, traceback 1 ==" in text
            errors = text.split("== errors the log shows", 1)[1].split("\n== ", 1)[0]
            assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB." in errors
            assert "Traceback (most recent call last):" in errors
            assert "no live process of the job" in text
            assert "GPU collector off (--no-collector.gpu)" in text
            assert http_get(exporter.url + path)[0] == 401  # behind the same basic auth as /metrics
    finally:
        if job.poll() is None:
            job.kill()
        job.wait()
