"""An NVML call that never returns: scrapes still answer, with the GPU collector marked failed."""

import psutil
from hardening_helpers import jsonl, metrics_when, value

from servers import start_exporter


def test_a_hung_nvml_read_fails_only_the_gpu_collector(tmp_path):
    run_file = tmp_path / "gsm8k" / "ppo.jsonl"
    run_file.parent.mkdir()
    run_file.write_text(jsonl(7, {"actor/pg_clipfrac": 0.1}))
    with start_exporter(tmp_path, "--source", str(run_file), "--gpu.fake", "hang:8", "--gpu.timeout", "0.3",
                        "--source.poll-interval", "0.1") as exporter:
        text = metrics_when(exporter, lambda t: value(t, "verl_training_last_step") == 7, "step 7")
        threads = psutil.Process(exporter.process.pid).num_threads()
        for _ in range(5):  # later scrapes must not pile up more stuck reads
            status, text = exporter.get("/metrics")
            assert status == 200
            assert value(text, "verl_exporter_collector_success", collector="gpu") == 0
            assert value(text, "verl_exporter_collector_success", collector="training") == 1
            assert value(text, "verl_exporter_collector_success", collector="host") == 1
            assert value(text, "verl_training_last_step") == 7
            assert value(text, "verl_host_memory_total_bytes") > 0
            assert not [line for line in text.splitlines() if line.startswith("verl_gpu_utilization_ratio")]
        assert psutil.Process(exporter.process.pid).num_threads() <= threads + 1
        assert exporter.get("/-/healthy")[0] == 200
    log = exporter.log()
    assert "collector gpu failed" in log and "NVML read took longer than 0.3 s" in log, log
    assert log.count("collector gpu failed") == 1, "a failing collector is logged once, not every scrape"
