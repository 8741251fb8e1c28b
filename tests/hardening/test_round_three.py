"""Hostile input, round three (outside Slurm): a connection flood of heads that promise a body, the
evidence's log tails and files against planted links, FIFOs and foreign files, a YAML alias bomb
in the options file, a replay whose times span centuries, and a line of nothing but NCCL words.
Each test fails on the code before its fix."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import bcrypt
import pytest

from certs import write_web_config
from owner import ME
from servers import REPO, http_get, require_binary
from verl_exporter.config.options import OptionsError, load_options
from verl_exporter.exposition import Exposition
from verl_exporter.forensics import EvidenceArchive, logtail
from verl_exporter.forensics.archive import file_name
from verl_exporter.http import server as server_module
from verl_exporter.http import web_config
from verl_exporter.sources import RecordsOnly, Source
from verl_exporter.sources.errors import error_kind
from verl_exporter.sources.open_files import OpenFiles
from verl_exporter.store.records import RunKey

RUN = RunKey("gsm8k", "ppo")


# --- H4: heads that announce a body and send none -------------------------------------------------

def test_heads_that_promise_a_body_do_not_hold_the_connection_cap(monkeypatch):
    """300 connections each send a request head with ``Content-Length: 1000`` and no body. They
    count as idle, not busy: the cap closes them to make room and a scrape is answered."""
    http, _ = server_module.serve(("127.0.0.1", 0), Exposition([]))
    try:
        http.max_connections = 32
        port = http.server_address[1]
        socks = []
        for _ in range(300):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
                socks.append(sock)
            except OSError:
                pass
        time.sleep(0.3)
        answers = [http_get(f"http://127.0.0.1:{port}/-/healthy", timeout=5)[0] for _ in range(5)]
        for sock in socks:
            sock.close()
        assert answers == [200] * 5
    finally:
        http.shutdown()
        http.server_close()


# --- H1, M2: the evidence reads what the followers read -------------------------------------------

def followed(tmp_path, name: str, text: str) -> tuple[str, OpenFiles]:
    """A log file a Source followed (with its own pool of open files)."""
    log = tmp_path / name
    log.write_text(text)
    pool = OpenFiles()
    Source(str(log), _Sink(), open_files=pool).settle()
    return str(log), pool


class _Sink(RecordsOnly):
    def ingest(self, record):
        pass

    def parse_error(self, source, reason):
        pass


def test_a_log_swapped_for_a_link_to_a_secret_is_not_read_into_the_evidence(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("api-key=hunter2\n")
    os.chmod(secret, 0o600)
    path, pool = followed(tmp_path, "job.out", "step:1 - actor/pg_loss:0.1\n")
    assert "step:1" in logtail.read_tail(path, inode=pool.inode(path)).lines[0]
    os.unlink(path)
    os.symlink(secret, path)
    tail = logtail.read_tail(path, inode=pool.inode(path))
    assert tail.lines == [] and tail.error
    hardlinked = tmp_path / "job2.out"
    os.link(secret, hardlinked)  # another name of the secret, never followed
    assert logtail.read_tail(str(hardlinked), inode=pool.inode(str(hardlinked))).lines == []
    os.unlink(path)
    (tmp_path / "job.out").write_text("step:2 - actor/pg_loss:0.1\n")  # a new file at the same name
    assert logtail.read_tail(path, inode=pool.inode(path)).lines == []


def test_a_log_replaced_by_a_fifo_does_not_block_the_evidence(tmp_path):
    path, pool = followed(tmp_path, "job.out", "step:1 - actor/pg_loss:0.1\n")
    os.unlink(path)
    os.mkfifo(path)
    done = []
    reader = threading.Thread(target=lambda: done.append(logtail.read_tail(path, inode=pool.inode(path))),
                              daemon=True)
    reader.start()
    reader.join(5)
    assert done and done[0].error and done[0].lines == []


# --- M3, L1: the evidence directory ---------------------------------------------------------------

def test_a_planted_link_at_the_temporary_name_is_not_written_through(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    folder = tmp_path / "evidence"
    folder.mkdir()
    moment = 1_700_000_000.0
    monkeypatch.setattr(time, "time", lambda: moment)
    planted = folder / ("." + file_name(RUN, moment) + ".tmp")
    os.symlink(victim, planted)
    EvidenceArchive(str(folder)).put(RUN, "evidence text\n", moment)
    assert victim.read_text() == "keep me\n"
    assert (folder / file_name(RUN, moment)).read_text() == "evidence text\n"


def test_retention_keeps_real_captures_against_planted_and_foreign_files(tmp_path):
    folder = tmp_path / "evidence"
    folder.mkdir()
    future = folder / "evidence-99991231T235959.000000Z-gsm8k-ppo-0123456789ab.txt"
    future.write_text("planted\n")
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not evidence\n")
    linked = folder / "evidence-20000101T000000.000000Z-a-b-0123456789ab.txt"
    os.symlink(elsewhere, linked)
    archive = EvidenceArchive(str(folder), retention=2)
    for index in range(3):
        archive.put(RunKey("gsm8k", f"run{index}"), f"capture {index}\n", 1_700_000_000.0 + index)
    kept = sorted(path.name for path in folder.iterdir())
    assert future.exists() and linked.is_symlink() and elsewhere.exists()
    assert [name for name in kept if "run" in name] == [file_name(RunKey("gsm8k", f"run{i}"), 1_700_000_000.0 + i)
                                                       for i in (1, 2)]


# --- L3: a YAML alias bomb in the options file ----------------------------------------------------

BOMB = "".join(f"{chr(97 + level)}: &{chr(97 + level)} [" + ",".join(
    [f"*{chr(96 + level)}"] * 9 if level else ['"x"'] * 9) + "]\n" for level in range(9))


def test_an_alias_bomb_in_the_options_file_is_one_line_and_no_memory(tmp_path):
    options = tmp_path / "options.yml"
    options.write_text(BOMB)
    with pytest.raises(OptionsError, match="uses a YAML alias"):
        load_options(["--config.file", str(options)])
    started = subprocess.run([sys.executable, "-m", "verl_exporter", "--config.file", str(options)],
                             capture_output=True, text=True, timeout=60, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO / "exporter")})
    assert started.returncode == 2 and "Traceback" not in started.stderr
    assert started.stderr.strip().count("\n") == 0 and "YAML alias" in started.stderr


# --- M5: a replay whose times span centuries ------------------------------------------------------

@pytest.mark.parametrize("lines", [
    "1970-01-01T00:00:01Z step:1 - actor/pg_loss:0.1\n2100-01-01T00:00:00Z step:2 - actor/pg_loss:0.2\n",
    "step:1 - actor/pg_loss:0.1 - timing_s/step:1e12\nstep:2 - actor/pg_loss:0.2 - timing_s/step:1e12\n",
])
@pytest.mark.parametrize("command", ["replay", "backfill"])
def test_a_log_whose_times_span_centuries_is_one_line_and_exit_2(tmp_path, lines, command):
    log = tmp_path / "console.log"
    log.write_text(lines)
    extra = (["--prometheus", require_binary("prometheus"), "--promtool", require_binary("promtool")]
             if command == "replay" else ["--output", str(tmp_path / "out"), "--no-blocks"])
    done = subprocess.run([sys.executable, "-m", "verl_exporter", command, str(log), *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO / "exporter")})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "over a year" in done.stderr and done.stderr.strip().count("\n") == 0


# --- L5: NCCL words cost what their line costs ----------------------------------------------------

def test_a_line_of_nccl_words_is_read_by_its_words_not_by_a_backtracking_regex(monkeypatch):
    """The NCCL timeout is found with ``str.find``: no regular expression is run over the line."""
    import verl_exporter.sources.errors as errors

    assert not hasattr(errors, "_NCCL_TIMEOUT")
    line = "NCCL 'timeout' " * 70_000
    assert error_kind(line) is None
    assert error_kind("(WorkerDict pid=9) NCCL operation timed out after 1800 s") == "nccl_timeout"
    assert error_kind("                        'nccl_timeout': 600,") is None


# --- round two's three left: reloads keep verified pairs, unknown users' cost, long passwords -----

def _hash(password: bytes, cost: int = 4) -> bytes:
    return bcrypt.hashpw(password, bcrypt.gensalt(cost))


def test_a_reload_keeps_the_pairs_verified_for_unchanged_users(tmp_path):
    config = write_web_config(tmp_path / "web.yml", {"basic_auth_users": {"alice": _hash(b"right").decode(),
                                                                          "bob": _hash(b"other").decode()}})
    before = web_config.load(str(config))
    assert before.check_password("alice", "right") and before.check_password("bob", "other")
    text = config.read_text().replace(before.users["bob"].decode(), _hash(b"new").decode())
    config.write_text(text)
    after = web_config.load(str(config))
    assert after.cached_password("alice", "right") is None  # what a reload used to start with
    after.keep_verified(before)
    assert after.cached_password("alice", "right") is True  # no bcrypt: no queue behind a flood
    assert after.cached_password("bob", "other") is None  # bob's hash changed: checked again
    assert not after.check_password("bob", "other") and after.check_password("bob", "new")


def test_an_unknown_user_costs_what_some_user_costs_and_the_same_each_time(monkeypatch):
    web = web_config.WebConfig(users={"alice": _hash(b"a", 4), "bob": _hash(b"b", 5)})
    used = []
    real = web_config.bcrypt.checkpw
    monkeypatch.setattr(web_config.bcrypt, "checkpw", lambda password, hashed: used.append(hashed) or real(password,
                                                                                                         hashed))
    for name in [f"mallory{index}" for index in range(40)] + ["mallory0"]:
        web.check_password(name, "wrong")
    costs = [int(hashed.split(b"$")[2]) for hashed in used]
    assert set(costs) == {4, 5}, "unknown names all cost the highest user's bcrypt: told apart from the others"
    assert costs[0] == costs[-1]  # the same name, the same cost


def test_a_password_over_72_bytes_is_checked_by_its_first_72_as_htpasswd_hashes_it():
    password = "p" * 80
    web = web_config.WebConfig(users={"alice": _hash(password.encode()[:72])})
    assert web.check_password("alice", password)
    assert not web.check_password("alice", "q" + password[1:])


# --- M6: churn of runs with keys of their own -----------------------------------------------------

def test_runs_that_come_and_go_with_keys_of_their_own_leave_nothing_behind():
    from verl_exporter.collectors.training import TrainingCollector
    from verl_exporter.store.catalog import default_catalog
    from verl_exporter.store.records import Record
    from verl_exporter.store.run_store import RunStore

    now = [1_000.0]
    store = RunStore(default_catalog(), idle_retention=60.0, clock=lambda: now[0])
    collector = TrainingCollector(store)
    for index in range(300):
        keys = {f"custom/run{index}/metric{k}": float(k) for k in range(20)}
        store.ingest(Record(RunKey("churn", f"run{index}"), 1, keys, time=now[0], source=f"/logs/{index}.log"))
        collector.text_parts()
        now[0] += 120.0  # each run idle past its retention before the next comes
    collector.text_parts()
    assert len(store.snapshot().runs) <= 1
    assert len(collector._text._headers) < 200, "every key ever logged keeps a header"


# --- L10: another log's config print --------------------------------------------------------------

def _config_print(total: int, lr: float) -> str:
    return ("{'trainer': {'project_name': 'gsm8k', 'experiment_name': 'ppo', 'total_training_steps': %d}, "
            "'actor_rollout_ref': {'actor': {'optim': {'lr': %g}}}}\n" % (total, lr))


def test_another_logs_config_print_neither_finishes_nor_describes_the_run(tmp_path):
    from verl_exporter.store.catalog import default_catalog
    from verl_exporter.store.run_store import RunStore

    (tmp_path / "a-victim.log").write_text(_config_print(100, 1e-6) + "".join(
        f"step:{step} - actor/pg_loss:0.1\n" for step in range(1, 51)))
    (tmp_path / "b-attacker.log").write_text(_config_print(1, 0.5) + "Total training steps: 1\n")
    store = RunStore(default_catalog())
    Source(str(tmp_path / "*.log"), store).settle()
    [state] = store.snapshot().runs
    assert state.last_step == 50 and not state.finished and state.total_steps == 100
    assert state.config.get("actor_rollout_ref.actor.optim.lr") == 1e-6


# --- L8: a head past 16 KiB in one write ----------------------------------------------------------

@pytest.mark.parametrize("size", [17 * 1024, 30 * 1024])
def test_a_head_past_16_kib_sent_in_one_write_is_refused(size):
    from hardening_helpers import raw_request

    http, _ = server_module.serve(("127.0.0.1", 0), Exposition([]))
    try:
        port = http.server_address[1]
        pad = b"X-Pad: " + b"a" * (size - 60) + b"\r\n"
        reply = raw_request(port, b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n" + pad + b"\r\n")
        assert reply.split(b"\r\n", 1)[0].split()[1] == b"431"
        small = raw_request(port, b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 15_000
                            + b"\r\nConnection: close\r\n\r\n")
        assert small.split(b"\r\n", 1)[0].split()[1] == b"200"
    finally:
        http.shutdown()
        http.server_close()


# --- the evidence without auth: this host's clients only ------------------------------------------

def _evidence_server(**kwargs):
    http, _ = server_module.serve(("0.0.0.0", 0), Exposition([]), evidence=lambda run: "evidence: secret\n",
                                  **kwargs)
    return http, http.server_address[1]


def _outside_address() -> str | None:
    """An address of this host that is not loopback, to come from as another machine would."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_the_evidence_without_auth_is_served_to_loopback_only():
    outside = _outside_address()
    if outside is None:
        pytest.skip("this host has no address but loopback to come from")
    http, port = _evidence_server()
    try:
        query = f"/debug/evidence?project=p&experiment=e&user={ME}"
        assert http_get(f"http://127.0.0.1:{port}{query}")[0] == 200
        status, body = http_get(f"http://{outside}:{port}{query}")
        assert status == 403 and "basic_auth_users" in body and "secret" not in body
        assert http_get(f"http://{outside}:{port}/metrics")[0] == 200  # scrapes from anywhere, as before
    finally:
        http.shutdown()
        http.server_close()
    http, port = _evidence_server(evidence_remote=True)
    try:
        assert http_get(f"http://{outside}:{port}/debug/evidence?project=p&experiment=e&user={ME}")[0] == 200
    finally:
        http.shutdown()
        http.server_close()


def test_the_slurm_unit_leaves_the_evidence_to_loopback_and_compose_publishes_on_loopback():
    unit = (REPO / "deploy" / "systemd" / "verl-exporter-slurm.service").read_text()
    assert "--forensics.remote" not in unit.split("ExecStart=", 1)[1].split("\n", 1)[0]
    compose = (REPO / "docker-compose.yml").read_text()
    assert "--forensics.remote" in compose and "- 127.0.0.1:9945:9945" in compose


# --- L9: past the cap of remembered names ---------------------------------------------------------

def test_past_the_cap_of_remembered_names_new_keys_keep_their_plain_names(monkeypatch):
    from verl_exporter.store import series_names
    from verl_exporter.store.catalog import default_catalog

    monkeypatch.setattr(series_names, "MAX_NAME_OWNERS", 10)
    names = series_names.SeriesNames(default_catalog())
    served = [names._entry(f"custom/metric{index}")[0][0] for index in range(30)]
    assert served == [f"verl_custom_metric{index}" for index in range(30)]
    assert names._entry("actor/pg_loss")[0][0] == "verl_actor_pg_loss"
    # Below the cap, two keys of one name still get a name each.
    fresh = series_names.SeriesNames(default_catalog())
    first, second = fresh._entry("custom/a:b")[0][0], fresh._entry("custom/a/b")[0][0]
    assert first == "verl_custom_a_b" and second.startswith("verl_custom_a_b_")


# --- M4: which file owns a run after a restart ----------------------------------------------------

def test_after_a_restart_the_file_that_named_the_run_first_still_owns_it(tmp_path):
    from verl_exporter.sources.birth_time import birth_time
    from verl_exporter.store.catalog import default_catalog
    from verl_exporter.store.run_store import RunStore

    victim = tmp_path / "z-victim.log"
    victim.write_text(_config_print(100, 1e-6) + "".join(f"step:{step} - actor/pg_loss:0.1\n" for step in range(1, 51)))
    time.sleep(0.05)
    attacker = tmp_path / "a-attacker.log"  # read first by name
    attacker.write_text(_config_print(100, 1e-6) + "step:1000 - actor/pg_loss:666\n")
    os.utime(attacker, (1, 1))  # and claims, by its modification time, to be older
    if birth_time(str(victim)) is None:
        pytest.skip("this file system keeps no birth time")
    store = RunStore(default_catalog())
    Source(str(tmp_path / "*.log"), store).settle()  # a restarted exporter reads both at once
    [state] = store.snapshot().runs
    assert state.last_step == 50 and state.values["actor/pg_loss"] == 0.1
    assert store.snapshot().values_dropped.get((str(attacker), "other_source"))


# --- L2: decoy stalls ------------------------------------------------------------------------------

def test_one_users_decoy_stalls_cannot_push_another_users_evidence_out():
    archive = EvidenceArchive()
    real = RunKey("team", "real-run")
    archive.put(real, "the real stall\n", 1.0, owner=1000)
    for index in range(60):
        archive.put(RunKey("decoy", f"run{index}"), "decoy\n", 2.0 + index, owner=65534)
    assert archive.get(real) == "the real stall\n"
    kept = [run for run in archive.runs() if run.project == "decoy"]
    assert len(kept) == 8 and RunKey("decoy", "run59") in kept  # the decoys' newest
