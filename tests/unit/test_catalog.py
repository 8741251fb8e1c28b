import math
import re

import pytest

from verl_exporter.catalog import Catalog, default_catalog, default_name

# Sections 1-10 of the metrics guide: every metric it names.
GUIDE_KEYS = [
    "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy_loss",
    "actor/kl_loss", "actor/grad_norm", "actor/lr",
    "critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/vf_explained_var", "critic/grad_norm",
    "critic/lr",
    *[f"critic/{group}/{stat}" for group in ("score", "rewards", "advantages", "returns", "values")
      for stat in ("mean", "max", "min")],
    "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff",
    *[f"{group}/{stat}" for group in ("response_length", "prompt_length") for stat in ("mean", "max", "min", "clip_ratio")],
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
}


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
    assert catalog.resolve(old).spec == catalog.resolve(new).spec


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
    aux = catalog.resolve("val-aux/lighteval/MATH/acc/best@4/mean")
    assert aux.spec.name == "verl_val_aux"
    assert aux.label_values == ("lighteval/MATH/acc", "best@4", "mean")
    old = catalog.resolve("val/test_score/openai/gsm8k")
    assert (old.spec.name, old.label_values) == ("verl_val_test_score", ("openai/gsm8k",))


def test_healthy_ranges_and_thresholds_are_numbers_in_range(catalog):
    for spec in catalog.metrics:
        for value in list(spec.healthy.values()) + list(spec.thresholds.values()):
            assert isinstance(value, (int, float)) and math.isfinite(value), spec.key
        low, high = spec.healthy.get("min"), spec.healthy.get("max")
        if low is not None and high is not None:
            assert low < high, spec.key


def test_names_are_unique_per_metric(catalog):
    names = [spec.name for spec in catalog.metrics] + [family.name for _, family in catalog.families]
    assert len(names) == len(set(names))


def test_duplicate_key_in_catalog_is_refused(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("metrics:\n  - {key: a/b, help: x}\n  - {key: c, aliases: [a/b], help: y}\n")
    with pytest.raises(ValueError, match="a/b"):
        Catalog.load(path)
