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
    test's input series, and its rule files as copies in ``out_dir`` holding the alerts it checks
    (``with_alerts``) and the step statistics its series feed (``with_step_statistics``). The file is
    edited as text, so every other value stays as written (YAML would read ``0x10`` as the number 16)."""
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
    asserted = {check.value for test in _items(_get(root, "tests"))
                for entry in _items(_get(test, "alert_rule_test")) if (check := _get(entry, "alertname"))}
    folder = out_dir / path.stem
    folder.mkdir(parents=True, exist_ok=True)
    rule_files = []
    for rule in _items(_get(root, "rule_files")):
        rule_files.append(with_alerts(path.parent / rule.value, asserted, folder / Path(rule.value).name))
        replaced = out.replace(f"- {rule.value}\n", f"- {rule_files[-1]}\n", 1)
        if replaced == out:  # promtool would read the untrimmed file, or none, relative to the copy
            raise ValueError(f"rule_files entry {rule.value!r} must be alone on its line")
        out = replaced
    out = with_step_statistics(out, rule_files, folder / STEP_STATISTICS_NAME)
    if len(_items(_get(yaml.compose(out, Loader=FAST_SAFE_LOADER), "tests"))) != len(_items(_get(root, "tests"))):
        raise ValueError(f"{path}: the expanded file does not hold the same tests")
    target = out_dir / path.name
    target.write_text(out, encoding="utf-8")
    return target


def with_alerts(rules: Path, asserted: set[str], target: Path) -> Path:
    """``rules`` written to ``target`` with every recording rule and only the alerts a test file checks
    (``asserted``), and those their expressions read through ``ALERTS``: no alert reads another's
    state otherwise, so the others change no checked result and promtool need not evaluate them at
    every time of every test. A rule file of no alert is taken as it is."""
    document = load_shipped(rules.read_text(encoding="utf-8")) or {}
    alerts = {rule["alert"]: rule for group in document.get("groups") or [] for rule in group.get("rules") or []
              if "alert" in rule}
    if not alerts:
        return rules.resolve()
    kept, todo = set(), [name for name in asserted if name in alerts]
    while todo:
        name = todo.pop()
        if name not in kept:
            kept.add(name)
            todo += [read for read in _READ_ALERT.findall(alerts[name]["expr"]) if read in alerts]
    groups = []
    for group in document["groups"]:
        chosen = [rule for rule in group["rules"] if "alert" not in rule or rule["alert"] in kept]
        if chosen:
            groups.append(group | {"rules": chosen})
    target.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False), encoding="utf-8")
    return target.resolve()


_READ_ALERT = re.compile(r'ALERTS\{[^}]*alertname="([^"]+)"')


def with_step_statistics(text: str, rule_files: list[Path], statistics: Path) -> str:
    """A test file's text that also loads the recorded step statistics the rules read and evaluates
    them first at each evaluation time, as the group's rules are evaluated before they are read.
    ``statistics`` is written with the rules of ``verl-step-statistics.rules.yml`` whose series the
    test file gives (``recorded_from``): a recording rule of no input series records nothing, so
    the others change no result, and promtool need not evaluate them at every time of every test.
    promtool orders only the groups that ``group_eval_order`` lists, so it lists every group: the
    statistics, then the others in file order."""
    if any(path.name == STEP_STATISTICS_NAME for path in rule_files) \
            or not any(path.name.startswith("verl-") for path in rule_files):
        return text
    head, marker, rest = text.partition("\nrule_files:\n")
    if not marker or "group_eval_order" in text:
        raise ValueError("a test file with rule_files and without group_eval_order is expected")
    shipped = load_shipped(STEP_STATISTICS_FILE.read_text(encoding="utf-8"))
    (group,) = shipped["groups"]
    given = given_statistics(text)
    group["rules"] = [rule for rule in group["rules"] if recorded_from(rule["expr"], given)]
    statistics.write_text(yaml.safe_dump(shipped, sort_keys=False), encoding="utf-8")
    groups = [group["name"]] + [other["name"] for path in rule_files
                                for other in load_shipped(path.read_text(encoding="utf-8"))["groups"]]
    indent = rest[:len(rest) - len(rest.lstrip(" "))]  # of the list's items
    return f"{head}{marker}{indent}- {statistics.resolve()}\n{rest}\ngroup_eval_order: {json.dumps(groups)}\n"


_STATISTIC = re.compile(r'verl_training_([a-z_]+)\{([^}]*)\}')
_METRIC_LABEL = re.compile(r'metric=\\?"([^"\\]+)')
_RECORDED_INPUT = re.compile(r'verl_training_([a-z_]+)\{metric(=~?)"([^"]+)"\}')


def given_statistics(text: str) -> set[tuple[str, str]]:
    """(statistic, metric) of every ``verl_training_<statistic>{metric=...}`` series a test file names."""
    return {(stat, metric.group(1)) for stat, labels in _STATISTIC.findall(text)
            for metric in _METRIC_LABEL.finditer(labels)}


def recorded_from(expr: str, given: set[tuple[str, str]]) -> bool:
    """Whether a step statistic's recording rule reads any of ``given``."""
    match = _RECORDED_INPUT.search(expr)
    if match is None:
        raise ValueError(f"not a recorded step statistic: {expr}")
    stat, op, metric = match.groups()
    if op == "=":
        return (stat, metric) in given
    return any(stat == name and re.fullmatch(metric, other) for name, other in given)


def _get(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((value for name, value in node.value if name.value == key), None)


def _items(node: yaml.Node | None) -> list:
    return node.value if isinstance(node, yaml.SequenceNode) else []
