"""Hostile input, round four: runs belong to their owners. Another user's file beside a run's log, or
naming the run before its job starts, makes a run of that user's and never feeds, finishes, renames or
crashes the victim's (H3, H4); the evidence of a run goes to the run's owner, root and the exporter's
own user on this host, told by the client socket's uid, not by its address (H2). The other user is
``nobody``: its files are given to it, its client runs as it. Each test fails on the code before."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys

import pytest

from owner import ME
from servers import http_get
from verl_exporter.exposition import Exposition
from verl_exporter.http import server as server_module
from verl_exporter.http.peer import peer_uid
from verl_exporter.sources import Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to nobody and acting as nobody needs root")
NOBODY = pwd.getpwnam("nobody").pw_uid
# nobody's clients: the system's Python (the standard library is all they need), run from /, as
# nobody may not reach the project's folder.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
CONFIG = ("(TaskRunner pid=1) {'trainer': {'project_name': 'gsm8k', 'experiment_name': 'grpo', "
          "'logger': ['console'], 'total_training_steps': 100}}\n")
OOM = ("Traceback (most recent call last):\n"
       '  File "/verl/trainer/main_ppo.py", line 10, in <module>\n'
       "    main()\n"
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
ALICE = RunKey("gsm8k", "grpo", ME)
BOB = RunKey("gsm8k", "grpo", "nobody")


def nobodys(path, text: str) -> None:
    """``text`` in a file of nobody's."""
    path.write_text(text)
    os.chown(path, NOBODY, -1)


def read(store: RunStore, *sources: Source) -> None:
    for source in sources:
        source.settle()


@pytest.mark.parametrize("name", ["job.err", "job.stderr.log", "job.txt", "job_err.txt"])
def test_a_file_of_another_user_beside_a_runs_log_is_no_part_of_it(tmp_path, name):
    """H3: alice's ``job.log`` names her run and steps; nobody puts a stream file of the same job stem
    beside it with a NaN, a fatal OOM, step 100 and the end marker."""
    (tmp_path / "job.log").write_text(CONFIG + "".join(f"(TaskRunner pid=1) step:{step} - actor/pg_loss:0.5\n"
                                                       for step in (1, 2, 3)))
    nobodys(tmp_path / name, CONFIG + "(TaskRunner pid=1) step:100 - actor/pg_loss:nan\n" + OOM
            + "(TaskRunner pid=1) Training finished\n")
    store = RunStore(default_catalog())
    read(store, Source(str(tmp_path / "*"), store))
    alice = store.run(ALICE)
    assert alice is not None and alice.last_step == 3 and not alice.finished
    assert alice.fatal is None and not alice.nonfinite and not alice.log_errors
    bob = store.run(BOB) or store.run(RunKey(tmp_path.name, "job", "nobody"))
    assert bob is not None, "nobody's lines are a run of nobody's"


def test_another_user_cannot_squat_a_runs_name_before_it_starts(tmp_path):
    """H4: nobody's file names alice's run and writes a line a minute before her job starts; her config
    print, steps, NaN and crash are all hers."""
    nobodys(tmp_path / "a-squat.log", CONFIG + "(TaskRunner pid=1) step:1 - actor/pg_loss:0.1\n")
    store = RunStore(default_catalog())
    source = Source(str(tmp_path / "*.log"), store)
    source.settle()
    (tmp_path / "b-real.log").write_text(CONFIG + "(TaskRunner pid=1) step:1 - actor/pg_loss:0.5\n"
                                         "(TaskRunner pid=1) step:2 - actor/pg_loss:nan\n" + OOM)
    source.settle()
    alice = store.run(ALICE)
    assert alice is not None and alice.last_step == 2 and alice.total_steps == 100
    assert alice.nonfinite["actor/pg_loss"] == 1 and alice.fatal is not None and alice.fatal[0] == "cuda_oom"
    snapshot = store.snapshot()
    assert not any(count for (path, reason), count in snapshot.values_dropped.items() if reason == "other_source")
    assert store.run(BOB).last_step == 1


def _as_nobody() -> None:
    os.setgid(pwd.getpwnam("nobody").pw_gid)
    os.setuid(NOBODY)


CLIENT = ("import sys, urllib.request, urllib.error\n"
          "try:\n"
          "    print(urllib.request.urlopen(sys.argv[1], timeout=10).status)\n"
          "except urllib.error.HTTPError as e:\n"
          "    print(e.code)\n")


def _status_as_nobody(url: str) -> int:
    result = subprocess.run([PYTHON, "-c", CLIENT, url], capture_output=True, text=True, timeout=30,
                            preexec_fn=_as_nobody, cwd="/")
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_evidence_on_loopback_goes_to_the_runs_owner_and_root_only(host):
    """H2: any local user could read any run's evidence from 127.0.0.1 or [::1]. Now nobody gets
    nobody's run's evidence, not root's run's; root gets both."""
    evidence = {RunKey("p", "mine", "nobody"): "nobody's stacks", RunKey("p", "root-run", "root"): "root's secret"}
    try:
        http, _ = server_module.serve((host, 0), Exposition([]), evidence=evidence.get)
    except OSError as exc:
        pytest.skip(f"no {host} here: {exc}")
    try:
        base = f"http://{'[::1]' if ':' in host else host}:{http.server_address[1]}/debug/evidence"
        assert _status_as_nobody(f"{base}?project=p&experiment=mine&user=nobody") == 200
        assert _status_as_nobody(f"{base}?project=p&experiment=root-run&user=root") == 403
        assert _status_as_nobody(f"{base}?project=p&experiment=root-run&user=nobody") == 404  # not the run
        status, body = http_get(f"{base}?project=p&experiment=root-run&user=root")
        assert status == 200 and body == "root's secret"
    finally:
        http.shutdown()
        http.server_close()


def test_the_peer_uid_is_the_clients_not_its_address():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = subprocess.Popen([PYTHON, "-c", "import socket, sys, time\n"
                               f"s = socket.create_connection(('127.0.0.1', {port})); time.sleep(5)"],
                              preexec_fn=_as_nobody, cwd="/")
    try:
        connection, _ = listener.accept()
        assert peer_uid(connection) == NOBODY
        connection.close()
    finally:
        client.kill()
        client.wait()
        listener.close()


def test_a_file_of_another_user_put_at_a_followed_path_is_a_file_of_its_own(tmp_path):
    """In a folder both may write, nobody removes the run's log and writes one of its own at the same
    path, naming the same run: its NaN and step 100 are nobody's run's, the owner's run keeps its own."""
    log = tmp_path / "job.log"
    log.write_text(CONFIG + "(TaskRunner pid=1) step:1 - actor/pg_loss:0.5\n")
    store = RunStore(default_catalog())
    source = Source(str(log), store)
    source.settle()
    log.unlink()
    nobodys(log, CONFIG + "(TaskRunner pid=1) step:100 - actor/pg_loss:nan\n")
    for _ in range(3):
        source.poll()
    alice = store.run(ALICE)
    assert alice is not None and alice.last_step == 1 and not alice.nonfinite
    bob = store.run(BOB)
    assert bob is not None and bob.last_step == 100 and bob.nonfinite["actor/pg_loss"] == 1
