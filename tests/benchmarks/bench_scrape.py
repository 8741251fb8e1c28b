"""Scrape cost: wall time of a full /metrics scrape, ours against Debian's node_exporter.

Our exporter follows one run whose steps carry every catalog metric, serves 8 fake GPUs with a
running process each, and the host collector. node_exporter runs with its default collectors. Both
are scraped over HTTP the way Prometheus does it (new connection, Prometheus' Accept and gzip
headers), alternately, so both see the same machine load.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from common import SCRAPE_HEADERS, BenchmarkError, Result, Row, ratio, sample_values, scrape, summary
from servers import start_exporter, start_node_exporter

NAME = "scrape"


def write_run(path: Path, steps: int = 3) -> None:
    from common import every_catalog_key_values

    values = every_catalog_key_values()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for step in range(1, steps + 1):
            out.write(json.dumps({"step": step, "data": values}) + "\n")


def _body_text(body: bytes) -> str:
    return (gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body).decode("utf-8", "replace")


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def run(work: Path, *, scrapes: int, warmup: int = 5) -> Result:
    run_file = work / "gsm8k" / "every-metric.jsonl"
    write_run(run_file)
    with start_exporter(work, "--source", str(run_file), "--gpu.fake", "healthy:8") as ours, \
            start_node_exporter(work) as theirs:
        targets = {"verl-exporter": ours.url + "/metrics", "node_exporter": theirs.url + "/metrics"}
        last_body = {}
        for name, url in targets.items():
            for _ in range(warmup):
                status, body, _ = scrape(url, SCRAPE_HEADERS)
                if status != 200:
                    raise BenchmarkError(f"{name} answered {status} during warm-up")
            last_body[name] = _body_text(body)
        if not sample_values(last_body["verl-exporter"], "verl_training_last_step"):
            raise BenchmarkError("the exporter serves no training run; is the source followed?")
        times: dict[str, list[float]] = {name: [] for name in targets}
        sizes: dict[str, int] = {}
        for index in range(scrapes):
            order = list(targets) if index % 2 == 0 else list(reversed(targets))
            for name in order:
                status, body, seconds = scrape(targets[name], SCRAPE_HEADERS)
                if status != 200:
                    raise BenchmarkError(f"{name} answered {status}")
                times[name].append(seconds)
                sizes[name] = len(body)
        ours_text = last_body["verl-exporter"]
        duration = {labels["collector"]: value for labels, value in
                    sample_values(ours_text, "verl_exporter_collector_duration_seconds")}

    stats = {name: summary(values) for name, values in times.items()}
    figures = {
        name: {**stats[name], "gzip_bytes": sizes[name], "series": _series(last_body[name])}
        for name in targets
    }
    figures["ratio_median"] = ratio(stats["verl-exporter"]["median"], stats["node_exporter"]["median"])
    figures["ratio_p99"] = ratio(stats["verl-exporter"]["p99"], stats["node_exporter"]["p99"])
    figures["collector_duration_seconds"] = duration
    ms = 1000
    rows = [
        Row("verl-exporter median", stats["verl-exporter"]["median"] * ms, "ms"),
        Row("verl-exporter p99", stats["verl-exporter"]["p99"] * ms, "ms"),
        Row("node_exporter median", stats["node_exporter"]["median"] * ms, "ms"),
        Row("node_exporter p99", stats["node_exporter"]["p99"] * ms, "ms"),
        Row("ratio of medians (ours / node_exporter)", figures["ratio_median"], "x", "<= 1",
            figures["ratio_median"] <= 1),
        Row("ratio of p99s", figures["ratio_p99"], "x"),
        Row("verl-exporter series", figures["verl-exporter"]["series"], "series"),
        Row("node_exporter series", figures["node_exporter"]["series"], "series"),
        Row("verl-exporter body (gzip)", sizes["verl-exporter"] / 1024, "KiB"),
        Row("node_exporter body (gzip)", sizes["node_exporter"] / 1024, "KiB"),
    ]
    rows += [Row(f"  collector {name} (last scrape)", seconds * ms, "ms") for name, seconds in sorted(duration.items())]
    return Result(NAME, {"scrapes": scrapes, "warmup": warmup, "gpus": 8, "headers": SCRAPE_HEADERS},
                  figures, rows)
