"""Overhead: CPU and memory of the exporter following live runs while Prometheus-like scrapes arrive.

A separate writer process appends simulated steps (its own CPU is not counted). The exporter follows
it with its default poll interval, 8 fake GPUs and the host collector, and is scraped every
``scrape_interval`` seconds for ``duration`` seconds. Reported: CPU seconds per minute of the
exporter process (share of one core) and its RSS; then the same with ``many`` runs followed at
once, for the RSS each extra run costs and whether RSS grows while they run.

Run as a script (``python bench_overhead.py write-runs DIR N INTERVAL``) it is the writer.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from common import (
    SCRAPE_HEADERS,
    BenchmarkError,
    Result,
    Row,
    cpu_seconds,
    metrics_text,
    rss_bytes,
    sample_values,
    scrape,
)

NAME = "overhead"
TARGET_CORE_SHARE = 0.01
TARGET_RSS_BYTES = 80 * 2**20
MIB = 2**20


def write_runs(folder: Path, runs: int, interval: float) -> None:
    """Append one step to each of ``runs`` files every ``interval`` s, half JSONL, half console logs."""
    from verl_exporter import simulate

    folder.mkdir(parents=True, exist_ok=True)
    scenarios = list(simulate.SCENARIOS)
    files = []
    for index in range(runs):
        fmt = "jsonl" if index % 2 == 0 else "console"
        path = folder / f"run-{index:04d}.{'jsonl' if fmt == 'jsonl' else 'log'}"
        files.append((fmt, path.open("a", encoding="utf-8"), scenarios[index % len(scenarios)]))
    step = 1
    while True:
        started = time.monotonic()
        for index, (fmt, handle, scenario) in enumerate(files):
            values = simulate.step_values(scenario, step, seed=index)
            line = simulate.format_jsonl(step, values) if fmt == "jsonl" else simulate.format_console(step, values)
            handle.write(line + "\n")
            handle.flush()
        step += 1
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


def _start_writer(folder: Path, runs: int, interval: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "write-runs", str(folder), str(runs), str(interval)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _runs_with_steps(url: str) -> int:
    return sum(1 for _, value in sample_values(metrics_text(url), "verl_training_last_step") if value >= 1)


def follow(work: Path, runs: int, *, duration: float, scrape_interval: float, step_interval: float) -> dict:
    """Run the writer and an exporter on ``runs`` runs; CPU and RSS over ``duration`` seconds."""
    from common import wait_for
    from servers import start_exporter

    folder = work / f"live-{runs}" / "runs"
    writer = _start_writer(folder, runs, step_interval)
    try:
        with start_exporter(work, "--source", str(folder / "*"), "--gpu.fake", "healthy:8") as exporter:
            pid = exporter.process.pid
            wait_for(lambda: _runs_with_steps(exporter.url) == runs, timeout=60, what=f"{runs} live runs")
            if writer.poll() is not None:
                raise BenchmarkError(f"the writer exited: {writer.stderr.read().decode()[-2000:]}")
            rss = [rss_bytes(pid)]
            cpu_start, started = cpu_seconds(pid), time.monotonic()
            scrapes = 0
            while time.monotonic() - started < duration:
                status, _, _ = scrape(exporter.url + "/metrics", SCRAPE_HEADERS)
                if status != 200:
                    raise BenchmarkError(f"scrape answered {status}")
                scrapes += 1
                rss.append(rss_bytes(pid))
                time.sleep(max(0.0, min(scrape_interval, duration - (time.monotonic() - started))))
            elapsed = time.monotonic() - started
            cpu = cpu_seconds(pid) - cpu_start
            rss.append(rss_bytes(pid))
            steps = [value for _, value in sample_values(metrics_text(exporter.url), "verl_training_last_step")]
    finally:
        writer.terminate()
        writer.wait(10)
    return {
        "runs": runs,
        "seconds": elapsed,
        "scrapes": scrapes,
        "cpu_seconds": cpu,
        "cpu_seconds_per_minute": cpu / elapsed * 60,
        "core_share": cpu / elapsed,
        "rss_start_bytes": rss[0],
        "rss_end_bytes": rss[-1],
        "rss_max_bytes": max(rss),
        "rss_growth_bytes": rss[-1] - rss[0],
        "min_last_step": min(steps),
    }


def run(work: Path, *, duration: float, scrape_interval: float, step_interval: float, many: int) -> Result:
    one = follow(work, 1, duration=duration, scrape_interval=scrape_interval, step_interval=step_interval)
    lots = follow(work, many, duration=duration, scrape_interval=scrape_interval, step_interval=step_interval)
    per_run = (lots["rss_end_bytes"] - one["rss_end_bytes"]) / max(many - 1, 1)
    figures = {"one_run": one, "many_runs": lots, "rss_per_extra_run_bytes": per_run}
    rows = [
        Row("1 run: CPU", one["cpu_seconds_per_minute"], "s/min"),
        Row("1 run: share of one core", one["core_share"] * 100, "%", f"< {TARGET_CORE_SHARE * 100:g}",
            one["core_share"] < TARGET_CORE_SHARE),
        Row("1 run: RSS max", one["rss_max_bytes"] / MIB, "MiB", f"< {TARGET_RSS_BYTES / MIB:g}",
            one["rss_max_bytes"] < TARGET_RSS_BYTES),
        Row("1 run: RSS growth over the window", one["rss_growth_bytes"] / MIB, "MiB"),
        Row(f"{many} runs: CPU", lots["cpu_seconds_per_minute"], "s/min"),
        Row(f"{many} runs: share of one core", lots["core_share"] * 100, "%"),
        Row(f"{many} runs: RSS max", lots["rss_max_bytes"] / MIB, "MiB"),
        Row(f"{many} runs: RSS growth over the window", lots["rss_growth_bytes"] / MIB, "MiB"),
        Row("RSS per extra run followed", per_run / 1024, "KiB"),
    ]
    params = {"duration_s": duration, "scrape_interval_s": scrape_interval, "step_interval_s": step_interval,
              "many": many, "gpus": 8}
    return Result(NAME, params, figures, rows)


if __name__ == "__main__":
    if sys.argv[1:2] != ["write-runs"] or len(sys.argv) != 5:
        sys.exit(f"usage: {sys.argv[0]} write-runs DIR RUNS INTERVAL")
    try:
        write_runs(Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    except KeyboardInterrupt:
        pass
