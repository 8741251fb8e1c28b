"""The metric catalog: how each verl key becomes a Prometheus series.

``catalog.yaml`` lists every metric of the guide with its name, unit conversion, meaning, healthy
range and thresholds (entries may share a name with fixed labels: actor and critic memory, by
``role``), plus key families (``val-core/...``, ``rollout/moe/max_vio/layer_<i>``) that become one
labelled metric (a label may be bounded: ``layer`` below 256, keys past it dropped), and described
patterns (``rollout_corr/*``) that give open-ended keys a meaning. Keys the catalog does not list
are still exported under the naming rule of :func:`default_name`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from verl_exporter import schema, shipped
from verl_exporter.config.yaml_files import load_shipped

CATALOG_PATH = shipped.catalog()
PREFIX = "verl_"
GIB = 1 << 30
MIB = 1 << 20

# Suffixes a gauge must not end in: Prometheus reserves them for counters, histograms, summaries.
_RESERVED_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created", "_info")

# A logged key whose name the exporter serves itself is renamed into this namespace.
LOGGED_PREFIX = PREFIX + "logged_"
# Namespaces that are the exporter's own as a whole (besides every name it serves, see
# schema.reserved_names): a logged key never takes a name in them.
RESERVED_PREFIXES = (*schema.OWN_PREFIXES, LOGGED_PREFIX)


def is_reserved(name: str) -> bool:
    """Whether ``name`` is one the exporter serves itself, or lies in one of its namespaces."""
    return name.startswith(RESERVED_PREFIXES) or name in schema.reserved_names()


# timing_s/* keys that hold no duration: verl puts counts, lengths and ratios of the generation and
# of the agent loop into the same timing dict as the stage times (timing_s/generation_timing/topk_ratio,
# timing_s/agent_loop/slowest/prompt_length, timing_s/agent_loop/num_preempted/max).
_NOT_A_DURATION = r"(?:.+/)?(?:[^/]*ratio|[^/]*_length|[^/]*utilization|[^/]*_samples|num_[^/]*)(?:/(?:min|max|mean))?"

# verl key shapes that carry a unit, and how to convert them to base units.
_UNIT_RULES = (
    (re.compile(r"^timing_per_token_ms/(.+)$"), "timing_per_token_{}", "_seconds", 1e-3),
    (re.compile(rf"^timing(?:_s)?/({_NOT_A_DURATION})$"), "timing_{}", "", 1.0),
    (re.compile(r"^timing_s/(.+)$"), "timing_{}", "_seconds", 1.0),
    (re.compile(r"^timing/(.+)$"), "timing_{}", "_seconds", 1.0),
    (re.compile(r"^(.+)_gb$"), "{}", "_bytes", float(GIB)),
    (re.compile(r"^(.+)_mb$"), "{}", "_bytes", float(MIB)),
    (re.compile(r"^(.+)_ms$"), "{}", "_seconds", 1e-3),
)


def sanitize(text: str) -> str:
    """Lower-case ``text`` with every run of characters outside [a-z0-9_] turned into one '_'."""
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")


def default_name(key: str) -> tuple[str, float]:
    """Prometheus name and scale factor for a verl key, by the naming rule.

    ``actor/pg_clipfrac`` -> ``verl_actor_pg_clipfrac``; ``timing_s/gen`` ->
    ``verl_timing_gen_seconds``, but ``timing_s/agent_loop/slowest/prompt_length`` ->
    ``verl_timing_agent_loop_slowest_prompt_length`` (no duration); ``timing_per_token_ms/gen`` ->
    ``verl_timing_per_token_gen_seconds`` (x 0.001); ``perf/max_memory_allocated_gb`` ->
    ``verl_perf_max_memory_allocated_bytes`` (x 2^30).
    """
    name, scale = _named_by_rule(key)
    if name.endswith(_RESERVED_SUFFIXES):
        name += "_value"
    # Checked on the final name, unit suffix included: host/memory_used_gb is not the host's
    # verl_host_memory_used_bytes but verl_logged_host_memory_used_bytes.
    if is_reserved(name):
        name = LOGGED_PREFIX + name[len(PREFIX):]
    return name, scale


def _named_by_rule(key: str) -> tuple[str, float]:
    """The naming rule alone: ``verl_`` + the key, with the unit rules' suffix and scale."""
    for pattern, template, suffix, scale in _UNIT_RULES:
        match = pattern.match(key)
        if match:
            return PREFIX + re.sub(r"_+", "_", sanitize(template.format(match.group(1))) + suffix), scale
    return PREFIX + (sanitize(key) or "unnamed"), 1.0


@dataclass(frozen=True)
class MetricSpec:
    """How one verl key (or family) is exported."""

    key: str
    name: str
    help: str
    unit: str = ""
    scale: float = 1.0
    healthy: dict = field(default_factory=dict, hash=False, compare=False)
    thresholds: dict = field(default_factory=dict, hash=False, compare=False)
    aliases: tuple[str, ...] = ()
    label_names: tuple[str, ...] = ()
    known: bool = True
    label_values: tuple[str, ...] = ()  # of a metric whose labels are fixed (role="critic")
    help_keys: tuple[str, ...] = ()  # every verl key served under this name, where several entries share it
    limits: dict = field(default_factory=dict, hash=False, compare=False)  # of a family: label -> bound of its number

    def full_help(self) -> str:
        """HELP text: the verl key(s), the guide's meaning, the unit and the healthy range."""
        keys = " / ".join(self.help_keys or (self.key,) + self.aliases)
        text = f"verl {keys}: {self.help}"
        if self.unit:
            text += f" [{self.unit}]"
        if self.healthy:
            low, high = self.healthy.get("min"), self.healthy.get("max")
            if low is not None and high is not None:
                text += f". Healthy {low} to {high}"
            elif low is not None:
                text += f". Healthy >= {low}"
            elif high is not None:
                text += f". Healthy <= {high}"
        return text + "."


@dataclass(frozen=True)
class SettingSpec:
    """A verl setting the exporter serves: a number (``verl_run_config{key}``) or, with ``label``,
    a label of ``verl_run_config_info``; ``default`` is verl's, for rules on runs of unknown config."""

    key: str
    aliases: tuple[str, ...] = ()
    default: float | None = None
    label: str = ""
    last_part: bool = False


@dataclass(frozen=True)
class Resolved:
    """A verl key resolved to its metric and the label values of this series."""

    spec: MetricSpec
    label_values: tuple[str, ...] = ()
    dropped: bool = False  # a family's label past its bound (``layer`` 256 on): not served, counted


class Catalog:
    """Looks up verl keys; loads ``catalog.yaml`` once."""

    _served_names: frozenset[str]  # set by served_names() on first use

    def __init__(self, metrics: list[MetricSpec], families: list[tuple[re.Pattern, MetricSpec]],
                 system: dict[str, float] | None = None, settings: list[SettingSpec] | None = None,
                 rules: dict[str, dict[str, float]] | None = None):
        self.metrics = metrics = _share_names(metrics)
        self.families = families
        self.system = dict(system or {})  # thresholds of GPU, host and job metrics
        self.settings = list(settings or ())  # the run's settings served from its config
        # Numbers of the rules that judge no single key, by table (``${anomaly:spike_zscore}``).
        self.rules = {table: {name: float(value) for name, value in values.items()}
                      for table, values in (rules or {}).items()}
        # Names served with labels: an unlisted key must not take one (its series would lack them).
        self._labelled = {spec.name for spec in metrics if spec.label_names} | {
            spec.name for _, spec in families if spec.label_names}
        self._by_key: dict[str, MetricSpec] = {}
        for spec in metrics:
            for key in (spec.key,) + spec.aliases:
                if key in self._by_key:
                    raise ValueError(f"catalog: key {key!r} listed twice")
                self._by_key[key] = spec
        self._cache: dict[str, Resolved] = {}
        # Every spelling of a metric that has several, by spelling (actor/entropy_loss, actor/entropy).
        self.spellings = {key: (spec.key,) + spec.aliases for spec in metrics if spec.aliases
                          for key in (spec.key,) + spec.aliases}

    @classmethod
    def load(cls, path: Path | str = CATALOG_PATH) -> "Catalog":
        data = load_shipped(Path(path).read_text(encoding="utf-8"))
        metrics = [_metric_from_yaml(entry) for entry in data.get("metrics", [])]
        families = []
        for entry in data.get("families", []):
            pattern = re.compile(entry["pattern"])
            spec = MetricSpec(  # without a name: a described pattern, each key named by the rule
                key=entry.get("key", entry["pattern"]),
                name=entry.get("name", ""),
                help=entry["help"],
                unit=entry.get("unit", ""),
                label_names=tuple(pattern.groupindex),
                limits={label: int(bound) for label, bound in (entry.get("limits") or {}).items()},
            )
            if not set(spec.limits) <= set(spec.label_names):
                raise ValueError(f"catalog: limits of {spec.key!r} name a label it does not have")
            families.append((pattern, spec))
        return cls(metrics, families, data.get("system"), _settings_from_yaml(data.get("settings") or {}),
                   data.get("rules"))

    def setting(self, key: str) -> SettingSpec:
        """The catalog's entry for a verl setting (newest spelling); KeyError if it is not listed."""
        for spec in self.settings:
            if spec.key == key:
                return spec
        raise KeyError(key)

    def spec(self, key: str) -> MetricSpec:
        """The catalog entry for a verl key or alias; KeyError if it is not listed."""
        return self._by_key[key]

    def by_name(self, name: str) -> MetricSpec:
        """The catalog entry exported under a Prometheus name; KeyError if none."""
        for spec in self.metrics:
            if spec.name == name:
                return spec
        for _, spec in self.families:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def listed_keys(self) -> frozenset[str]:
        """Every key and alias the catalog lists."""
        return frozenset(self._by_key)

    def served_names(self) -> frozenset[str]:
        """The names of the catalog's metrics and families."""
        try:
            return self._served_names
        except AttributeError:
            self._served_names = frozenset(spec.name for spec in self.metrics) | {
                spec.name for _, spec in self.families}
            return self._served_names

    def _outside(self, resolved: Resolved) -> Resolved:
        """A key outside the catalog never takes a name the catalog serves (``actor_pg_loss`` is not
        ``actor/pg_loss``, ``val_core`` not the family): it is renamed into ``verl_logged_``."""
        spec = resolved.spec
        if spec.known or spec.name not in self.served_names():
            return resolved
        return Resolved(MetricSpec(key=spec.key, name=LOGGED_PREFIX + spec.name[len(PREFIX):], help=spec.help,
                                   scale=spec.scale, known=False))

    def resolve(self, key: str) -> Resolved:
        """The metric and label values a verl key is exported as (cached per key)."""
        resolved = self._cache.get(key)
        if resolved is None:
            resolved = self._outside(self._resolve(key))
            if len(self._cache) < 100_000:
                self._cache[key] = resolved
        return resolved

    def is_known(self, key: str) -> bool:
        """Whether the catalog describes ``key`` (listed, or of a family or described pattern); a key
        not resolved before is not cached (a key the series cap refuses must not be kept)."""
        resolved = self._cache.get(key)
        return (resolved or self._resolve(key)).spec.known

    def _resolve(self, key: str) -> Resolved:
        spec = self._by_key.get(key)
        if spec is not None:
            return Resolved(spec, spec.label_values)
        for pattern, family in self.families:
            match = pattern.match(key)
            if match and family.name:
                values = tuple(match.group(name) for name in family.label_names)
                return Resolved(family, values, dropped=_past_limits(family, values))
            if match:
                return Resolved(replace(family, key=key, **self._rule_name(key)))
        return Resolved(MetricSpec(key=key, help="(not in the catalog)", known=False, **self._rule_name(key)))

    def own(self, key: str) -> Resolved:
        """An alias as a metric of its own, for a release that logs it beside the catalog's key
        (verl 0.8 logs actor/entropy_loss, the entropy of the update, beside actor/entropy)."""
        spec = self._by_key[key]
        named = self._rule_name(key)
        if named["name"] == spec.name:
            named["name"] = PREFIX + "logged_" + spec.name[len(PREFIX):]
        return Resolved(replace(spec, key=key, aliases=(), help_keys=(), label_names=(), label_values=(),
                                help=f"{spec.help} (as logged beside {spec.key})", **named))

    def _rule_name(self, key: str) -> dict:
        name, scale = default_name(key)
        if name in self._labelled:  # e.g. "val_core": not the family
            name = PREFIX + "logged_" + name[len(PREFIX):]
        return {"name": name, "scale": scale}


def _past_limits(family: MetricSpec, values: tuple[str, ...]) -> bool:
    """Whether a label of a family's key is past its bound (``layer`` 256 of ``rollout/moe/...``)."""
    return any(not value.isdigit() or int(value) >= family.limits[label]
               for label, value in zip(family.label_names, values) if label in family.limits)


def _share_names(metrics: list[MetricSpec]) -> list[MetricSpec]:
    """Entries served under one name (actor and critic memory, told apart by a fixed ``role``
    label) must have the same label names; each one's HELP then lists every key of the name."""
    keys: dict[str, tuple[str, ...]] = {}
    labels: dict[str, tuple[str, ...]] = {}
    for spec in metrics:
        keys[spec.name] = keys.get(spec.name, ()) + (spec.key,) + spec.aliases
        if labels.setdefault(spec.name, spec.label_names) != spec.label_names:
            raise ValueError(f"catalog: entries named {spec.name!r} have different labels")
    return [spec if len(keys[spec.name]) == 1 + len(spec.aliases) else replace(spec, help_keys=keys[spec.name])
            for spec in metrics]


def _metric_from_yaml(entry: dict) -> MetricSpec:
    key = entry["key"]
    derived_name, derived_scale = default_name(key)
    labels = dict(entry.get("labels") or {})
    return MetricSpec(
        key=key,
        name=entry.get("name", derived_name),
        help=entry["help"],
        unit=entry.get("unit", ""),
        scale=float(entry.get("scale", derived_scale)),
        healthy=dict(entry.get("healthy") or {}),
        thresholds=dict(entry.get("thresholds") or {}),
        aliases=tuple(entry.get("aliases") or ()),
        label_names=tuple(labels),
        label_values=tuple(str(value) for value in labels.values()),
    )


def _settings_from_yaml(data: dict) -> list[SettingSpec]:
    specs = [SettingSpec(entry["key"], tuple(entry.get("aliases") or ()), entry.get("default"))
             for entry in data.get("numeric") or ()]
    specs += [SettingSpec(entry["key"], tuple(entry.get("aliases") or ()), label=entry["label"],
                          last_part=bool(entry.get("last_part"))) for entry in data.get("info") or ()]
    return specs


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The catalog shipped with the package."""
    return Catalog.load()
