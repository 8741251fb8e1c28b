"""``verl-exporter backfill``: step times, the series the live exporter serves, OpenMetrics and blocks."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as read_openmetrics

from exposition import samples
from owner import ME
from servers import require_binary, start_exporter, wait_until
from verl_exporter import simulate
from verl_exporter.cli import main
from verl_exporter.history.backfill import HELP_NOTE, build, parse_time, write_openmetrics
from verl_exporter.history.timeline import read_file, split_timestamp
from verl_exporter.store.records import RunKey

TARGET = {"job", "instance"}


def write(path: Path, lines: list[str], mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def jsonl(step: int, **values: float) -> str:
    return json.dumps({"step": step, "data": {key.replace("__", "/"): value for key, value in values.items()}})


@pytest.mark.parametrize("text, expected", [
    ("2025-06-12T10:22:31.123456789Z step:1", 1749723751.123456),
    ("2025-06-12 10:22:31,500 step:1", 1749723751.5),
    ("[2025-06-12 10:22:31] step:1", 1749723751.0),
    ("[2025-06-12T12:22:31+02:00] step:1", 1749723751.0),
    ("2025-06-12T12:22:31+0200 step:1", 1749723751.0),
])
def test_leading_timestamps_are_read(text, expected):
    moment, rest = split_timestamp(text)
    assert moment == pytest.approx(expected, abs=1e-3)
    assert rest == "step:1"


@pytest.mark.parametrize("text", ["step:1 - a:1", "(TaskRunner pid=1) step:1", "2025-06-12 step:1",
                                  "06-12 10:22:31 [x.py:1] INFO", "2025-13-45T10:22:31Z step:1"])
def test_lines_without_a_timestamp_are_left_alone(text):
    assert split_timestamp(text) == (None, text)


def test_step_times_go_back_from_the_file_mtime_by_each_steps_duration(tmp_path):
    end = 1_750_000_000.0
    path = write(tmp_path / "p" / "e.jsonl", [
        jsonl(1, timing_s__step=10.0, actor__pg_loss=0.1),
        jsonl(2, timing_s__step=20.0),
        jsonl(2, **{"val-core/x/acc/mean@1": 0.5}),  # validation at the same step
        jsonl(3, perf__time_per_step=30.0),
    ], mtime=end)
    timeline = read_file(str(path))
    assert [(step.step, step.time) for step in timeline.steps] == [(1, end - 50), (2, end - 30), (3, end)]
    assert "modification time" in timeline.method


def test_a_step_without_duration_takes_the_median_and_restarts_keep_file_order(tmp_path):
    end = 1_750_000_000.0
    path = write(tmp_path / "p" / "e.jsonl", [
        jsonl(1, timing_s__step=10.0), jsonl(2, timing_s__step=30.0), jsonl(1, actor__pg_loss=1.0),
        jsonl(2, timing_s__step=100.0),
    ], mtime=end)
    times = [(step.step, step.time) for step in read_file(str(path)).steps]
    assert times == [(1, end - 100 - 30 - 30), (2, end - 100 - 30), (1, end - 100), (2, end)]


def test_console_timestamps_are_used_and_fill_in_around_untimed_steps(tmp_path):
    path = write(tmp_path / "run.log", [
        "2025-06-12T10:00:00Z (TaskRunner pid=1) step:1 - timing_s/step:5.0 - actor/pg_loss:0.1",
        "2025-06-12T10:00:05Z (TaskRunner pid=1) INFO something else",
        "(TaskRunner pid=1) step:2 - timing_s/step:7.0 - actor/pg_loss:0.2",
        "2025-06-12T10:01:00Z (TaskRunner pid=1) step:3 - timing_s/step:9.0 - actor/pg_loss:0.3",
    ], mtime=1_760_000_000)
    start = parse_time("2025-06-12T10:00:00Z")
    timeline = read_file(str(path))
    assert [step.time for step in timeline.steps] == [start, start + 60 - 9, start + 60]
    assert timeline.method == "line timestamps where present, else timing_s/step"


def test_unreadable_lines_are_kept_as_errors_and_counted_at_their_step(tmp_path):
    path = write(tmp_path / "p" / "e.jsonl", [jsonl(1, timing_s__step=1.0), "{not json", jsonl(2, timing_s__step=1.0)],
                 mtime=1_750_000_000)
    history = build([str(path)])
    errors = [key for key in history.series if key[1] == "verl_exporter_parse_errors_total"]
    assert len(errors) == 1 and history.series[errors[0]] == [(1_750_000_000, 1.0)]  # read just before step 2


def test_no_steps_is_an_error(tmp_path, capsys):
    path = write(tmp_path / "empty.log", ["nothing here"])
    assert main(["backfill", str(path), "--output", str(tmp_path / "out")]) == 2
    assert "no training steps" in capsys.readouterr().err
    assert main(["backfill", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "out")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_backfilled_series_are_the_live_exporters_and_promtool_makes_blocks(tmp_path, capsys):
    """The last scrape of a backfill holds the same series (names and labels) as the live exporter
    serves for the same file, plus Prometheus' target labels; promtool turns the file into blocks."""
    require_binary("promtool")
    log = tmp_path / "logs" / "run.log"
    log.parent.mkdir()
    simulate.write_file(log, "healthy", "console", steps=30)
    out = tmp_path / "out"
    assert main(["backfill", str(log), "--output", str(out), "--instance", "node-1:9945"]) == 0
    printed = capsys.readouterr().out
    assert "30 steps (1-30)" in printed and "file modification time" in printed
    text = (out / "backfill.om").read_text()
    assert text.endswith("# EOF\n")
    blocks = [path for path in (out / "blocks").iterdir() if (path / "meta.json").is_file()]
    assert blocks, "promtool wrote no block"

    last: dict[tuple, tuple[float, float]] = {}
    helps = {}
    for family in read_openmetrics(text):
        helps[family.name] = family.documentation
        for sample in family.samples:
            labels = dict(sample.labels)
            assert {labels.pop(k) for k in TARGET} == {"verl", "node-1:9945"}
            key = (sample.name, tuple(sorted((k, v) for k, v in labels.items() if v)))  # "" is no label
            stamp = float(sample.timestamp)
            assert stamp >= last.get(key, (0, 0))[0], f"{key} out of order"
            last[key] = (stamp, sample.value)
    assert all(text.endswith(HELP_NOTE) for text in helps.values())
    run = (("experiment", "run"), ("project", "logs"), ("user", ME))
    assert last[("verl_training_last_step", run)][1] == 30
    assert last[("verl_training_finished", run)][1] == 1

    with start_exporter(tmp_path, "--source", str(log), "--no-collector.gpu", "--no-collector.host") as exporter:
        live_text = wait_until(lambda: (lambda t: "verl_training_finished{" in t and t)(exporter.get("/metrics")[1]))
    live = {(name, labels) for name, labels in samples(live_text)
            if name.startswith("verl_") and not name.startswith(("verl_exporter_collector", "verl_exporter_build",
                                                                 "verl_exporter_source_up"))}  # live state
    live = {(name, tuple((k, v) for k, v in labels if not (name == "verl_training_run_info" and k == "source")))
            for name, labels in live}
    backfilled = {(name, tuple((k, v) for k, v in labels if not (name == "verl_training_run_info" and k == "source")))
                  for name, labels in last}
    assert backfilled == live


def test_last_step_time_is_the_files_mtime_and_until_extends_the_scrapes(tmp_path):
    end = 1_750_000_000.0
    path = write(tmp_path / "p" / "e.jsonl", [jsonl(1, timing_s__step=60.0), jsonl(2, timing_s__step=60.0)], mtime=end)
    history = build([str(path)], until=end + 300)
    clock = history.series[("verl_training_last_step_timestamp_seconds", "verl_training_last_step_timestamp_seconds",
                            (("experiment", "e"), ("project", "p"), ("team", ""), ("user", ME)))]
    assert clock == [(end - 60, end - 60), (end, end)]
    grid = history.grid(15.0)
    assert grid[0] == end - 60 and grid[-1] == end + 300 and len(grid) == 25
    run = RunKey("p", "e", ME)
    assert history.step_at(run, end - 1) == 1 and history.step_at(run, end + 200) == 2


def test_without_blocks_the_promtool_line_is_printed(tmp_path):
    path = write(tmp_path / "p" / "e.jsonl", [jsonl(1, timing_s__step=1.0)])
    result = subprocess.run([sys.executable, "-m", "verl_exporter", "backfill", str(path), "--output",
                             str(tmp_path / "out"), "--no-blocks"], capture_output=True, text=True, check=True)
    assert "promtool tsdb create-blocks-from openmetrics" in result.stdout
    assert not (tmp_path / "out" / "blocks").exists()


def test_a_series_the_exporter_stops_serving_ends_there_as_a_live_prometheus_marks_it_stale(tmp_path):
    """A restart (the config printed again) starts the throughput baseline again: its old statistics end at
    the restart, in the history and in the OpenMetrics written, not carried on as if still served."""
    config = repr({"trainer": {"project_name": "p", "experiment_name": "e", "critic_warmup": 0}})
    lines = [f"2026-01-01T00:00:00Z {config}"]
    lines += [f"2026-01-01T00:{step:02d}:00Z step:{step} - perf/throughput:1000.0 - timing_s/step:60.0"
              for step in range(1, 26)]
    lines += [f"2026-01-01T00:26:30Z {config}"]
    lines += [f"2026-01-01T00:{step + 2:02d}:00Z step:{step} - perf/throughput:400.0 - timing_s/step:60.0"
              for step in range(26, 31)]
    history = build([str(write(tmp_path / "run.log", lines))])
    key = next(key for key in history.series if key[1] == "verl_training_prior_mean"
               and dict(key[2])["metric"] == "verl_perf_throughput")
    changes = history.series[key]
    assert changes[-1][1] is None and changes[-2][1] == 1000.0  # ended at the restart
    ended = changes[-1][0]
    out = io.StringIO()
    write_openmetrics(history, out, interval=15.0)
    written = [line for line in out.getvalue().splitlines()
               if line.startswith("verl_training_prior_mean{") and 'metric="verl_perf_throughput"' in line]
    assert written and max(float(line.rsplit(" ", 1)[1]) for line in written) < ended


def test_a_copy_under_a_recorded_name_has_the_samples_of_its_series_without_the_metric_label(tmp_path):
    """``copies``: a recording rule that only drops the ``metric`` label (a recorded step statistic) is
    written as its series' samples under the recorded name, ending where the series ends."""
    lines = [f"2026-01-01T00:{step:02d}:00Z step:{step} - actor/entropy:{0.5 + step / 100} - timing_s/step:60.0"
             for step in range(1, 31)]
    history = build([str(write(tmp_path / "run.log", lines))])
    out = io.StringIO()
    write_openmetrics(history, out, interval=15.0, keep=lambda name: name == "verl_training_recent_max",
                      copies={("verl_training_recent_max", "verl_actor_entropy"): "run:verl_actor_entropy:recent_max",
                              ("verl_training_recent_max", "no_such_metric"): "run:no_such_metric:recent_max"})
    families = {family.name: family for family in read_openmetrics(out.getvalue())}
    assert "run:no_such_metric:recent_max" not in families
    source = [(dict(s.labels), s.value, s.timestamp) for s in families["verl_training_recent_max"].samples
              if s.labels["metric"] == "verl_actor_entropy"]
    copy = [(dict(s.labels), s.value, s.timestamp) for s in families["run:verl_actor_entropy:recent_max"].samples]
    assert len(copy) == len(source) > 20
    assert copy == [({k: v for k, v in labels.items() if k != "metric"}, value, at) for labels, value, at in source]
    assert copy[-1][1] == 0.8  # the max of the last 3 steps, at the last one
