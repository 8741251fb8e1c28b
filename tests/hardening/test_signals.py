"""Signals: SIGTERM and SIGINT stop the exporter with exit 0 at any moment, the first read of a
backlog included; SIGHUP reloads --config.file and --web.config.file, keeping the running options
when a new file is bad, and keeping the listener."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import yaml
from hardening_helpers import jsonl, metrics_when, value

from certs import PASSWORD, make_pki, password_hash, write_web_config
from servers import REPO, free_port, http_get, start_exporter, wait_until

# Stand-in for a backlog that takes long to read: the first poll of every source blocks until the
# exporter is told to stop (it listens already: backlogs are read in the background).
SLOW_FIRST_READ = """
import sys, threading
from verl_exporter import sources
def poll(self):
    print("first read started", flush=True)
    threading.Event().wait()
sources.Source.poll = poll
from verl_exporter.cli import main
sys.exit(main(sys.argv[1:]))
"""


def log_of(process: subprocess.Popen, path) -> str:
    return path.read_text(errors="replace")


def start_raw(tmp_path, *args: str, script: str | None = None):
    log_path = tmp_path / f"exporter-{len(list(tmp_path.glob('exporter-*.log')))}.log"
    log_file = open(log_path, "wb")
    command = [sys.executable, "-c", script] if script else [sys.executable, "-m", "verl_exporter"]
    process = subprocess.Popen([*command, "--web.listen-address", f"127.0.0.1:{free_port()}", *args],
                               stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO)
    log_file.close()
    return process, log_path


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_the_first_read_exits_0(tmp_path, signum):
    run = tmp_path / "gsm8k" / "ppo.jsonl"
    run.parent.mkdir()
    run.write_text(jsonl(1, {"actor/pg_clipfrac": 0.1}))
    process, log_path = start_raw(tmp_path, "--source", str(run), "--gpu.fake", "healthy:1", "--no-collector.host",
                                  script=SLOW_FIRST_READ)
    try:
        wait_until(lambda: "first read started" in log_path.read_text(), message="the first read")
        process.send_signal(signum)
        assert process.wait(30) == 0, log_path.read_text()
    finally:
        process.kill()
        process.wait()
    log = log_path.read_text()
    assert "shutting down" in log and "Traceback" not in log, log
    assert log.index("listening on") < log.index("first read started"), log  # the backlog is read after


def test_a_stop_while_reading_a_real_backlog_exits_0(tmp_path):
    runs = tmp_path / "runs"
    for index in range(4):
        path = runs / "p" / f"run{index}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as handle:
            for step in range(8000):
                handle.write(jsonl(step, {f"actor/key_{k}": step * 0.5 for k in range(40)}))
    process, log_path = start_raw(tmp_path, "--source", str(runs / "*" / "*.jsonl"), "--gpu.fake", "healthy:1",
                                  "--no-collector.host")
    try:
        wait_until(lambda: "reading what the sources hold" in log_path.read_text(), message="the first read")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log_path.read_text()
    finally:
        process.kill()
        process.wait()
    assert "Traceback" not in log_path.read_text()


def test_a_stop_while_serving_exits_0(tmp_path):
    with start_exporter(tmp_path, "--gpu.fake", "healthy:1", "--no-collector.host") as exporter:
        exporter.process.send_signal(signal.SIGTERM)
        assert exporter.process.wait(30) == 0
        assert "shutting down" in exporter.log() and "Traceback" not in exporter.log()


def run_names(text: str) -> set[str]:
    return {line.split('experiment="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith("verl_training_last_step{")}


def test_sighup_reloads_the_config_file(tmp_path):
    runs = tmp_path / "runs" / "gsm8k"
    runs.mkdir(parents=True)
    for name in ("first", "second"):
        (runs / f"{name}.jsonl").write_text(jsonl(3, {"actor/pg_clipfrac": 0.2}))
    config_file = tmp_path / "exporter.yml"
    settings = {"source": [str(runs / "first.jsonl")], "gpu.fake": "healthy:1", "collector.host": False}
    config_file.write_text(yaml.safe_dump(settings))
    with start_exporter(tmp_path, "--config.file", str(config_file)) as exporter:
        metrics_when(exporter, lambda text: run_names(text) == {"first"}, "the first run")
        pid, port = exporter.process.pid, exporter.port

        # A good file: a new source is followed, the old one keeps its place, the log level changes.
        (runs / "first.jsonl").open("a").write(jsonl(4, {"actor/pg_clipfrac": 0.3}))
        settings.update({"source": [str(runs / "first.jsonl"), str(runs / "second.jsonl")], "log.level": "debug"})
        config_file.write_text(yaml.safe_dump(settings))
        exporter.process.send_signal(signal.SIGHUP)
        text = metrics_when(exporter, lambda text: run_names(text) == {"first", "second"}, "the second run")
        assert value(text, "verl_training_steps_ingested_total", experiment="first") == 2
        wait_until(lambda: "options reloaded" in exporter.log(), message="the reload logged")

        # A bad file: logged, the running options kept.
        config_file.write_text("source: [\n")
        exporter.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "reloading the options failed" in exporter.log(), message="the failed reload logged")
        settings.update({"store.max-series-per-run": 10, "store.max-runs": 5})  # need a restart
        config_file.write_text(yaml.safe_dump(settings))
        exporter.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "only after a restart: store.max-series-per-run, store.max-runs" in exporter.log(),
                   message="options that need a restart logged")
        assert run_names(exporter.get("/metrics")[1]) == {"first", "second"}
        assert exporter.process.poll() is None and (exporter.process.pid, exporter.port) == (pid, port)
        assert "Traceback" not in exporter.log()


MISTYPED = {  # options file text -> the option the error names
    "web.telemetry-path: null\n": "web.telemetry-path",
    "source.poll-interval: null\n": "source.poll-interval",
    "log.level: null\n": "log.level",
    "log.level: [a]\n": "log.level",
    "store.max-runs: x\n": "store.max-runs",
    "gpu.timeout: {a: 1}\n": "gpu.timeout",
    "store.max-runs: true\n": "store.max-runs",
    "collector.gpu: 1\n": "collector.gpu",
}


def test_sighup_with_a_value_of_the_wrong_type_keeps_the_exporter_and_its_options(tmp_path):
    runs = tmp_path / "runs" / "gsm8k"
    runs.mkdir(parents=True)
    (runs / "first.jsonl").write_text(jsonl(3, {"actor/pg_clipfrac": 0.2}))
    config_file = tmp_path / "exporter.yml"
    good = f"source: [{runs / 'first.jsonl'}]\ngpu.fake: healthy:1\ncollector.host: false\n"
    config_file.write_text(good)
    with start_exporter(tmp_path, "--config.file", str(config_file)) as exporter:
        metrics_when(exporter, lambda text: run_names(text) == {"first"}, "the first run")
        pid, port = exporter.process.pid, exporter.port
        for text, option in MISTYPED.items():
            count = exporter.log().count("reloading the options failed")
            config_file.write_text(good + text)
            exporter.process.send_signal(signal.SIGHUP)
            wait_until(lambda count=count: exporter.log().count("reloading the options failed") > count, message=text)
            line = [line for line in exporter.log().splitlines() if "reloading the options failed" in line][-1]
            assert "level=ERROR" in line and f": {option} must be" in line, line
            assert exporter.process.poll() is None, text
            assert run_names(exporter.get("/metrics")[1]) == {"first"}, text
        assert (exporter.process.pid, exporter.port) == (pid, port)
        assert "Traceback" not in exporter.log()


@pytest.mark.parametrize("text", list(MISTYPED)[:4])
def test_a_value_of_the_wrong_type_at_start_is_one_line_and_exit_2(tmp_path, text):
    path = tmp_path / "exporter.yml"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-m", "verl_exporter", "--web.listen-address", f"127.0.0.1:{free_port()}",
                             "--config.file", str(path), "--gpu.fake", "healthy:1"],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"verl-exporter: error: options file {path}: {MISTYPED[text]} "), \
        result.stderr


def test_sighup_reloads_the_web_config_without_dropping_the_listener(tmp_path):
    import base64
    import ssl

    pki = make_pki(tmp_path / "pki")
    web_file = write_web_config(tmp_path / "web.yml", {"basic_auth_users": {"alice": password_hash()}})

    def auth(user):
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()}

    with start_exporter(tmp_path, "--web.config.file", str(web_file), "--gpu.fake", "healthy:1",
                        "--no-collector.host", headers=auth("alice")) as exporter:
        url = f"127.0.0.1:{exporter.port}/metrics"
        assert http_get("http://" + url)[0] == 401

        def reload_to(config: dict | str, logged: str):
            count = exporter.log().count(logged)
            web_file.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
            exporter.process.send_signal(signal.SIGHUP)
            wait_until(lambda: exporter.log().count(logged) > count, message=logged)

        # New users and headers, then TLS, then a bad file: each on the same listener.
        reload_to({"basic_auth_users": {"bob": password_hash()},
                   "http_server_config": {"headers": {"X-Frame-Options": "deny"}}}, "options reloaded")
        assert http_get("http://" + url, headers=auth("alice"))[0] == 401
        assert http_get("http://" + url, headers=auth("bob"))[0] == 200
        context = ssl.create_default_context(cafile=str(pki.ca))
        reload_to({"basic_auth_users": {"bob": password_hash()},
                   "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}},
                  "options reloaded")
        assert http_get("https://" + url, context=context, headers=auth("bob"))[0] == 200
        for bad in ("basic_auth_users: {bob: not-a-hash}\n", "tls_server_config: {cert_file: /nope, key_file: /nope}\n",
                    json.dumps({"http_server_config": {"headers": {"Server": "x"}}})):
            reload_to(bad, "reloading the options failed")
            assert http_get("https://" + url, context=context, headers=auth("bob"))[0] == 200
        assert exporter.process.poll() is None
        assert "Traceback" not in exporter.log()


BAD_AT_START = {
    "unknown key": "tls_config: {}\n",
    "plain password": "basic_auth_users: {alice: secret}\n",
    "missing file": None,
}


@pytest.mark.parametrize("case", BAD_AT_START)
def test_a_bad_web_config_at_start_is_one_line_and_exit_2(tmp_path, case):
    path = tmp_path / "web.yml"
    if BAD_AT_START[case] is not None:
        path.write_text(BAD_AT_START[case])
    result = subprocess.run([sys.executable, "-m", "verl_exporter", "--web.listen-address", f"127.0.0.1:{free_port()}",
                             "--web.config.file", str(path), "--gpu.fake", "healthy:1"],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("verl-exporter: error: ") and str(path) in lines[0], result.stderr


def test_sighup_with_an_empty_web_config_keeps_tls_and_auth(tmp_path):
    import base64
    import ssl

    pki = make_pki(tmp_path / "pki")
    protected = {"basic_auth_users": {"alice": password_hash()},
                 "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}}
    web_file = write_web_config(tmp_path / "web.yml", protected)
    context = ssl.create_default_context(cafile=str(pki.ca))
    auth = {"Authorization": "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()}
    with start_exporter(tmp_path, "--web.config.file", str(web_file), "--gpu.fake", "healthy:1",
                        "--no-collector.host", context=context, headers=auth) as exporter:
        url = f"127.0.0.1:{exporter.port}/metrics"
        for text in ("", "# tls_server_config:\n#   cert_file: x\n", "tls_server_config:\nbasic_auth_users:\n"):
            count = exporter.log().count("reload refused")
            web_file.write_text(text)
            exporter.process.send_signal(signal.SIGHUP)
            wait_until(lambda count=count: exporter.log().count("reload refused") > count, message=repr(text))
            line = [line for line in exporter.log().splitlines() if "reload refused" in line][-1]
            assert "level=WARNING" in line and "TLS and basic auth off" in line, line
            assert http_get("https://" + url, context=context)[0] == 401
            assert http_get("https://" + url, context=context, headers=auth)[0] == 200
        # On purpose: TLS off, auth kept.
        write_web_config(web_file, {"tls_server_config": {}, "basic_auth_users": protected["basic_auth_users"]})
        exporter.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "options reloaded" in exporter.log(), message="the reload")
        assert http_get("http://" + url)[0] == 401 and http_get("http://" + url, headers=auth)[0] == 200
        assert "options reloaded (none to apply; TLS off; basic auth on (1 users))" in exporter.log()
        assert exporter.process.poll() is None and "Traceback" not in exporter.log()


# A reload whose read of the web config never returns (a hung network file system).
HUNG_RELOAD_READ = """
import sys, threading
from verl_exporter.http import web_config
real = web_config.load
calls = []
def load(path):
    calls.append(path)
    if len(calls) > 1:
        print("reload read started", flush=True)
        threading.Event().wait()
    return real(path)
web_config.load = load
from verl_exporter.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_during_a_reload_that_hangs_exits_0(tmp_path):
    web_file = write_web_config(tmp_path / "web.yml", {})
    process, log_path = start_raw(tmp_path, "--web.config.file", str(web_file), "--gpu.fake", "healthy:1",
                                  "--no-collector.host", script=HUNG_RELOAD_READ)
    try:
        wait_until(lambda: "listening on" in log_path.read_text(), message="the listener")
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: "reload read started" in log_path.read_text(), message="the reload")
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0, log_path.read_text()
    finally:
        process.kill()
        process.wait()
    assert "shutting down" in log_path.read_text() and "Traceback" not in log_path.read_text()


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_sighup_with_a_fifo_or_dev_zero_web_config_is_refused_and_sigterm_still_stops(tmp_path, special):
    import os

    link = tmp_path / "web.yml"
    write_web_config(link, {})
    with start_exporter(tmp_path, "--web.config.file", str(link), "--gpu.fake", "healthy:1",
                        "--no-collector.host") as exporter:
        link.unlink()
        if special == "fifo":
            os.mkfifo(link)
        else:
            link.symlink_to(special)
        exporter.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "reloading the options failed" in exporter.log(), timeout=10, message="the refusal")
        assert "not a regular file" in exporter.log()
        assert exporter.get("/metrics")[0] == 200
        exporter.process.send_signal(signal.SIGTERM)
        assert exporter.process.wait(15) == 0, exporter.log()


@pytest.mark.parametrize("stderr", ["/dev/full", "closed"])
def test_port_in_use_exits_2_even_when_stderr_cannot_be_written(tmp_path, stderr):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "verl_exporter", "--web.listen-address", f"127.0.0.1:{port}",
                   "--gpu.fake", "healthy:1", "--no-collector.host"]
        if stderr == "/dev/full":
            with open("/dev/full", "w") as full:
                result = subprocess.run(command, stderr=full, stdout=subprocess.DEVNULL, timeout=60, cwd=REPO)
        else:
            result = subprocess.run(["sh", "-c", '"$@" 2>&-', "sh", *command], stdout=subprocess.DEVNULL,
                                    timeout=60, cwd=REPO)
    assert result.returncode == 2


def test_a_reload_that_hangs_is_given_up_and_the_exporter_keeps_serving(tmp_path):
    web_file = write_web_config(tmp_path / "web.yml", {})
    script = HUNG_RELOAD_READ.replace("from verl_exporter.cli import main",
                                      "from verl_exporter import cli\ncli.RELOAD_READ_SECONDS = 1\nmain = cli.main")
    port = free_port()
    log_file = tmp_path / "hung.log"
    with open(log_file, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", script, "--web.listen-address", f"127.0.0.1:{port}",
                                    "--web.config.file", str(web_file), "--gpu.fake", "healthy:1",
                                    "--no-collector.host"], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_until(lambda: "listening on" in log_file.read_text(), message="the listener")
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: "reading the files took more than 1s" in log_file.read_text(), message="given up")
        assert http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        process.send_signal(signal.SIGHUP)  # the hung read is still there: no second one piles up
        wait_until(lambda: "still reading its files" in log_file.read_text(), message="the second reload refused")
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0, log_file.read_text()
    finally:
        process.kill()
        process.wait()
    assert "Traceback" not in log_file.read_text()
