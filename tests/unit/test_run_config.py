"""The run's config and length: verl's config print, hydra's config.yaml, --run.config, and how the
store and the training collector serve them."""

from __future__ import annotations

import logging
import pprint

import pytest
import yaml

from exposition import samples
from exposition import scrape as scrape_collectors
from promtool import check_metrics
from verl_exporter import config as settings_module
from verl_exporter import simulate
from verl_exporter.catalog import default_catalog
from verl_exporter.cli import Exporter
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.records import ParseError, Record, RunKey
from verl_exporter.sources import Source, format_for
from verl_exporter.sources.run_config import (
    MAX_CONFIG_LINES, ConfigPrint, flatten, parse_total_steps, read_config_text, read_literal,
)
from verl_exporter.store import RunStore

RUN = RunKey("gsm8k", "grpo")
CONFIG = simulate.run_config("healthy-grpo", project="gsm8k", experiment="grpo")


def printed(config: dict, prefix: str = "(TaskRunner pid=222265) ") -> list[str]:
    return [prefix + row for row in pprint.pformat(config).splitlines()]


def read_print(lines: list[str]) -> dict | None:
    reader = ConfigPrint.start(lines[0])
    assert reader is not None
    for line in lines:
        taken, config = reader.feed(line)
        assert taken
        if config is not None:
            return config
    return None


def make_store() -> RunStore:
    return RunStore(default_catalog())


# The config print ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["(TaskRunner pid=222265) ", "(main_task pid=8918) ",
                                    "\x1b[36m(TaskRunner pid=1)\x1b[0m ", ""])
def test_the_config_print_of_every_release_reads_as_the_literal_it_is(prefix):
    assert read_print(printed(CONFIG, prefix)) == CONFIG


def test_long_strings_wrapped_by_pprint_inf_and_nan_read_back():
    config = {"trainer": {"project_name": "p" * 200, "experiment_name": "e"},
              "data": {"path": "/very/" * 30, "max": float("inf"), "min": float("-inf")}}
    lines = printed(config)
    assert len(lines) > 3
    read = read_print(lines)
    assert read["trainer"]["project_name"] == "p" * 200 and read["data"]["max"] == float("inf")


def test_other_actors_lines_in_between_are_not_part_of_it():
    lines = printed(CONFIG)
    reader = ConfigPrint.start(lines[0])
    reader.feed(lines[0])
    assert reader.feed("(WorkerDict pid=5678) INFO a worker's line") == (False, None)
    assert not reader.broken
    for line in lines[1:]:
        taken, config = reader.feed(line)
    assert config == CONFIG


def test_a_python_warning_and_rows_split_by_ray_inside_the_print_are_read_through():
    """Seen in verl 0.6 and 0.7: stderr's UserWarning (and its source line) lands in the middle of
    a row, and Ray's log monitor splits a row where pprint wrote it piece by piece."""
    prefix = "(TaskRunner pid=222265) "
    lines = printed(CONFIG, prefix)
    cut = len(lines) // 2
    head, _, tail = lines[cut].rpartition(": ")
    interrupted = [head + ": ",
                   prefix + "/verl/trainer/ppo/ray_trainer.py:325: UserWarning: Disabled critic as algorithm.adv_estimator != gae.",
                   prefix + "  self.use_critic = need_critic(self.config)",
                   prefix + "   ",
                   prefix + tail]
    reader = ConfigPrint.start(lines[0])
    config = None
    for line in lines[:cut] + interrupted + lines[cut + 1:]:
        taken, config = reader.feed(line)
        assert not reader.broken, line
    assert config == CONFIG


def test_a_print_cut_short_breaks_on_the_first_line_that_is_no_row():
    lines = printed(CONFIG)[:5]
    reader = ConfigPrint.start(lines[0])
    for line in lines:
        reader.feed(line)
    assert reader.feed("(TaskRunner pid=222265) step:1 - actor/pg_loss:0.1") == (False, None)
    assert reader.broken


def test_a_print_too_long_or_unreadable_is_a_parse_error():
    reader = ConfigPrint.start("(TaskRunner pid=1) {'a': [")
    reader.feed("(TaskRunner pid=1) {'a': [")
    with pytest.raises(ParseError, match="longer than"):
        for _ in range(MAX_CONFIG_LINES + 2):
            reader.feed("(TaskRunner pid=1) 1,")
    with pytest.raises(ParseError, match="not a Python literal"):
        read_literal("{'a': __import__('os')}")
    with pytest.raises(ParseError, match="not a dict"):
        read_literal("['a']")


def test_total_training_steps():
    assert parse_total_steps("(TaskRunner pid=222265) Total training steps: 105") == 105
    assert parse_total_steps("\x1b[36m(main_task pid=1)\x1b[0m Total training steps: 7\n") == 7
    assert parse_total_steps("Total training steps: many") is None
    assert parse_total_steps("step:1 - a:1") is None


def test_flatten_resolves_hydras_references_and_leaves_lists_out():
    flat = flatten({"data": {"max_response_length": 1024},
                    "actor_rollout_ref": {"rollout": {"response_length": "${data.max_response_length}",
                                                      "loop": "${a.b}", "env": "${oc.env:HOME}"}},
                    "trainer": {"logger": ["console"]}})
    assert flat == {"data.max_response_length": 1024, "actor_rollout_ref.rollout.response_length": 1024,
                    "actor_rollout_ref.rollout.loop": "${a.b}", "actor_rollout_ref.rollout.env": "${oc.env:HOME}"}


def test_config_files_are_yaml_or_a_saved_print():
    assert read_config_text(yaml.safe_dump(CONFIG)) == CONFIG
    assert read_config_text(pprint.pformat(CONFIG)) == CONFIG
    for text, reason in (("a: [", "not valid YAML"), ("- 1\n", "not a mapping"), ("{'a': ", "not a Python literal")):
        with pytest.raises(ParseError, match=reason):
            read_config_text(text)


# Sources -----------------------------------------------------------------------------------------------------

def test_a_console_log_brings_the_settings_and_the_total_before_the_steps(tmp_path):
    log = tmp_path / "any" / "job.log"
    simulate.write_run(log, "healthy-grpo", fmt="console", steps=3, interval=0, seed=1)
    store = make_store()
    Source(str(log), store).poll()
    state = store.run(RunKey("any", "job"))
    assert state.config["actor_rollout_ref.actor.ppo_epochs"] == 1
    assert state.config["data.train_batch_size"] == state.config["actor_rollout_ref.actor.ppo_mini_batch_size"] == 64
    assert state.config_info == {"adv_estimator": "grpo", "model": "Qwen2.5-0.5B-Instruct", "rollout": "vllm",
                                 "strategy": "fsdp"}
    assert (state.total_steps, state.last_step, state.finished) == (3, 3, True)
    assert store.snapshot().parse_errors == {}


def test_a_broken_config_print_is_counted_and_the_steps_after_it_are_read(tmp_path):
    log = tmp_path / "p" / "e.log"
    log.parent.mkdir()
    lines = printed(CONFIG)[:4] + ["(TaskRunner pid=222265) step:1 - actor/pg_loss:0.5",
                                   "(TaskRunner pid=222265) step:2 - actor/pg_loss:0.25"]
    log.write_text("\n".join(lines) + "\n")
    store = make_store()
    Source(str(log), store).poll()
    assert store.snapshot().parse_errors == {str(log): 1}
    state = store.run(RunKey("p", "e"))
    assert state.last_step == 2 and state.config == {}


def test_a_dict_that_is_not_the_config_is_ignored(tmp_path):
    log = tmp_path / "p" / "e.log"
    log.parent.mkdir()
    log.write_text("(TaskRunner pid=1) {'eos_token_id': 151645,\n(TaskRunner pid=1)  'validate': True}\n"
                   "(TaskRunner pid=1) step:1 - a:1\n")
    store = make_store()
    Source(str(log), store).poll()
    assert store.snapshot().parse_errors == {} and store.run(RunKey("p", "e")).last_step == 1


def test_a_hydra_config_yaml_is_a_source_matched_by_the_run_names(tmp_path):
    hydra = tmp_path / "outputs" / "10-14-07" / ".hydra" / "config.yaml"
    jsonl = tmp_path / "gsm8k" / "grpo.jsonl"
    simulate.write_run(jsonl, "healthy-grpo", fmt="jsonl", steps=4, interval=0)
    simulate.write_hydra_config(hydra, simulate.run_config("healthy-grpo", project="gsm8k", experiment="grpo",
                                                           total_steps=4))
    assert format_for(str(hydra)) == "config"
    store = make_store()
    Source(str(jsonl), store).poll()
    assert store.run(RUN).finished is False  # the JSONL alone does not know the run's length
    Source(str(tmp_path / "outputs" / "*" / ".hydra" / "config.yaml"), store).poll()
    state = store.run(RUN)
    assert (state.total_steps, state.finished) == (4, True)
    assert state.config["actor_rollout_ref.rollout.n"] == 4


def test_a_config_file_without_run_names_or_unreadable_is_counted(tmp_path):
    nameless, broken = tmp_path / "a.yaml", tmp_path / "b.yaml"
    nameless.write_text("data:\n  train_batch_size: 8\n")
    broken.write_text("trainer: [\n")
    store = make_store()
    Source(str(tmp_path / "*.yaml"), store).poll()
    assert store.snapshot().parse_errors == {str(nameless): 1, str(broken): 1}
    store = make_store()
    Source(str(nameless), store, project="p", experiment="e").poll()  # the flags name the run
    assert store.run(RunKey("p", "e")).config == {"data.train_batch_size": 8.0}


def test_the_run_config_flag_reads_a_config_file_of_any_name_and_a_reload_keeps_it(tmp_path):
    saved = tmp_path / "run-config.txt"  # a saved config print: read as a config whatever its name
    saved.write_text(pprint.pformat(CONFIG) + "\n")
    config_file = tmp_path / "exporter.yml"
    config_file.write_text(yaml.safe_dump({"source": [], "log.level": "info"}))
    argv = ["--config.file", str(config_file), "--run.config", str(saved), "--no-collector.gpu",
            "--no-collector.host"]
    app = Exporter(settings_module.load(argv), argv=argv)
    app.ingestor.poll_all()
    assert app.store.run(RUN).config["actor_rollout_ref.actor.grad_clip"] == 1.0
    source = next(iter(app.sources.values()))
    config_file.write_text(yaml.safe_dump({"source": [], "log.level": "debug"}))
    try:
        assert app.reload()
        assert list(app.sources.values()) == [source] and source.fmt == "config"
    finally:
        app.stop()
        logging.getLogger().setLevel(logging.WARNING)


# The store: length, end and settings --------------------------------------------------------------------------

def test_the_last_step_finishes_the_run_and_the_same_steps_again_leave_it_finished():
    store = make_store()
    store.ingest(Record(RUN, 0, {}, total_steps=3))
    for step in (1, 2, 3):
        store.ingest(Record(RUN, step, {"a": 1.0}, source="run.log"))
    assert store.run(RUN).finished
    for step in (1, 2, 3):  # another source of the run (its JSONL, trailing), or a re-read file
        store.ingest(Record(RUN, step, {"a": 1.0}, source="run.jsonl"))
        assert store.run(RUN).finished
    store.ingest(Record(RUN, 4, {"a": 1.0}))  # resumed with more steps
    assert not store.run(RUN).finished


def test_the_end_marker_finishes_a_run_of_unknown_length_and_a_trailing_source_keeps_it():
    store = make_store()
    for step in (1, 2):
        store.ingest(Record(RUN, step, {"a": 1.0}))
    store.ingest(Record(RUN, 2, {}, finished=True))
    store.ingest(Record(RUN, 1, {"a": 1.0}))
    store.ingest(Record(RUN, 2, {"a": 1.0}))
    assert store.run(RUN).finished and store.run(RUN).total_steps is None


def test_the_logged_total_wins_over_the_configured_one_and_aliases_map_to_the_newest_key():
    store = make_store()
    store.ingest(Record(RUN, 0, {}, total_steps=105))
    store.ingest(Record(RUN, 0, {}, settings={"trainer.total_training_steps": 50, "trainer.project_name": "x",
                                              "actor_rollout_ref.actor.optim.clip_grad": 5,
                                              "actor_rollout_ref.rollout.response_length": 2048,
                                              "actor_rollout_ref.actor.optim.lr": "1e-06",
                                              "actor_rollout_ref.actor.ppo_epochs": True,
                                              "actor_rollout_ref.model.path": "/models/Qwen2.5-7B/"}))
    state = store.run(RUN)
    assert state.total_steps == 105
    assert state.config == {"trainer.total_training_steps": 50.0, "actor_rollout_ref.actor.grad_clip": 5.0,
                            "data.max_response_length": 2048.0, "actor_rollout_ref.actor.optim.lr": 1e-06}
    assert state.config_info == {"model": "Qwen2.5-7B"}


def test_settings_length_and_end_are_served():
    store = make_store()
    store.ingest(Record(RUN, 0, {}, settings=flatten(CONFIG)))
    store.ingest(Record(RUN, 0, {}, total_steps=2))
    store.ingest(Record(RUN, 1, {"actor/pg_clipfrac": 0.0008}))
    store.ingest(Record(RunKey("gsm8k", "unknown"), 1, {"actor/pg_clipfrac": 0.1}))
    text = scrape_collectors(training=TrainingCollector(store))
    assert check_metrics(text) == ""
    values = samples(text)
    run = (("experiment", "grpo"), ("project", "gsm8k"))
    assert values[("verl_run_config", (("experiment", "grpo"), ("key", "actor_rollout_ref.actor.clip_ratio"),
                                       ("project", "gsm8k")))] == 0.2
    info = (("adv_estimator", "grpo"), ("experiment", "grpo"), ("model", "Qwen2.5-0.5B-Instruct"),
            ("project", "gsm8k"), ("rollout", "vllm"), ("strategy", "fsdp"))
    assert values[("verl_run_config_info", info)] == 1
    assert values[("verl_training_total_steps", run)] == 2
    assert values[("verl_training_finished", run)] == 0
    assert not any(labels and ("experiment", "unknown") in labels for (name, labels) in values
                   if name.startswith(("verl_run_config", "verl_training_total_steps")))


def test_the_finished_time_is_served_once_the_run_has_finished_and_only_then():
    store = make_store()
    store.ingest(Record(RUN, 0, {}, total_steps=2))
    store.ingest(Record(RUN, 1, {"actor/pg_clipfrac": 0.1}, time=100.0))
    run = (("experiment", RUN.experiment), ("project", RUN.project))

    def served() -> dict:
        text = scrape_collectors(training=TrainingCollector(store))
        assert check_metrics(text) == ""
        return samples(text)

    assert ("verl_training_finished_timestamp_seconds", run) not in served()
    assert "verl_training_finished_timestamp_seconds" not in scrape_collectors(training=TrainingCollector(store))
    store.ingest(Record(RUN, 2, {"actor/pg_clipfrac": 0.1}, time=160.0))
    values = served()
    assert values[("verl_training_finished", run)] == 1
    assert values[("verl_training_finished_timestamp_seconds", run)] == 160.0
    store.ingest(Record(RUN, 3, {"actor/pg_clipfrac": 0.1}, time=220.0))  # resumed: running again
    assert ("verl_training_finished_timestamp_seconds", run) not in served()


def test_the_catalog_lists_the_settings_the_rules_need_each_spelling_once():
    catalog = default_catalog()
    keys = [spec.key for spec in catalog.settings]
    assert {"data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
            "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_epochs",
            "actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low",
            "actor_rollout_ref.actor.clip_ratio_high", "actor_rollout_ref.actor.clip_ratio_c",
            "actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.optim.lr",
            "actor_rollout_ref.actor.entropy_coeff", "actor_rollout_ref.actor.kl_loss_coef",
            "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.temperature", "critic.optim.lr",
            "critic.ppo_epochs", "critic.grad_clip", "trainer.n_gpus_per_node", "trainer.nnodes",
            "trainer.total_epochs", "trainer.total_training_steps"} <= set(keys)
    spellings = [key for spec in catalog.settings for key in (spec.key, *spec.aliases)]
    assert len(spellings) == len(set(spellings))
    assert catalog.setting("actor_rollout_ref.actor.grad_clip").default == 1.0
    assert catalog.setting("critic.grad_clip").default == 1.0
    assert [spec.label for spec in catalog.settings if spec.label] == ["adv_estimator", "model", "rollout", "strategy"]
    with pytest.raises(KeyError):
        catalog.setting("no.such.setting")
