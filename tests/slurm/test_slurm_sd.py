"""``verl-exporter slurm-sd`` without a cluster: squeue and scontrol output as fixed strings."""

from __future__ import annotations

import functools
import gzip
import json
import logging
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from servers import free_port, http_get, wait_until
from verl_exporter.schedulers import slurm_sd
from verl_exporter.schedulers.slurm_sd import CachedTargets, Discovery, SlurmError

JOBS = [  # id, user, partition, node list, name
    ("4214", "dave", "gpu", "", "no-nodes-yet"),
    ("4211", "alice", "gpu", "gpu[01-02,07]", "verl-grpo-qwen7b"),
    ("4212", "bob", "gpu-long", "node3", "verl ppo | with a bar"),
    ("4213_5", "carol", "debug", "cpu1,gpu[10-11]", "sweep"),
]
HOSTNAMES = {
    "gpu[01-02,07]": "gpu01\ngpu02\ngpu07\n",
    "gpu[10-11]": "gpu10\ngpu11\n",
}


def squeue(fmt: str, jobs: list[tuple[str, ...]]) -> str:
    """What ``squeue --noheader --format=fmt`` prints for ``jobs``: ``%[.][size]X`` fields as
    squeue's ``_print_str`` writes them (cut to ``size`` bytes, padded with spaces), one line per job
    (a name's line breaks printed as they are)."""
    def field(job: tuple[str, ...], match: re.Match) -> bytes:
        value = job["iuPNj".index(match[3].decode())].encode("utf-8", "surrogateescape")
        if not match[2]:
            return value
        width = int(match[2])
        return value[:width].rjust(width) if match[1] else value[:width].ljust(width)
    lines = [re.sub(rb"%(\.?)(\d*)([iuPNj])", functools.partial(field, job), fmt.encode()) for job in jobs]
    return b"".join(line + b"\n" for line in lines).decode("utf-8", "surrogateescape")


class FakeSlurm:
    """Answers squeue for ``jobs`` in the format asked and scontrol show hostnames from HOSTNAMES;
    records calls."""

    def __init__(self, jobs: list[tuple[str, ...]] = JOBS):
        self.jobs = jobs
        self.calls: list[list[str]] = []
        self.fail: Exception | None = None

    def __call__(self, argv: list[str], timeout: float) -> str:
        self.calls.append(argv)
        if self.fail is not None:
            raise self.fail
        if argv[0] == "squeue":
            assert argv[3].startswith("--format="), argv
            return squeue(argv[3].removeprefix("--format="), self.jobs)
        assert argv[:3] == ["scontrol", "show", "hostnames"], argv
        return HOSTNAMES[argv[3]]


def labels(job_id, user, partition, name):
    return {"slurm_job_id": job_id, "slurm_user": user, "slurm_partition": partition, "slurm_job_name": name}


def parse(jobs: list[tuple[str, ...]], extra: str = "") -> list[slurm_sd.Job]:
    return slurm_sd.parse_squeue(extra + squeue(slurm_sd.SQUEUE_JOBS_FORMAT, jobs),
                                 squeue(slurm_sd.SQUEUE_NAMES_FORMAT, jobs))


def test_squeue_lines_become_jobs_and_bad_lines_are_skipped(caplog):
    with caplog.at_level(logging.WARNING):
        jobs = parse(JOBS, "not a line squeue prints\n")
    assert [(job.labels, job.nodes) for job in jobs] == [
        (labels("4211", "alice", "gpu", "verl-grpo-qwen7b"), "gpu[01-02,07]"),
        (labels("4212", "bob", "gpu-long", "verl ppo | with a bar"), "node3"),
        (labels("4213_5", "carol", "debug", "sweep"), "cpu1,gpu[10-11]"),
    ]
    assert len([r for r in caplog.records if "skipping an squeue line" in r.getMessage()]) == 2


def test_a_name_cannot_forge_a_job_a_host_or_a_user():
    """A name holding a line break and a whole forged squeue line (``\x1e`` and U+2028 too, which
    ``str.splitlines`` would cut at) stays that job's name: the jobs come from the nameless list."""
    forged = "99999|root|debug|evil.example.com|verl-x"
    jobs = parse([("4211", "alice", "gpu", "gpu[01-02,07]", f"verl-a\n{forged}\nevil[1-5000]"),
                  ("4212", "bob", "gpu-long", "node3", f"verl-b\x1e{forged}\u2028{forged}")])
    assert [(job.labels["slurm_job_id"], job.labels["slurm_user"], job.nodes) for job in jobs] == [
        ("4211", "alice", "gpu[01-02,07]"), ("4212", "bob", "node3")]
    assert jobs[0].labels["slurm_job_name"] == f"verl-a\n{forged}\nevil[1-5000]"
    assert jobs[1].labels["slurm_job_name"] == f"verl-b\x1e{forged}\u2028{forged}"


@pytest.mark.parametrize("job_match", [".*", "verl-.*"])
def test_a_name_cannot_take_over_another_jobs_name(job_match):
    """A name holding a line break and the other job's own squeue fields (listed first, as a job of
    higher priority is) names only its own job: the older job keeps its name, its node and its group."""
    victim = ("5001", "alice", "gpu", "gpu01", "verl-real")
    hostile = ("5002", "mallory", "gpu", "gpu01", "x\n" + "|".join(victim[:4]) + "|evil\n" + "|".join(victim))
    slurm = FakeSlurm([hostile, victim])
    assert Discovery(run=slurm, job_match=job_match).target_groups() == [
        {"targets": ["gpu01:9945"], "labels": labels("5001", "alice", "gpu", "verl-real")}]
    assert {job.labels["slurm_job_id"]: job.labels["slurm_job_name"] for job in parse(slurm.jobs)} == {
        "5001": "verl-real", "5002": hostile[4]}


def test_a_job_whose_name_cannot_be_read_is_listed_without_one(caplog):
    """A names answer that does not parse (here squeue leaving the name unpadded) names no job, and
    every job is still listed."""
    jobs = [("5001", "alice", "gpu", "gpu01", "verl-a"), ("5002", "bob", "gpu", "gpu02", "verl-b\n5001|x|5001")]
    names = squeue(slurm_sd.SQUEUE_NAMES_FORMAT.replace(str(slurm_sd.NAME_WIDTH), ""), jobs)
    with caplog.at_level(logging.WARNING):
        parsed = slurm_sd.parse_squeue(squeue(slurm_sd.SQUEUE_JOBS_FORMAT, jobs), names)
    assert [job.labels for job in parsed] == [labels("5001", "alice", "gpu", ""), labels("5002", "bob", "gpu", "")]
    assert "cannot read the job names" in caplog.text


def test_a_name_not_in_utf8_is_that_jobs_name_with_replacement_characters():
    name = b"verl-\xff\xfe-latin1 \xc3\xa9".decode("utf-8", "surrogateescape")
    [job] = parse([("5001", "alice", "gpu", "gpu01", name)])
    assert job.labels["slurm_job_name"] == "verl-\ufffd\ufffd-latin1 \u00e9"


def test_node_lists_split_outside_brackets():
    assert slurm_sd.split_node_list("gpu[01-02,07],cpu1, io[1-2]") == ["gpu[01-02,07]", "cpu1", "io[1-2]"]
    assert slurm_sd.split_node_list("node3") == ["node3"]
    assert slurm_sd.split_node_list("") == []
    assert slurm_sd.parse_hostnames("gpu01\ngpu02\n\n") == ["gpu01", "gpu02"]


def test_target_groups_expand_nodes_once_per_list():
    slurm = FakeSlurm()
    discovery = Discovery(run=slurm)
    expected = [
        {"targets": ["gpu01:9945", "gpu02:9945", "gpu07:9945"],
         "labels": labels("4211", "alice", "gpu", "verl-grpo-qwen7b")},
        {"targets": ["node3:9945"], "labels": labels("4212", "bob", "gpu-long", "verl ppo | with a bar")},
        {"targets": ["cpu1:9945", "gpu10:9945", "gpu11:9945"], "labels": labels("4213_5", "carol", "debug", "sweep")},
    ]
    assert discovery.target_groups() == expected
    assert slurm.calls[:2] == [["squeue", "--noheader", "--states=RUNNING", "--format=%i|%u|%P|%N"],
                               ["squeue", "--noheader", "--states=RUNNING", "--format=%i|%1024j|%i"]]
    assert [call[3] for call in slurm.calls[2:]] == ["gpu[01-02,07]", "gpu[10-11]"]  # no call for plain names
    assert discovery.target_groups() == expected
    assert len(slurm.calls) == 6  # the second round asked squeue only


def test_a_node_shared_by_jobs_is_listed_once_with_its_oldest_job():
    jobs = [("5120", "bob", "gpu", "gpu02", "verl-b"),  # squeue lists it first; 4211 is older
            ("4211", "alice", "gpu", "gpu[01-02,07]", "verl-a"),
            ("5121", "carol", "gpu", "gpu07", "verl-c")]
    groups = Discovery(run=FakeSlurm(jobs)).target_groups()
    assert groups == [
        {"targets": ["gpu01:9945", "gpu02:9945", "gpu07:9945"], "labels": labels("4211", "alice", "gpu", "verl-a")},
    ]  # 5120 and 5121 run only on 4211's nodes: no group of their own
    jobs += [("5122", "dave", "gpu", "gpu[01-02,07]", "verl-d"), ("4213_5", "erin", "gpu", "node3", "verl-e")]
    groups = Discovery(run=FakeSlurm(jobs)).target_groups()
    assert [(group["labels"]["slurm_job_id"], group["targets"]) for group in groups] == [
        ("4211", ["gpu01:9945", "gpu02:9945", "gpu07:9945"]), ("4213_5", ["node3:9945"])]


def test_job_name_match_partitions_and_port():
    slurm = FakeSlurm()
    discovery = Discovery(run=slurm, job_match="verl.*", partitions=("gpu", "gpu-long"), exporter_port=9100)
    groups = discovery.target_groups()
    assert [group["labels"]["slurm_job_id"] for group in groups] == ["4211", "4212"]
    assert groups[1]["targets"] == ["node3:9100"]
    assert slurm.calls[0][-1] == "--partition=gpu,gpu-long"
    # the match is anchored, as in Prometheus: "grpo" alone matches no whole name
    assert Discovery(run=FakeSlurm(), job_match="grpo").target_groups() == []


def test_answers_are_cached_and_a_failing_slurm_serves_the_last_good_one(caplog):
    now = [100.0]
    slurm = FakeSlurm()
    targets = CachedTargets(Discovery(run=slurm), ttl=5, clock=lambda: now[0])
    first = targets.body()
    assert [group["labels"]["slurm_job_id"] for group in json.loads(first)] == ["4211", "4212", "4213_5"]
    now[0] += 4.9
    assert targets.body() is first and len(slurm.calls) == 4  # within the TTL: Slurm not asked
    assert gzip.decompress(targets.body(compressed=True)) == first
    slurm.fail = SlurmError("squeue did not answer within 10s")
    now[0] += 0.2
    with caplog.at_level(logging.ERROR):
        assert targets.body() == first
    assert "serving the last good answer: squeue did not answer within 10s" in caplog.text
    calls = len(slurm.calls)
    now[0] += 1
    assert targets.body() == first and len(slurm.calls) == calls  # a failure waits the TTL too
    slurm.fail, slurm.jobs = None, [("4300", "erin", "gpu", "node9", "verl-next")]
    now[0] += 5
    assert json.loads(targets.body()) == [{"targets": ["node9:9945"],
                                           "labels": labels("4300", "erin", "gpu", "verl-next")}]


def test_before_any_good_answer_the_failure_is_raised():
    slurm = FakeSlurm()
    slurm.fail = SlurmError("squeue exited with 1: slurm_load_jobs error: Unable to contact slurm controller")
    with pytest.raises(SlurmError, match="Unable to contact"):
        CachedTargets(Discovery(run=slurm), ttl=5).body()


def test_commands_that_fail_or_hang_raise_slurm_errors(tmp_path):
    started = time.monotonic()
    with pytest.raises(SlurmError, match="did not answer within 0.2s"):
        slurm_sd.run_command(["sh", "-c", f"sleep 30 & echo $! > {tmp_path}/child; wait"], timeout=0.2)
    assert time.monotonic() - started < 5
    child = int((tmp_path / "child").read_text())
    wait_until(lambda: not _alive(child), timeout=5, message="the hung command's child killed too")
    with pytest.raises(SlurmError, match="exited with 3: oops"):
        slurm_sd.run_command(["sh", "-c", "echo oops >&2; exit 3"], timeout=5)
    with pytest.raises(SlurmError, match="cannot run"):
        slurm_sd.run_command([str(tmp_path / "no-squeue")], timeout=5)


def test_the_service_answers_json_and_health_and_survives_a_hanging_squeue(tmp_path):
    """The real command with a stand-in squeue: good, then hanging past --slurm.timeout."""
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\nif [ -e hang ]; then sleep 30; fi\n"
                      "case \"$3\" in *j*) printf '77|%-1024s|77\\n' verl-job ;; *) echo '77|root|debug|vm' ;; esac\n")
    squeue.chmod(0o755)
    port = free_port()
    log = (tmp_path / "sd.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "verl_exporter", "slurm-sd", "--web.listen-address",
                                f"127.0.0.1:{port}", "--squeue", str(squeue), "--cache-ttl", "200ms",
                                "--slurm.timeout", "500ms", "--exporter-port", "9100"],
                               cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_get(url + "/-/healthy")[0] == 200, message="slurm-sd healthy")
        expected = [{"targets": ["vm:9100"], "labels": labels("77", "root", "debug", "verl-job")}]
        status, body = http_get(url + "/targets")
        assert status == 200 and json.loads(body) == expected
        with urllib.request.urlopen(url + "/targets") as response:
            assert response.headers["Content-Type"] == "application/json"
        (tmp_path / "hang").touch()
        time.sleep(0.3)  # past the TTL: the next request asks squeue, which hangs
        started = time.monotonic()
        status, body = http_get(url + "/targets")
        assert status == 200 and json.loads(body) == expected
        assert 0.4 < time.monotonic() - started < 5
        assert b"did not answer within 0.5s" in (tmp_path / "sd.log").read_bytes()
    finally:
        process.terminate()
        assert process.wait(10) == 0
        log.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
