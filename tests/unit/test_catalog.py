import math
import re

import pytest

from verl_exporter.store.catalog import Catalog, default_catalog, default_name

# Sections 1-10 of the metrics guide: every metric it names.
GUIDE_KEYS = [
    "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy_loss",
    "actor/kl_loss", "actor/grad_norm", "actor/lr",
    "critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/vf_explained_var", "critic/grad_norm",
    "critic/lr",
    *[f"critic/{group}/{stat}" for group in ("score", "rewards", "advantages", "returns", "values")
      for stat in ("mean", "max", "min")],
    "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff",
    *[f"{group}/{stat}" for group in ("response_length", "prompt_length")
      for stat in ("mean", "max", "min", "clip_ratio")],
    *[f"episode/{group}/{stat}" for group in ("reward", "length") for stat in ("mean", "max", "min")],
    *[f"timing_s/{phase}" for phase in ("gen", "ref", "values", "adv", "update_critic", "update_actor", "step")],
    *[f"timing_per_token_ms/{phase}" for phase in ("gen", "ref", "values")],
    "perf/total_num_tokens", "perf/time_per_step", "perf/throughput", "perf/mfu/actor", "perf/mfu/critic",
    "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb",
    "training/global_step", "training/epoch", "world_model/loss", "world_model/grad_norm", "val/score",
    "val/accuracy",
]

SPELLINGS = {  # other verl versions' spelling -> the newest one
    "actor/entropy_loss": "actor/entropy",
    "actor/perf/max_memory_allocated_gb": "perf/max_memory_allocated_gb",
    "mfu/actor": "perf/mfu/actor",
    "timing/gen": "timing_s/gen",
    "timing/update_actor": "timing_s/update_actor",
    "timing/step": "timing_s/step",
    "critic/kl": "actor/reward_kl_penalty",  # verl 0.3
    "critic/kl_coeff": "actor/reward_kl_penalty_coeff",
}

# Keys verl logged after the guide was written: each has a meaning in the catalog.
NEWER_KEYS = [
    *[f"global_seqlen/{stat}" for stat in ("min", "max", "minmax_diff", "balanced_min", "balanced_max", "mean")],
    "actor/loss", "critic/loss",
    *[f"timing_s/{phase}" for phase in ("old_log_prob", "reward", "testing", "update_weights", "save_checkpoint",
                                        "start_profile", "stop_profile")],
    "response/aborted_ratio",
    *[f"response_length_non_aborted/{stat}" for stat in ("mean", "max", "min", "clip_ratio")],
    *[f"{group}/{stat}" for group in ("num_turns", "tool_call_counts") for stat in ("mean", "max", "min")],
    *[f"timing_s/agent_loop/{part}/{stat}" for part in ("generate_sequences", "tool_calls", "compute_score",
                                                        "num_preempted") for stat in ("mean", "max", "min")],
    *[f"timing_s/agent_loop/slowest/{part}" for part in ("generate_sequences", "tool_calls", "compute_score",
                                                         "num_preempted", "prompt_length", "response_length")],
    "perf/mfu/actor_infer",
    *[f"training/rollout_probs_diff_{stat}" for stat in ("valid", "max", "mean", "std")],
    "training/rollout_actor_probs_pearson_corr",
    "rollout_corr/kl", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_seq_max_deviation",
    "training/off_policy/trajectory_staleness/max", "training/off_policy/evicted_samples",
    "critic/perf/max_memory_allocated_gb", "val-aux/num_turns/mean",
]


@pytest.fixture(scope="module")
def catalog():
    return default_catalog()


@pytest.mark.parametrize("key", GUIDE_KEYS)
def test_every_guide_metric_is_in_the_catalog(catalog, key):
    spec = catalog.spec(key)
    assert spec.help and spec.known
    assert re.fullmatch(r"verl_[a-z0-9_]+", spec.name)
    assert key in spec.full_help()


@pytest.mark.parametrize("old, new", SPELLINGS.items())
def test_other_versions_spellings_map_to_one_metric(catalog, old, new):
    assert catalog.resolve(old) == catalog.resolve(new)


@pytest.mark.parametrize("key", NEWER_KEYS)
def test_keys_verl_logged_since_the_guide_have_a_meaning(catalog, key):
    spec = catalog.resolve(key).spec
    assert spec.known and "not in the catalog" not in spec.full_help()
    assert key in spec.full_help()


def test_healthy_ranges_of_verl_docs_are_in_help(catalog):
    assert "Healthy 0.5 to 2.0" in catalog.resolve("rollout_corr/rollout_is_mean").spec.full_help()
    assert "Healthy >= 0.3" in catalog.resolve("rollout_corr/rollout_is_eff_sample_size").spec.full_help()


@pytest.mark.parametrize("key, name, unit", [
    ("timing_s/generation_timing/topk_ratio", "verl_timing_generation_timing_topk_ratio", "ratio"),
    ("timing_s/agent_loop/slowest/prompt_length", "verl_timing_agent_loop_slowest_prompt_length", "tokens"),
    ("timing_s/agent_loop/slowest/response_length", "verl_timing_agent_loop_slowest_response_length", "tokens"),
    ("timing_s/agent_loop/num_preempted/max", "verl_timing_agent_loop_num_preempted_max", ""),
    ("timing_s/agent_loop/slowest/num_preempted", "verl_timing_agent_loop_slowest_num_preempted", ""),
    ("timing_s/agent_loop/slowest/generate_sequences", "verl_timing_agent_loop_slowest_generate_sequences_seconds",
     "seconds"),
])
def test_timing_keys_that_are_not_durations_get_no_seconds(catalog, key, name, unit):
    spec = catalog.resolve(key).spec
    assert (spec.name, spec.unit, spec.scale) == (name, unit, 1)


@pytest.mark.parametrize("key, name", [
    ("timing_s/fully_async/rollouter/idle_ratio", "verl_timing_fully_async_rollouter_idle_ratio"),
    ("timing_s/fully_async/rollouter/step_generated_samples",
     "verl_timing_fully_async_rollouter_step_generated_samples"),
    ("timing_s/dynamic_resource/rollout_resource_utilization",
     "verl_timing_dynamic_resource_rollout_resource_utilization"),
    ("timing/agent/prompt_length", "verl_timing_agent_prompt_length"),
    ("timing_s/some_new_phase", "verl_timing_some_new_phase_seconds"),
])
def test_the_rule_knows_which_timing_keys_are_durations(key, name):
    assert default_name(key) == (name, 1.0)


def test_actor_and_critic_memory_are_one_metric_told_apart_by_role(catalog):
    old, actor, critic = (catalog.resolve(key) for key in (
        "perf/max_memory_allocated_gb", "actor/perf/max_memory_allocated_gb", "critic/perf/max_memory_allocated_gb"))
    assert old == actor
    assert actor.spec.name == critic.spec.name == "verl_perf_max_memory_allocated_bytes"
    assert actor.spec.label_names == critic.spec.label_names == ("role",)
    assert (actor.label_values, critic.label_values) == (("actor",), ("critic",))
    assert actor.spec.full_help() == critic.spec.full_help()
    assert "critic/perf/max_memory_allocated_gb" in actor.spec.full_help()
    assert catalog.by_name("verl_perf_max_memory_allocated_bytes").thresholds["near_total_ratio"] == 0.95
    for key in ("perf/max_memory_reserved_gb", "critic/perf/max_memory_reserved_gb", "actor/perf/cpu_memory_used_gb"):
        assert catalog.resolve(key).spec.label_names == ("role",)


def test_an_unlisted_key_never_takes_a_labelled_name(catalog):
    assert catalog.resolve("perf.max_memory_allocated_gb").spec.name == "verl_logged_perf_max_memory_allocated_bytes"


@pytest.mark.parametrize("key, name, scale", [
    ("actor/pg_clipfrac", "verl_actor_pg_clipfrac", 1),
    ("critic/score/mean", "verl_critic_score_mean", 1),
    ("timing_s/gen", "verl_timing_gen_seconds", 1),
    ("timing_per_token_ms/gen", "verl_timing_per_token_gen_seconds", 1e-3),
    ("perf/max_memory_allocated_gb", "verl_perf_max_memory_allocated_bytes", 2**30),
    ("perf/mfu/actor", "verl_perf_mfu_actor", 1),
])
def test_names_and_base_units(catalog, key, name, scale):
    spec = catalog.resolve(key).spec
    assert (spec.name, spec.scale) == (name, scale)


@pytest.mark.parametrize("key, name, scale", [
    ("critic/lr(1e-4)", "verl_critic_lr_1e_4", 1),
    ("actor/some-new@metric", "verl_actor_some_new_metric", 1),
    ("timing_s/reshard", "verl_timing_reshard_seconds", 1),
    ("timing_per_token_ms/reshard", "verl_timing_per_token_reshard_seconds", 1e-3),
    ("perf/new_buffer_gb", "verl_perf_new_buffer_bytes", 2**30),
    ("Agent/Turns..Total", "verl_agent_turns_total_value", 1),
    ("gpu/util", "verl_logged_gpu_util", 1),
    ("training/last_step", "verl_logged_training_last_step", 1),
    ("///", "verl_unnamed", 1),
])
def test_unknown_keys_follow_the_naming_rule(catalog, key, name, scale):
    resolved = catalog.resolve(key)
    assert not resolved.spec.known
    assert (resolved.spec.name, resolved.spec.scale) == (name, scale)
    assert default_name(key) == (name, scale)


def test_validation_keys_become_labelled_families(catalog):
    resolved = catalog.resolve("val-core/openai/gsm8k/reward/mean@1")
    assert resolved.spec.name == "verl_val_core"
    assert dict(zip(resolved.spec.label_names, resolved.label_values)) == {
        "data_source": "openai/gsm8k", "variable": "reward", "metric": "mean@1"}
    old = catalog.resolve("val/test_score/openai/gsm8k")
    assert (old.spec.name, old.label_values) == ("verl_val_test_score", ("openai/gsm8k",))
    assert "val-core/<data_source>/<variable>/<statistic>:" in resolved.spec.full_help()
    assert "?P<" not in resolved.spec.full_help() and "?P<" not in old.spec.full_help()


@pytest.mark.parametrize("key, labels", [
    # process_validation_metrics' statistics, read from the right; data sources hold slashes.
    ("val-core/openai/gsm8k/acc/best@4/mean", ("openai/gsm8k", "acc", "best@4/mean")),
    ("val-aux/openai/gsm8k/acc/worst@2/std", ("openai/gsm8k", "acc", "worst@2/std")),
    ("val-core/openai/gsm8k/acc/maj@4/mean", ("openai/gsm8k", "acc", "maj@4/mean")),
    ("val-aux/lighteval/MATH/score/best@16/std", ("lighteval/MATH", "score", "best@16/std")),
    ("val-aux/lighteval/MATH/reward/std@8", ("lighteval/MATH", "reward", "std@8")),
    ("val-core/gsm8k/acc/mean@1", ("gsm8k", "acc", "mean@1")),
    ("val-aux/a/b/c/pred/custom", ("a/b/c", "pred", "custom")),  # not verl's: the last part
])
def test_validation_statistics_are_read_from_the_right(catalog, key, labels):
    resolved = catalog.resolve(key)
    assert resolved.spec.name == ("verl_val_core" if key.startswith("val-core") else "verl_val_aux")
    assert resolved.label_values == labels


def test_names_say_their_base_unit(catalog):
    for spec in catalog.metrics:
        if spec.unit in ("seconds", "bytes"):
            assert spec.name.endswith("_" + spec.unit), spec.key
        else:
            assert not spec.name.endswith(("_seconds", "_bytes")), spec.key


def test_healthy_ranges_and_thresholds_are_numbers_in_range(catalog):
    for spec in catalog.metrics:
        for value in list(spec.healthy.values()) + list(spec.thresholds.values()):
            assert isinstance(value, (int, float)) and math.isfinite(value), spec.key
        low, high = spec.healthy.get("min"), spec.healthy.get("max")
        if low is not None and high is not None:
            assert low < high, spec.key


def test_names_are_unique_per_metric(catalog):
    """A name is one metric; entries share it only with fixed labels that tell them apart."""
    series = [(spec.name, spec.label_values) for spec in catalog.metrics]
    series += [(family.name, ()) for _, family in catalog.families if family.name]
    assert len(series) == len(set(series))
    for spec in catalog.metrics:
        if [other.name for other in catalog.metrics].count(spec.name) > 1:
            assert spec.label_names, spec.key


def test_entries_sharing_a_name_need_the_same_labels(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("metrics:\n  - {key: a/m, name: verl_m, labels: {role: a}, help: x}\n"
                    "  - {key: b/m, name: verl_m, help: y}\n")
    with pytest.raises(ValueError, match="verl_m"):
        Catalog.load(path)


def test_duplicate_key_in_catalog_is_refused(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("metrics:\n  - {key: a/b, help: x}\n  - {key: c, aliases: [a/b], help: y}\n")
    with pytest.raises(ValueError, match="a/b"):
        Catalog.load(path)
