"""FileFollower: ``tail -F`` over a path or glob, polled without blocking."""

import logging
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_exporter.sources import tail
from verl_exporter.sources.tail import FileFollower


def _append(path, data):
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def _texts(lines):
    return [text for _, text in lines]


@pytest.fixture
def follower_for():
    made = []

    def make(pattern, **kwargs):
        follower = FileFollower(str(pattern), **kwargs)
        made.append(follower)
        return follower

    yield make
    for follower in made:
        follower.close()


def test_reads_existing_file_from_the_beginning_then_only_new_lines(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, "a\nb\n")
    follower = follower_for(log)
    assert follower.poll() == [(str(log), "a"), (str(log), "b")]
    assert follower.poll() == []
    _append(log, "c\n")
    assert follower.poll() == [(str(log), "c")]


def test_file_created_later_is_picked_up(tmp_path, follower_for):
    log = tmp_path / "later.jsonl"
    follower = follower_for(log)
    assert follower.poll() == []
    _append(log, "first\n")
    assert _texts(follower.poll()) == ["first"]


def test_glob_picks_up_new_files(tmp_path, follower_for):
    (tmp_path / "proj").mkdir()
    _append(tmp_path / "proj" / "a.jsonl", "a1\n")
    follower = follower_for(tmp_path / "*" / "*.jsonl")
    assert follower.poll() == [(str(tmp_path / "proj" / "a.jsonl"), "a1")]
    _append(tmp_path / "proj" / "b.jsonl", "b1\n")
    _append(tmp_path / "proj" / "ignored.log", "x\n")
    _append(tmp_path / "proj" / "a.jsonl", "a2\n")
    assert sorted(follower.poll()) == [
        (str(tmp_path / "proj" / "a.jsonl"), "a2"),
        (str(tmp_path / "proj" / "b.jsonl"), "b1"),
    ]


def test_half_written_line_waits_for_its_newline(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, "done\nhalf")
    follower = follower_for(log)
    assert _texts(follower.poll()) == ["done"]
    _append(log, "-way")
    assert follower.poll() == []
    _append(log, " there\nnext")
    assert _texts(follower.poll()) == ["half-way there"]


def test_truncation_restarts_from_zero(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, "old line one\nold line two\npartial")
    follower = follower_for(log)
    assert _texts(follower.poll()) == ["old line one", "old line two"]
    with open(log, "wb") as f:  # what verl's FileLogger does when a run restarts ("wb")
        f.write(b"new\n")
    assert _texts(follower.poll()) == ["new"]


def test_a_file_rewritten_in_place_past_the_offset_is_read_from_zero(tmp_path, follower_for):
    """verl 0.9's FileLogger opens its file "wb": a resumed run truncates it and, before the next poll,
    may write more than had been read. The same file (same inode), longer than the offset, is read
    again from its start, not from the old offset (which would cut its first line)."""
    log = tmp_path / "run.log"
    _append(log, '{"step": 1}\n{"step": 2}\n')
    follower = follower_for(log)
    inode = os.stat(log).st_ino
    assert _texts(follower.poll()) == ['{"step": 1}', '{"step": 2}']
    with open(log, "wb") as f:
        f.write(b'{"step": 3, "resumed": 1}\n{"step": 4, "resumed": 1}\n')
    assert os.stat(log).st_ino == inode
    assert _texts(follower.poll()) == ['{"step": 3, "resumed": 1}', '{"step": 4, "resumed": 1}']
    _append(log, '{"step": 5}\n')  # and an append is an append
    assert _texts(follower.poll()) == ['{"step": 5}']


def test_rotation_finishes_old_file_then_reads_new_one(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, "1\n2\n")
    follower = follower_for(log)
    assert _texts(follower.poll()) == ["1", "2"]
    _append(log, "3\n4\nunfinished")
    os.rename(log, tmp_path / "run.log.1")
    _append(log, "5\n")
    assert _texts(follower.poll()) == ["3", "4", "5"]
    _append(tmp_path / "run.log.1", "\nlate\n")  # old file is closed: nothing more from it
    _append(log, "6\n")
    assert _texts(follower.poll()) == ["6"]


def test_rotation_backlog_is_read_over_several_polls_in_order(tmp_path, follower_for):
    log = tmp_path / "run.log"
    follower = follower_for(log, read_chunk=64, max_poll_bytes=64)
    _append(log, "")
    follower.poll()
    _append(log, "".join(f"old{i:03d}\n" for i in range(40)))
    os.rename(log, tmp_path / "run.log.1")
    _append(log, "".join(f"new{i:03d}\n" for i in range(40)))
    seen = []
    for _ in range(100):
        seen += _texts(follower.poll())
        if not follower.behind:
            break
    assert seen == [f"old{i:03d}" for i in range(40)] + [f"new{i:03d}" for i in range(40)]


def test_deleted_file_warns_once_and_is_read_again_when_recreated(tmp_path, follower_for, caplog):
    log = tmp_path / "run.log"
    _append(log, "a\n")
    follower = follower_for(log)
    assert _texts(follower.poll()) == ["a"]
    _append(log, "b\n")
    os.unlink(log)
    with caplog.at_level(logging.WARNING, logger=tail.__name__):
        assert _texts(follower.poll()) == ["b"]  # the open descriptor still holds it
        assert follower.poll() == []
        assert follower.poll() == []
    assert len([r for r in caplog.records if "disappeared" in r.getMessage()]) == 1
    _append(log, "c\n")
    assert _texts(follower.poll()) == ["c"]
    os.unlink(log)  # a new disappearance after recovery is worth a new warning
    with caplog.at_level(logging.WARNING, logger=tail.__name__):
        follower.poll()
    assert len([r for r in caplog.records if "disappeared" in r.getMessage()]) == 2


def test_backlog_is_bounded_per_poll(tmp_path, follower_for):
    log = tmp_path / "run.log"
    lines = [f"line {i:05d}" for i in range(2000)]
    _append(log, "".join(line + "\n" for line in lines))
    follower = follower_for(log, read_chunk=1000, max_poll_bytes=4000)
    assert follower.behind  # nothing read yet
    first = follower.poll()
    assert 0 < len(first) < len(lines) and follower.behind
    seen = _texts(first)
    for _ in range(100):
        if not follower.behind:
            break
        seen += _texts(follower.poll())
    assert seen == lines and not follower.behind


def test_oversize_line_in_one_read_is_dropped_and_reported(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, "ok1\n" + "x" * 5000 + "\nok2\n")
    follower = follower_for(log, max_line_bytes=1000)
    assert _texts(follower.poll()) == ["ok1", "ok2"]
    assert follower.take_oversize() == [(str(log), 5000)]
    assert follower.take_oversize() == []
    assert follower.oversize_lines == 1


def test_oversize_line_across_reads_is_never_held_in_memory(tmp_path, follower_for):
    log = tmp_path / "run.log"
    follower = follower_for(log, max_line_bytes=1000, read_chunk=256)
    _append(log, "ok1\n")
    assert _texts(follower.poll()) == ["ok1"]
    for _ in range(20):
        _append(log, "y" * 700)
        assert follower.poll() == []
        assert len(follower._handles[str(log)].pending) <= 1000
    _append(log, "tail of the long line\nok2\n")
    assert _texts(follower.poll()) == ["ok2"]
    assert [path for path, _ in follower.take_oversize()] == [str(log)]
    assert follower.oversize_lines == 1


def test_multibyte_line_limit_counts_bytes(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, "é" * 600 + "\n" + "é" * 400 + "\n")  # 1200 and 800 bytes
    follower = follower_for(log, max_line_bytes=1000)
    assert _texts(follower.poll()) == ["é" * 400]
    assert follower.oversize_lines == 1


def test_invalid_utf8_is_replaced_and_nul_bytes_survive(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, b"bad \xff\xfe byte\nnul\x00inside\ncut \xe2\x82\nok\r\n")
    follower = follower_for(log)
    assert _texts(follower.poll()) == ["bad \ufffd\ufffd byte", "nul\x00inside", "cut \ufffd", "ok\r"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=12), st.sampled_from(
    [b"\n", b"\r\n", b"\xe2\x82", b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80", b"\xed\xa0\x80", b"\xc3", b"\xa9",
     b"\xff", "é€😀".encode()])), max_size=40).map(b"".join))
def test_lines_read_as_the_whole_block_decoded_would_split(raw):
    # Lines are decoded one by one: the same text as the block decoded, then split, whatever the bytes.
    follower = FileFollower("unused")
    out: list = []
    follower._emit("p", raw, out)
    assert [line for _, line in out] == raw.decode("utf-8", "replace").split("\n")


def test_directory_matching_the_glob_is_skipped_with_one_warning(tmp_path, follower_for, caplog):
    (tmp_path / "dir.log").mkdir()
    _append(tmp_path / "real.log", "a\n")
    follower = follower_for(tmp_path / "*.log")
    with caplog.at_level(logging.WARNING, logger=tail.__name__):
        assert _texts(follower.poll()) == ["a"]
        assert follower.poll() == []
    assert len([r for r in caplog.records if "dir.log" in r.getMessage()]) == 1


def test_fifo_does_not_block(tmp_path, follower_for):
    os.mkfifo(tmp_path / "pipe.log")
    _append(tmp_path / "real.log", "a\n")
    follower = follower_for(tmp_path / "*.log")
    assert _texts(follower.poll()) == ["a"]


def test_unreadable_file_warns_once_and_recovers(tmp_path, follower_for, caplog, monkeypatch):
    log = tmp_path / "run.log"
    _append(log, "a\n")
    follower = follower_for(log)
    real_open = os.open

    def denied(path, *args, **kwargs):
        if str(path) == str(log):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(tail.os, "open", denied)
    with caplog.at_level(logging.WARNING, logger=tail.__name__):
        assert follower.poll() == []
        assert follower.poll() == []
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "Permission denied" in warnings[0]
    monkeypatch.setattr(tail.os, "open", real_open)
    assert _texts(follower.poll()) == ["a"]


def test_read_error_keeps_the_position(tmp_path, follower_for, monkeypatch):
    log = tmp_path / "run.log"
    _append(log, "a\n")
    follower = follower_for(log)
    assert _texts(follower.poll()) == ["a"]
    _append(log, "b\n")

    def broken(fd, n):
        raise OSError(5, "Input/output error")

    real_read = os.read
    monkeypatch.setattr(tail.os, "read", broken)
    assert follower.poll() == []
    monkeypatch.setattr(tail.os, "read", real_read)
    assert _texts(follower.poll()) == ["b"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_chmod_000_file_does_not_raise(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, "a\n")
    log.chmod(0)
    follower = follower_for(log)
    assert follower.poll() == []
    log.chmod(0o644)
    assert _texts(follower.poll()) == ["a"]


def test_idle_file_is_closed_and_resumed_at_its_offset(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, "a\nhal")
    follower = follower_for(log, close_idle_after=2)
    assert _texts(follower.poll()) == ["a"]
    follower.poll()
    follower.poll()
    assert follower._handles[str(log)].fd is None  # descriptor given back
    assert follower.poll() == []
    _append(log, "f\nb\n")
    assert _texts(follower.poll()) == ["half", "b"]
    assert follower._handles[str(log)].fd is not None


def test_idle_file_truncated_or_replaced_is_read_from_zero(tmp_path, follower_for):
    log = tmp_path / "run.log"
    _append(log, "first run line\n")
    follower = follower_for(log, close_idle_after=1)
    assert _texts(follower.poll()) == ["first run line"]
    follower.poll()
    assert follower._handles[str(log)].fd is None
    with open(log, "wb") as f:
        f.write(b"again\n")
    assert _texts(follower.poll()) == ["again"]
    follower.poll()
    os.rename(log, tmp_path / "run.log.1")
    _append(log, "new file\n")
    assert _texts(follower.poll()) == ["new file"]
    follower.poll()
    os.unlink(log)
    assert follower.poll() == []
    assert str(log) not in follower._handles
