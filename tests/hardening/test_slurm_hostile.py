"""--slurm against the users of its node: what a user controls (their processes' environment and
cgroup, their job's name, paths and output) must not blind the watcher to other users' jobs, make it
read files as root, or make it ask Slurm without end."""

from __future__ import annotations

import os
import shutil

import pytest

from owner import ME
from unit import test_slurm_watcher
from unit.test_slurm_watcher import (
    fake_process,
    families,
    poll,
    run_as,
    scontrol_line,
    write_log,
)
from verl_exporter.schedulers.slurm import SlurmWatcher
from verl_exporter.schedulers.slurm_jobs import SlurmJob, gpu_list, show_job
from verl_exporter.schedulers.slurm_procs import read_environ, scan_proc
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.owners import user_name
from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore

node = test_slurm_watcher.node  # the fake node: /proc tree, scontrol answers, a watcher
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making processes of another user takes root")
RUN = RunKey("gsm8k", "grpo-7b", ME)  # a job of this process's user (the fake node's default)


def gone(cluster, pid: int) -> None:
    shutil.rmtree(cluster.proc / str(pid))


def slurmstepd(cluster, pid: int, job_id: str) -> None:
    """Root's slurmstepd (or the prolog) in the job's cgroup, before the user's tasks are there."""
    fake_process(cluster.proc, pid, {}, cgroup=f"0::/system.slice/slurmstepd.scope/job_{job_id}/step_batch/slurm\n")
    run_as(cluster, (pid,), 0)


def test_job_ids_are_plain_ascii_numbers(tmp_path):
    proc = tmp_path / "proc"
    fake_process(proc, 100, {"SLURM_JOB_ID": "42"})
    for pid, job_id in enumerate(["０４２", "²", "0042", "99999999999999999999", "4" * 5000], start=200):
        fake_process(proc, pid, {"SLURM_JOB_ID": job_id})  # str.isdigit() takes all of them
    fake_process(proc, 300, {}, cgroup="0::/system.slice/slurmstepd.scope/job_١٢/step_0\n")  # \d takes it too
    assert set(scan_proc(str(proc), own_pid=1)) == {"42"}


def test_a_zero_padded_id_cannot_take_a_running_job_over(node):
    cluster, store, watcher = node
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=5)
    cluster.start("42")
    fake_process(cluster.proc, 2000, {"SLURM_JOB_ID": "0042"})  # anyone's process
    watcher.scontrol = lambda job_id: cluster.scontrol(str(int(job_id)))  # scontrol reads the id as a number
    for _ in range(3):
        poll(watcher)
    assert cluster.asked == ["42"] and not watcher.ended
    assert watcher.jobs["42"].sources and store.run(RUN).last_step == 2 and not store.run(RUN).finished


def test_an_array_jobs_answer_is_read_on_the_line_of_the_asked_id(node):
    cluster, store, watcher = node
    write_log(cluster.runs / "grpo-qwen-40.out", steps=2, total=5)
    cluster.start("40")
    # scontrol show job <ArrayJobId> shows every task of the array, one line each
    other = scontrol_line(job_id="41", workdir=str(cluster.runs), stdout="%x-%j.out").replace(
        "JobId=41 ", "JobId=41 ArrayJobId=40 ArrayTaskId=1 ")
    cluster.answers["40"] = other + cluster.answers["40"].replace("JobId=40 ", "JobId=40 ArrayJobId=40 ArrayTaskId=2 ")
    for _ in range(3):
        poll(watcher)
    assert set(watcher.jobs) == {"40"} and cluster.asked == ["40"]
    assert [source.pattern for source in watcher.jobs["40"].sources] == [str(cluster.runs / "grpo-qwen-40.out")]


def test_ids_slurm_does_not_know_are_asked_about_less_and_less(node):
    cluster, store, watcher = node
    fake_process(cluster.proc, 2000, {"SLURM_JOB_ID": "777"})
    for _ in range(20):
        watcher.refresh()
    assert 2 <= len(cluster.asked) <= 6  # asked at the next look, then after 2, 4, 8, 16 looks


def test_thousands_of_made_up_ids_cost_a_bounded_number_of_questions(node):
    cluster, store, watcher = node
    for pid in range(2000, 3000):
        fake_process(cluster.proc, pid, {"SLURM_JOB_ID": str(pid * 7)})
    for _ in range(5):
        watcher.refresh()
    assert len(cluster.asked) <= 5 * 16 and watcher.jobs == {}


@as_root
def test_a_real_job_is_asked_about_before_made_up_ids(node):
    cluster, store, watcher = node
    intruder = os.getuid() + 4242
    for pid in range(2000, 2500):
        fake_process(cluster.proc, pid, {"SLURM_JOB_ID": str(pid * 7)})
    run_as(cluster, range(2000, 2500), intruder)
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=5)
    cluster.start("42", pids=(5000,))
    slurmstepd(cluster, 4999, "42")  # no user can make a root process claim a job id
    poll(watcher)
    assert "42" in watcher.jobs and store.run(RUN).last_step == 2


@as_root
def test_a_job_first_seen_with_only_slurmstepd_is_followed_once_its_tasks_come(node, caplog):
    cluster, store, watcher = node
    alice = os.getuid() + 1001
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=5)
    os.chown(cluster.runs / "grpo-qwen-42.out", alice, -1)
    cluster.start("42", user=f"alice({alice})")
    gone(cluster, 1000)
    slurmstepd(cluster, 900, "42")
    poll(watcher)
    assert watcher.jobs["42"].sources == []  # root's process alone does not say whose files they are
    assert "not read" not in caplog.text  # the usual start of a job: no warning
    cluster.start("42", user=f"alice({alice})")
    run_as(cluster, (1000,), alice)
    poll(watcher)
    run = RunKey("gsm8k", "grpo-7b", user_name(alice))  # the job's user owns its runs
    assert store.run(run).last_step == 2 and [s.labels["job_id"] for s in families(watcher)["verl_job_info"]] == ["42"]


@as_root
def test_another_users_process_claiming_a_job_id_first_does_not_blind_the_job(node):
    cluster, store, watcher = node
    alice, mallory = os.getuid() + 1001, os.getuid() + 4242
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=5)
    os.chown(cluster.runs / "grpo-qwen-42.out", alice, -1)
    write_log(cluster.runs / "grpo-qwen-43.out", steps=2, total=5)
    os.chown(cluster.runs / "grpo-qwen-43.out", alice, -1)
    for job_id, pid in (("42", 2000), ("43", 2001)):  # alice's jobs, still pending
        cluster.answers[job_id] = scontrol_line(job_id=job_id, user=f"alice({alice})", workdir=str(cluster.runs),
                                                stdout="%x-%j.out")
        fake_process(cluster.proc, pid, {"SLURM_JOB_ID": job_id})
        run_as(cluster, (pid,), mallory)
    poll(watcher)
    gone(cluster, 2000)  # mallory's claim on 42 ended before the job started, the one on 43 did not
    poll(watcher)
    for job_id, pid in (("42", 1000), ("43", 1001)):
        cluster.start(job_id, pids=(pid,), user=f"alice({alice})")
        run_as(cluster, (pid,), alice)
    poll(watcher)
    assert [(s.labels["job_id"], s.labels["experiment"]) for s in families(watcher)["verl_job_info"]] == [
        ("42", "grpo-7b"), ("43", "grpo-7b")]


@as_root
@pytest.mark.parametrize("name", ["x UserId=root(0) GroupId=root(0)", "x StdOut={secret}\n"])
def test_a_forged_user_id_is_not_believed_while_only_roots_processes_are_seen(node, name):
    cluster, store, watcher = node
    mallory = os.getuid() + 4242
    secret = cluster.runs / "secret.log"
    write_log(secret, steps=2, total=5)  # root's
    cluster.start("42", name=name.format(secret=secret), user=f"mallory({mallory})", stdout=str(secret))
    gone(cluster, 1000)
    slurmstepd(cluster, 900, "42")  # the prolog, or slurmstepd before the tasks start
    poll(watcher)
    assert store.snapshot().runs == [] and watcher.jobs["42"].sources == []
    cluster.start("42", name=name.format(secret=secret), user=f"mallory({mallory})", stdout=str(secret))
    run_as(cluster, (1000,), mallory)
    poll(watcher)
    assert store.snapshot().runs == [] and watcher.jobs["42"].sources == []


def test_a_job_name_with_a_line_separator_python_knows_but_scontrol_does_not(tmp_path):
    job = SlurmJob.parse(scontrol_line(name="grpo\x1cqwen\u2028x"))
    assert (job.job_name, job.user, job.partition) == ("grpo\x1cqwen\u2028x", "alice", "gpu")


def test_scontrol_output_that_is_not_utf8_does_not_stop_the_watcher(tmp_path, monkeypatch):
    answers, bin_dir = tmp_path / "answers", tmp_path / "bin"
    answers.mkdir()
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\ncat "{answers}/$5"\n')  # scontrol show job -d -o <id>
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    proc = tmp_path / "proc"
    for job_id, name in (("42", "grpo-qwen"), ("43", "grpo\udcffbad")):
        line = scontrol_line(job_id=job_id, name=name, workdir=str(tmp_path), stdout="%j.out")
        (answers / job_id).write_bytes(line.encode("utf-8", "surrogateescape"))  # sbatch --job-name=$'grpo\xffbad'
        fake_process(proc, int(job_id), {"SLURM_JOB_ID": job_id})
    assert SlurmJob.parse(show_job("43") or "").job_name == "grpo\ufffdbad"
    watcher = SlurmWatcher(RunStore(default_catalog()), proc_root=str(proc), hostname="gpu03", own_pid=1)
    watcher.refresh()
    assert set(watcher.jobs) == {"42", "43"}


def test_environment_values_and_gpu_lists_are_bounded(tmp_path):
    path = tmp_path / "environ"
    path.write_bytes(b"SLURM_JOB_ID=5\0CUDA_VISIBLE_DEVICES=" + b"0," * 60000 + b"\0SLURMD_NODENAME=gpu03\0")
    env = read_environ(str(path))
    assert env.get("SLURM_JOB_ID") == "5" and env.get("SLURMD_NODENAME") == "gpu03"
    assert len(env.get("CUDA_VISIBLE_DEVICES", "")) <= 4096  # thousands of processes each holding 120 KB
    assert len(gpu_list(",".join(f"{low}-{low + 1000}" for low in range(0, 400_000, 1001)))) <= 128
    assert gpu_list("0-3,7") == ("0", "1", "2", "3", "7")


def test_a_resolved_output_path_can_be_long_only_as_a_path_can():
    job = SlurmJob.parse(scontrol_line(name="n" * 1024, stdout="/r/" + "%x" * 2000))
    assert job.output_files() == []


@as_root
def test_a_real_job_without_a_root_process_is_asked_about_in_the_first_look(node):
    """No slurmstepd in the job's cgroup to vouch for it (proctrack without cgroups): the user's
    job still comes before a thousand ids another user's processes made up (one ask per user in
    turn), not a hundred looks later."""
    cluster, store, watcher = node
    intruder, alice = os.getuid() + 4242, os.getuid() + 4243
    for pid in range(2000, 3000):
        fake_process(cluster.proc, pid, {"SLURM_JOB_ID": str(pid * 7)})
    run_as(cluster, range(2000, 3000), intruder)
    log = cluster.runs / "grpo-qwen-42.out"
    write_log(log, steps=2, total=5)
    os.chown(log, alice, -1)
    cluster.start("42", pids=(5000,), user=f"alice({alice})")
    run_as(cluster, (5000,), alice)
    watcher.refresh()
    assert "42" in watcher.jobs
