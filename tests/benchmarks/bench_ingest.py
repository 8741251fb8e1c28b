"""Ingestion: MB/s and steps/s reading a large verl log, from exporter start to "all steps in /metrics".

The files come from the simulator (``simulate.write_file``): a console log with the noise verl's
workers print between steps (vLLM and Ray logs, progress bars, warnings, sample prompts) and a
FileLogger JSONL file with validation lines. They are cached under the results folder and rebuilt
when the simulator changes. The file is read once before timing, so both formats start from the
page cache. Only the training collector is on: this measures reading, not GPU or host collection.

Where ``../shared/real-runs`` is beside the checkout, a real 2-node PPO console log (every line of it,
Ray's ANSI colours included) is repeated to the same size with its steps renumbered, and written
again as a FileLogger JSONL file of its steps. Two references are measured on them in the same run:
Debian's ``mtail`` (one-shot, a program that reads ``REFERENCE_KEYS`` of each step line) on the
console log, and ``orjson.loads`` of every line of the JSONL file in a fresh interpreter, the floor
of any reader of it in Python.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import (
    REPO,
    BenchmarkError,
    Result,
    Row,
    cpu_seconds,
    metrics_text,
    rss_bytes,
    sample_values,
    simulated_file,
)
from servers import start_exporter

NAME = "ingest"
TARGET_MB_S = 50.0
TARGET_MTAIL_RATIO = 2.0  # mtail's time over ours on the real console log
MB = 1_000_000
REAL_LOG = REPO.parent / "shared" / "real-runs" / "dstack-ppo-qwen7b-2node-resumed" / "console.log"
# The keys mtail's program reads: the ones the guide's alerts look at most.
REFERENCE_KEYS = ("global_seqlen/min", "global_seqlen/max", "actor/entropy_loss", "critic/vf_loss",
                  "critic/grad_norm", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm",
                  "perf/mfu/actor", "actor/lr", "critic/score/mean", "critic/rewards/mean", "critic/advantages/mean",
                  "critic/vf_explained_var", "response_length/mean", "response_length/clip_ratio", "timing_s/gen",
                  "timing_s/step", "perf/throughput")
_STEP = re.compile(r"step:(\d+) - ")


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


def real_files(cache: Path, target_bytes: int) -> tuple[tuple[Path, int], tuple[Path, int]] | None:
    """The real console log repeated to ``target_bytes`` with its steps renumbered, and a FileLogger
    JSONL file of its steps of about the same size, cached: each (path, steps); None without the log."""
    if not REAL_LOG.is_file():
        return None
    from verl_exporter.simulate.logs import format_jsonl
    from verl_exporter.sources.console import parse_console_line

    folder = cache / "ingest"
    console, jsonl = folder / f"real-console-{target_bytes}.log", folder / f"real-jsonl-{target_bytes}.jsonl"
    meta = folder / f"real-{target_bytes}.steps"
    if console.exists() and jsonl.exists() and meta.exists():
        console_steps, jsonl_steps = json.loads(meta.read_text())
        return (console, console_steps), (jsonl, jsonl_steps)
    folder.mkdir(parents=True, exist_ok=True)
    lines = REAL_LOG.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    first = next(index for index, line in enumerate(lines) if _STEP.search(line))
    step, size, values = 0, 0, []
    with console.open("w", encoding="utf-8") as out:
        out.writelines(lines[:first])
        size = sum(map(len, lines[:first]))
        while size < target_bytes:
            for line in lines[first:]:
                found = _STEP.search(line)
                if found:
                    step += 1
                    line = f"{line[:found.start()]}step:{step} - {line[found.end():]}"
                    if len(values) < 400:
                        parsed = parse_console_line(line)
                        values.append(parsed[1] if parsed else {})
                out.write(line)
                size += len(line)
                if size >= target_bytes:
                    break
    with jsonl.open("w", encoding="utf-8") as out:
        written, count = 0, 0
        while written < target_bytes:
            count += 1
            line = format_jsonl(count, values[(count - 1) % len(values)]) + "\n"
            out.write(line)
            written += len(line)
    meta.write_text(json.dumps([step, count]))
    return (console, step), (jsonl, count)


def mtail_seconds(work: Path, path: Path, steps: int) -> float | None:
    """Debian's mtail reading ``path`` once (``--one_shot``) with a program of REFERENCE_KEYS; None without it."""
    binary = shutil.which("mtail")
    if binary is None:
        return None
    programs = work / "mtail-progs"
    programs.mkdir(exist_ok=True)
    names = [key.replace("/", "_") for key in REFERENCE_KEYS]
    text = ["gauge verl_last_step"] + [f"gauge verl_{name}" for name in names]
    text.append(r"/step:(?P<step>\d+) - / {")
    text.append("  verl_last_step = $step")
    for key, name in zip(REFERENCE_KEYS, names):
        text += ["  /" + key.replace("/", r"\/") + f":(?P<{name}>-?[0-9.]+(e[-+]?[0-9]+)?)/ {{",
                 f"    verl_{name} = float(${name})", "  }"]
    text.append("}")
    (programs / "verl.mtail").write_text("\n".join(text) + "\n")
    started = time.perf_counter()
    done = subprocess.run([binary, "--one_shot", "--one_shot_format", "prometheus", "--progs", str(programs),
                           "--logs", str(path), "--logtostderr"], capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or f"verl_last_step{{prog=\"verl.mtail\"}} {steps}" not in done.stdout:
        raise BenchmarkError(f"mtail did not read the {steps} steps: {done.stderr[-1000:]}")
    return seconds


def orjson_seconds(path: Path) -> float:
    """A fresh interpreter's ``orjson.loads`` of every line of ``path``: the floor of a reader in Python."""
    code = "import orjson,sys\nfor line in open(sys.argv[1], 'rb'):\n    orjson.loads(line)\n"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=600)
    return time.perf_counter() - started


def run(work: Path, cache: Path, *, target_bytes: int, timeout: float = 600.0) -> Result:
    figures: dict[str, dict] = {}
    rows = []
    real = real_files(cache, target_bytes)
    cases = [("console", "console", None), ("jsonl", "jsonl", None)]
    if real is not None:
        cases += [("real console", "console", real[0]), ("real jsonl", "jsonl", real[1])]
    for label, fmt, given in cases:
        generating = time.perf_counter()
        path, steps = given or simulated_file(cache, fmt, target_bytes)
        generated = time.perf_counter() - generating
        result = measure(work, path, fmt, steps, timeout)
        result["generate_seconds"] = generated
        figures[label] = result
        rows += [
            Row(f"{label}: file", result["bytes"] / MB, "MB"),
            Row(f"{label}: steps in the file", steps, "steps"),
            Row(f"{label}: throughput", result["mb_per_s"], "MB/s", f">= {TARGET_MB_S:g}",
                result["mb_per_s"] >= TARGET_MB_S),
            Row(f"{label}: steps", result["steps_per_s"], "steps/s"),
            Row(f"{label}: start to all steps visible", result["seconds"], "s"),
            Row(f"{label}: exporter CPU", result["exporter_cpu_seconds"], "s"),
            Row(f"{label}: exporter RSS after", result["exporter_rss_bytes"] / 2**20, "MiB"),
            Row(f"{label}: parse errors", result["parse_errors"], "lines"),
        ]
    if real is not None:
        mtail = mtail_seconds(work, real[0][0], real[0][1])
        floor = orjson_seconds(real[1][0])
        figures["references"] = {"mtail_seconds": mtail, "orjson_seconds": floor, "mtail_keys": len(REFERENCE_KEYS)}
        if mtail is None:
            rows.append(Row("real console: mtail (not installed)", 0.0, "s"))
        else:
            ratio = mtail / figures["real console"]["seconds"]
            rows += [Row(f"real console: mtail one-shot, {len(REFERENCE_KEYS)} keys", mtail, "s"),
                     Row("real console: our speed / mtail's", ratio, "x", f">= {TARGET_MTAIL_RATIO:g}",
                         ratio >= TARGET_MTAIL_RATIO)]
        rows += [Row("real jsonl: orjson.loads of every line (floor)", floor, "s"),
                 Row("real jsonl: our time / the floor", figures["real jsonl"]["seconds"] / floor, "x")]
    return Result(NAME, {"target_bytes": target_bytes, "scenario": "healthy"}, figures, rows)
