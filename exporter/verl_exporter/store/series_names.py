"""Series names of a run's latest values: one series per catalog metric and label set, and two
keys never share one. A key whose name another key took first (``a:b`` and ``a/b`` are both
``verl_a_b``) gets a name of its own; where a run logged two spellings of one metric, the one
logged last is served. A key of a family whose label is past its bound (``rollout/moe/max_vio/layer_300``)
is not served but counted as dropped."""

from __future__ import annotations

import dataclasses
import hashlib

from verl_exporter.store.catalog import Catalog, Resolved
from verl_exporter.store.run_state import RunState, SeriesKey

MAX_NAME_OWNERS = 100_000  # series names whose first key is remembered (two keys never share a series)


class SeriesNames:
    """Names verl keys as series, remembering which key took each name first; shared by every run
    of a store, so a name means one key in every run."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self._owners: dict[SeriesKey, str] = {}  # series -> the key (catalog key) that first took it
        self._entries: dict[str, tuple[SeriesKey, Resolved, float]] = {}

    def fill_series(self, state: RunState) -> None:
        """Name the run's latest values: one series per catalog metric and label set. Where two
        spellings of one metric were logged (a run resumed on a newer verl), the one logged last
        wins; two logged side by side in one record are two metrics: the alias gets its own name."""
        series, logged_at = state.series, state.logged_at
        owners: dict[SeriesKey, str] = {}
        for key, value in state.values.items():
            series_key, resolved, scale = self._entries.get(key) or self._entry(key)
            if resolved.dropped:
                state.dropped_unremembered += 1  # a snapshot's copy: counted afresh on each
                continue
            if key in logged_at:
                owner = owners.get(series_key)
                if owner is not None and logged_at[owner] > logged_at[key]:
                    continue
                if owner is not None and logged_at[owner] == logged_at[key]:
                    alias = key if resolved.spec.key != key else owner
                    own = self.catalog.own(alias)
                    alias_value = state.values[alias]
                    assert not isinstance(alias_value, str)  # converted: snapshot() and run() convert first
                    series[(own.spec.name, ())] = (own, alias_value * own.spec.scale)
                    if alias == key:
                        continue
                owners[series_key] = key
            assert not isinstance(value, str)  # converted: snapshot() and run() convert first
            series[series_key] = (resolved, value * scale)

    def _entry(self, key: str) -> tuple[SeriesKey, Resolved, float]:
        """(series key, resolved metric, scale) of a verl key, cached like the catalog's lookups."""
        resolved = self.catalog.resolve(key)
        series_key = (resolved.spec.name, resolved.label_values)
        owner = self._owners.get(series_key)
        if resolved.dropped:
            pass  # never served: takes no name
        elif owner is None and len(self._owners) < MAX_NAME_OWNERS:
            self._owners[series_key] = resolved.spec.key
        elif owner is not None and owner != resolved.spec.key:
            series_key, resolved = self._own_name(key, resolved)
        # Past MAX_NAME_OWNERS a name nobody took keeps its plain name, unremembered: the names
        # dashboards and rules read do not change; only a clash between two keys met after that
        # (``a:b`` and ``a/b``) is no longer told apart.
        entry = (series_key, resolved, resolved.spec.scale)
        if len(self._entries) < 100_000:
            self._entries[key] = entry
        return entry

    def _own_name(self, key: str, resolved: Resolved) -> tuple[SeriesKey, Resolved]:
        """A name of its own for a key whose name another key took first (``a:b`` and ``a/b`` are
        both ``verl_a_b``): the name and a suffix from the key's hash, the same on every start, so
        two keys' values never interleave in one series."""
        spec = resolved.spec
        for size in (4, 8):
            name = f"{spec.name}_{hashlib.blake2b(key.encode('utf-8', 'replace'), digest_size=size).hexdigest()}"
            series_key = (name, resolved.label_values)
            owner = self._owners.get(series_key)
            if owner is None or owner == key:
                break
        if owner is None and len(self._owners) < MAX_NAME_OWNERS:
            self._owners[series_key] = key
        own = Resolved(dataclasses.replace(spec, key=key, name=name, aliases=(), help_keys=(),
                                           help=f"{spec.help} (logged as {key!r}, whose name {spec.name} another "
                                                f"key has)"), resolved.label_values)
        return series_key, own

