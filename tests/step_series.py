"""promtool test files whose training series also come as the exporter's step statistics.

The training rules read ``verl_training_<stat>{metric=...}`` (``verl_exporter.step_windows``), which
the exporter computes from a run's steps. A test file gives the raw series a run logs; ``expand``
adds, for every watched metric among them, the statistics the exporter would serve, computed by
the exporter's own ``StepWindow``, taking each sample of the series as one step of the run.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from verl_exporter.step_windows import WATCHED, StepWindow

_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
_NUMBER = r"(?:[+-]?[0-9.]+(?:e[+-]?[0-9]+)?|NaN|[+-]?Inf)"
_ITEM = re.compile(rf"^({_NUMBER}|_|stale)(?:([+-][0-9.]+(?:e[+-]?[0-9]+)?)?x([0-9]+))?$")


def values(text: str) -> list[float | None]:
    """promtool's expanding notation (``1+0.5x3``, ``0x10``, ``_x2``, ``stale``) as a list; None: no sample."""
    out: list[float | None] = []
    for item in str(text).split():
        match = _ITEM.match(item)
        if not match:
            raise ValueError(f"unreadable promtool value {item!r}")
        start, step, count = match.groups()
        if start in ("_", "stale"):
            out += [None] * (int(count) if count else 1)
            continue
        first, delta = float(start), float(step or 0)
        out += [first + k * delta for k in range((int(count) + 1) if count else 1)]
    return out


def step_series(series: str, points: list[float | None]) -> list[dict]:
    """The step statistics of one watched series, as promtool input series."""
    name, labels = _SERIES.match(series.strip()).groups()
    window, stats = StepWindow(), sorted(WATCHED[name])
    rows: dict[str, list[str]] = {stat: [] for stat in stats}
    for step, value in enumerate(points):
        if value is not None:
            window.add(step, value)
        for stat in stats:
            result = window.stat(stat) if value is not None else None
            rows[stat].append("_" if result is None else repr(result))
    extra = (", " if labels.strip() else "") + f'metric="{name}"'
    return [{"series": f"verl_training_{stat}{{{labels}{extra}}}", "values": " ".join(row)}
            for stat, row in rows.items() if any(item != "_" for item in row)]


def expand(path: Path, out_dir: Path) -> Path:
    """``path`` written to ``out_dir`` with the step statistics of its watched series and absolute rule paths."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["rule_files"] = [str((path.parent / rule).resolve()) for rule in data.get("rule_files", [])]
    for test in data.get("tests", []):
        added = []
        for entry in test.get("input_series", []):
            match = _SERIES.match(entry["series"].strip())
            if match and match.group(1) in WATCHED:
                added += step_series(entry["series"], values(entry["values"]))
        test["input_series"] = test.get("input_series", []) + added
    target = out_dir / path.name
    target.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000), encoding="utf-8")
    return target
