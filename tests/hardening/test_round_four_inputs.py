"""Hostile input, round four: lines of 72,000 keys (memory bounded by the caps, not by the lines),
values near the largest float (the run stays on /metrics) and a console line of exactly 4,096
characters (its last pair is read). Each test fails on the code before its fix."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from exposition import samples
from exposition import scrape as scrape_collectors
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.sources import Source, jsonl
from verl_exporter.sources.console import WANDB_LINE_CHARS
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("gsm8k", "ppo")

# --- H6: lines of 72,000 keys -----------------------------------------------------------------------

KEYS = 72_000  # a line just under 1 MiB
LINES = 20  # of the reported 300: before the fix each line held ~10 MB until folded (256 lines: 2.4 GB)
RSS_BOUND_MB = 120  # after the fix: 55-65 MB, whatever the number of lines

# The peak RSS is VmHWM, the process's own: ru_maxrss keeps the parent's peak across the exec.
READ_FILE = """
import json, sys
from verl_exporter.sources import Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore
store = RunStore(default_catalog())
Source(sys.argv[1], store, project="p", experiment="e").settle(timeout=300)
snapshot = store.snapshot()
[run] = snapshot.runs
peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0].split()[1]
print(json.dumps({"rss_mb": int(peak) / 1024,
                  "last_step": run.last_step, "entropy": run.values.get("actor/entropy"),
                  "windows": sorted(run.windows), "series_dropped": run.dropped_unremembered + len(run.dropped_keys),
                  "dropped": {reason: count for (_, reason), count in snapshot.values_dropped.items()}}))
"""


def _write_wide_lines(path, shape: str) -> None:
    with open(path, "w") as out:
        for step in range(1, LINES + 1):
            if shape == "jsonl":
                keys = ",".join(f'"k{i:05d}":1.0' for i in range(KEYS))
                line = '{"step":%d,%s,"actor/entropy":0.5}' % (step, keys)
            else:
                keys = " - ".join(f"k{i:05d}:1.0" for i in range(KEYS))
                line = f"step:{step} - {keys} - actor/entropy:0.5"
            assert len(line) < 1 << 20
            out.write(line + "\n")


def test_lines_of_72000_keys_are_read_in_memory_bounded_by_the_caps(tmp_path):
    """20 lines of 72,000 keys, as JSON lines and as console lines, each read through the real
    Source into a RunStore in a process of its own: its peak RSS stays under RSS_BOUND_MB (before
    the fix: 219 and 249 MB, ~10 MB more a line up to 256 lines; 2.4 and 2.8 GB for 300 lines,
    64 and 57 MB after). The catalog key at each line's end is still read, its step statistics
    kept, the keys over the cap counted."""
    files = {shape: tmp_path / f"wide.{shape}" for shape in ("jsonl", "log")}
    for shape, path in files.items():
        _write_wide_lines(path, shape)
    readers = {shape: subprocess.Popen([sys.executable, "-c", READ_FILE, str(path)], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True) for shape, path in files.items()}
    try:
        results = {shape: reader.communicate(timeout=120) for shape, reader in readers.items()}
    finally:
        for reader in readers.values():
            reader.kill()
    for shape, (out, err) in results.items():
        assert readers[shape].returncode == 0, err[-2000:]
        read = json.loads(out)
        assert read["rss_mb"] < RSS_BOUND_MB, (shape, read)
        assert read["last_step"] == LINES and read["entropy"] == 0.5, (shape, read)
        assert read["windows"] == ["verl_actor_entropy"], (shape, read)
        assert read["dropped"] == {"too_many_keys": LINES * (KEYS - jsonl.MAX_KEYS_PER_LINE)}, (shape, read)
        assert read["series_dropped"] > 0, (shape, read)


def test_a_line_over_the_key_cap_keeps_its_first_keys_and_every_catalog_key():
    cap = jsonl.MAX_KEYS_PER_LINE
    data = {f"junk/{i}": 1.0 for i in range(2 * cap)}
    data["actor/pg_loss"] = 0.25
    dropped: list[str] = []
    step, values = jsonl.parse_jsonl_line(json.dumps({"step": 3, "data": data}), dropped.append)
    assert step == 3 and len(values) == cap + 1 and values["actor/pg_loss"] == 0.25
    assert list(values)[:cap] == [f"junk/{i}" for i in range(cap)]
    assert dropped == ["too_many_keys"] * cap
    # a line at the cap is whole
    dropped.clear()
    line = json.dumps({"step": 4, **{f"k{i}": 1 for i in range(cap)}})
    assert len(jsonl.parse_jsonl_line(line, dropped.append)[1]) == cap and dropped == []


# --- L4: values near the largest float ----------------------------------------------------------------

HUGE = 1.7e308


def _served(store: RunStore) -> dict:
    return samples(scrape_collectors(training=TrainingCollector(store)))


def _of(served: dict, name: str, metric: str | None = None) -> list[float]:
    """The values of ``name`` for the run (and the watched ``metric``, for a step statistic)."""
    return [value for (sample, labels), value in served.items() if sample == name
            and ("experiment", RUN.experiment) in labels and (metric is None or metric in dict(labels).values())]


@pytest.mark.parametrize("as_text", [False, True], ids=["numbers", "text"])
def test_values_near_the_largest_float_are_served_as_they_are_and_the_run_stays(as_text):
    """Two keys of 1.7e308 in each line (their sum overflows), the step statistics' sums over them
    (an fsum raised: the run left /metrics), alternating signs (a window's sum of +-1.7e308, a
    median of two of them): every value is served finite, inf only for the key the log said inf."""
    store = RunStore(default_catalog())
    for step in range(1, 31):
        values = {"actor/pg_loss": HUGE, "actor/entropy": HUGE, "critic/score/mean": HUGE,
                  "actor/grad_norm": HUGE if step % 2 else -HUGE, "actor/ppo_kl": -HUGE,
                  "critic/vf_loss": math.inf if step == 30 else HUGE}
        if as_text:
            values = {key: repr(value) for key, value in values.items()}
        store.ingest(Record(RUN, step, values, time=1_700_000_000.0 + step, source="/runs/x.log"))
    served = _served(store)
    assert _of(served, "verl_training_last_step") == [30]
    assert _of(served, "verl_actor_pg_loss") == [HUGE] and _of(served, "verl_actor_ppo_kl") == [-HUGE]
    assert _of(served, "verl_critic_vf_loss") == [math.inf]  # the log said inf
    for stat in ("window_mean", "prior_mean", "long_mean", "window_median", "recent_max", "early_median",
                 "best_window_mean"):
        assert _of(served, f"verl_training_{stat}", "verl_critic_score_mean") == [HUGE], stat
    for stat in ("prior_mean", "long_mean", "window_median", "recent_min", "early_median"):
        assert _of(served, f"verl_training_{stat}", "verl_actor_entropy") == [HUGE], stat
    for stat in ("prior_mean", "window_median", "recent_min", "recent_max"):
        assert _of(served, f"verl_training_{stat}", "verl_actor_ppo_kl") == [-HUGE], stat
    grad = {stat: _of(served, f"verl_training_{stat}", "verl_actor_grad_norm")
            for stat in ("recent_min", "recent_max", "window_median", "prior_mean", "prior_stddev")}
    assert grad == {"recent_min": [-HUGE], "recent_max": [HUGE], "window_median": [0.0], "prior_mean": [0.0],
                    "prior_stddev": [HUGE]}
    assert all(math.isfinite(value) for (name, _), value in served.items() if name.startswith("verl_training_"))
    nonfinite = [labels for (name, labels), _ in served.items() if name == "verl_training_nonfinite_values_total"]
    assert [dict(labels)["key"] for labels in nonfinite] == ["critic/vf_loss"]


def test_a_window_that_held_huge_values_serves_plain_ones_again():
    store = RunStore(default_catalog())
    for step in range(1, 41):
        score = HUGE if step <= 5 else 0.5
        store.ingest(Record(RUN, step, {"critic/score/mean": score}, time=1_700_000_000.0 + step))
        if step in (5, 12):
            _served(store)  # folded one record at a time and in bulk
    served = _served(store)
    assert _of(served, "verl_training_window_mean", "verl_critic_score_mean") == [0.5]
    assert _of(served, "verl_training_best_window_mean", "verl_critic_score_mean") == [pytest.approx(HUGE / 2)]


# --- L9: a console line of exactly 4,096 characters ---------------------------------------------------

def _step_line(length: int, last: str = "actor/entropy:0.25") -> str:
    """``step:9 - actor/pg_loss:0.5 - p0000:0.5 - ... - <last>``, ``length`` characters."""
    line = "step:9 - actor/pg_loss:0.5 - "
    index = 0
    while length - len(line) - len(last) > 40:
        line += f"p{index:04d}:0.5 - "
        index += 1
    return line + "q" * (length - len(line) - len(last) - len(":0.5 - ")) + ":0.5 - " + last


def _read(tmp_path, writes: list[str]) -> tuple[dict, dict]:
    """The run's values and the values dropped, after each of ``writes`` is appended to a log that a
    Source (the real file-tailing path) polls after every write."""
    log = tmp_path / "train.log"
    log.write_text("")
    store = RunStore(default_catalog())
    source = Source(str(log), store, project=RUN.project, experiment=RUN.experiment)
    for chunk in writes:
        with open(log, "a") as out:
            out.write(chunk)
        source.poll()
    snapshot = store.snapshot()
    [state] = snapshot.runs
    return state.values, {reason: count for (_, reason), count in snapshot.values_dropped.items()}


@pytest.mark.parametrize("length", [WANDB_LINE_CHARS - 1, WANDB_LINE_CHARS, WANDB_LINE_CHARS + 1])
@pytest.mark.parametrize("ending", ["\n", "\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("writes", [1, 2])
def test_a_console_line_whose_last_pair_ends_at_4096_characters_keeps_it(tmp_path, length, ending, writes):
    """A last pair that shows its own end (numpy 2's ``np.float64(0.25)``) is read at any length; a
    plain number at exactly wandb's limit may be a longer one cut short, and is left out."""
    for last, kept in (("actor/entropy:np.float64(0.25)", True), ("actor/entropy:0.25", length != WANDB_LINE_CHARS)):
        line = _step_line(length, last)
        assert len(line) == length and line.endswith(last)
        text = line + ending
        chunks = [text] if writes == 1 else [text[:length // 2], text[length // 2:]]
        values, dropped = _read(tmp_path, chunks)
        assert values.get("actor/entropy") == (0.25 if kept else None), last
        assert values["actor/pg_loss"] == 0.5 and dropped == {}
        (tmp_path / "train.log").unlink()


@pytest.mark.parametrize("cut", ["actor/entropy:np.float64(0.2", "actor/entropy:", "actor/entropy:np.flo",
                                 "actor/entropy:1.5e", "actor/entr"])
def test_a_line_that_wandb_visibly_cut_at_4096_characters_still_loses_the_cut_pair(tmp_path, cut):
    line = _step_line(WANDB_LINE_CHARS, last=cut)
    values, dropped = _read(tmp_path, [line + "\n"])
    assert "actor/entropy" not in values and "actor/entr" not in values and values["actor/pg_loss"] == 0.5
    assert dropped == {}
