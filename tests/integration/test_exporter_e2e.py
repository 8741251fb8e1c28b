"""The exporter as a process: follow a file, serve /metrics over HTTP, fail clearly on bad set-up."""

import json
import subprocess
import sys

import pytest

from exposition import sample_value
from promtool import check_metrics
from servers import REPO, start_exporter, wait_until


def jsonl(step: int, data: dict) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


def test_follows_a_jsonl_file_as_it_grows(tmp_path):
    run_file = tmp_path / "gsm8k" / "ppo-qwen.jsonl"
    run_file.parent.mkdir()
    run_file.write_text(jsonl(0, {"actor/pg_clipfrac": 0.0, "timing_s/gen": 21.47}))
    with start_exporter(tmp_path, "--source", str(run_file), "--no-collector.gpu",
                        "--source.poll-interval", "0.1") as exporter:
        run = {"project": "gsm8k", "experiment": "ppo-qwen"}
        text = wait_until(lambda: (t := exporter.get("/metrics")[1]) and
                          sample_value(t, "verl_training_last_step", **run) == 0 and t, message="step 0")
        assert sample_value(text, "verl_timing_gen_seconds", **run) == 21.47
        with run_file.open("a") as handle:
            handle.write(jsonl(1, {"actor/pg_clipfrac": 0.12, "perf/max_memory_allocated_gb": 45.2}))
            handle.write('{"step": 2, "data": {"actor/pg_clipfrac": 0.')  # half-written line
        text = wait_until(lambda: (t := exporter.get("/metrics")[1]) and
                          sample_value(t, "verl_training_last_step", **run) == 1 and t, message="step 1")
        assert sample_value(text, "verl_actor_pg_clipfrac", **run) == 0.12
        assert sample_value(text, "verl_perf_max_memory_allocated_bytes", **run) == 45.2 * 2**30
        with run_file.open("a") as handle:
            handle.write('2}}\nnot json at all\n' + jsonl(3, {"actor/pg_loss": float("nan")}))
        text = wait_until(lambda: (t := exporter.get("/metrics")[1]) and
                          sample_value(t, "verl_training_last_step", **run) == 3 and t, message="step 3")
        assert sample_value(text, "verl_actor_pg_clipfrac", **run) == 0.2
        assert sample_value(text, "verl_exporter_parse_errors_total", source=str(run_file)) == 1
        assert sample_value(text, "verl_training_nonfinite_values_total", key="actor/pg_loss", **run) == 1
        assert sample_value(text, "verl_training_steps_ingested_total", **run) == 4
        assert exporter.get("/-/healthy")[0] == 200
        assert exporter.get("/-/ready")[0] == 200
        assert exporter.get("/nope")[0] == 404


def test_console_log_by_glob_with_project_flags(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    with start_exporter(tmp_path, "--source", str(logs / "*.log"), "--project", "math",
                        "--experiment", "grpo-7b", "--no-collector.gpu", "--source.poll-interval", "0.1") as exporter:
        (logs / "train.log").write_text(
            "(TaskRunner pid=222265) step:7 - actor/pg_loss:-0.005 - actor/ppo_kl:np.float64(0.003)"
            " - critic/score/mean:0.523 - timing_per_token_ms/gen:41.67\n")
        run = {"project": "math", "experiment": "grpo-7b"}
        text = wait_until(lambda: (t := exporter.get("/metrics")[1]) and
                          sample_value(t, "verl_training_last_step", **run) == 7 and t, message="step 7")
        assert sample_value(text, "verl_actor_ppo_kl", **run) == 0.003
        assert abs(sample_value(text, "verl_timing_per_token_gen_seconds", **run) - 0.04167) < 1e-12


def test_full_output_with_fake_gpus_and_a_simulated_run_is_promtool_clean(tmp_path):
    with start_exporter(tmp_path, "--simulate", "healthy", "--simulate.interval", "0.05",
                        "--simulate.dir", str(tmp_path / "sim"), "--gpu.fake", "healthy:8",
                        "--source.poll-interval", "0.1") as exporter:
        text = wait_until(lambda: (t := exporter.get("/metrics")[1]) and
                          (sample_value(t, "verl_training_last_step") or 0) >= 12 and t,
                          message="simulated steps")
        for name in ("verl_actor_pg_clipfrac", "verl_critic_vf_explained_var", "verl_val_core",
                     "verl_gpu_utilization_ratio", "verl_host_memory_total_bytes", "verl_exporter_build_info",
                     "process_resident_memory_bytes"):
            assert sample_value(text, name) is not None, name
        assert sample_value(text, "verl_exporter_collector_success", collector="gpu") == 1
        assert check_metrics(text) == ""
        # the values move as the simulated run advances
        first = sample_value(text, "verl_training_last_step")
        later = wait_until(lambda: (t := exporter.get("/metrics")[1]) and
                           sample_value(t, "verl_training_last_step") > first and t, message="progress")
        assert sample_value(later, "verl_critic_score_mean") is not None


def test_without_nvml_the_exporter_serves_the_rest_and_reports_the_gpu_failure(tmp_path):
    run_file = tmp_path / "p" / "e.jsonl"
    run_file.parent.mkdir()
    run_file.write_text(jsonl(1, {"actor/pg_loss": 0.01}))
    with start_exporter(tmp_path, "--source", str(run_file), "--gpu.fake", "library-missing") as exporter:
        text = wait_until(lambda: (t := exporter.get("/metrics")[1]) and
                          sample_value(t, "verl_training_last_step") == 1 and t, message="step 1")
        assert sample_value(text, "verl_exporter_collector_success", collector="gpu") == 0
        assert sample_value(text, "verl_exporter_collector_success", collector="host") == 1
        assert sample_value(text, "verl_host_memory_total_bytes") > 0


def run_cli(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "verl_exporter", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.mark.parametrize("args, message", [
    (["--no-such-flag"], "unrecognized arguments"),
    (["--job.pid", "abc"], "--job.pid must be a whole number"),
    (["--gpu.timeout", "x"], "--gpu.timeout must be a duration"),
    (["--gpu.fake", "healthy:many", "--web.listen-address", "127.0.0.1:0"], "bad fake GPU spec"),
    (["--web.listen-address", "nonsense"], "invalid listen address"),
    (["--config.file", "/nonexistent/exporter.yml"], "cannot read options file"),
    (["--simulate", "no-such-scenario", "--web.listen-address", "127.0.0.1:0"], "unknown scenario"),
])
def test_bad_setup_gives_one_clear_line_and_exit_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_port_in_use(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--web.listen-address", f"127.0.0.1:{port}", "--no-collector.gpu")
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("verl-exporter ")
