"""Shared pieces of the benchmarks: statistics, tables, JSON results, process sampling, test data.

The benchmarks start real processes through ``tests/servers.py`` (the same helpers the tests use),
so this module puts ``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import psutil  # noqa: E402

import servers  # noqa: E402

# What Prometheus (Debian's 2.42) sends on a scrape; both exporters are scraped with it.
SCRAPE_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/2.42.0",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}


class BenchmarkError(Exception):
    """A benchmark could not measure what it was asked to (a process failed, a condition never came)."""


# -- statistics ----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: list[float]) -> dict:
    """Median, p99, min, max and count of a list of measurements."""
    return {
        "median": statistics.median(values) if values else float("nan"),
        "p99": percentile(values, 99),
        "min": min(values, default=float("nan")),
        "max": max(values, default=float("nan")),
        "n": len(values),
    }


def ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs else float("nan")


# -- output --------------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of a benchmark's table: what, the measured figure, its unit, the target if any."""

    what: str
    value: float | str
    unit: str = ""
    target: str = ""
    met: bool | None = None


@dataclass
class Result:
    name: str
    params: dict
    figures: dict
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def format_value(value: float | str) -> str:
    if isinstance(value, str):
        return value
    if value != value:  # NaN
        return "n/a"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if value == 0 or 0.01 <= abs(value) < 1e6:
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.1f}"
    return f"{value:.3g}"


def print_table(result: Result, stream=sys.stdout) -> None:
    header = ("measure", "value", "unit", "target", "")
    lines = [(row.what, format_value(row.value), row.unit, row.target,
              "" if row.met is None else ("ok" if row.met else "MISSED")) for row in result.rows]
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    print(f"\n== {result.name} ==", file=stream)
    for line in [header, *lines]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip(), file=stream)
    for note in result.notes:
        print(f"  note: {note}", file=stream)
    stream.flush()


def write_json(result: Result, out_dir: Path, environment: dict) -> Path:
    """``out_dir/<name>.json`` with the figures, parameters, table and environment."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result.name}.json"
    payload = {
        "benchmark": result.name,
        "environment": environment,
        "params": result.params,
        "figures": result.figures,
        "table": [row.__dict__ for row in result.rows],
        "notes": result.notes,
    }
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=_jsonable) + "\n")
    return path


def _jsonable(value):
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def environment() -> dict:
    """Commit, machine and tool versions, so results of two commits can be compared fairly."""
    def command(*args: str) -> str:
        try:
            return subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": command("git", "rev-parse", "HEAD"),
        "dirty": bool(command("git", "status", "--porcelain", "--untracked-files=no")),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "node_exporter": command("prometheus-node-exporter", "--version").splitlines()[:1],
        "prometheus": command("prometheus", "--version").splitlines()[:1],
    }


# -- HTTP ----------------------------------------------------------------------------------------


def scrape(url: str, headers: dict | None = None, timeout: float = 30.0) -> tuple[int, bytes, float]:
    """GET ``url`` on a new connection, read the whole body; (status, body, wall seconds)."""
    parts = urllib.parse.urlsplit(url)
    started = time.perf_counter()
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("GET", parts.path or "/", headers=headers or {})
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    return response.status, body, time.perf_counter() - started


def metrics_text(url: str) -> str:
    status, body, _ = scrape(url + "/metrics")
    if status != 200:
        raise BenchmarkError(f"{url}/metrics answered {status}: {body[:200]!r}")
    return body.decode("utf-8", "replace")


def sample_values(text: str, name: str) -> list[tuple[dict, float]]:
    """(labels, value) of every sample called ``name`` in an exposition text (plain parsing, fast)."""
    from prometheus_client.parser import text_string_to_metric_families

    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found.append((sample.labels, sample.value))
    return found


def wait_for(condition, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll ``condition`` until truthy; BenchmarkError after ``timeout`` seconds."""

    def fail(reason: str):
        raise BenchmarkError(reason)

    return servers.wait_until(condition, timeout, interval, message=what, fail=fail)


# -- processes -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def rss_bytes(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


# -- test data -----------------------------------------------------------------------------------


def simulator_digest() -> str:
    """Changes whenever the simulator does, so cached files are rebuilt after it changes."""
    from verl_exporter import simulate
    from verl_exporter.simulate import scenarios

    digest = hashlib.sha256()
    for module in (scenarios, simulate):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:12]


def simulated_file(cache: Path, fmt: str, target_bytes: int, scenario: str = "healthy") -> tuple[Path, int]:
    """A run written by the simulator, about ``target_bytes`` long, cached; (path, training steps)."""
    from verl_exporter import simulate

    suffix = "jsonl" if fmt == "jsonl" else "log"
    stem = f"{scenario}-{fmt}-{target_bytes}-{simulator_digest()}"
    path = cache / "ingest" / f"{stem}.{suffix}"
    meta = path.with_suffix(".steps")
    if path.exists() and meta.exists():
        return path, int(meta.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(f"{scenario}-{fmt}-*"):
        old.unlink()
    partial = path.with_name(path.name + ".partial")
    steps = simulate.write_file(partial, scenario, fmt, steps=None, target_bytes=target_bytes)
    partial.rename(path)
    meta.write_text(str(steps))
    return path, steps


def every_catalog_key_values() -> dict[str, float]:
    """A PPO step of the simulator plus every key the catalog lists (and one of each family)."""
    from verl_exporter import simulate
    from verl_exporter.store.catalog import default_catalog

    values = dict(simulate.step_values("healthy", 50))
    values.update(simulate.validation_values("healthy", 50))
    for index, spec in enumerate(default_catalog().metrics):
        values.setdefault(spec.key, 0.25 + index / 1000)
    values.setdefault("val/test_score/openai/gsm8k", 0.71)
    return values
