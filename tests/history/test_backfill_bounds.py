"""``verl-exporter backfill`` against long logs and planted outputs: memory bounded by the log, not
by its scrapes; every failure one line and exit status 2; nothing written through a link."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from servers import require_binary
from verl_exporter.cli import main
from verl_exporter.history import backfill

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
END = 1_750_000_000.0
KEYS = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl", "actor/lr", "critic/score/mean",
        "critic/rewards/mean", "response_length/mean", "perf/throughput")

# Stands in for promtool: adds the sample count of its part to $COUNTS; fails unless it ends in "# EOF".
STUB_PROMTOOL = """#!/bin/sh
eval "file=\\${$(($# - 1))}"
exec awk '!/^#/ { n++ } END { print n >> ENVIRON["COUNTS"]; exit $0 != "# EOF" }' "$file"
"""


def long_log(path: Path, steps: int, days: float) -> Path:
    """A JSONL log of ``steps`` steps with ten keys each, ending at END and spanning ``days``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    seconds = days * 86400 / steps
    with path.open("w") as out:
        for step in range(1, steps + 1):
            data = {key: round(rng.random(), 4) for key in KEYS}
            data["timing_s/step"] = seconds
            out.write(json.dumps({"step": step, "data": data}) + "\n")
    os.utime(path, (END, END))
    return path


def run_backfill(*args: str) -> tuple[int, str, str]:
    """``verl-exporter backfill ARGS`` in a child: its exit status, stdout and stderr."""
    done = subprocess.run([sys.executable, "-m", "verl_exporter", "backfill", *args], capture_output=True,
                          text=True, timeout=600, cwd=REPO, env=ENV)
    return done.returncode, done.stdout, done.stderr


def peak_rss(args: list[str], env: dict[str, str]) -> int:
    """Run ``verl-exporter backfill ARGS`` under a Python of its own and return the backfill's peak
    RSS in KiB (ru_maxrss of that Python's children: the largest, the backfill)."""
    measure = ("import resource, subprocess, sys; status = subprocess.run(sys.argv[1:]).returncode; "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, status)")
    done = subprocess.run([sys.executable, "-c", measure, sys.executable, "-m", "verl_exporter", "backfill",
                           *args], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    rss, status = done.stdout.split()[-2:]
    assert status == "0", done.stderr[-2000:]
    return int(rss)


def check_openmetrics(path: Path) -> int:
    """Read ``path`` line by line: each family's samples together, ``# EOF`` last; its sample count."""
    families: set[str] = set()
    family, samples, last = "", 0, ""
    with path.open() as lines:
        for line in lines:
            last = line
            if line.startswith("# TYPE "):
                family = line.split()[2]
                assert family not in families, f"{family} comes twice"
                families.add(family)
            elif not line.startswith("#"):
                name = line.split("{")[0].split(" ")[0]
                assert name == family or name.startswith(family + "_"), f"{name} outside its family {family}"
                samples += 1
    assert last == "# EOF\n"
    return samples


@pytest.mark.slow
def test_a_long_history_is_split_into_blocks_in_bounded_memory(tmp_path):
    """69 days scraped every 600 s (115 MB of OpenMetrics, 828 two-hour block windows): the whole
    text was held to split it by block (200 MiB peak); it is now split through files (67 MiB)."""
    log = long_log(tmp_path / "logs" / "p" / "long.jsonl", 2_000, 69)
    promtool = tmp_path / "promtool"
    promtool.write_text(STUB_PROMTOOL)
    promtool.chmod(0o755)
    counts = tmp_path / "counts"
    out = tmp_path / "out"
    rss = peak_rss([str(log), "--output", str(out), "--scrape-interval", "600", "--promtool", str(promtool)],
                   env={**ENV, "COUNTS": str(counts)})
    written = check_openmetrics(out / "backfill.om")
    assert written > 700_000
    assert rss < 120 * 1024, f"peak RSS {rss // 1024} MiB"
    assert sum(map(int, counts.read_text().split())) == written  # every sample in one block window's part
    assert len(counts.read_text().split()) > 800  # 69 days of two-hour windows
    assert sorted(path.name for path in out.iterdir()) == ["backfill.om", "blocks"]  # no part left

    blocks = tmp_path / "blocks"
    subprocess.run([require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                    "--max-block-duration=1458h", str(out / "backfill.om"), str(blocks)],
                   check=True, capture_output=True, timeout=600)
    listed = subprocess.run([require_binary("promtool"), "tsdb", "list", str(blocks)], check=True,
                            capture_output=True, text=True).stdout.splitlines()[1:]
    assert sum(int(line.split()[4]) for line in listed if line.strip()) == written


def test_a_history_over_the_sample_cap_is_one_line_and_leaves_no_file(tmp_path):
    log = long_log(tmp_path / "logs" / "p" / "e.jsonl", 20, 10)
    out = tmp_path / "out"
    status, _, err = run_backfill(str(log), "--output", str(out), "--scrape-interval", "0.01", "--no-blocks")
    assert status == 2 and "Traceback" not in err and err.strip().count("\n") == 0, err[-2000:]
    assert f"over {backfill.MAX_SAMPLES:,} samples: give a longer --scrape-interval (at least" in err
    assert list(out.iterdir()) == []


def test_running_out_of_memory_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    log = long_log(tmp_path / "logs" / "p" / "e.jsonl", 20, 1)
    out = tmp_path / "out"

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(backfill, "write_openmetrics", exhausted)
    assert main(["backfill", str(log), "--output", str(out), "--no-blocks"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "out of memory" in err
    assert list(out.iterdir()) == []


def test_a_multiline_error_is_printed_on_one_line(tmp_path, monkeypatch, capsys):
    log = long_log(tmp_path / "logs" / "p" / "e.jsonl", 20, 1)

    def failing(*args, **kwargs):
        raise RuntimeError("promtool failed (1): line one\nline two\n")

    monkeypatch.setattr(backfill, "create_blocks", failing)
    assert main(["backfill", str(log), "--output", str(tmp_path / "out"), "--promtool", "promtool"]) == 2
    assert capsys.readouterr().err == "verl-exporter backfill: error: promtool failed (1): line one; line two\n"


@pytest.mark.parametrize("name", [backfill.OPENMETRICS_FILE, backfill.BLOCKS_DIR])
def test_a_planted_link_in_the_output_folder_is_refused_and_not_followed(tmp_path, name):
    log = long_log(tmp_path / "logs" / "p" / "e.jsonl", 20, 1)
    victim = tmp_path / "victim"
    victim.mkdir()
    precious = victim / "file"
    precious.write_text("root's own\n")
    out = tmp_path / "shared"
    out.mkdir()
    (out / name).symlink_to(precious if name == backfill.OPENMETRICS_FILE else victim)
    status, _, err = run_backfill(str(log), "--output", str(out), "--promtool", require_binary("promtool"))
    assert status == 2 and "Traceback" not in err and err.strip().count("\n") == 0, err[-2000:]
    assert f"refusing to write {out / name}: it is a symbolic link" in err
    assert precious.read_text() == "root's own\n" and sorted(victim.iterdir()) == [precious]
    assert sorted(out.iterdir()) == [out / name]


def test_another_users_file_is_refused_and_ones_own_replaced(tmp_path):
    log = long_log(tmp_path / "logs" / "p" / "e.jsonl", 20, 1)
    out = tmp_path / "out"
    out.mkdir()
    openmetrics = out / backfill.OPENMETRICS_FILE
    openmetrics.write_text("an earlier backfill\n")
    status, _, err = run_backfill(str(log), "--output", str(out), "--no-blocks")
    assert status == 0, err
    assert openmetrics.read_text().endswith("# EOF\n") and not openmetrics.is_symlink()
    assert sorted(out.iterdir()) == [openmetrics]
    if os.geteuid() != 0:
        return  # a file of another user's can only be made by root
    os.chown(openmetrics, 65534, 65534)
    status, _, err = run_backfill(str(log), "--output", str(out), "--no-blocks")
    assert status == 2 and "owned by another user (uid 65534)" in err and err.strip().count("\n") == 0


def test_a_link_put_in_place_while_writing_is_replaced_not_followed(tmp_path):
    """``replacing`` writes a new file and renames it onto the path: a link there meanwhile is
    replaced, its target left alone; an error leaves neither file nor temporary."""
    precious = tmp_path / "precious"
    precious.write_text("kept\n")
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "backfill.om"
    with backfill.replacing(target) as out:
        target.symlink_to(precious)
        out.write("# EOF\n")
    assert precious.read_text() == "kept\n"
    assert not target.is_symlink() and target.read_text() == "# EOF\n"
    with pytest.raises(ValueError), backfill.replacing(folder / "other.om") as out:
        out.write("half")
        raise ValueError("stopped")
    assert sorted(folder.iterdir()) == [target]
