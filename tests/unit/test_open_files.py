"""The follower's descriptor cap: many files, few descriptors, nothing lost; streamed polls."""

import os

from verl_exporter.sources.open_files import OpenFiles
from verl_exporter.sources.tail import FileFollower


def _append(path, text):
    with open(path, "a") as out:
        out.write(text)


def _lines(follower):
    return sorted(line for _, line in follower.poll())


def _fds():
    return len(os.listdir("/proc/self/fd"))


def test_many_files_are_read_with_few_descriptors(tmp_path):
    pool = OpenFiles(3)
    for index in range(20):
        _append(tmp_path / f"run{index:02}.log", f"a{index}\n")
    follower = FileFollower(str(tmp_path / "*.log"), open_files=pool)
    before = _fds()
    assert _lines(follower) == sorted(f"a{index}" for index in range(20))
    assert len(pool) <= 3 and _fds() - before <= 3
    for index in range(20):  # every file grows: reopened by path at its offset, one after another
        _append(tmp_path / f"run{index:02}.log", f"b{index}\n")
    assert _lines(follower) == sorted(f"b{index}" for index in range(20))
    assert len(pool) <= 3 and _fds() - before <= 3 and pool.evictions >= 17
    follower.close()
    assert len(pool) == 0 and _fds() == before


def _two_files(tmp_path, first_text):
    """a.log and b.log followed with one descriptor: a.log is closed to make room for b.log."""
    first = tmp_path / "a.log"
    _append(first, first_text)
    _append(tmp_path / "b.log", "x\n")
    follower = FileFollower(str(tmp_path / "*.log"), open_files=OpenFiles(1))
    assert _lines(follower) == sorted(first_text.split() + ["x"])
    return first, follower


def test_a_closed_file_replaced_under_its_path_is_read_from_zero(tmp_path):
    first, follower = _two_files(tmp_path, "one\n")
    os.rename(first, tmp_path / "a.log.1")
    _append(first, "fresh\n")  # another inode under the same path
    assert _lines(follower) == ["fresh"]
    _append(first, "more\n")
    _append(tmp_path / "a.log.1", "late\n")  # the old file is no longer followed
    assert _lines(follower) == ["more"]
    follower.close()


def test_a_truncated_closed_file_is_read_again_from_zero(tmp_path):
    first, follower = _two_files(tmp_path, "one\ntwo\n")
    first.write_text("new\n")  # shorter than the offset held while closed
    assert _lines(follower) == ["new"]
    follower.close()


def test_rotation_keeps_the_old_file_open_whatever_the_cap(tmp_path):
    pool = OpenFiles(1)
    path = tmp_path / "run.log"
    _append(path, "1\n")
    follower = FileFollower(str(path), open_files=pool)
    assert _lines(follower) == ["1"]
    _append(path, "2\n")
    os.rename(path, tmp_path / "run.log.1")
    _append(path, "3\n")
    assert [line for _, line in follower.poll()] == ["2", "3"]  # the old file's rest first
    follower.close()


def test_lines_are_handed_over_one_file_at_a_time_and_state_is_set_at_the_end(tmp_path):
    for name in "abc":
        _append(tmp_path / f"{name}.log", f"{name}1\n{name}2\n")
    follower = FileFollower(str(tmp_path / "*.log"), read_chunk=4, max_poll_bytes=4, open_files=OpenFiles(8))
    assert follower.behind and not follower.caught_up
    batches = []
    for batch in follower.poll_iter():
        assert len({path for path, _ in batch}) == 1
        assert follower.behind and not follower.caught_up  # no answer before the poll is over
        batches.append(batch)
    assert len(batches) == 3 and follower.behind and not follower.caught_up
    while follower.behind:
        follower.poll()
    assert follower.caught_up
    _append(tmp_path / "a.log", "x" * 40 + "\n")
    follower.poll()
    assert follower.behind and follower.caught_up  # caught up once: new lines do not unready it
    follower.close()
