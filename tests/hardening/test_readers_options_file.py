"""The options file (``--config.file``) is read within bounds: only a regular file, at most 256 KiB,
so a reload pointed at a FIFO or ``/dev/zero`` neither blocks nor reads without end; and its errors
name the option and the line, never what the file holds (a file symlinked to a secret must not end
up in the log)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from verl_exporter.config.options import MAX_OPTIONS_FILE_BYTES, OptionsError, load_options

SECRET = "s3cr3t-t0ken"


def _load_in_thread(path: Path) -> list:
    outcome: list = []

    def load():
        try:
            outcome.append(load_options(["--config.file", str(path)]))
        except OptionsError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(5.0)
    if thread.is_alive():  # blocked opening the FIFO: a writer lets it go, and the test fails
        with open(path, "w"):
            pass
        thread.join(5.0)
        pytest.fail("reading a FIFO as the options file blocked")
    return outcome


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "exporter.yml"
    os.mkfifo(fifo)
    [outcome] = _load_in_thread(fifo)
    assert isinstance(outcome, OptionsError) and "not a regular file" in str(outcome)


def test_dev_zero_is_refused_at_once():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    # In a child with a memory limit: an unbounded read would exhaust the machine, not just fail.
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            f"from {load_options.__module__} import {OptionsError.__name__} as E, {load_options.__name__} as load\n"
            "try:\n    load(['--config.file', '/dev/zero'])\n"
            "except E as exc:\n    print(exc)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 0 and "not a regular file" in result.stdout, result.stderr[-500:]


def test_a_file_over_the_cap_is_refused(tmp_path):
    big = tmp_path / "exporter.yml"
    big.write_text("# padding\n" * (MAX_OPTIONS_FILE_BYTES // 10 + 1))
    with pytest.raises(OptionsError, match="larger than"):
        load_options(["--config.file", str(big)])


@pytest.mark.parametrize("text, line", [
    (f"store.max-runs: 5\n{SECRET}: 1\n", "line 2"),  # an unknown option is the file's own text
    (f"store.max-runs: {SECRET}\n", "line 1"),  # a value that is no number
    (f"gpu.timeout: '{SECRET}'\n", "line 1"),
    (f"web.listen-address: [{SECRET}\n", "line 2"),  # not YAML: the parser's message quotes the text
    (f"project: {{{SECRET}: [1]}}\n", "line 1"),
], ids=["unknown-option", "bad-number", "bad-duration", "not-yaml", "mapping-value"])
def test_errors_name_the_line_never_the_content(tmp_path, text, line):
    secret = tmp_path / "secret"
    secret.write_text(text)
    linked = tmp_path / "exporter.yml"
    linked.symlink_to(secret)
    with pytest.raises(OptionsError) as error:
        load_options(["--config.file", str(linked)])
    message = str(error.value)
    assert SECRET not in message and line in message, message
