"""A live exporter and a real Prometheus with the shipped rules, fed a RAGEN-style job whose
stdout names the run and whose stderr alone holds the trainer's fatal OOM: the run pages
VerlTrainingOutOfMemory and VerlTrainingCrashed (kind cuda_oom), and a verl-agent flat JSON-lines
file is served step by step."""

from __future__ import annotations

import json

from exposition import sample_value
from promtool import check_metrics
from servers import prom_query, start_exporter, start_prometheus, wait_until
from verl_exporter import shipped

CONFIG = ("config: {'trainer': {'project_name': 'frozen_lake', 'experiment_name': 'ppo-16-32', "
          "'total_epochs': 1}, 'actor_rollout_ref': {'actor': {'ppo_mini_batch_size': 32}}}\n")
STDERR = (
    "Error executing job with overrides: ['trainer.project_name=frozen_lake']\n"
    "Traceback (most recent call last):\n"
    '  File "/home/u/RAGEN/train.py", line 130, in main\n'
    "ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=525973, ip=10.0.0.1)\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.85 GiB.\n"
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")


def test_a_crash_only_in_the_jobs_stderr_pages_for_the_run_its_stdout_names(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "ppo-16-32.out").write_text(CONFIG + "step:0 - val-env/FrozenLake/success:0.05\n")
    with start_exporter(tmp_path, "--source", str(logs / "*"), "--no-collector.gpu",
                        "--source.poll-interval", "0.1") as exporter:
        run = {"project": "frozen_lake", "experiment": "ppo-16-32"}
        wait_until(lambda: sample_value(exporter.get("/metrics")[1], "verl_training_last_step", **run) == 0,
                   message="step 0 of the run")
        (logs / "ppo-16-32.err").write_text(STDERR)
        text = wait_until(lambda: (t := exporter.get("/metrics")[1]) and sample_value(
            t, "verl_training_fatal_error_last_step", kind="cuda_oom", **run) == 0 and t, message="the fatal end")
        check_metrics(text)
        target = {"targets": [f"127.0.0.1:{exporter.port}"]}
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [path.name for path in shipped.alert_rule_files()],
                  "scrape_configs": [{"job_name": "verl", "static_configs": [target]}]}
        with start_prometheus(tmp_path, config, rule_files=shipped.alert_rule_files()) as prometheus:
            firing = wait_until(lambda: {sample["metric"]["alertname"] for sample in prom_query(
                prometheus, 'ALERTS{alertstate="firing", project="frozen_lake"}')} >= {
                "VerlTrainingCrashed", "VerlTrainingOutOfMemory"} or None, timeout=60,
                message="VerlTrainingCrashed and VerlTrainingOutOfMemory firing")
            assert firing
            [crashed] = prom_query(prometheus, 'ALERTS{alertname="VerlTrainingCrashed", alertstate="firing"}')
            assert crashed["metric"]["kind"] == "cuda_oom" and crashed["metric"]["severity"] == "critical"


def test_a_flat_json_lines_file_is_served_step_by_step(tmp_path):
    folder = tmp_path / "alfworld"
    folder.mkdir()
    log = folder / "grpo.jsonl"
    log.write_text(json.dumps({"step": 0, "val/success_rate": 0.2}) + "\n")
    with start_exporter(tmp_path, "--source", str(folder / "*.jsonl"), "--no-collector.gpu",
                        "--source.poll-interval", "0.1") as exporter:
        run = {"project": "alfworld", "experiment": "grpo"}
        with log.open("a") as handle:
            for step in (1, 2):
                handle.write(json.dumps({"step": step, "actor/entropy_loss": 0.9 - step / 10,
                                         "episode/webshop_task_score (not success_rate)": 0.06}) + "\n")
        text = wait_until(lambda: (t := exporter.get("/metrics")[1]) and
                          sample_value(t, "verl_training_last_step", **run) == 2 and t, message="step 2")
        assert sample_value(text, "verl_exporter_parse_errors_total", source=str(log)) in (None, 0.0)
        assert sample_value(text, "verl_actor_entropy", **run) == 0.7
        check_metrics(text)
