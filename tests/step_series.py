"""promtool test files whose training series also come as the exporter's step statistics.

The training rules read ``verl_training_<stat>{metric=...}`` (``verl_exporter.store.step_windows``), which
the exporter computes from a run's steps. A test file gives the raw series a run logs; ``expand``
adds, for every watched metric among them, the statistics the exporter would serve, computed by
the exporter's own ``StepWindow``, taking each sample of the series as one step of the run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from verl_exporter.config.yaml_files import FAST_SAFE_LOADER, load_shipped
from verl_exporter.shipped import rules_dir
from verl_exporter.store.step_windows import WATCHED, StepWindow
from verl_mixin.render import STEP_STATISTICS_FILE as STEP_STATISTICS_NAME

STEP_STATISTICS_FILE = (rules_dir() / STEP_STATISTICS_NAME).resolve()

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
    """``path`` written to ``out_dir`` with the step statistics of its watched series added to each
    test's input series, and its rule files as absolute paths. The file is edited as text, so every
    other value stays as written (YAML would read ``0x10`` as the number 16)."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    inserts: list[tuple[int, list[str]]] = []
    root = yaml.compose(text, Loader=FAST_SAFE_LOADER)
    for test in _items(_get(root, "tests")):
        sequence = _get(test, "input_series")
        if sequence is None or not sequence.value:
            continue
        added = []
        for entry in sequence.value:
            series, points = _get(entry, "series"), _get(entry, "values")
            match = _SERIES.match(series.value.strip()) if series is not None else None
            if match and match.group(1) in WATCHED and points is not None:
                added += step_series(series.value, values(points.value))
        if added:
            indent = " " * sequence.start_mark.column
            block = [f"{indent}- series: {json.dumps(item['series'])}\n"
                     f"{indent}  values: {item['values']}" for item in added]
            inserts.append((sequence.start_mark.line, block))
    for line, block in sorted(inserts, reverse=True):
        lines[line:line] = block
    out = "\n".join(lines)
    rule_files = [(path.parent / rule.value).resolve() for rule in _items(_get(root, "rule_files"))]
    for rule, resolved in zip(_items(_get(root, "rule_files")), rule_files):
        out = out.replace(f"- {rule.value}\n", f"- {resolved}\n", 1)
    out = with_step_statistics(out, rule_files)
    if len(_items(_get(yaml.compose(out, Loader=FAST_SAFE_LOADER), "tests"))) != len(_items(_get(root, "tests"))):
        raise ValueError(f"{path}: the expanded file does not hold the same tests")
    target = out_dir / path.name
    target.write_text(out, encoding="utf-8")
    return target


def with_step_statistics(text: str, rule_files: list[Path]) -> str:
    """A test file's text that also loads the recorded step statistics the rules read
    (``verl-step-statistics.rules.yml``) and evaluates them first at each evaluation time, as the
    group's rules are evaluated before they are read. promtool orders only the groups that
    ``group_eval_order`` lists, so it lists every group: the statistics, then the others in file order."""
    if STEP_STATISTICS_FILE in rule_files or not any(path.name.startswith("verl-") for path in rule_files):
        return text
    groups = [group["name"] for path in [STEP_STATISTICS_FILE, *rule_files]
              for group in load_shipped(path.read_text(encoding="utf-8"))["groups"]]
    head, marker, rest = text.partition("\nrule_files:\n")
    if not marker or "group_eval_order" in text:
        raise ValueError("a test file with rule_files and without group_eval_order is expected")
    indent = rest[:len(rest) - len(rest.lstrip(" "))]  # of the list's items
    return f"{head}{marker}{indent}- {STEP_STATISTICS_FILE}\n{rest}\ngroup_eval_order: {json.dumps(groups)}\n"


def _get(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((value for name, value in node.value if name.value == key), None)


def _items(node: yaml.Node | None) -> list:
    return node.value if isinstance(node, yaml.SequenceNode) else []
