"""The running exporter, twice on the same files (a restart reads them again from the start),
keeps answering /metrics whatever its sources hold: a lone surrogate in a key, a file name that is
not UTF-8, steps of 310 and 4,300 digits, keys posing as its own metrics, 2,000 junk keys before
a catalog key, values that are no number, and a directory and a FIFO its glob matches."""

import json
import os
import urllib.request

from hardening_helpers import metrics_when, value
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from promtool import check_metrics
from servers import start_exporter

FORGED = ["host/memory_used_gb", "gpu/memory_used_gb", "job/rss_mb", "training/last_step_timestamp_ms",
          "exporter/collector_duration_ms"]


def write_runs(root) -> dict:
    runs = root / "runs"
    (runs / "gsm8k").mkdir(parents=True)
    lines = [
        '{"step":1,"data":{"x\\ud800":1}}',
        '{"step":%s,"data":{"actor/pg_loss":9}}' % ("9" * 310),
        '{"step":%s,"data":{"actor/pg_loss":9}}' % ("9" * 4300),
        json.dumps({"step": 2, "data": {key: 1e15 for key in FORGED}}),
        json.dumps({"step": 3, "data": {f"junk/{i}": 1.0 for i in range(2000)}}),
        json.dumps({"step": 4, "data": {"actor/pg_loss": 0.5, "a": "0x10", "b": {"c": 1}, "d": [1]}}),
    ]
    (runs / "gsm8k" / "ppo.jsonl").write_text("\n".join(lines) + "\n")
    with open(os.path.join(os.fsencode(runs), b"gsm8k", b"grpo\xff.jsonl"), "wb") as out:
        out.write(b'{"step":7,"data":{"actor/pg_loss":0.25}}\n')
    (runs / "gsm8k" / "dir.jsonl").mkdir()
    os.mkfifo(runs / "gsm8k" / "fifo.jsonl")
    return {"pattern": str(runs / "*" / "*.jsonl"), "ppo": str(runs / "gsm8k" / "ppo.jsonl"),
            "grpo": str(runs / "gsm8k" / "grpo\\xff.jsonl"), "dir": str(runs / "gsm8k" / "dir.jsonl"),
            "fifo": str(runs / "gsm8k" / "fifo.jsonl")}


def test_hostile_sources_never_blind_metrics_across_a_restart(tmp_path):
    paths = write_runs(tmp_path)
    ppo, grpo = {"project": "gsm8k", "experiment": "ppo"}, {"project": "gsm8k", "experiment": "grpo\\xff"}
    for _ in range(2):  # the second exporter reads the same lines again from the start
        with start_exporter(tmp_path, "--source", paths["pattern"], "--no-collector.gpu", "--no-collector.host",
                            "--source.poll-interval", "0.1") as exporter:
            text = metrics_when(exporter, lambda t: value(t, "verl_training_last_step", **ppo) == 4, "step 4")
            assert value(text, "verl_exporter_collector_success", collector="training") == 1
            assert value(text, "verl_actor_pg_loss", **ppo) == 0.5  # after 2,000 junk keys
            assert value(text, "verl_actor_pg_loss", **grpo) == 0.25
            assert value(text, "verl_x", **ppo) == 1
            assert value(text, "verl_exporter_parse_errors_total", source=paths["ppo"]) == 2  # the huge steps
            assert value(text, "verl_training_series_dropped_total", **ppo) == 6  # x and 5 forged came first
            for reason in ("not_a_number", "object", "list"):
                assert value(text, "verl_exporter_values_dropped_total", source=paths["ppo"], reason=reason) == 1
            for name in ("verl_host_memory_used_bytes", "verl_gpu_memory_used_bytes", "verl_job_rss_bytes"):
                assert value(text, name, **ppo) is None and value(text, name.replace("verl_", "verl_logged_"), **ppo)
            for path, up in ((paths["ppo"], 1), (paths["grpo"], 1), (paths["dir"], 0), (paths["fifo"], 0)):
                assert value(text, "verl_exporter_source_up", source=path) == up, path
            assert check_metrics(text) == ""
            request = urllib.request.Request(exporter.url + "/metrics",
                                             headers={"Accept": "application/openmetrics-text; version=1.0.0"})
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200
                list(parse_openmetrics(response.read().decode()))
    log = exporter.log()
    assert log.count("is a FIFO, not a regular file") == 1 and log.count("is a directory, not a regular file") == 1
