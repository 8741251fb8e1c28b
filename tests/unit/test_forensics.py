"""Evidence on a stall: when a run counts as stalled (once per stall), what a capture holds and how
big it may get, py-spy's failures, the job's GPUs, the files and their retention, the endpoint."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import bcrypt
import pytest

from owner import ME
from servers import http_get
from verl_exporter.collectors.gpu import GpuCollector
from verl_exporter.config.options import OPTIONS, OptionsError, load_options
from verl_exporter.exposition import Exposition
from verl_exporter.forensics import EvidenceArchive, Forensics, Stall, StallWatch, logtail, stacks
from verl_exporter.forensics.archive import file_name, safe_name
from verl_exporter.forensics.gpus import describe_gpus
from verl_exporter.forensics.report import render
from verl_exporter.gpu.fake import GIB, FakeNvmlBackend
from verl_exporter.http.server import serve
from verl_exporter.http.web_config import WebConfig
from verl_exporter.sources.open_files import OPEN_FILES, FileHandle
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("gsm8k", "ppo-qwen", ME)
REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_store(clock) -> RunStore:
    return RunStore(default_catalog(), clock=clock)


def followed(path) -> None:
    """``path`` as a log follower opened it (the evidence reads only the files followers read)."""
    info = os.stat(path)
    OPEN_FILES.add(FileHandle(str(path), None, (info.st_dev, info.st_ino)))


def step(store, clock, number, seconds=None, run=RUN, source="/logs/train.log"):
    """A step of ``run`` read from ``source``, a file the operator named (so two files may feed it)."""
    if os.path.isfile(source):
        followed(source)
    values = {"actor/pg_loss": 0.1}
    if seconds is not None:
        values["timing_s/step"] = seconds
    store.ingest(Record(run, number, values, time=clock.now, source=source, named=True))


# -- when a run has stalled -----------------------------------------------------------------------


def test_a_stall_is_longer_than_stall_after_and_five_median_steps_and_is_reported_once():
    clock = Clock()
    store = make_store(clock)
    watch = StallWatch(store, stall_after=60, clock=clock)
    for number, seconds in enumerate([90.0, 100.0, 110.0], start=1):
        step(store, clock, number, seconds)
        assert watch.check() == []
        clock.now += seconds
    assert watch.median_step_seconds(RUN) == 100.0 and watch.threshold(RUN) == 500.0
    clock.now += 500 - 110  # 500 s since step 3: not yet
    assert watch.check() == []
    clock.now += 1
    [stall] = watch.check()
    assert stall.kind == "no_step" and stall.run == RUN and stall.sources == ["/logs/train.log"]
    assert "since step 3" in stall.why and "5 x the median step time 1m40s" in stall.why
    clock.now += 3600
    assert watch.check() == []  # the same stall: once
    step(store, clock, 4, 100.0)  # a step ends it
    assert watch.check() == []
    clock.now += 501
    assert [s.kind for s in watch.check()] == ["no_step"]  # the next stall is reported again


def test_without_step_times_stall_after_alone_counts():
    clock = Clock()
    store = make_store(clock)
    watch = StallWatch(store, stall_after=60, clock=clock)
    step(store, clock, 1)
    clock.now += 60
    assert watch.check() == []
    clock.now += 1
    [stall] = watch.check()
    assert "--forensics.stall-after 1m; no step time known" in stall.why


def test_no_first_step_an_hour_after_the_first_line():
    clock = Clock()
    store = make_store(clock)
    watch = StallWatch(store, stall_after=600, clock=clock)
    store.ingest(Record(RUN, 0, run_config={"trainer.total_training_steps": 10}, time=clock.now))
    clock.now += 3599
    assert watch.check() == []
    clock.now += 2
    [stall] = watch.check()
    assert stall.kind == "no_first_step" and "no first step 1h after the run's first line" in stall.why
    longer = StallWatch(store, stall_after=7200, clock=clock)  # a longer stall-after waits longer
    assert longer.check() == []


def test_the_trainers_fatal_end_is_captured_at_once_and_once():
    clock = Clock()
    store = make_store(clock)
    watch = StallWatch(store, stall_after=600, clock=clock)
    step(store, clock, 1, 100.0)
    assert watch.check() == []
    store.ingest(Record(RUN, 1, fatal="cuda_oom", line="ray.exceptions.RayTaskError(OutOfMemoryError): "
                        "ray::TaskRunner.run()", time=clock.now))
    [stall] = watch.check()
    assert stall.kind == "fatal" and stall.why == "the trainer's output ended in a fatal cuda_oom error at step 1"
    clock.now += 3600
    assert watch.check() == []  # the same stop: not again as a stall


def test_finished_runs_do_not_stall():
    clock = Clock()
    store = make_store(clock)
    watch = StallWatch(store, stall_after=60, clock=clock)
    step(store, clock, 5)
    store.ingest(Record(RUN, 5, finished=True, time=clock.now))
    clock.now += 3600
    assert watch.check() == []


def test_the_jobs_exit_is_a_stall_of_this_nodes_unfinished_runs_after_a_grace():
    clock = Clock()
    store = make_store(clock)
    other = RunKey("shared", "someone-else", ME)
    watch = StallWatch(store, stall_after=3600, exit_grace=2.0, clock=clock)
    step(store, clock, 1)
    step(store, clock, 1, run=other)
    mine = lambda: [RUN]  # noqa: E731
    assert watch.check(False, mine) == []  # never seen running: an old log, not an exit
    assert watch.check(True, mine) == []
    clock.now += 1
    assert watch.check(False, mine) == []  # gone, but its last lines may not be read yet
    clock.now += 2
    [stall] = watch.check(False, mine)
    assert stall.kind == "job_exited" and stall.run == RUN and "after step 1" in stall.why
    clock.now += 3601
    assert [s.run for s in watch.check(False, mine)] == [other]  # RUN's stall was reported already


def test_at_most_limit_stalls_per_check_the_others_next_time():
    clock = Clock()
    store = make_store(clock)
    watch = StallWatch(store, stall_after=60, clock=clock)
    for index in range(3):
        step(store, clock, 1, run=RunKey("p", f"e{index}", ME))
    clock.now += 61
    assert len(watch.check(limit=2)) == 2
    assert len(watch.check(limit=2)) == 1
    assert watch.check(limit=2) == []


def test_the_files_of_a_run_are_remembered_latest_first():
    clock = Clock()
    store = make_store(clock)
    watch = StallWatch(store, stall_after=60, clock=clock)
    for number, source in enumerate(["/a.log", "/b.jsonl", "/a.log"]):
        step(store, clock, number, source=source)
        watch.check()
    clock.now += 61
    assert watch.check()[0].sources == ["/a.log", "/b.jsonl"]


# -- the end of a log ----------------------------------------------------------------------------


def test_the_tail_is_read_from_the_end_in_bounded_reads(tmp_path, monkeypatch):
    path = tmp_path / "big.log"
    with path.open("w") as handle:
        for number in range(200_000):
            handle.write(f"(TaskRunner pid=1) step:{number} - actor/pg_loss:0.1\n")
    read = []
    real_open = open

    class Counting:
        def __init__(self, *args, **kwargs):
            self.handle = real_open(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def read(self, size=-1):
            assert size >= 0, "never the whole file"
            data = self.handle.read(size)
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self.handle, name)

    monkeypatch.setattr(logtail, "open", Counting, raising=False)
    tail = logtail.read_tail(str(path), follower_read=False)
    assert sum(read) <= logtail.MAX_TAIL_BYTES < path.stat().st_size
    assert tail.lines[-1] == "(TaskRunner pid=1) step:199999 - actor/pg_loss:0.1"
    assert tail.lines[0].startswith("(TaskRunner pid=1) step:")  # the line cut by the limit is left out
    assert tail.phase() == ("step", tail.lines[-1])


def test_progress_bars_colours_and_long_lines(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"\x1b[36m(TaskRunner pid=7)\x1b[0m Total training steps: 100\n"
                     b"Training Progress:   1%|  | 1/100\rTraining Progress:   2%|  | 2/100\r\n"
                     + b"x" * 5000 + b"\ncaf\xc3\xa9 \xff\n")
    tail = logtail.read_tail(str(path), follower_read=False)
    assert tail.lines[0] == "(TaskRunner pid=7) Total training steps: 100"
    assert tail.lines[1] == "Training Progress:   2%|  | 2/100"
    assert tail.lines[2].endswith("[line cut]") and len(tail.lines[2]) < 1100
    assert tail.lines[3] == "caf\u00e9 \ufffd"
    assert tail.phase() == ("progress", "Training Progress:   2%|  | 2/100")


@pytest.mark.parametrize("line, phase", [
    ('{"step": 12, "data": {"actor/pg_loss": 0.1}}', "step"),
    ("(TaskRunner pid=3) local_global_step_folder: /ckpt/global_step_40", "checkpoint"),
    ("(WorkerDict pid=9) Saved model to /ckpt/global_step_40/actor", "checkpoint"),
    ("(TaskRunner pid=3) Initial validation metrics: {'val-core/gsm8k/acc/mean@1': 0.3}", "validation"),
    ("(TaskRunner pid=3) Total training steps: 100", "setup"),
    ("(raylet) some warning", None),
])
def test_the_last_phase(tmp_path, line, phase):
    path = tmp_path / "x.log"
    path.write_text(line + "\nunrelated line\n")
    found = logtail.read_tail(str(path), follower_read=False).phase()
    assert (found[0] if found else None) == phase


def test_a_missing_file_says_why(tmp_path):
    tail = logtail.read_tail(str(tmp_path / "gone.log"), follower_read=False)
    assert tail.error and tail.lines == []


# -- py-spy ------------------------------------------------------------------------------------------


def fake_process(pid, command="python -m verl.trainer.main_ppo"):
    return SimpleNamespace(pid=pid, cmdline=lambda: command.split(), name=lambda: "python")


def fake_py_spy(outcomes):
    """A subprocess.run that answers each pid as ``outcomes`` says."""
    def run(argv, **kwargs):
        assert argv[1:3] == ["dump", "--pid"] and kwargs["timeout"] > 0
        outcome = outcomes[int(argv[3])]
        if outcome == "timeout":
            raise subprocess.TimeoutExpired(argv, kwargs["timeout"])
        code, out, err = outcome
        return subprocess.CompletedProcess(argv, code, out.encode(), err.encode())
    return run


def test_dumps_and_failures_one_line_each_kind():
    denied = (1, "", "Permission Denied: Try running again with elevated permissions\n")
    run = fake_py_spy({
        10: (0, 'Thread 10 (idle): "MainThread"\n    wait_for_allreduce (train.py:3)\n', ""),
        11: denied, 12: denied,
        13: (1, "", "Error: Failed to find python version from target process\n"),
        14: "timeout",
        15: (1, "", "Error: something else entirely\nmore\n"),
    })
    text = stacks.dump_job([fake_process(pid) for pid in range(10, 16)], py_spy="/bin/py-spy", run=run)
    assert "--- pid 10: python -m verl.trainer.main_ppo\n" in text and "wait_for_allreduce (train.py:3)" in text
    [denied_line] = [line for line in text.splitlines() if "ptrace denied" in line]
    assert denied_line.startswith("pids 11, 12:") and "SYS_PTRACE" in denied_line and "root" in denied_line
    assert "pids 13: not a Python process" in text
    assert "pids 14: py-spy took longer than" in text
    assert "py-spy failed: Error: something else entirely" in text


def test_missing_py_spy_and_no_process_are_one_line():
    assert stacks.dump_job([fake_process(1)], py_spy=None) == stacks.MISSING_HINT + "\n"
    assert "no live process of the job" in stacks.dump_job([], py_spy="/bin/py-spy")


def test_a_huge_dump_is_cut():
    run = fake_py_spy({1: (0, "frame\n" * 100_000, "")})
    text = stacks.dump_job([fake_process(1)], py_spy="/bin/py-spy", run=run)
    assert len(text) < stacks.MAX_DUMP_CHARS + 500 and "[dump cut]" in text


def test_py_spy_is_found_beside_the_exporters_python():
    found = stacks.find_py_spy()
    assert found is not None and Path(found).name == "py-spy"  # the test extra installs it


# -- GPUs ----------------------------------------------------------------------------------------------


def test_the_jobs_gpus_only_when_it_has_processes_on_some():
    backend = FakeNvmlBackend("hot", gpus=4, processes={0: [(4242, 60 * GIB)], 2: [(4243, 50 * GIB), (99, GIB)]})
    text = describe_gpus(GpuCollector(backend), {4242, 4243})
    lines = text.splitlines()
    assert lines[0] == "the job has processes on 2 of 4 GPUs"
    assert lines[1].startswith("gpu 0 NVIDIA H100") and "4242 60.0 GiB (job)" in lines[1]
    assert "hw_thermal_slowdown" in lines[1] and "uncorrectable ECC errors 1" in lines[1] and "XID 79 x1" in lines[1]
    assert lines[2].startswith("gpu 2 ") and "99 1.0 GiB" in lines[2] and len(lines) == 3
    assert describe_gpus(GpuCollector(backend), None).startswith("4 GPUs (no --job.pid")


def test_gpus_that_cannot_be_read_are_one_line():
    text = describe_gpus(GpuCollector(FakeNvmlBackend("library-missing")), set())
    assert text.startswith("GPUs could not be read: NVML library") and text.count("\n") == 1
    lost = describe_gpus(GpuCollector(FakeNvmlBackend("gpu-lost", gpus=4)), None)
    assert "\ngpu 3: LOST (no longer answers NVML)\n" in lost and lost.count("utilization") == 3


# -- the whole capture -------------------------------------------------------------------------------


class FakeJob:
    configured = True

    def __init__(self, processes):
        self._processes = processes

    def running(self):
        return bool(self._processes)

    def processes(self):
        return list(self._processes)


def stalled_forensics(tmp_path, *, node_runs=lambda: [RUN], py_spy=lambda: None, **kwargs):
    clock = Clock()
    store = make_store(clock)
    log = tmp_path / "train.log"
    log.write_text("".join(f"(TaskRunner pid=5) step:{n} - timing_s/step:10.0\n" for n in range(1, 80)))
    step(store, clock, 79, 10.0, source=str(log))
    oom = ("(WorkerDict pid=9) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
           "GPU 0 has a total capacity of 79.10 GiB of which 1.05 GiB is free.")
    store.ingest(Record(RUN, 79, error="cuda_oom", line=oom, time=clock.now, source=str(log)))
    forensics = Forensics(store, job=FakeJob([fake_process(77)]), gpu=GpuCollector(FakeNvmlBackend(gpus=2)),
                          node_runs=node_runs, stall_after=60, clock=clock, py_spy=py_spy, **kwargs)
    assert forensics.check() == []
    clock.now += 61
    return forensics, clock, oom


def test_a_capture_holds_why_the_phase_errors_gpus_stacks_and_the_tail(tmp_path):
    forensics, clock, oom = stalled_forensics(tmp_path)
    [stall] = forensics.check()
    text = forensics.evidence(RUN)
    assert text.startswith(f'verl-exporter evidence\nrun: project="gsm8k" experiment="ppo-qwen" user="{ME}"\n')
    assert f"why: {stall.why}\n" in text and "last step: 79 at" in text
    assert "last phase: step (in " in text and "step:79 - timing_s/step:10.0" in text
    assert "== errors the log shows: cuda_oom 1 ==\n" + oom + "\n" in text
    assert "== GPUs (NVML, at capture) ==\nthe job has no process on any of the 2 GPUs" in text
    assert "== stacks (py-spy dump) ==\n" + stacks.MISSING_HINT in text
    assert "== last 50 lines of " in text and "step:30 " in text and "step:29 " not in text
    assert forensics.check() == []  # once per stall
    assert forensics.evidence(RunKey("gsm8k", "other", ME)) is None
    assert forensics.evidence(RunKey("gsm8k", "ppo-qwen", ME + "-other")) is None  # another user's run of the names


def test_other_runs_of_a_shared_directory_get_no_stacks_or_gpus(tmp_path):
    forensics, clock, _ = stalled_forensics(tmp_path, node_runs=lambda: [])
    forensics.check()
    text = forensics.evidence(RUN)
    assert text.count("not captured: this exporter follows more unfinished runs") == 2
    assert "torch.OutOfMemoryError" in text


def test_a_capture_is_bounded_in_size(tmp_path):
    clock = Clock()
    store = make_store(clock)
    forensics = Forensics(store, job=FakeJob([fake_process(pid) for pid in range(32)]),
                          node_runs=lambda: [RUN], stall_after=60, clock=clock,
                          py_spy=lambda: "/bin/py-spy", max_bytes=64 * 1024)
    for index in range(8):
        log = tmp_path / f"rank{index}.log"
        log.write_text(("\u00e9" * 999 + "\n") * 300)
        step(store, clock, 1, source=str(log))
        forensics.check()
    for _ in range(40):
        store.ingest(Record(RUN, 1, error="traceback", line="Traceback (most recent call last):" + "y" * 400,
                            time=clock.now))
    run = fake_py_spy({pid: (0, "frame\n" * 10_000, "") for pid in range(32)})
    clock.now += 61
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stacks.subprocess, "run", run)
        forensics.check()
    text = forensics.evidence(RUN)
    assert len(text.encode()) <= 64 * 1024 and "[cut:" in text
    assert text.startswith("verl-exporter evidence\n") and "== errors the log shows: traceback 40 ==" in text
    big = render(Stall(RUN, "no_step", "why", []), None, now=clock.now, stacks="s" * 10**6, gpus="g" * 10**6,
                 tails=[])
    assert len(big.encode()) <= 256 * 1024


# -- files and retention ---------------------------------------------------------------------------


def test_files_are_named_safely_for_any_run_name(tmp_path):
    archive = EvidenceArchive(str(tmp_path / "evidence"), retention=100)
    names = ["../../etc/passwd", "a/b", "a?b", ".hidden", "", "\u00fcber \u5b9f\u9a13", "x" * 400, "nul\x00byte",
             "\ud800lone surrogate"]
    for index, project in enumerate(names):
        path = Path(archive.put(RunKey(project, "exp/1", ME), f"evidence {index}", 1_000_000.0 + index))
        assert path.parent == tmp_path / "evidence" and path.exists()
        assert len(path.name) < 200 and not path.name.startswith(".")
        assert set(path.name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    assert len(archive.files()) == len(names)
    assert safe_name("a/b") == safe_name("a?b") == "a_b"
    assert file_name(RunKey("a/b", "e", ME), 0) != file_name(RunKey("a?b", "e", ME), 0)  # kept apart by the hash


def test_retention_keeps_the_newest_files_and_leaves_others_alone(tmp_path):
    directory = tmp_path / "evidence"
    archive = EvidenceArchive(str(directory), retention=3)
    (directory / "notes.txt").write_text("mine")
    for index in range(5):
        archive.put(RunKey("p", f"e{index}", ME),
                    f'verl-exporter evidence\nrun: project="p" experiment="e{index}" user="{ME}"\n',
                    1_000_000.0 + index)
    files = archive.files()
    assert len(files) == 3 and [f.name.split("-")[3] for f in files] == ["e2", "e3", "e4"]
    assert (directory / "notes.txt").read_text() == "mine"
    restarted = EvidenceArchive(str(directory), retention=3)  # memory is gone: served from the files
    assert restarted.get(RunKey("p", "e4", ME)).endswith(f'experiment="e4" user="{ME}"\n')
    assert restarted.get(RunKey("p", "e0", ME)) is None
    assert restarted.get(RunKey("p", "e4", "another-user")) is None  # another user's run of the same names


def test_memory_keeps_the_latest_capture_of_a_bounded_number_of_runs():
    archive = EvidenceArchive(max_runs=2)
    for index in range(3):
        archive.put(RunKey("p", f"e{index}", ME), f"text {index}", float(index))
    archive.put(RunKey("p", "e2", ME), "newer", 9.0)
    assert archive.get(RunKey("p", "e0", ME)) is None and archive.get(RunKey("p", "e2", ME)) == "newer"
    assert archive.runs() == [RunKey("p", "e1", ME), RunKey("p", "e2", ME)]


def test_evidence_files_are_written_when_a_dir_is_given(tmp_path):
    forensics, clock, _ = stalled_forensics(tmp_path, directory=str(tmp_path / "ev"), retention=5)
    forensics.check()
    [path] = forensics.archive.files()
    assert path.read_text() == forensics.evidence(RUN)
    assert path.stat().st_mode & 0o077 == 0


# -- the endpoint --------------------------------------------------------------------------------


@pytest.fixture
def evidence_server():
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4))
    texts = {RUN: "verl-exporter evidence\nsome text\n"}
    server, _ = serve(("127.0.0.1", 0), Exposition([]), web=WebConfig(users={"prometheus": hashed}),
                      evidence=texts.get)
    yield f"http://127.0.0.1:{server.server_address[1]}", server
    server.shutdown()
    server.server_close()


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_the_endpoint_asks_for_the_password_like_metrics(evidence_server):
    url, _ = evidence_server
    path = f"/debug/evidence?project=gsm8k&experiment=ppo-qwen&user={ME}"
    assert http_get(url + path)[0] == 401
    assert http_get(url + path, headers=basic("prometheus", "wrong"))[0] == 401
    assert http_get(url + path, headers=basic("prometheus", "secret")) == (200, "verl-exporter evidence\nsome text\n")


@pytest.mark.parametrize("query, code, message", [
    ("", 400, "want ?project=P&experiment=E"),
    ("?project=gsm8k", 400, "want ?project=P&experiment=E"),
    ("?project=gsm8k&experiment=", 400, "want ?project=P&experiment=E"),
    (f"?project=gsm8k&experiment=other&user={ME}", 404,
     f"no evidence for project='gsm8k' experiment='other' user={ME!r}"),
    ("?project=gsm8k&experiment=ppo-qwen", 404, "no evidence for project='gsm8k' experiment='ppo-qwen' user=''"),
    (f"?project=gsm8k&experiment=ppo%2Dqwen&user={ME}", 200, "verl-exporter evidence"),
])
def test_the_endpoints_answers(evidence_server, query, code, message):
    url, _ = evidence_server
    status, body = http_get(url + "/debug/evidence" + query, headers=basic("prometheus", "secret"))
    assert status == code and message in body


def test_the_endpoint_when_forensics_is_off(evidence_server):
    url, server = evidence_server
    server.evidence = None
    status, body = http_get(url + "/debug/evidence?project=a&experiment=b", headers=basic("prometheus", "secret"))
    assert status == 404 and "forensics is off" in body


# -- flags ---------------------------------------------------------------------------------------


def test_flags_and_their_defaults():
    settings = load_options([])
    assert settings.forensics is True and settings.forensics_stall_after == 600
    assert settings.forensics_check_interval == 15 and settings.forensics_dir is None
    assert settings.forensics_retention == 50
    settings = load_options(["--no-forensics", "--forensics.stall-after", "1h", "--forensics.dir", "/tmp/x",
                            "--forensics.retention", "7"])
    assert (settings.forensics, settings.forensics_stall_after, settings.forensics_dir,
            settings.forensics_retention) == (False, 3600, "/tmp/x", 7)


@pytest.mark.parametrize("argv, message", [
    (["--forensics.stall-after", "soon"], "forensics.stall-after must be a duration"),
    (["--forensics.stall-after", "0"], "forensics.stall-after must be positive"),
    (["--forensics.check-interval", "0s"], "forensics.check-interval must be positive"),
    (["--forensics.retention", "0"], "forensics.retention must be positive"),
    (["--web.telemetry-path", "/debug/evidence"], "cannot be /debug/evidence"),
])
def test_bad_flags(argv, message):
    with pytest.raises(OptionsError, match=message):
        load_options(argv)


def test_the_forensics_docs_document_every_forensics_flag():
    docs = (REPO / "docs" / "forensics.md").read_text()
    assert docs.startswith("# When a run stops")
    for option in OPTIONS:
        if option.flag.startswith("forensics"):
            assert f"`--{option.flag}`" in docs or f"`--[no-]{option.flag}`" in docs, option.flag


def test_the_top_frame_is_the_first_thread_s_innermost_frame():
    from verl_exporter.forensics.stacks import top_frame

    dump = ("3 of the job's 3 processes, with py-spy\n--- pid 12: python train.py\nProcess 12: python train.py\n"
            "Python v3.11.7 (/usr/bin/python3.11)\n\nThread 12 (idle): \"MainThread\"\n"
            "    wait_for_allreduce (hung.py:5)\n    <module> (hung.py:9)\nThread 13 (idle): \"pt_autograd\"\n"
            "    run (threading.py:975)\n")
    assert top_frame(dump) == "wait_for_allreduce (hung.py:5)"
    assert top_frame("pids 12: ptrace denied: run as root\n") is None


def test_the_evidence_collector_serves_the_latest_captures_with_their_frames():
    from prometheus_client import CollectorRegistry, generate_latest

    from verl_exporter.collectors.evidence import EvidenceCollector
    from verl_exporter.schema import reserved_names
    from verl_exporter.store.records import RunKey

    class Captured:
        captured = {RunKey("gsm8k", "hung", ME): (1000.0, "wait_for_allreduce (hung.py:5)"),
                    RunKey("gsm8k", "denied", ME): (2000.0, "")}

    registry = CollectorRegistry()
    registry.register(EvidenceCollector(Captured()))
    text = generate_latest(registry).decode()
    assert ('verl_evidence_top_frame_info{experiment="hung",frame="wait_for_allreduce (hung.py:5)",project="gsm8k",'
            f'team="",user="{ME}"}} 1.0') in text
    assert (f'verl_evidence_captured_timestamp_seconds{{experiment="denied",project="gsm8k",team="",user="{ME}"}} '
            '2000.0') in text
    assert 'frame=""' not in text
    assert {"verl_evidence_top_frame_info", "verl_evidence_captured_timestamp_seconds"} <= reserved_names()


def test_a_checkpoint_save_under_way_is_no_stall_up_to_the_rules_ceiling():
    clock = Clock()
    store = make_store(clock)
    watch = StallWatch(store, stall_after=60, clock=clock)
    step(store, clock, 19, 100.0)
    store.ingest(Record(RUN, 19, {}, time=clock.now, checkpoint_step=20))
    clock.now += 2400  # a 40-minute save: no stall
    assert watch.check() == []
    clock.now += watch.save_ceiling
    [stall] = watch.check()  # past the ceiling it is one
    assert stall.kind == "no_step" and "since step 19" in stall.why


def test_under_slurm_a_runs_evidence_holds_its_own_jobs_stacks_only(tmp_path, monkeypatch):
    """Two jobs on the node: the stalled run's evidence dumps its job's processes, never the other
    job's (its command line may hold a secret)."""
    clock = Clock()
    store = make_store(clock)
    other = RunKey("root", "secret-job", ME)
    for run in (RUN, other):
        step(store, clock, 1, 10.0, run=run, source=str(tmp_path / f"{run.experiment}.log"))
    processes = [fake_process(11, "python train.py"), fake_process(22, "python serve.py --api-key=hunter2")]
    dumped = []
    run = fake_py_spy({11: (0, "Thread 11 (idle)\n    train (train.py:1)\n", ""),
                       22: (0, "Thread 22 (idle)\n    serve (serve.py:9)\n", "")})
    monkeypatch.setattr(stacks.subprocess, "run", lambda argv, **kw: dumped.append(int(argv[3])) or run(argv, **kw))
    forensics = Forensics(store, job=FakeJob(processes), node_runs=lambda: [RUN],
                          stall_after=60, clock=clock, py_spy=lambda: "/bin/py-spy",
                          pids_of_run=lambda key: {11} if key == RUN else {22})
    clock.now += 61
    assert RUN in {s.run for s in forensics.check()}
    text = forensics.evidence(RUN)
    assert "train.py" in text and "hunter2" not in text and "serve.py" not in text
    assert 22 not in dumped
