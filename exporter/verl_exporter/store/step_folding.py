"""The step statistics' input: each run's steps of the metrics the rules judge in steps, folded into
the run's ``StepWindow`` per metric (``step_windows``). The store appends a record's values of those
metrics (``StepFolder.watched``: a few of a line's keys, however many it holds) to the run's
``pending_steps`` as it ingests them; ``StepFolder.fold`` adds them to the windows, in bulk (at the
next snapshot, or once ``PENDING_STEPS`` wait).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from itertools import compress, repeat
from operator import is_not, itemgetter
from typing import cast

from verl_exporter.store import validation
from verl_exporter.store.catalog import Catalog
from verl_exporter.store.run_state import RunState
from verl_exporter.store.step_windows import SPARSE, WATCHED, StepWindow

MAX_RESOLVED = 100_000  # verl keys remembered as watched or not


def _numbers(column: Iterable) -> list[float | None]:
    """The column's values as floats (None for one that is no number), converted in C where all are."""
    try:
        return list(map(float, column))
    except (TypeError, ValueError, OverflowError):
        pass
    numbers: list[float | None] = []
    for value in column:
        try:
            numbers.append(float(value))
        except (TypeError, ValueError, OverflowError):
            numbers.append(None)
    return numbers


def _present(steps: list[int], column: list) -> tuple[list[int], list]:
    """The steps and values of ``column`` that are not None."""
    if None not in column:
        return steps, column
    kept = list(map(is_not, column, repeat(None)))
    return list(compress(steps, kept)), list(compress(column, kept))


class StepFolder:
    """Which verl keys are watched metrics (with their served name and scale), and the folding."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self._watched: dict[str, tuple[str, float]] = {}  # watched verl key -> served name and scale
        self._resolved: set[str] = set()  # the keys looked up for _watched
        self._validation_keys: set[str] = set()  # the keys a step logs only when it validated
        self._sparse: set[str] = set()  # watched keys verl logs only at a step where they are not 0

    def watched(self, state: RunState, step: int, values: Mapping) -> dict:
        """The values of ``values`` (the run's record at ``step``, just ingested) of the metrics the
        rules judge in steps: what ``pending_steps`` keeps. Notes a step that validated."""
        keys, resolved = values.keys(), self._resolved
        if not keys <= resolved:
            latest = state.values
            for key in keys - resolved:
                if key in latest:  # a key refused by the series cap is not resolved, nor remembered
                    self._resolve(key)
        if not self._validation_keys.isdisjoint(keys):
            validation.note(state, step)
        found = {key: values[key] for key in keys & self._watched.keys()}
        sparse = self._sparse
        if sparse and (found or not sparse.isdisjoint(keys)) and any(key in state.values for key in sparse):
            self._fill_sparse(state, step, keys, found)
        return found

    def _fill_sparse(self, state: RunState, step: int, keys: Set[str], found: dict) -> None:
        """A training step's record without a sparse count the run has logged: 0 for it (served too),
        unless an earlier record of the same step gave it."""
        logged, latest = state.sparse_steps, state.values
        for key in self._sparse & keys:
            logged[key] = step
        for key in self._sparse - keys:
            if key in latest and logged.get(key) != step:
                latest[key] = 0.0
                if key in self._watched:
                    found[key] = 0.0

    def fold(self, state: RunState) -> None:
        """Add each waiting step's value of every metric the rules judge in steps to the run's windows.

        Each metric's values are fetched column by column (``dict.get`` mapped over the waiting
        steps) and converted in C, so the work per value is C's. A metric logged under two keys in
        the waiting steps (a run resumed on a newer release) is folded by ``_fold_tables``."""
        pending, state.pending_steps = state.pending_steps, []
        watched = self._watched
        rows = [values for _, values in pending]
        keys = set().union(*rows)
        names = {watched[key][0] for key in keys}
        if len(names) != len(keys):
            self._fold_tables(state, pending)
            return
        steps = [step for step, _ in pending]
        windows = state.windows
        for key in keys:
            name, scale = watched[key]
            key_steps, column = _present(steps, list(map(dict.get, rows, repeat(key))))
            key_steps, floats = _present(key_steps, _numbers(column))
            window = windows.get(name)
            if window is None:
                window = windows[name] = StepWindow()
            window.add_all(key_steps, floats if scale == 1 else [number * scale for number in floats])

    def _fold_tables(self, state: RunState, pending: list) -> None:
        """``fold`` of waiting steps that log a metric under two keys. Records with the same watched
        keys are taken as one table: their values fetched by one ``itemgetter``, converted column by
        column."""
        watched = self._watched
        tables: dict[frozenset, tuple[tuple[str, ...], Callable, list[tuple[int, int]], list]] = {}
        for index, (step, values) in enumerate(pending):
            present = frozenset(values)
            table = tables.get(present)
            if table is None:
                order = tuple(present)
                table = tables[present] = (order, itemgetter(*order), [], [])
            table[2].append((index, step))
            table[3].append(table[1](values))
        points: dict[str, list[tuple[int, int, float]]] = {}
        windows = state.windows
        for order, _, steps, rows in tables.values():
            columns = zip(*rows) if len(order) > 1 else (rows,)
            table_steps = [step for _, step in steps]
            for key, column in zip(order, columns):
                name, scale = watched[key]
                numbers = _numbers(column)
                if len(tables) == 1 and None not in numbers:  # the common case: one table, all numbers
                    window = windows.get(name)
                    if window is None:
                        window = windows[name] = StepWindow()
                    floats = cast("list[float]", numbers)
                    window.add_all(table_steps, floats if scale == 1 else [number * scale for number in floats])
                    continue
                found = points.setdefault(name, [])
                found += [(index, step, number * scale) for (index, step), number in zip(steps, numbers)
                          if number is not None]
        for name, found in points.items():
            found.sort()
            window = windows.get(name)
            if window is None:
                window = windows[name] = StepWindow()
            window.add_all([step for _, step, _ in found], [number for _, _, number in found])

    def _resolve(self, key: str) -> None:
        """Remember whether ``key`` is a watched metric, with its served name and scale (bounded)."""
        if len(self._resolved) >= MAX_RESOLVED:
            return
        if validation.is_validation_key(key):
            self._validation_keys.add(key)
        resolved = self.catalog.resolve(key)
        spec = resolved.spec
        if spec.name in WATCHED and not resolved.label_values:
            self._watched[key] = (spec.name, spec.scale)
        if spec.name in SPARSE:
            self._sparse.add(key)
        self._resolved.add(key)
