"""A whole log directory: more files than descriptors, backlogs read after the server listens
(/-/ready only once they are in), finished and idle runs let go."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

from hardening_helpers import jsonl, metrics_when, samples, value

from servers import REPO, free_port, http_get, wait_until

# The first poll of every source waits for a gate file: a backlog that takes as long as the test wants.
GATED_FIRST_READ = """
import os, sys, time
from verl_exporter import sources
poll = sources.Source.poll
def gated(self):
    while not os.path.exists(os.environ["GATE"]):
        time.sleep(0.05)
    return poll(self)
sources.Source.poll = gated
from verl_exporter.cli import main
sys.exit(main(sys.argv[1:]))
"""


class Exporter:
    def __init__(self, tmp_path, *args, script=None, nofile=None, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"exporter-{self.port}.log"
        command = [sys.executable, "-c", script] if script else [sys.executable, "-m", "verl_exporter"]
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*command, "--web.listen-address", f"127.0.0.1:{self.port}", "--no-collector.gpu",
                 "--no-collector.host", *args], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                preexec_fn=limit, env={**os.environ, **(env or {})})

    def get(self, path):
        assert self.process.poll() is None, self.log_path.read_text()
        try:
            return http_get(self.url + path, timeout=10)
        except OSError:
            return 0, ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(20)


def write_runs(root, count, steps=1):
    for index in range(count):
        path = root / f"team{index % 7}" / f"run{index}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(jsonl(step, {"actor/pg_loss": 0.5}) for step in range(1, steps + 1)))


def test_more_files_than_descriptors_are_all_followed(tmp_path):
    write_runs(tmp_path / "runs", 300)
    with Exporter(tmp_path, "--source", str(tmp_path / "runs" / "*" / "*.jsonl"), "--store.max-runs", "400",
                  nofile=128) as exporter:
        text = metrics_when(exporter, lambda t: len(samples(t, "verl_training_last_step")) == 300,
                            "every run served", timeout=120)
        fds = len(os.listdir(f"/proc/{exporter.process.pid}/fd"))
        assert fds < 128 and value(text, "verl_exporter_source_up", source=str(tmp_path / "runs" / "team0" /
                                                                                "run0.jsonl")) == 1
        for index in (0, 150, 299):  # files closed to make room are reopened when they grow
            path = tmp_path / "runs" / f"team{index % 7}" / f"run{index}.jsonl"
            with path.open("a") as out:
                out.write(jsonl(2, {"actor/pg_loss": 0.25}))
        metrics_when(exporter, lambda t: sorted(samples(t, "verl_training_last_step")) == [1.0] * 297 + [2.0] * 3,
                     "the grown files read", timeout=60)
        assert "Too many open files" not in exporter.log_path.read_text()


def test_the_server_answers_before_the_backlog_is_read_and_is_ready_only_after(tmp_path):
    write_runs(tmp_path / "runs", 5, steps=50)
    gate = tmp_path / "gate"
    with Exporter(tmp_path, "--source", str(tmp_path / "runs" / "*" / "*.jsonl"), script=GATED_FIRST_READ,
                  env={"GATE": str(gate)}) as exporter:
        wait_until(lambda: exporter.get("/-/healthy")[0] == 200, timeout=30, message="listening")
        assert exporter.get("/-/ready")[0] == 503  # nothing read yet
        status, text = exporter.get("/metrics")
        assert status == 200 and value(text, "verl_training_runs") == 0
        gate.write_text("go")
        wait_until(lambda: exporter.get("/-/ready")[0] == 200, timeout=60, message="ready")
        status, text = exporter.get("/metrics")  # ready means every backlog line is in
        assert sorted(samples(text, "verl_training_last_step")) == [50.0] * 5


def test_finished_and_idle_runs_are_let_go_and_free_the_cap(tmp_path):
    root = tmp_path / "runs"
    write_runs(root, 3, steps=2)
    idle = root / "team1" / "run1.jsonl"
    config = tmp_path / "finished.log"
    config.write_text("step:2 - actor/pg_loss:0.1\nFinal validation metrics: {'val/score': 0.5}\n")
    hours_ago = time.time() - 3 * 3600
    os.utime(config, (hours_ago, hours_ago))
    days_ago = time.time() - 3 * 86400
    os.utime(idle, (days_ago, days_ago))
    # Read in this order: the finished run takes a place, run0 the other, run1 is too old to take
    # one, and run2 finds the cap reached until the finished run is let go.
    with Exporter(tmp_path, "--source", str(config), "--source", str(root / "*" / "*.jsonl"),
                  "--project", "team", "--store.max-runs", "2", "--store.retention", "1h",
                  "--store.idle-retention", "1d") as exporter:
        wait_until(lambda: exporter.get("/-/ready")[0] == 200, timeout=60, message="ready")
        text = metrics_when(exporter, lambda t: value(t, "verl_training_runs_expired_total", reason="finished") == 1,
                            "the finished run let go")
        served = {labels["experiment"] for labels, _ in _labelled(text, "verl_training_last_step")}
        assert "finished" not in served and "run1" not in served  # finished 3h ago; idle for 3 days
        assert served == {"run0", "run2"} and value(text, "verl_training_run_cap_reached") == 0
        assert "reached the cap" not in exporter.log_path.read_text()


def _labelled(text, name):
    from prometheus_client.parser import text_string_to_metric_families

    return [(sample.labels, sample.value) for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name]
