"""The settings of a run the exporter serves, picked from its flattened config by the catalog.

``pick`` turns ``{"actor_rollout_ref.actor.clip_ratio": 0.2, ...}`` (every setting of the config)
into the catalog's numeric settings, under their newest spelling, and the labels of the run's
info metric. A setting the config lacks, or holds as null, is simply absent.
"""

from __future__ import annotations

import math

from verl_exporter.store.catalog import Catalog
from verl_exporter.store.records import MAX_STEP, clean_text

MAX_LABEL_CHARS = 1024  # of a setting served as a label (a model path)

TOTAL_STEPS_KEY = "trainer.total_training_steps"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float, str)):  # YAML 1.1 reads 1e-06 as a string
        try:
            number = float(value)
        except (ValueError, OverflowError):  # text, or an integer of hundreds of digits
            return None
        return number if math.isfinite(number) else None
    return None


def pick(catalog: Catalog, flat: dict) -> tuple[dict[str, float], dict[str, str]]:
    """(numeric settings by catalog key, info labels by label name) of a flattened config."""
    numbers: dict[str, float] = {}
    labels: dict[str, str] = {}
    for spec in catalog.settings:
        value = next((flat[key] for key in (spec.key,) + spec.aliases if flat.get(key) is not None), None)
        if value is None:
            continue
        if spec.label:
            text = clean_text(str(value)[:MAX_LABEL_CHARS]).rstrip("/")
            labels[spec.label] = text.rpartition("/")[2] if spec.last_part else text
        else:
            number = _number(value)
            if number is not None:
                numbers[spec.key] = number
    return numbers, labels


def info_labels(catalog: Catalog) -> list[str]:
    """The labels of ``verl_run_config_info`` besides the run's."""
    return [spec.label for spec in catalog.settings if spec.label]


def total_steps(numbers: dict[str, float]) -> int | None:
    """The config's ``trainer.total_training_steps`` when the user set it (verl's default is null)."""
    value = numbers.get(TOTAL_STEPS_KEY)
    return int(value) if value is not None and 1 <= value <= MAX_STEP else None


MAX_GPUS = 1_000_000  # of one run: a larger product is no config's


def gpus(numbers: dict[str, float]) -> float | None:
    """The GPUs the run's config asks for: ``trainer.n_gpus_per_node`` x ``trainer.nnodes`` (1 node
    where it says none); None where it names no GPUs per node."""
    per_node, nodes = numbers.get("trainer.n_gpus_per_node"), numbers.get("trainer.nnodes", 1.0)
    if per_node is None or not 0 < per_node * nodes <= MAX_GPUS:
        return None
    return per_node * nodes
