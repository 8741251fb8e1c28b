"""--slurm without a cluster: fixed `scontrol show job -o` outputs, fake /proc trees, real log files."""

from __future__ import annotations

import os
import pprint
import time
from pathlib import Path

import pytest

from owner import ME
from verl_exporter.collectors.job_info import JobInfoCollector
from verl_exporter.collectors.job_processes import JobSelector
from verl_exporter.schedulers.slurm import SlurmWatcher
from verl_exporter.schedulers.slurm_jobs import SlurmJob, first_node, gpu_list, parse_fields, resolve_path
from verl_exporter.schedulers.slurm_procs import job_owner, read_environ, scan_proc
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.owners import user_name
from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore

PREFIX = "\x1b[36m(TaskRunner pid=7)\x1b[0m "
CONFIG = {"trainer": {"project_name": "gsm8k", "experiment_name": "grpo-7b", "total_epochs": 1, "nnodes": 1},
          "data": {"train_batch_size": 8}}


ALICE = f"alice({os.getuid()})"  # the job's user owns its output files: here, this process's user


def scontrol_line(job_id="42", name="grpo-qwen", user=ALICE, state="RUNNING", exit_code="0:0",
                  stdout="/home/alice/runs/%x-%j.out", stderr=None, workdir="/home/alice/runs", gres=True) -> str:
    stderr = stdout if stderr is None else stderr
    details = " Nodes=gpu03 CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1)" if gres else ""
    return (f"JobId={job_id} JobName={name} UserId={user} GroupId=alice(1001) MCS_label=N/A Priority=4294901759 "
            f"Nice=0 Account=(null) QOS=normal JobState={state} Reason=None Dependency=(null) Requeue=1 Restarts=0 "
            f"BatchFlag=1 Reboot=0 ExitCode={exit_code} DerivedExitCode=0:0 RunTime=00:00:05 TimeLimit=UNLIMITED "
            f"Partition=gpu AllocNode:Sid=login1:1234 ReqNodeList=(null) ExcNodeList=(null) NodeList=gpu[03-04] "
            f"BatchHost=gpu03 NumNodes=2 NumCPUs=2 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
            f"TRES=cpu=2,node=1,billing=2,gres/gpu=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
            f"JOB_GRES=gpu:2{details} MinCPUsNode=1 Features=(null) OverSubscribe=OK Command=(null) "
            f"WorkDir={workdir} StdErr={stderr} StdIn=/dev/null StdOut={stdout} Power=\n")


def test_fields_of_scontrol_one_line():
    fields = parse_fields(scontrol_line())
    assert fields["JobId"] == "42" and fields["TRES"] == "cpu=2,node=1,billing=2,gres/gpu=2"
    assert fields["AllocNode:Sid"] == "login1:1234" and fields["Power"] == ""
    job = SlurmJob.parse(scontrol_line(workdir="/home/alice/my runs"))
    assert (job.job_name, job.user, job.partition, job.work_dir) == ("grpo-qwen", "alice", "gpu", "/home/alice/my runs")
    assert job.gres_gpus == ("0", "1") and job.batch_host == "gpu03"
    assert SlurmJob.parse("slurm_load_jobs error: Invalid job id specified\n") is None


@pytest.mark.parametrize("pattern, expected", [
    ("/r/%x-%j.out", "/r/grpo-qwen-42.out"),
    ("slurm-%j.out", "/home/alice/runs/slurm-42.out"),  # relative to WorkDir
    ("/r/%u/%N/%A_%a.log", "/r/alice/gpu03/42_4294967294.log"),
    ("/r/100%%-%4j.log", "/r/100%-0042.log"),
    ("/r/\\%j.log", "/r/%j.log"),  # a backslash turns the symbols off
    ("/r/already-42.out", "/r/already-42.out"),
    ("/dev/null", None), ("(null)", None), ("", None),
])
def test_output_patterns_resolve(pattern, expected):
    assert resolve_path(pattern, SlurmJob.parse(scontrol_line())) == expected


def test_array_jobs_and_host_lists():
    job = SlurmJob.parse(scontrol_line().replace("JobId=42 ", "JobId=43 ArrayJobId=40 ArrayTaskId=3 "))
    assert resolve_path("/r/%A_%a-%j", job) == "/r/40_3-43"
    assert first_node("gpu[03-05,9],cpu1") == "gpu03" and first_node("node7") == "node7" and first_node("") == ""
    assert gpu_list("0-2,5") == ("0", "1", "2", "5") and gpu_list("GPU-ab,GPU-cd") == ("GPU-ab", "GPU-cd")
    assert gpu_list("N/A") == ()


def fake_process(proc: Path, pid: int, env: dict[str, str] | None = None, cgroup: str = "0::/user.slice\n") -> None:
    base = proc / str(pid)
    base.mkdir(parents=True, exist_ok=True)
    (base / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()) + b"\0")
    (base / "cgroup").write_text(cgroup)


def test_jobs_are_found_by_environment_or_cgroup_and_the_exporter_is_not(tmp_path):
    proc = tmp_path / "proc"
    fake_process(proc, 100, {"PATH": "/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2,3",
                             "CUDA_VISIBLE_DEVICES": "0,1"})
    fake_process(proc, 101, {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "0,1"})
    fake_process(proc, 200, {}, cgroup="0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n")
    fake_process(proc, 300, {"HOME": "/root"})
    fake_process(proc, 400, {"SLURM_JOB_ID": "42"})  # the exporter itself
    (proc / "self").mkdir()
    jobs = scan_proc(str(proc), own_pid=400)
    assert set(jobs) == {"42", "77"}
    me = os.getuid()
    assert jobs["42"].pids == {100, 101} and jobs["42"].uids == {me} and jobs["42"].of_user(me).gpus == ("2", "3")
    assert jobs["42"].gpus == () and jobs["42"].of_user(me + 1).gpus == ()  # only its user's processes say
    assert jobs["77"].pids == {200} and jobs["77"].of_user(me).gpus == ()


def test_environ_is_read_with_a_bound(tmp_path):
    path = tmp_path / "environ"
    path.write_bytes(b"A=" + b"x" * 1000 + b"\0SLURM_JOB_ID=5\0")
    assert read_environ(str(path), limit=100) == {}
    assert read_environ(str(path)) == {"SLURM_JOB_ID": "5"}
    assert read_environ(str(tmp_path / "missing")) == {}


class Cluster:
    """A fake node: /proc entries, scontrol answers, the jobs' output files."""

    def __init__(self, tmp_path: Path):
        self.proc = tmp_path / "proc"
        self.proc.mkdir()
        self.runs = tmp_path / "runs"
        self.runs.mkdir()
        self.answers: dict[str, str] = {}
        self.asked: list[str] = []

    def scontrol(self, job_id: str) -> str | None:
        self.asked.append(job_id)
        return self.answers.get(job_id)

    def start(self, job_id: str, pids=(1000,), node: str | None = None, **line) -> None:
        """The job's processes on this node; ``node``: the SLURMD_NODENAME they carry (none by default)."""
        line.setdefault("stdout", "%x-%j.out")  # relative to WorkDir, patterns left to resolve
        self.answers[job_id] = scontrol_line(job_id=job_id, workdir=str(self.runs), **line)
        env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_GPUS": "0,1", **({"SLURMD_NODENAME": node} if node else {})}
        for pid in pids:
            fake_process(self.proc, pid, env)

    def end(self, job_id: str, pids=(1000,), state="COMPLETED", exit_code="0:0", reason="None") -> None:
        for pid in pids:
            for name in ("environ", "cgroup"):
                (self.proc / str(pid) / name).unlink()
            (self.proc / str(pid)).rmdir()
        self.answers[job_id] = self.answers[job_id].replace("JobState=RUNNING", f"JobState={state}").replace(
            "ExitCode=0:0", f"ExitCode={exit_code}").replace("Reason=None", f"Reason={reason}")


@pytest.fixture
def node(tmp_path):
    cluster = Cluster(tmp_path)
    store = RunStore(default_catalog())
    watcher = SlurmWatcher(store, proc_root=str(cluster.proc), scontrol=cluster.scontrol, hostname="gpu03",
                           own_pid=os.getpid())
    return cluster, store, watcher


def write_log(path: Path, steps: int, total: int | None = None, config: bool = True) -> None:
    lines = ["2024-01-02 03:04:05,678\tINFO worker.py:1 -- Started a local Ray instance."]
    if config:
        lines += [PREFIX + row for row in pprint.pformat(CONFIG).splitlines()]
    if total is not None:
        lines.append(PREFIX + f"Total training steps: {total}")
    lines += [PREFIX + f"step:{step} - actor/pg_loss:{0.5 / step} - critic/score/mean:0.{step}"
              for step in range(1, steps + 1)]
    path.write_text("\n".join(lines) + "\n")


def poll(watcher: SlurmWatcher) -> None:
    watcher.refresh()
    watcher.poll_all()
    watcher.poll_all()


def families(watcher: SlurmWatcher) -> dict:
    return {family.name: family.samples for family in JobInfoCollector(watcher.rows, serves_running=True).collect()}


def test_a_job_that_reaches_its_last_step_finishes(node):
    cluster, store, watcher = node
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=3)
    cluster.start("42")
    poll(watcher)
    assert [source.pattern for f in watcher.jobs.values() for source in f.sources] == [
        str(cluster.runs / "grpo-qwen-42.out")]
    run = RunKey("gsm8k", "grpo-7b", ME)  # named by the config print, owned by the job's user
    got = families(watcher)
    # Account=(null): Slurm knows no account of the job, so the run's owner has no team
    assert [s.labels for s in got["verl_job_info"]] == [{
        "project": "gsm8k", "experiment": "grpo-7b", "user": ME, "team": "", "scheduler": "slurm", "job_id": "42",
        "job_name": "grpo-qwen", "partition": "gpu", "namespace": "", "pod": ""}]
    assert [s.labels["gpu"] for s in got["verl_job_gpu_info"]] == ["0", "1"]
    assert [(s.labels, s.value) for s in got["verl_job_running"]] == [(
        {"project": "gsm8k", "experiment": "grpo-7b", "user": ME, "team": ""}, 1.0)]
    assert watcher.pids() == {1000}
    with open(cluster.runs / "grpo-qwen-42.out", "a") as log:  # the last step, written as the job ends
        log.write(PREFIX + "step:3 - actor/pg_loss:0.1\n")
    cluster.end("42")
    watcher.refresh()
    assert store.run(run).finished and store.run(run).last_step == 3
    assert watcher.jobs == {} and watcher.sources() == [] and watcher.pids() == set()
    assert [s.value for s in families(watcher)["verl_job_running"]] == [0.0]
    assert [(s.labels["state"], s.labels["exit_code"], s.labels["reason"])
            for s in families(watcher)["verl_job_ended_timestamp_seconds"]] == [("COMPLETED", "0:0", "")]
    assert cluster.asked == ["42", "42"]  # once when found, once when it ended
    poll(watcher)
    assert cluster.asked == ["42", "42"]


def test_a_job_that_stops_early_is_counted_as_crashed(node):
    cluster, store, watcher = node
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=5)
    cluster.start("42")
    poll(watcher)
    assert families(watcher)["verl_job_ended_timestamp_seconds"] == []  # while it runs
    cluster.end("42", state="TIMEOUT", exit_code="0:15", reason="TimeLimit")
    before = time.time()
    watcher.refresh()
    state = store.run(RunKey("gsm8k", "grpo-7b", ME))
    assert not state.finished and state.last_step == 2 and state.total_steps == 5
    got = families(watcher)
    assert [s.value for s in got["verl_job_running"]] == [0.0] and len(got["verl_job_info"]) == 1
    # how Slurm ended it, for the crash page
    [ended] = got["verl_job_ended_timestamp_seconds"]
    assert ended.labels == {"project": "gsm8k", "experiment": "grpo-7b", "user": ME, "team": "", "scheduler": "slurm",
                            "job_id": "42", "state": "TIMEOUT", "exit_code": "0:15", "reason": "TimeLimit"}
    assert before <= ended.value <= time.time()


def test_a_worker_node_attributes_itself_to_the_run_without_serving_its_figures(node):
    cluster, store, watcher = node
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=5)  # on the shared file system
    cluster.start("42", node="gpu04")  # BatchHost=gpu03: this node is a worker of the job
    poll(watcher)
    run = RunKey("gsm8k", "grpo-7b", ME)
    assert store.snapshot().runs == []  # the head node serves the training figures, not this one
    got = families(watcher)
    assert [(s.labels["project"], s.labels["experiment"], s.labels["job_id"]) for s in got["verl_job_info"]] == [
        ("gsm8k", "grpo-7b", "42")]  # named by the config print it read
    assert [s.labels["gpu"] for s in got["verl_job_gpu_info"]] == ["0", "1"]
    assert watcher.node_runs() == {run} and watcher.pids() == {1000}
    watcher.refresh()  # named: no more of the output is read here
    assert watcher.jobs["42"].sources == [] and watcher.sources() == []
    assert watcher.node_runs() == {run}
    assert [s.labels["experiment"] for s in families(watcher)["verl_job_info"]] == ["grpo-7b"]
    cluster.end("42", state="FAILED", exit_code="1:0")
    watcher.refresh()
    assert cluster.asked == ["42"]  # the batch host decides the run: no question about its end here
    assert watcher.node_runs() == set() and store.snapshot().runs == []
    assert [s.value for s in families(watcher)["verl_job_running"]] == [0.0]
    assert families(watcher)["verl_job_ended_timestamp_seconds"] == []  # the batch host says how it ended


def test_a_worker_that_cannot_read_the_output_makes_up_no_run(node, caplog):
    cluster, store, watcher = node
    cluster.start("42", node="gpu04", stdout="/nonexistent/shared/%x-%j.out")
    poll(watcher)
    assert watcher.node_runs() == set() and families(watcher)["verl_job_info"] == []
    assert watcher.pids() == {1000}  # its processes are still the job's
    assert "cannot follow /nonexistent/shared/grpo-qwen-42.out" in caplog.text


def test_a_crashed_runs_node_is_free_once_its_job_ended(node):
    cluster, store, watcher = node
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=5)
    cluster.start("42", node="gpu03")  # this node is the batch host
    poll(watcher)
    run = RunKey("gsm8k", "grpo-7b", ME)
    assert watcher.node_runs() == {run} and store.run(run).last_step == 2
    cluster.end("42", state="FAILED", exit_code="1:0")
    watcher.refresh()
    assert not store.run(run).finished  # crashed: still served, for the alerts
    assert watcher.node_runs() == set()  # but the node no longer works for it


def run_as(cluster, pids, uid: int) -> None:
    """The fake processes run as ``uid`` (their /proc/PID belongs to it)."""
    for pid in pids:
        os.chown(cluster.proc / str(pid), uid, -1)


@pytest.mark.skipif(os.geteuid() != 0, reason="making processes of another user takes root")
def test_an_output_file_of_another_user_is_not_read(node, caplog):
    cluster, store, watcher = node
    write_log(cluster.runs / "secret.log", steps=2, total=2)  # this process's file, not the job user's
    (cluster.runs / "link.out").symlink_to(cluster.runs / "secret.log")
    uid = os.getuid() + 4242
    cluster.start("42", user=f"mallory({uid})", stdout="secret.log")
    cluster.start("43", pids=(1001,), user=f"mallory({uid})", stdout="link.out")
    run_as(cluster, (1000, 1001), uid)
    poll(watcher)
    assert store.snapshot().runs == [] and watcher.rows() == []
    assert f"belongs to uid {os.getuid()}, not to uid {uid}" in caplog.text
    assert SlurmJob.parse(scontrol_line(user="bob(1002)")).uid == 1002
    assert SlurmJob.parse(scontrol_line(user="bob")).uid is None  # no uid given: no owner check


@pytest.mark.skipif(os.geteuid() != 0, reason="making processes of another user takes root")
def test_a_job_name_that_claims_another_user_is_not_believed(node, caplog):
    cluster, store, watcher = node
    write_log(cluster.runs / "secret.log", steps=2, total=2)  # root's file
    mallory = os.getuid() + 4242
    # sbatch --job-name='x UserId=root(0)': scontrol's one line does not escape it, and the first
    # UserId= it shows is the name's.
    cluster.start("42", name="x UserId=root(0) GroupId=root(0)", user=f"mallory({mallory})", stdout="secret.log")
    run_as(cluster, (1000,), mallory)
    assert SlurmJob.parse(cluster.answers["42"]).uid == 0
    poll(watcher)
    assert store.snapshot().runs == [] and watcher.rows() == [] and watcher.jobs["42"].sources == []
    assert f"Slurm says uid 0 runs it, its processes here run as {mallory}; its files are not read" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="making processes of another user takes root")
def test_another_users_process_cannot_speak_for_a_job(node):
    cluster, store, watcher = node
    alice, intruder = os.getuid() + 1001, os.getuid() + 4242
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=5)
    os.chown(cluster.runs / "grpo-qwen-42.out", alice, -1)
    cluster.start("42", node="gpu03", user=f"alice({alice})")  # its own task: this node is its batch host
    run_as(cluster, (1000,), alice)
    fake_process(cluster.proc, 2000, {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu99", "SLURM_JOB_GPUS": "7"})
    run_as(cluster, (2000,), intruder)
    poll(watcher)
    followed = watcher.jobs["42"]
    assert followed.head and followed.local.gpus == ("0", "1") and followed.local.node == "gpu03"
    assert store.run(RunKey("gsm8k", "grpo-7b", user_name(alice))).last_step == 2  # served here, as the batch host's
    assert watcher.pids() == {1000}  # the intruder's process is not the job's: its memory and CPU are not counted


def test_who_owns_a_job():
    assert job_owner(1001, {1001, 0}) == 1001  # the user's tasks, root's slurmstepd
    assert job_owner(1001, {1002}) is None  # no process of Slurm's user: not believed
    assert job_owner(0, {0}) == 0 and job_owner(0, {0, 1001}) is None
    assert job_owner(None, {1001}) == 1001 and job_owner(None, {1001, 0}) is None


def test_a_run_without_config_print_is_named_by_the_job_and_its_length_unknown(node):
    cluster, store, watcher = node
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, config=False)
    write_log(cluster.runs / "grpo-qwen-43.out", steps=2, config=False)
    cluster.start("42", pids=(1000,))
    cluster.start("43", pids=(1001,))
    poll(watcher)
    assert {(s.labels["project"], s.labels["experiment"]) for s in families(watcher)["verl_job_info"]} == {
        ("grpo-qwen", "42"), ("grpo-qwen", "43")}
    cluster.end("42", pids=(1000,))  # COMPLETED 0:0: finished, though verl printed no total
    cluster.end("43", pids=(1001,), state="CANCELLED", exit_code="0:15")
    watcher.refresh()
    assert store.run(RunKey("grpo-qwen", "42", ME)).finished
    assert not store.run(RunKey("grpo-qwen", "43", ME)).finished


def test_an_ended_job_slurm_still_calls_running_is_looked_at_again(node):
    cluster, store, watcher = node
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, config=False)
    cluster.start("42")
    poll(watcher)
    cluster.end("42", state="COMPLETING")
    watcher.refresh()
    assert "42" in watcher.jobs  # its state is not settled yet
    cluster.answers["42"] = cluster.answers["42"].replace("JobState=COMPLETING", "JobState=COMPLETED")
    watcher.refresh()
    assert watcher.jobs == {} and store.run(RunKey("grpo-qwen", "42", ME)).finished


def test_a_file_without_verl_lines_and_dev_null_make_no_run(node):
    cluster, store, watcher = node
    (cluster.runs / "plain-44.out").write_text("hello\nTraceback (most recent call last):\nstep: nothing\n")
    cluster.start("44", name="plain")
    cluster.start("45", pids=(1001,), stdout="/dev/null")
    poll(watcher)
    assert len(watcher.jobs) == 2 and watcher.jobs["45"].sources == []
    assert watcher.rows() == [] and store.snapshot().runs == []
    assert families(watcher)["verl_job_info"] == []


def test_stdout_and_stderr_apart_feed_one_run(node):
    cluster, store, watcher = node
    out, err = cluster.runs / "j.out", cluster.runs / "j.err"
    write_log(out, steps=2, total=2)
    err.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom\n")
    cluster.start("46", stdout=str(out), stderr=str(err))
    watcher.refresh()
    watcher.poll_all()  # stdout first: it names the run
    state = store.run(RunKey("gsm8k", "grpo-7b", ME))
    assert state.last_step == 2 and state.total_steps == 2 and state.finished
    assert state.log_errors == {"traceback": 1}  # stderr's traceback is the run's
    assert len(families(watcher)["verl_job_info"]) == 1


def test_scontrol_not_answering_is_asked_again(node):
    cluster, store, watcher = node
    cluster.start("47")
    del cluster.answers["47"]
    watcher.refresh()
    assert watcher.jobs == {}
    cluster.answers["47"] = scontrol_line(job_id="47", workdir=str(cluster.runs))
    watcher.refresh()
    assert set(watcher.jobs) == {"47"}


def test_the_job_selector_takes_the_jobs_pids():
    own = os.getpid()
    selector = JobSelector(pids=lambda: {own, 999_999_999})
    assert selector.configured and selector.pids() == set()  # never the exporter itself; gone pids skipped
    parent = os.getppid()
    assert parent in JobSelector(pids=lambda: [parent]).pids()


def test_slurm_excludes_job_flags_and_serves_job_info(tmp_path):
    from verl_exporter.app import Exporter
    from verl_exporter.config.options import OptionsError, load_options

    with pytest.raises(OptionsError, match="--slurm"):
        Exporter(load_options(["--slurm", "--job.match", "python", "--gpu.fake", "healthy:2"]))
    app = Exporter(load_options(["--slurm", "--gpu.fake", "healthy:2", "--no-forensics"]))
    assert app.slurm is not None and "job_info" in app.collectors
    assert load_options(["--slurm", "--slurm.poll-interval", "2s"]).slurm_poll_interval == 2.0


def test_a_job_whose_files_hang_stops_only_its_own_reading(node, monkeypatch, caplog):
    import threading

    from verl_exporter.schedulers import slurm

    cluster, store, watcher = node
    monkeypatch.setattr(slurm, "READ_STOP_TIMEOUT", 0.2)
    write_log(cluster.runs / "grpo-qwen-42.out", steps=1, total=9)  # on a mount that stops answering
    log_43 = cluster.runs / "other-43.out"
    write_log(log_43, steps=1, total=9, config=False)
    cluster.start("42")
    cluster.start("43", pids=(1001,), name="other")
    watcher.refresh()
    released = threading.Event()
    hanging = watcher.jobs["42"].sources[0]
    monkeypatch.setattr(hanging, "poll", lambda: released.wait(30) and 0)
    for followed in watcher.jobs.values():
        followed.reader.interval = 0.01
        followed.reader.start()
    try:
        with open(log_43, "a") as log:
            log.write("step:2 - actor/pg_loss:0.1\n")
        other = RunKey("other", "43", ME)
        deadline = time.monotonic() + 10
        while (store.run(other) is None or store.run(other).last_step != 2) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.run(other).last_step == 2  # read on while job 42's reading hangs
        cluster.end("42", state="FAILED", exit_code="1:0")
        started = time.monotonic()
        watcher.refresh()
        assert time.monotonic() - started < 5  # the look does not wait for the hung read
        assert "42" not in watcher.jobs and "reading its files hangs" in caplog.text
        assert "43" in watcher.jobs and watcher.jobs["43"].reader.running
    finally:
        released.set()
        for followed in watcher.jobs.values():
            followed.reader.stop()


def test_a_jobs_gpus_are_those_nvml_sees_its_processes_on(node):
    """Slurm numbers GPUs in gres.conf's order, NVML in PCI bus order: once the job's processes run
    on GPUs, verl_job_gpu_info names NVML's indices of those GPUs (the ones the GPU series carry);
    until then, and without NVML, SLURM_JOB_GPUS."""
    from verl_exporter.collectors.gpu import GpuCollector
    from verl_exporter.gpu.fake import FakeNvmlBackend

    cluster, _, watcher = node
    write_log(cluster.runs / "grpo-qwen-42.out", steps=2, total=5)
    cluster.start("42", pids=(1000, 1001))
    fake_process(cluster.proc, 2000, {"SLURM_JOB_ID": "99"})  # another job's process, on GPU 0
    processes: dict[int, list[tuple[int, int]]] = {}
    gpu = GpuCollector(FakeNvmlBackend(gpus=4, processes=processes))
    watcher.gpus_in_use = gpu.gpus_used_by
    poll(watcher)

    def job_gpus():
        return [s.labels["gpu"] for s in families(watcher)["verl_job_gpu_info"]]

    assert job_gpus() == ["0", "1"]  # nothing read from NVML yet: Slurm's list
    list(gpu.collect())
    assert job_gpus() == ["0", "1"]  # read, but no process of the job on a GPU yet
    processes.update({0: [(2000, 1 << 30)], 2: [(1001, 1 << 30)], 3: [(1000, 1 << 30), (2000, 1)]})
    list(gpu.collect())
    assert job_gpus() == ["2", "3"]
    cluster.end("42", pids=(1000, 1001))
    watcher.refresh()
    assert job_gpus() == ["0", "1"]  # an ended job holds no GPU NVML could show


def test_slurm_wires_the_gpu_collector_into_the_watcher():
    from verl_exporter.app import Exporter
    from verl_exporter.config.options import load_options

    app = Exporter(load_options(["--slurm", "--gpu.fake", "healthy:2", "--no-forensics"]))
    assert app.slurm.gpus_in_use == app.collectors["gpu"].gpus_used_by
    no_gpu = Exporter(load_options(["--slurm", "--no-collector.gpu", "--no-forensics"]))
    assert "gpu" not in no_gpu.collectors and no_gpu.slurm.gpus_in_use is None


def test_how_a_job_ended_is_served_within_bounds():
    from verl_exporter.collectors.job_info import MAX_END_LABEL, JobEnd

    labels = JobEnd("CANCELLED" * 50, "0:15", "x" * 1000, 1.0).labels()
    assert [len(value) for value in labels] == [MAX_END_LABEL, 4, MAX_END_LABEL]
    job = SlurmJob.parse(scontrol_line(state="TIMEOUT").replace("Reason=None", "Reason=TimeLimit"))
    assert (job.state, job.reason) == ("TIMEOUT", "TimeLimit")
    assert SlurmJob.parse(scontrol_line()).reason == ""  # Slurm's "None"


@pytest.mark.parametrize("skipping", [True, False], ids=["quiet-lines-skipped", "every-line-read"])
def test_a_jobs_stderr_takes_the_run_its_stdout_named_at_its_first_line_even_a_quiet_one(
        tmp_path, monkeypatch, skipping):
    """The stderr file of a job takes the run the stdout file named when its first line arrives, a line
    skipped as quiet included: a later config print naming another run does not move the file."""
    from verl_exporter.schedulers.slurm_output import JobSource
    from verl_exporter.sources import source as source_module

    if not skipping:
        monkeypatch.setattr(source_module, "is_quiet", lambda line, trainer_exit: False)
    out, err = tmp_path / "train.log", tmp_path / "errors.txt"
    store = RunStore(default_catalog())
    default = RunKey("slurm", "42", ME)
    stdout = JobSource(str(out), store, default_run=default, both_files=True)
    stderr = JobSource(str(err), store, default_run=default, both_files=True)
    stdout.siblings, stderr.siblings = [stderr], [stdout]

    def write(path: Path, line: str, source: JobSource) -> None:
        with path.open("a") as handle:
            handle.write(line + "\n")
        source.poll()

    write(out, "{'trainer': {'project_name': 'p', 'experiment_name': 'first'}}", stdout)
    write(err, "/usr/lib/python3/site-packages/torch/cuda/__init__.py:61: FutureWarning: pynvml is deprecated",
          stderr)
    write(out, "{'trainer': {'project_name': 'p', 'experiment_name': 'second'}}", stdout)
    write(err, "Traceback (most recent call last):", stderr)
    errors = {state.run.experiment: dict(state.log_errors) for state in store.snapshot().runs if state.log_errors}
    assert errors == {"first": {"traceback": 1}}
    assert {run.experiment for run in stderr.runs()} == {"first"}
