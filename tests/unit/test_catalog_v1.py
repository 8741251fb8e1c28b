"""The metrics verl 0.8 to 0.9.1 added (the V1 trainer, asynchronous training, the rollout engine):
names, units and labels, the bounded ``layer`` label, and one series across the V0 and V1 spellings."""

import pytest

from exposition import samples, scrape
from promtool import check_metrics
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.store.catalog import Catalog, default_catalog
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

RUN = RunKey("gsm8k", "v1-grpo")
RUN_LABELS = (("experiment", "v1-grpo"), ("project", "gsm8k"))
SECONDS, RATIO, TOKENS, BYTES = "seconds", "ratio", "tokens", "bytes"

# key -> (name, unit) of every metric verl 0.8.0, 0.9.0 and 0.9.1 log that the catalog lists.
V1_KEYS = {
    **{f"{part}/{group}/{count}": (f"verl_{part}_{group}_{count}", "")
       for part in ("training", "validation")
       for group, count in (("filter_groups", "evicted_samples"), ("filter_groups", "discarded_surplus_samples"),
                            ("rollout_failure", "evicted_samples"), ("off_policy", "evicted_samples"))},
    **{f"training/off_policy/{group}/{stat}": (f"verl_training_off_policy_{group}_{stat}", "")
       for group in ("trajectory_spans", "trajectory_staleness", "trajectory_staleness_worst",
                     "evicted_samples_staleness") for stat in ("mean", "max", "min")},
    "separate_async/switch/idle": ("verl_separate_async_switch_idle", ""),
    "separate_async/switch/threshold_ratio": ("verl_separate_async_switch_threshold_ratio", RATIO),
    "separate_async/switch/wait_samples": ("verl_separate_async_switch_wait_samples", ""),
    "separate_async/decision/sampleable_count": ("verl_separate_async_decision_sampleable_count_value", ""),
    "separate_async/decision/remaining": ("verl_separate_async_decision_remaining", ""),
    "separate_async/decision/should_switch_to_rollout": ("verl_separate_async_decision_should_switch_to_rollout", ""),
    "separate_async/decision/per_sample_time_seconds": ("verl_separate_async_decision_per_sample_time_seconds",
                                                        SECONDS),
    "separate_async/decision/effective_switch_cost_seconds": (
        "verl_separate_async_decision_effective_switch_cost_seconds", SECONDS),
    "timing_s/switch_wait": ("verl_timing_switch_wait_seconds", SECONDS),
    "timing_s/switch_to_trainer": ("verl_timing_switch_to_trainer_seconds", SECONDS),
    "timing_s/switch_to_rollout": ("verl_timing_switch_to_rollout_seconds", SECONDS),
    "fully_async/trainer/idle_ratio": ("verl_fully_async_trainer_idle_ratio", RATIO),
    "fully_async/rollouter/idle_ratio": ("verl_fully_async_rollouter_idle_ratio", RATIO),
    "fully_async/rollouter/active_time": ("verl_fully_async_rollouter_active_time_seconds", SECONDS),
    "fully_async/rollouter/version_time": ("verl_fully_async_rollouter_version_time_seconds", SECONDS),
    "fully_async/rollouter/step_generated_samples": ("verl_fully_async_rollouter_step_generated_samples", ""),
    "fully_async/total_wait_time": ("verl_fully_async_total_wait_time_seconds", SECONDS),
    **{f"fully_async/count/{count}": (f"verl_fully_async_count_{count}", "")
       for count in ("total_generated_samples", "staleness_samples", "dropped_stale_samples",
                     "stale_samples_processed", "stale_trajectory_processed", "current_param_version")},
    "fully_async/monitor/queue/mq_queue_size": ("verl_fully_async_monitor_queue_mq_queue_size", ""),
    "fully_async/monitor/queue/pending_queue_size": ("verl_fully_async_monitor_queue_pending_queue_size", ""),
    "fully_async/monitor/active_tasks_size": ("verl_fully_async_monitor_active_tasks_size", ""),
    "fully_async/partial/total_partial_num": ("verl_fully_async_partial_total_partial_num", ""),
    "fully_async/partial/partial_ratio": ("verl_fully_async_partial_partial_ratio", RATIO),
    "fully_async/partial/max_partial_span": ("verl_fully_async_partial_max_partial_span", ""),
    **{f"fully_async/processing_time/{stat}": (f"verl_fully_async_processing_time_{stat}_seconds", SECONDS)
       for stat in ("avg", "max", "min", "tp50", "tp95", "tp99")},
    "dynamic_resource/resource_utilization": ("verl_dynamic_resource_resource_utilization", RATIO),
    "dynamic_resource/rollout_resource_utilization": ("verl_dynamic_resource_rollout_resource_utilization", RATIO),
    "dynamic_resource/train_resource_utilization": ("verl_dynamic_resource_train_resource_utilization", RATIO),
    "dynamic_resource/train_compute_time_s": ("verl_dynamic_resource_train_compute_time_seconds", SECONDS),
    "dynamic_resource/train_allocated_time_s": ("verl_dynamic_resource_train_allocated_time_seconds", SECONDS),
    "dynamic_resource/mq_size": ("verl_dynamic_resource_mq_size", ""),
    "timing_s/wait_for_enough_samples": ("verl_timing_wait_for_enough_samples_seconds", SECONDS),
    "rollout/spec_accept_rate": ("verl_rollout_spec_accept_rate", RATIO),
    "rollout/spec_accept_length": ("verl_rollout_spec_accept_length", TOKENS),
    **{f"rollout/moe/{vio}/{stat}": (f"verl_rollout_moe_{vio}_{stat}", "")
       for vio in ("max_vio", "min_vio", "avg_vio") for stat in ("max", "avg")},
    "rollout/moe/routed_experts_found": ("verl_rollout_moe_routed_experts_found", ""),
    "rollout/moe/routed_expert_assignments": ("verl_rollout_moe_routed_expert_assignments", ""),
    "checkpoint_engine/changed_ratio": ("verl_checkpoint_engine_changed_ratio", RATIO),
    "checkpoint_engine/changed_elems": ("verl_checkpoint_engine_changed_elems", ""),
    "checkpoint_engine/payload_mbytes": ("verl_checkpoint_engine_payload_bytes", BYTES),
    "checkpoint_engine/flushes": ("verl_checkpoint_engine_flushes", ""),
    **{f"variance_proxy/{part}": (f"verl_variance_proxy_{part}", "")
       for part in ("proxy1_signal_strength", "proxy2_total_power", "proxy3_pure_noise", "expected_a_squared",
                    "expected_w")},
    **{f"actor/distillation/{part}": (f"verl_actor_distillation_{part}", "")
       for part in ("loss", "abs_loss", "loss_max", "loss_min")},
}

# Open-ended keys of the same releases, described by a pattern and named by the rule.
DESCRIBED = {
    "actor/mtp_losses/mtp_1_loss": "verl_actor_mtp_losses_mtp_1_loss",
    "actor/distillation/student_mass": "verl_actor_distillation_student_mass",
    "fully_async/static/max_queue_size": "verl_fully_async_static_max_queue_size",
    "validation/off_policy/evicted_samples_staleness/max": "verl_validation_off_policy_evicted_samples_staleness_max",
    "separate_async/switch/some_new": "verl_separate_async_switch_some_new",
}

MOE_LAYERS = {f"rollout/moe/{vio}/layer_{layer}": (f"verl_rollout_moe_{vio}", str(layer))
              for vio in ("max_vio", "min_vio", "avg_vio") for layer in (0, 1, 60, 255)}

V0_V1 = {f"num_turns/{stat}": f"training/num_turns/{stat}" for stat in ("mean", "max", "min")}


@pytest.fixture(scope="module")
def catalog():
    return default_catalog()


def scrape_store(store: RunStore) -> str:
    return scrape(training=TrainingCollector(store))


@pytest.mark.parametrize("key, name, unit", [(key, *value) for key, value in V1_KEYS.items()])
def test_each_key_has_its_name_unit_and_meaning(catalog, key, name, unit):
    spec = catalog.spec(key)
    assert (spec.name, spec.unit, spec.label_names) == (name, unit, ())
    assert spec.scale == (2**20 if key == "checkpoint_engine/payload_mbytes" else 1)
    assert key in spec.full_help() and "verl 0." in spec.help  # the release that added it


@pytest.mark.parametrize("key, name", DESCRIBED.items())
def test_open_ended_keys_are_described(catalog, key, name):
    resolved = catalog.resolve(key)
    assert resolved.spec.known and resolved.spec.name == name and not resolved.label_values
    assert "verl 0." in resolved.spec.help


@pytest.mark.parametrize("key, family", MOE_LAYERS.items())
def test_moe_layers_are_one_family_per_statistic_labelled_by_layer(catalog, key, family):
    resolved = catalog.resolve(key)
    name, layer = family
    assert (resolved.spec.name, resolved.spec.label_names, resolved.label_values) == (name, ("layer",), (layer,))
    assert not resolved.dropped and resolved.spec.unit == ""
    assert "layer_<layer>:" in resolved.spec.full_help() and "verl 0.9" in resolved.spec.help


def test_the_layer_label_is_bounded(catalog):
    assert not catalog.resolve("rollout/moe/max_vio/layer_255").dropped
    for key in ("rollout/moe/max_vio/layer_256", "rollout/moe/avg_vio/layer_100000"):
        resolved = catalog.resolve(key)
        assert resolved.dropped and resolved.spec.name == "verl_rollout_moe_" + key.split("/")[2]


def test_layers_past_the_bound_are_dropped_and_counted():
    store = RunStore(default_catalog())
    values = {f"rollout/moe/{vio}/layer_{layer}": layer / 1000
              for vio in ("max_vio", "min_vio", "avg_vio") for layer in range(300)}
    store.ingest(Record(RUN, 1, values, time=1.0))
    text = scrape_store(store)
    served = samples(text)
    for vio in ("max_vio", "min_vio", "avg_vio"):
        layers = {dict(labels)["layer"] for name, labels in served if name == f"verl_rollout_moe_{vio}"}
        assert layers == {str(layer) for layer in range(256)}
    assert served[("verl_rollout_moe_max_vio", RUN_LABELS[:1] + (("layer", "7"),) + RUN_LABELS[1:])] == 0.007
    assert not [name for name, _ in served if "layer" in name]  # never a name per layer
    assert served[("verl_training_series_dropped_total", RUN_LABELS)] == 3 * 44
    assert check_metrics(text) == ""
    # Counted once per scrape, not once per scrape ever.
    assert samples(scrape_store(store))[("verl_training_series_dropped_total", RUN_LABELS)] == 3 * 44


@pytest.mark.parametrize("v0, v1", V0_V1.items())
def test_the_v0_and_v1_spellings_are_one_metric(catalog, v0, v1):
    assert catalog.resolve(v0) == catalog.resolve(v1)
    assert catalog.spellings[v1] == (v0, v1)


def test_a_run_upgraded_to_the_v1_trainer_keeps_its_series():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 1, {"num_turns/mean": 2.0}, time=1.0))  # the V0 trainer
    assert samples(scrape_store(store))[("verl_num_turns_mean", RUN_LABELS)] == 2.0
    store.ingest(Record(RUN, 2, {"training/num_turns/mean": 3.0}, time=2.0))  # resumed on V1
    served = samples(scrape_store(store))
    assert served[("verl_num_turns_mean", RUN_LABELS)] == 3.0
    assert not [name for name, _ in served if "num_turns" in name and name != "verl_num_turns_mean"]


def test_v1_logging_both_spellings_keeps_the_v0_name():
    store = RunStore(default_catalog())
    store.ingest(Record(RUN, 1, {"num_turns/mean": 2.0, "training/num_turns/mean": 2.5}, time=1.0))
    served = samples(scrape_store(store))
    assert served[("verl_num_turns_mean", RUN_LABELS)] == 2.0
    assert served[("verl_training_num_turns_mean", RUN_LABELS)] == 2.5


def test_validation_success_only_accuracy_is_a_variable_of_the_families(catalog):
    for section in ("val-core", "val-aux"):
        resolved = catalog.resolve(f"{section}/openai/gsm8k/acc_success_only/mean@4")
        assert resolved.spec.name == "verl_" + section.replace("-", "_")
        assert resolved.label_values == ("openai/gsm8k", "acc_success_only", "mean@4")
    assert "acc_success_only" in catalog.resolve("val-aux/a/acc_success_only/mean@1").spec.help


def test_a_store_holding_every_new_key_is_promtool_clean():
    store = RunStore(default_catalog())
    keys = [*V1_KEYS, *DESCRIBED, *MOE_LAYERS, *V0_V1, *V0_V1.values(), "rollout/moe/max_vio/layer_999",
            "val-aux/openai/gsm8k/acc_success_only/mean@4"]
    for step in (1, 2):
        store.ingest(Record(RUN, step, {key: 0.5 for key in keys}, time=float(step)))
    text = scrape_store(store)
    assert check_metrics(text) == ""
    served = samples(text)
    for name, _ in V1_KEYS.values():
        assert (name, RUN_LABELS) in served, name


def test_limits_must_name_a_label(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("families:\n  - {pattern: '^m/(?P<layer>\\d+)$', name: verl_m, limits: {depth: 4}, help: x}\n")
    with pytest.raises(ValueError, match="limits"):
        Catalog.load(path)


def test_a_family_without_limits_is_unbounded(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("families:\n  - {pattern: '^m/layer_(?P<layer>\\d+)$', name: verl_m, help: x}\n"
                    "  - {pattern: '^n/layer_(?P<layer>\\d+)$', name: verl_n, limits: {layer: 4}, help: y}\n")
    catalog = Catalog.load(path)
    assert not catalog.resolve("m/layer_4000").dropped
    assert not catalog.resolve("n/layer_3").dropped and catalog.resolve("n/layer_4").dropped
