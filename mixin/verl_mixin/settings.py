"""The run's settings as the rules use them.

verl's config reaches Prometheus as ``verl_run_config{project, experiment, key}`` (the exporter reads
it from the config verl prints, hydra's config.yaml or ``--run.config``). The recording rules here
give each run one series per setting a rule needs: the run's own value, or, for a run whose config
the exporter does not know, verl's default from the catalog's ``settings`` section
(``${setting:KEY}``). They live beside the alerts that use them (verl-training.rules.yml), so the
alert files work without prometheus/recording-rules.yml.

Descriptions quote a setting with ``quote``: the run's value, or a text for a run whose config is
unknown.
"""

from __future__ import annotations

from .model import PER_STEP_INTERVAL, run_query, sub

RULE_FILE = "verl-training.rules.yml"
ACTOR_GRAD_CLIP = "run:verl_actor_grad_clip:setting"
CRITIC_GRAD_CLIP = "run:verl_critic_grad_clip:setting"
# A lower bound of the policy updates per rollout: ppo_epochs x mini-batches per batch, or what of
# it is known. Absent for a run whose config is unknown.
POLICY_UPDATES = "run:verl_policy_updates_per_rollout:setting"
# The V1 trainer's staleness bound (model versions): the run's own, verl's default where the run's config
# is unknown, and none where its config sets it to null (no bound: nothing is too stale).
STALENESS_BOUND = "run:verl_max_off_policy_threshold:setting"
STALENESS_KEY = "trainer.v1.sampler.max_off_policy_threshold"
# Prompt groups trained per step (``data.train_batch_size``): none for a run whose config is unknown.
TRAIN_BATCH = "run:verl_train_batch_size:setting"

ACTOR = "actor_rollout_ref.actor"


def setting(key: str) -> str:
    """The run's own value of a verl setting (no series for a run whose config is unknown)."""
    return sub('max without(key) (verl_run_config{key="${key}"})', key=key)


def setting_or_default(key: str) -> str:
    """The run's own value of a setting, else verl's default (``${setting:KEY}`` of the catalog)."""
    return sub("${setting} or (0 * verl_training_last_step + ${default})", setting=setting(key),
               default=sub("${setting:${key}}", key=key))


def setting_or_default_where_unknown(key: str) -> str:
    """The run's own value of a setting; verl's default only for a run whose config is unknown (a
    run whose config leaves the setting out, or null, has none)."""
    return sub("${setting} or (0 * verl_training_last_step + ${default}"
               " unless on(job, instance, project, experiment, user, team) verl_run_config)",
               setting=setting(key), default=sub("${setting:${key}}", key=key))


def quote(key: str, missing: str) -> str:
    """Alert template text: the run's value of ``key``, or ``missing`` for a run of unknown config."""
    selector = sub('verl_run_config{key="${key}",project=%q,experiment=%q,user=%q}', key=key)
    return run_query(selector) + '{{ . | first | value | printf "%.4g" }}{{ else }}' + missing + "{{ end }}"


def recording_groups() -> list[dict]:
    """The settings the rules of verl-training.rules.yml use, one series per run."""
    epochs = setting(sub("${ACTOR}.ppo_epochs", ACTOR=ACTOR))
    batches = sub("ceil(${size} / ${mini})", size=setting("data.train_batch_size"),
                  mini=setting(sub("${ACTOR}.ppo_mini_batch_size", ACTOR=ACTOR)))
    return [{
        "name": "verl-run-settings",
        "interval": PER_STEP_INTERVAL,
        "rules": [
            {"record": ACTOR_GRAD_CLIP, "expr": setting_or_default(sub("${ACTOR}.grad_clip", ACTOR=ACTOR))},
            {"record": CRITIC_GRAD_CLIP, "expr": setting_or_default("critic.grad_clip")},
            {"record": POLICY_UPDATES, "expr": sub("${epochs} * ${batches} or ${epochs} or ${batches}",
                                                    epochs=epochs, batches=batches)},
            {"record": STALENESS_BOUND, "expr": setting_or_default_where_unknown(STALENESS_KEY)},
            {"record": TRAIN_BATCH, "expr": setting("data.train_batch_size")},
        ],
    }]
