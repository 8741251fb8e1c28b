"""The run's config and length: verl's config print, hydra's config.yaml, --run.config, and how the
store and the training collector serve them."""

from __future__ import annotations

import logging
import pprint
import random
import time

import pytest
import yaml

from exposition import samples
from exposition import scrape as scrape_collectors
from owner import ME
from promtool import check_metrics
from verl_exporter import simulate
from verl_exporter.app import Exporter
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.config.options import load_options
from verl_exporter.sources import Source, format_for
from verl_exporter.sources.run_config import (
    MAX_CONFIG_LINES,
    MAX_SKIPPED_LINES,
    ConfigPrint,
    flatten,
    parse_total_steps,
    read_config_text,
    read_literal,
)
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import ParseError, Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("gsm8k", "grpo", ME)
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


def read_through(lines: list[str]) -> dict | None:
    """The config of a log's lines, whichever are the print's."""
    reader = None
    for line in lines:
        reader = reader or ConfigPrint.start(line)
        if reader is None:
            continue
        taken, config = reader.feed(line)
        assert not reader.broken, line
        if config is not None:
            return config
    return None


def cut(config: dict, positions: list[int], prefix: str = "(TaskRunner pid=222265) ") -> list[str]:
    """The print as Ray writes it when it read the actor's output at these character positions:
    each row cut there goes on in a line of its own."""
    text, lines, start = pprint.pformat(config), [], 0
    for end in sorted(set(positions)) + [None]:
        piece = text[start:end]
        lines.extend(piece.split("\n") if end is None or not piece.endswith("\n") else piece.split("\n")[:-1])
        start = end
    return [prefix + line for line in lines]


TRICKY = {"trainer": {"project_name": "gsm8k", "experiment_name": "grpo (v2)", "logger": ["console", "wandb"],
                      "val_before_train": True, "resume_from_path": None, "nnodes": 1},
          "data": {"path": "C:\\data\\it's \"here\"", "long": "/very/long/path/" * 8, "max": float("inf"),
                   "lr": 1e-06, "min": -1.5e-20, "neg": -1, "pair": {"a": 1, "b": [2, 3]}, "empty": {}}}


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
                   prefix + "/verl/trainer/ppo/ray_trainer.py:325: UserWarning: "
                   "Disabled critic as algorithm.adv_estimator != gae.",
                   prefix + "  self.use_critic = need_critic(self.config)",
                   prefix + "   ",
                   prefix + tail]
    reader = ConfigPrint.start(lines[0])
    config = None
    for line in lines[:cut] + interrupted + lines[cut + 1:]:
        taken, config = reader.feed(line)
        assert not reader.broken, line
    assert config == CONFIG


def test_a_row_cut_anywhere_reads_whole_again():
    """Ray prints what it read of a row as a line and the rest as the next: a lone ",", a value on
    the next line, the middle of a string, a name, a number or an escape."""
    text = pprint.pformat(TRICKY)
    assert "\n" in text
    for position in range(2, len(text)):  # after the "{'" that opens the print
        assert read_print(cut(TRICKY, [position])) == TRICKY, position
    assert cut(TRICKY, [text.index(",")])[1] == "(TaskRunner pid=222265) ,"
    shuffle, rows = random.Random(7), pprint.pformat(CONFIG).splitlines(keepends=True)
    starts = [sum(map(len, rows[:i])) for i in range(len(rows))]
    for _ in range(50):  # a dozen rows cut, each once
        chosen = shuffle.sample(range(len(rows)), 12)
        positions = [max(2, starts[i] + shuffle.randrange(1, len(rows[i]))) for i in chosen]
        assert read_print(cut(CONFIG, positions)) == CONFIG


@pytest.mark.parametrize("prefix", ["(main_task pid=8918) ", "(TaskRunner pid=222265) ",
                                    "(WorkerDict pid=5678, ip=10.0.0.2) ",
                                    "(aBcDeFWorkerDict_0:0 WorkerDict pid=31337) ",
                                    "\x1b[2m\x1b[36m(main_task pid=8918)\x1b[0m ", ""])
def test_a_print_under_any_prefix_is_read_past_other_actors_and_its_actors_other_output(prefix):
    other = "(VmXaWorkerDict_0:1 WorkerDict pid=777) " if prefix else "(TaskRunner pid=1) "
    lines = cut(TRICKY, [40, 41, 200, 333], prefix)
    noise = [other + "model is float32 here: try autocast(device_type='cuda')",
             prefix + "DeprecationWarning: `ray.some_api` is private.",
             prefix + "WARNING:2024-01-02 03:04:05,678:still waiting for the workers",
             prefix + "/pkg/trainer.py:12: UserWarning: no critic.",
             prefix + "  self.flag = compute(self.config)",
             prefix + "[check] the settings look fine",
             prefix + "Loading: 10%|#  | 1/10\rLoading: 20%|##  | 2/10",
             "Traceback (most recent call last):",
             prefix + "2024-01-02 03:04:05,678\tINFO node.py:1 -- Ray is up.",
             prefix + "   "]
    mixed = [line for row in lines for line in (row, *noise[len(row) % 4::4])]
    assert read_through(mixed) == TRICKY


def test_another_actors_output_glued_to_a_row_ends_that_row():
    """Ray may print another actor's output right after a row that had no newline yet; the row's own
    newline comes later, as an empty line of no actor."""
    lines = printed(CONFIG, "\x1b[2m\x1b[36m(main_task pid=4242)\x1b[0m ")
    middle = len(lines) // 2
    assert lines[middle].endswith(",")
    glued = [lines[middle] + "\x1b[2m\x1b[36m(QwErtyWorkerDict_0:0 WorkerDict pid=4343)\x1b[0m model is float32: "
             "wrap it in autocast(device_type='cuda'), or load(\"m\", dtype=half)",
             "(QwErtyWorkerDict_0:0 WorkerDict pid=4343) shards: 100%|##########| 2/2",
             ""]
    assert read_through(lines[:middle] + glued + lines[middle + 1:]) == CONFIG
    bare = [lines[middle] + "(pid=5151) ", "(pid=5151) OMP_NUM_THREADS ignored"]
    assert read_through(lines[:middle] + bare + lines[middle + 1:]) == CONFIG


def test_rays_repeated_suffix_and_carriage_returns_are_not_part_of_a_row():
    lines = printed(TRICKY)
    lines[2] += " [repeated 2x across cluster]"
    lines[3] = "(TaskRunner pid=222265) Loading: 50%\r" + lines[3]
    assert read_through(lines) == TRICKY


def test_a_lost_row_that_closed_a_bracket_leaves_the_sections_after_it_whole():
    """A row missing from the log (here one that closes a nested dict) would leave the print open to
    its end; the top-level rows after it are read at the top level again."""
    config = {"actor_rollout_ref": {"actor": {"optim": {"lr": 1e-06, "lr_warmup_steps_ratio": 0.0,
                                                        "warmup_style": "constant"},
                                              "ppo_epochs": 1},
                                    "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}},
              "data": {"train_batch_size": 256, "max_prompt_length": 512, "train_files": "data/gsm8k/train.parquet"},
              "trainer": {"project_name": "gsm8k", "experiment_name": "ppo", "total_epochs": 15, "nnodes": 1}}
    lines = printed(config)
    lost = next(i for i, line in enumerate(lines) if "'warmup_style'" in line)
    assert lines[lost].endswith("},")
    damaged = lines[:lost] + ["something else", "", ""] + lines[lost + 1:]
    read = read_through(damaged + ["(TaskRunner pid=222265) dataset size: 12"])
    assert read["trainer"] == config["trainer"] and read["data"] == config["data"]
    assert read["actor_rollout_ref"]["actor"]["optim"]["lr"] == 1e-06


def test_a_row_cut_after_a_comma_inside_a_nested_dict_is_no_lost_row():
    text = pprint.pformat(TRICKY)
    after = text.index("'a': 1,") + len("'a': 1,")
    lines = cut(TRICKY, [after])  # the rest starts like a row of the top-level dict
    assert "(TaskRunner pid=222265)  'b': [2, 3]}," in lines
    assert read_print(lines) == TRICKY


def test_a_print_cut_short_breaks_on_the_first_line_that_is_no_row():
    lines = printed(CONFIG)[:5]
    reader = ConfigPrint.start(lines[0])
    for line in lines:
        reader.feed(line)
    assert reader.feed("(TaskRunner pid=222265) step:1 - actor/pg_loss:0.1") == (False, None)
    assert reader.broken


def test_a_print_whose_actor_goes_on_with_other_output_breaks():
    reader = ConfigPrint.start(printed(CONFIG)[0])
    reader.feed(printed(CONFIG)[0])
    for _ in range(MAX_SKIPPED_LINES):
        assert reader.feed("(TaskRunner pid=222265) INFO waiting for workers") == (False, None)
        assert not reader.broken
    reader.feed("(TaskRunner pid=222265) INFO waiting for workers")
    assert reader.broken


def test_a_print_starts_with_a_literal_and_ends_at_its_closing_bracket():
    assert ConfigPrint.start("(TaskRunner pid=1) {'a': <object at 0x7f>,") is None
    line = "(TaskRunner pid=1) {'eos_token_id': 2} and more"
    assert ConfigPrint.start(line).feed(line) == (True, {"eos_token_id": 2})


def test_hostile_prints_end_in_bounded_time():
    began = time.monotonic()
    deep = "(TaskRunner pid=1) " + "[" * 100_000
    reader = ConfigPrint.start("(TaskRunner pid=1) {'a': ")
    reader.feed("(TaskRunner pid=1) {'a': ")
    assert reader.feed(deep) == (False, None)  # nested deeper than Python reads: no row
    flat = "(TaskRunner pid=1) {'a': [" + "[]" * 400_000
    reader = ConfigPrint.start(flat)
    with pytest.raises(ParseError, match="longer than"):
        for _ in range(10):
            reader.feed(flat)
    # rows of the top-level dict again and again inside an open dict: the second reading is tried once
    reader = ConfigPrint.start("(TaskRunner pid=1) {'a': {'b': 1,")
    reader.feed("(TaskRunner pid=1) {'a': {'b': 1,")
    with pytest.raises(ParseError, match="longer than"):
        for _ in range(MAX_CONFIG_LINES):
            reader.feed("(TaskRunner pid=1)  'c': 1}, 'd': {'e': " + "1, " * 20 + "'f': 2,")
    assert time.monotonic() - began < 10


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
    state = store.run(RunKey("any", "job", ME))
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
    state = store.run(RunKey("p", "e", ME))
    assert state.last_step == 2 and state.config == {}


def test_a_print_ray_cut_and_mixed_with_other_output_names_the_run_without_errors(tmp_path):
    log = tmp_path / "any" / "job.log"
    log.parent.mkdir()
    prefix = "\x1b[36m(TaskRunner pid=9)\x1b[0m "
    rows = cut(TRICKY, [100, 250], prefix)
    lines = (["2024-01-02 03:04:05,678\tINFO node.py:1 -- Ray is up."] + rows[:3]
             + [prefix + "DeprecationWarning: `ray.some_api` is private.",
                "(WorkerDict pid=10, ip=10.0.0.2) INFO a worker's line"]
             + rows[3:] + [prefix + "Total training steps: 2", prefix + "step:1 - actor/pg_loss:0.5",
                           prefix + "step:2 - actor/pg_loss:0.25"])
    log.write_text("\n".join(lines) + "\n")
    store = make_store()
    Source(str(log), store).poll()
    assert store.snapshot().parse_errors == {}
    state = store.run(RunKey("gsm8k", "grpo (v2)", ME))
    assert (state.last_step, state.total_steps, state.config["trainer.nnodes"]) == (2, 2, 1.0)


def test_a_dict_that_is_not_the_config_is_ignored(tmp_path):
    log = tmp_path / "p" / "e.log"
    log.parent.mkdir()
    log.write_text("(TaskRunner pid=1) {'eos_token_id': 151645,\n(TaskRunner pid=1)  'validate': True}\n"
                   "(TaskRunner pid=1) step:1 - a:1\n")
    store = make_store()
    Source(str(log), store).poll()
    assert store.snapshot().parse_errors == {} and store.run(RunKey("p", "e", ME)).last_step == 1


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
    Source(str(tmp_path / "outputs" / "*" / ".hydra" / "config.yaml"), store).settle()
    state = store.run(RUN)
    assert (state.total_steps, state.finished) == (4, True)
    assert state.config["actor_rollout_ref.rollout.n"] == 4


def test_a_config_file_without_run_names_or_unreadable_is_counted(tmp_path):
    nameless, broken = tmp_path / "a.yaml", tmp_path / "b.yaml"
    nameless.write_text("data:\n  train_batch_size: 8\n")
    broken.write_text("trainer: [\n")
    store = make_store()
    Source(str(tmp_path / "*.yaml"), store).settle()
    assert store.snapshot().parse_errors == {str(nameless): 1, str(broken): 1}
    store = make_store()
    Source(str(nameless), store, project="p", experiment="e").settle()  # the flags name the run
    assert store.run(RunKey("p", "e", ME)).config == {"data.train_batch_size": 8.0}


def test_the_run_config_flag_reads_a_config_file_of_any_name_and_a_reload_keeps_it(tmp_path):
    saved = tmp_path / "run-config.txt"  # a saved config print: read as a config whatever its name
    saved.write_text(pprint.pformat(CONFIG) + "\n")
    config_file = tmp_path / "exporter.yml"
    config_file.write_text(yaml.safe_dump({"source": [], "log.level": "info"}))
    argv = ["--config.file", str(config_file), "--run.config", str(saved), "--no-collector.gpu",
            "--no-collector.host"]
    app = Exporter(load_options(argv), argv=argv)
    for source in app.ingestor.sources:
        source.settle()  # type: ignore[attr-defined]  # the config file is parsed on its own thread
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
    store.ingest(Record(RUN, 0, {}, run_config={"trainer.total_training_steps": 50, "trainer.project_name": "x",
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
    store.ingest(Record(RUN, 0, {}, run_config=flatten(CONFIG)))
    store.ingest(Record(RUN, 0, {}, total_steps=2))
    store.ingest(Record(RUN, 1, {"actor/pg_clipfrac": 0.0008}))
    store.ingest(Record(RunKey("gsm8k", "unknown", ME), 1, {"actor/pg_clipfrac": 0.1}))
    text = scrape_collectors(training=TrainingCollector(store))
    assert check_metrics(text) == ""
    values = samples(text)
    run = (("experiment", "grpo"), ("project", "gsm8k"), ("user", ME))
    assert values[("verl_run_config", (("experiment", "grpo"), ("key", "actor_rollout_ref.actor.clip_ratio"),
                                       ("project", "gsm8k"), ("user", ME)))] == 0.2
    info = (("adv_estimator", "grpo"), ("experiment", "grpo"), ("model", "Qwen2.5-0.5B-Instruct"),
            ("project", "gsm8k"), ("rollout", "vllm"), ("strategy", "fsdp"), ("user", ME))
    assert values[("verl_run_config_info", info)] == 1
    assert values[("verl_training_total_steps", run)] == 2
    assert values[("verl_training_finished", run)] == 0
    assert not any(labels and ("experiment", "unknown") in labels for (name, labels) in values
                   if name.startswith(("verl_run_config", "verl_training_total_steps")))


def test_the_finished_time_is_served_once_the_run_has_finished_and_only_then():
    store = make_store()
    store.ingest(Record(RUN, 0, {}, total_steps=2))
    store.ingest(Record(RUN, 1, {"actor/pg_clipfrac": 0.1}, time=100.0))
    run = (("experiment", RUN.experiment), ("project", RUN.project), ("user", RUN.user))

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
