"""Cardinality and remote-write volume of one run: ``python tests/benchmarks/bench_cardinality.py``.

One exporter follows a simulated PPO run (scenario ``healthy``, one step every 0.2 s) with 8 fake
GPUs, the host collector and the job's process (this benchmark's own PID). Once the run has passed a
validation step its /metrics is scraped and every sample counted by kind: training (the run's
``verl_*`` series), GPU (``verl_gpu_*``), host and job (``verl_host_*``, ``verl_job_*``) and the
exporter itself (``verl_exporter_*``, ``process_*``, ``python_*``).

Then vmagent and Prometheus each scrape it every second and remote-write into one VictoriaMetrics
(Debian's packages), for ``--scrapes`` scrapes; bytes per scrape are the growth of their own
counters (vmagent_remotewrite_bytes_sent_total, prometheus_remote_storage_bytes_total: compressed
request bodies) divided by the scrapes they made meanwhile (vm_promscrape_scrapes_total,
prometheus_target_interval_length_seconds_count).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from common import BenchmarkError, Result, Row, environment, metrics_text, print_table, wait_for, write_json  # noqa: E402
from servers import start_exporter, start_prometheus  # noqa: E402
from victoriametrics import start_victoria_metrics, start_vmagent  # noqa: E402

NAME = "cardinality"
GPUS = 8
KINDS = ("training", "gpu", "host", "exporter")


def kind(name: str) -> str:
    if name.startswith("verl_gpu_"):
        return "gpu"
    if name.startswith(("verl_host_", "verl_job_")):
        return "host"
    if name.startswith(("verl_exporter_", "process_", "python_")):
        return "exporter"
    return "training" if name.startswith("verl_") else "exporter"


def series_by_kind(text: str) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            counts[kind(sample.name)] += 1
    return counts


def counter(text: str, name: str) -> float:
    """The sum of ``name`` over its label sets in exposition ``text``."""
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == name)


def remote_write_rates(work: Path, exporter_target: str, scrapes: int) -> dict[str, float]:
    """Bytes and samples per scrape that vmagent and Prometheus remote-write for one exporter."""
    with start_victoria_metrics(work) as vm, \
            start_vmagent(work, [exporter_target], f"{vm.url}/api/v1/write") as vmagent, \
            start_prometheus(work, {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [{"job_name": "verl", "static_configs": [{"targets": [exporter_target]}]}],
                "remote_write": [{"url": f"{vm.url}/api/v1/write", "queue_config": {"batch_send_deadline": "1s"}}],
            }) as prometheus:
        names = {"vmagent": (vmagent, "vmagent_remotewrite_bytes_sent_total", "vm_promscrape_scrapes_total",
                             "vmagent_remotewrite_block_size_rows_sum"),
                 "prometheus": (prometheus, "prometheus_remote_storage_bytes_total",
                                "prometheus_target_interval_length_seconds_count",
                                "prometheus_remote_storage_samples_total")}

        def read():
            return {agent: [counter(metrics_text(server.url), name) for name in metric_names]
                    for agent, (server, *metric_names) in names.items()}

        wait_for(lambda: all(b > 0 and s >= 5 for b, s, _ in read().values()), timeout=60,
                 what="both agents remote-writing")
        start = read()
        time.sleep(scrapes)
        end = read()
    rates = {}
    for agent in names:
        (b0, s0, n0), (b1, s1, n1) = start[agent], end[agent]
        if s1 <= s0:
            raise BenchmarkError(f"{agent} made no scrape while measured")
        rates[f"{agent}_bytes_per_scrape"] = (b1 - b0) / (s1 - s0)
        rates[f"{agent}_samples_per_scrape"] = (n1 - n0) / (s1 - s0)
        rates[f"{agent}_scrapes"] = s1 - s0
    return rates


def every_key_training_series(work: Path) -> int:
    """Training series of a run whose steps carry every key of the catalog (an upper bound)."""
    from bench_scrape import write_run

    run_file = work / "every-key" / "gsm8k" / "every-metric.jsonl"
    write_run(run_file)
    with start_exporter(work, "--source", str(run_file), "--no-collector.gpu", "--no-collector.host") as exporter:
        wait_for(lambda: "verl_training_last_step{" in metrics_text(exporter.url), timeout=30, what="the run's steps")
        return series_by_kind(metrics_text(exporter.url))["training"]


def run(work: Path, *, scrapes: int = 60) -> Result:
    args = ("--simulate", "healthy", "--simulate.interval", "0.2", "--simulate.dir", str(work / "runs"),
            "--gpu.fake", f"healthy:{GPUS}", "--job.pid", str(os.getpid()))
    with start_exporter(work, *args) as exporter:
        url = exporter.url
        wait_for(lambda: "verl_val_core" in metrics_text(url), timeout=120,
                 what="a validation step of the simulated run")
        text = metrics_text(url)
        counts = series_by_kind(text)
        rates = remote_write_rates(work, f"127.0.0.1:{exporter.port}", scrapes)
    counts_every_key = every_key_training_series(work)
    total = sum(counts.values())
    figures = {"series": counts, "series_total": total, "training_series_every_catalog_key": counts_every_key,
               "gpu_series_per_gpu": counts["gpu"] / GPUS, **rates}
    rows = [Row(f"series: {name}", counts[name]) for name in KINDS]
    rows += [Row("series: total (one node, one run, 8 GPUs)", total),
             Row("series per GPU", counts["gpu"] / GPUS),
             Row("series: training, a run logging every catalog key", counts_every_key)]
    for agent in ("vmagent", "prometheus"):
        per_scrape = rates[f"{agent}_bytes_per_scrape"]
        samples = rates[f"{agent}_samples_per_scrape"]
        rows += [Row(f"{agent} remote-write per scrape", per_scrape, "bytes"),
                 Row(f"{agent} remote-write per sample", per_scrape / samples if samples else float("nan"), "bytes")]
    notes = [f"{rates['vmagent_scrapes']:.0f} vmagent and {rates['prometheus_scrapes']:.0f} "
             "Prometheus scrapes measured",
             "bytes are compressed remote-write request bodies (snappy protobuf), headers not counted"]
    return Result(NAME, {"gpus": GPUS, "scrapes": scrapes, "scenario": "healthy"}, figures, rows, notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=60, help="seconds (one scrape each) to measure remote write")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "bench-results")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="verl-bench-cardinality-") as work:
        result = run(Path(work), scrapes=args.scrapes)
    print_table(result)
    print(f"  wrote {write_json(result, args.out, environment())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
