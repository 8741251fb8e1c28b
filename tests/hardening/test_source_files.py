"""A followed file deleted, replaced, truncated, made unreadable or cut short by a full disk.

Each case runs the real exporter: it keeps serving what it has read, says what happened in its
log, and picks the file up again once it is back. Nothing already ingested is lost.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from hardening_helpers import jsonl, metrics_when, value

from servers import Server, free_port, start_exporter

RUN = {"project": "gsm8k", "experiment": "ppo"}
FAST = ("--source.poll-interval", "0.1", "--no-collector.gpu", "--no-collector.host")


def steps(first: int, last: int) -> str:
    return "".join(jsonl(step, {"actor/pg_clipfrac": step / 100}) for step in range(first, last + 1))


def at_step(server, step: int, **expected):
    """Wait until the run's last step is ``step`` (and each ``expected`` sample matches)."""
    def done(text):
        return value(text, "verl_training_last_step", **RUN) == step and all(
            value(text, name, **RUN) == wanted for name, wanted in expected.items())

    return metrics_when(server, done, f"step {step} {expected}")


@pytest.fixture
def run_file(tmp_path):
    path = tmp_path / "gsm8k" / "ppo.jsonl"
    path.parent.mkdir()
    path.write_text(steps(1, 3))
    return path


def test_deleted_then_recreated(tmp_path, run_file):
    with start_exporter(tmp_path, "--source", str(run_file), *FAST) as exporter:
        at_step(exporter, 3)
        run_file.unlink()
        metrics_when(exporter, lambda _: "disappeared" in exporter.log(), "a warning that the file is gone")
        text = at_step(exporter, 3)  # the values read stay served
        assert value(text, "verl_actor_pg_clipfrac", **RUN) == 0.03
        run_file.write_text(steps(1, 2))  # a new attempt of the run
        at_step(exporter, 2, verl_actor_pg_clipfrac=0.02, verl_training_steps_ingested_total=5)
        assert exporter.get("/-/healthy")[0] == 200
    assert "disappeared" in exporter.log()


def test_replaced_by_rename_reads_the_old_files_last_lines_first(tmp_path, run_file):
    with start_exporter(tmp_path, "--source", str(run_file), *FAST) as exporter:
        at_step(exporter, 3)
        with run_file.open("a") as old:  # the old file gets a last step, then is renamed away
            old.write(steps(4, 4))
        replacement = run_file.with_name("ppo.jsonl.new")
        replacement.write_text(steps(10, 11))
        os.rename(run_file.with_name("ppo.jsonl"), run_file.with_name("ppo.jsonl.1"))
        os.rename(replacement, run_file)
        text = at_step(exporter, 11, verl_actor_pg_clipfrac=0.11)
        assert value(text, "verl_training_steps_ingested_total", **RUN) == 6  # 1-4 and 10-11
        assert value(text, "verl_exporter_parse_errors_total", source=str(run_file)) in (None, 0)


def test_truncated_and_rewritten(tmp_path, run_file):
    run_file.write_text(steps(1, 8))
    with start_exporter(tmp_path, "--source", str(run_file), *FAST) as exporter:
        at_step(exporter, 8)
        with run_file.open("w") as handle:  # `> file`: the job restarted and writes from the top
            handle.write(steps(1, 2))
        text = at_step(exporter, 2, verl_actor_pg_clipfrac=0.02)
        assert value(text, "verl_training_steps_ingested_total", **RUN) == 10
        assert value(text, "verl_exporter_parse_errors_total", source=str(run_file)) in (None, 0)


def start_without_file_permission_override(tmp_path, *args):
    """The exporter, unable to read files its mode forbids even when the tests run as root."""
    if os.geteuid() != 0:
        return start_exporter(tmp_path, *args)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot take away root's permission to read any file")
    port = free_port()
    drop = "-dac_override,-dac_read_search"
    cmd = [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}", sys.executable, "-m", "verl_exporter",
           "--web.listen-address", f"127.0.0.1:{port}", *args]
    return Server("verl-exporter", cmd, port, tmp_path / f"exporter-{port}.log", "/-/ready")


def test_unreadable_then_readable_again(tmp_path, run_file):
    with start_without_file_permission_override(tmp_path, "--source", str(run_file), *FAST) as exporter:
        at_step(exporter, 3)
        with run_file.open("a") as handle:
            handle.write(steps(4, 4))
        run_file.chmod(0)
        try:
            # The file is already open: the exporter may read step 4 through that handle. A copy
            # put in place (same name, new file, still mode 000) cannot be opened.
            replacement = run_file.with_name("copy")
            replacement.write_text(steps(1, 6))
            replacement.chmod(0)
            os.rename(replacement, run_file)
            metrics_when(exporter, lambda _: "Permission denied" in exporter.log(), "a permission warning")
            assert exporter.get("/metrics")[0] == 200
            assert value(exporter.get("/metrics")[1], "verl_training_last_step", **RUN) in (3, 4)
        finally:
            run_file.chmod(0o644)
        at_step(exporter, 6, verl_actor_pg_clipfrac=0.06)


WRITER = textwrap.dedent("""
    import os, resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk: writes fail instead of killing us
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for line in sys.stdin.buffer:
        try:
            os.write(fd, line)
        except OSError as exc:
            print(f"write failed: {exc.strerror}", file=sys.stderr)
            sys.exit(1)
""")


def test_a_full_disk_cuts_a_line_in_half(tmp_path, run_file):
    """The writer's disk fills mid-line; later the job writes on. One bad line, no more."""
    limit = run_file.stat().st_size + len(steps(4, 4)) + len(steps(5, 5)) // 2
    writer = subprocess.run([sys.executable, "-c", WRITER, str(run_file), str(limit)], input=steps(4, 9).encode(),
                            capture_output=True, timeout=60)
    assert writer.returncode == 1 and b"File too large" in writer.stderr, writer.stderr
    assert run_file.stat().st_size == limit and not run_file.read_bytes().endswith(b"\n")
    with start_exporter(tmp_path, "--source", str(run_file), *FAST) as exporter:
        text = at_step(exporter, 4, verl_actor_pg_clipfrac=0.04)
        assert value(text, "verl_exporter_parse_errors_total", source=str(run_file)) in (None, 0)
        with run_file.open("a") as handle:  # space again: the job's next lines land after the half line
            handle.write(steps(10, 11))
        text = at_step(exporter, 11, verl_actor_pg_clipfrac=0.11)
        assert value(text, "verl_exporter_parse_errors_total", source=str(run_file)) == 1
        assert value(text, "verl_training_steps_ingested_total", **RUN) == 5  # 1-4 and 11
        assert "skipped a line" in exporter.log()
