"""Ingestion: MB/s and steps/s reading a large verl log, from exporter start to "all steps in /metrics".

The files come from the simulator (``simulate.write_file``): a console log with the noise verl's
workers print between steps (vLLM and Ray logs, progress bars, warnings, sample prompts) and a
FileLogger JSONL file with validation lines. They are cached under the results folder and rebuilt
when the simulator changes. The file is read once before timing, so both formats start from the
page cache. Only the training collector is on: this measures reading, not GPU or host collection.
"""

from __future__ import annotations

import time
from pathlib import Path

from common import BenchmarkError, Result, Row, cpu_seconds, metrics_text, rss_bytes, sample_values, simulated_file
from servers import start_exporter

NAME = "ingest"
TARGET_MB_S = 50.0
MB = 1_000_000


def _warm_page_cache(path: Path) -> None:
    with path.open("rb") as handle:
        while handle.read(8 << 20):
            pass


def _all_steps_visible(url: str, steps: int) -> bool:
    text = metrics_text(url)
    last = [value for _, value in sample_values(text, "verl_training_last_step")]
    done = [value for _, value in sample_values(text, "verl_training_steps_ingested_total")]
    return last == [steps] and done == [steps]


def measure(work: Path, path: Path, fmt: str, steps: int, timeout: float) -> dict:
    """Start an exporter on ``path`` and time it until every step is served."""
    _warm_page_cache(path)
    size = path.stat().st_size
    started = time.perf_counter()
    with start_exporter(work, "--source", str(path), "--source.format", fmt, "--no-collector.gpu",
                        "--no-collector.host", "--source.poll-interval", "0.2",
                        ready_path="/-/healthy") as exporter:
        healthy = time.perf_counter() - started
        deadline = started + timeout
        while not _all_steps_visible(exporter.url, steps):
            if exporter.process.poll() is not None:
                raise BenchmarkError(f"exporter exited with {exporter.process.returncode}:\n{exporter.log()[-2000:]}")
            if time.perf_counter() > deadline:
                raise BenchmarkError(f"{fmt}: not all {steps} steps visible after {timeout:g}s")
            time.sleep(0.1)
        seconds = time.perf_counter() - started
        cpu = cpu_seconds(exporter.process.pid)
        rss = rss_bytes(exporter.process.pid)
        errors = sum(value for _, value in
                     sample_values(metrics_text(exporter.url), "verl_exporter_parse_errors_total"))
    return {
        "format": fmt,
        "bytes": size,
        "steps": steps,
        "seconds": seconds,
        "startup_seconds": healthy,
        "mb_per_s": size / MB / seconds,
        "steps_per_s": steps / seconds,
        "exporter_cpu_seconds": cpu,
        "exporter_rss_bytes": rss,
        "parse_errors": errors,
    }


def run(work: Path, cache: Path, *, target_bytes: int, timeout: float = 600.0) -> Result:
    figures = {}
    rows = []
    for fmt in ("console", "jsonl"):
        generating = time.perf_counter()
        path, steps = simulated_file(cache, fmt, target_bytes)
        generated = time.perf_counter() - generating
        result = measure(work, path, fmt, steps, timeout)
        result["generate_seconds"] = generated
        figures[fmt] = result
        rows += [
            Row(f"{fmt}: file", result["bytes"] / MB, "MB"),
            Row(f"{fmt}: steps in the file", steps, "steps"),
            Row(f"{fmt}: throughput", result["mb_per_s"], "MB/s", f">= {TARGET_MB_S:g}",
                result["mb_per_s"] >= TARGET_MB_S),
            Row(f"{fmt}: steps", result["steps_per_s"], "steps/s"),
            Row(f"{fmt}: start to all steps visible", result["seconds"], "s"),
            Row(f"{fmt}: exporter CPU", result["exporter_cpu_seconds"], "s"),
            Row(f"{fmt}: exporter RSS after", result["exporter_rss_bytes"] / 2**20, "MiB"),
            Row(f"{fmt}: parse errors", result["parse_errors"], "lines"),
        ]
    return Result(NAME, {"target_bytes": target_bytes, "scenario": "healthy"}, figures, rows)
