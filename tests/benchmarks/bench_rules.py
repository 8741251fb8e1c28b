"""Scale of the rules: a real Prometheus with the shipped rule files, scraping N simulated runs.

One exporter follows a glob of N JSONL run files (scenarios in turn, so some alerts fire), with 8
fake GPUs. Prometheus scrapes it and evaluates every shipped rule group, each at the benchmark's
interval (a group's own ``interval`` is taken out, so that every evaluation counts every group).
Reported per N: the summed and the slowest rule-group evaluation time
(``prometheus_rule_group_last_duration_seconds``, median over several evaluations); the same per
minute with each group at its shipped interval; Prometheus's CPU time per evaluation interval
against a Prometheus without rules; the scrape duration, the series each run adds, the series the
recording rules create, the costliest rules and the alerts most often pending or firing (each one's
annotations are expanded at every evaluation). The shipped rule files are the YAML files with a
``groups:`` list under ``alerts/`` and ``prometheus/``.
"""

from __future__ import annotations

import json
import subprocess
import time
from itertools import takewhile
from pathlib import Path

import yaml

from common import REPO, BenchmarkError, Result, Row, metrics_text, sample_values, scrape, summary, wait_for

NAME = "rules"
# Where a commit keeps its rule files: the package data now, alerts/ and prometheus/ before.
RULE_FOLDERS = ("alerts/rules", "alerts", "prometheus")


def _is_rule_file(text: str) -> bool:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and isinstance(data.get("groups"), list) and data.get("kind") is None


def shipped_rule_files() -> list[Path]:
    """The alert and recording rules the package ships."""
    from verl_exporter import shipped

    return shipped.rule_files()


def reference_rule_files(revision: str, folder: Path) -> list[Path]:
    """The rule files as they were at git ``revision``, written under ``folder`` (flat, by file name)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout

    try:
        names = git("ls-tree", "-r", "--name-only", revision, "--", *RULE_FOLDERS).split()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BenchmarkError(f"cannot read the rule files of {revision!r} from git: {exc}") from None
    folder.mkdir(parents=True, exist_ok=True)
    found = []
    for name in names:
        if not name.endswith((".yml", ".yaml")) or "test" in Path(name).stem:
            continue
        text = git("show", f"{revision}:{name}")
        if _is_rule_file(text):
            path = folder / Path(name).name
            path.write_text(text)
            found.append(path)
    return found


def write_runs(folder: Path, runs: int, steps: int) -> None:
    """``runs`` JSONL files in 10 projects, ``steps`` steps each, scenarios in turn."""
    from verl_exporter import simulate

    scenarios = list(simulate.SCENARIOS)
    for index in range(runs):
        path = folder / f"project-{index % 10}" / f"run-{index:04d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        scenario = scenarios[index % len(scenarios)]
        items = simulate.generate_steps(scenario, seed=index, stall_after=steps)
        lines = [simulate.format_jsonl(step, values)
                 for step, values in takewhile(lambda item: item[0] <= steps, items)]
        path.write_text("".join(line + "\n" for line in lines))


def _prometheus_metric(url: str, name: str) -> dict[str, float]:
    """``{rule_group: value}`` of one Prometheus self-metric, read from its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body, _ = scrape(url + "/metrics")
    if status != 200:
        raise BenchmarkError(f"prometheus /metrics answered {status}")
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name:
                found[sample.labels.get("rule_group", "")] = sample.value
    return found


def _prometheus_cpu_seconds(prometheus) -> float:
    return _prometheus_metric(prometheus.url, "process_cpu_seconds_total").get("", float("nan"))


def _query_scalar(prometheus, expr: str) -> float:
    """An instant query's first value (0 if empty); queries over every series of 1000 runs take seconds
    while Prometheus evaluates the rules, hence the long timeout."""
    import urllib.parse

    from servers import http_get

    status, body = http_get(prometheus.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=120)
    if status != 200:
        raise BenchmarkError(f"query {expr!r} answered {status}: {body[:300]}")
    result = json.loads(body)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def measure(work: Path, runs: int, rule_sets: dict[str, list[Path]], *, steps: int, interval: float,
            evaluations: int) -> dict[str, dict]:
    """Figures per rule set, each evaluated by its own Prometheus against the same exporter of ``runs`` runs."""
    from servers import start_exporter

    folder = work / f"runs-{runs}"
    write_runs(folder, runs, steps)
    with start_exporter(work, "--source", str(folder / "*" / "*.jsonl"), "--gpu.fake", "healthy:8",
                        "--store.max-runs", str(max(runs, 1000))) as exporter:
        wait_for(lambda: [value for _, value in sample_values(metrics_text(exporter.url), "verl_training_runs")]
                 == [runs],
                 timeout=120, interval=0.5, what=f"{runs} runs in the exporter")
        return {name: _measure_rules(work, exporter, runs, name, files, interval=interval, evaluations=evaluations)
                for name, files in rule_sets.items()}


def _active_alerts_by_name(prometheus, count: int = 8) -> list[dict]:
    """The alerts with the most pending or firing instances: each costs template work at every evaluation."""
    import urllib.parse

    from servers import http_get

    query = "count by (alertname, alertstate) (ALERTS)"
    status, body = http_get(prometheus.url + "/api/v1/query?" + urllib.parse.urlencode({"query": query}), timeout=120)
    if status != 200:
        return []
    rows = [{"alert": item["metric"]["alertname"], "state": item["metric"]["alertstate"],
             "count": int(float(item["value"][1]))} for item in json.loads(body)["data"]["result"]]
    return sorted(rows, key=lambda row: -row["count"])[:count]


def _costliest_rules(prometheus, count: int = 5) -> list[dict]:
    status, body, _ = scrape(prometheus.url + "/api/v1/rules")
    if status != 200:
        return []
    rules = [{"group": group["name"], "rule": rule["name"], "seconds": rule.get("evaluationTime", 0.0)}
             for group in json.loads(body)["data"]["groups"] for rule in group["rules"]]
    return sorted(rules, key=lambda rule: -rule["seconds"])[:count]


def _duration_seconds(text: str) -> float:
    from verl_exporter.config.durations import parse_duration

    return parse_duration(text)


def shipped_evaluation_interval() -> float:
    """The global evaluation interval of prometheus/prometheus.yml."""
    config = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    return _duration_seconds(config["global"]["evaluation_interval"])


def without_group_intervals(rule_files: list[Path], folder: Path) -> tuple[list[Path], dict[str, float]]:
    """Copies of ``rule_files`` whose groups all evaluate at the global interval, and the intervals
    (seconds) the groups set: every group is measured at every evaluation of the benchmark."""
    folder.mkdir(parents=True, exist_ok=True)
    copies, intervals = [], {}
    for path in rule_files:
        data = yaml.safe_load(path.read_text())
        for group in data["groups"]:
            if "interval" in group:
                intervals[group["name"]] = _duration_seconds(group.pop("interval"))
        copy = folder / path.name
        copy.write_text(yaml.safe_dump(data, sort_keys=False))
        copies.append(copy)
    return copies, intervals


def _measure_rules(work: Path, exporter, runs: int, name: str, rule_files: list[Path], *, interval: float,
                   evaluations: int) -> dict:
    from servers import start_prometheus

    rule_files, group_intervals = without_group_intervals(rule_files, work / f"rules-{runs}-{name}")

    config = {
        "global": {"scrape_interval": f"{interval:g}s", "evaluation_interval": f"{interval:g}s",
                   "scrape_timeout": f"{interval:g}s"},
        "rule_files": [path.name for path in rule_files],
        "scrape_configs": [{"job_name": "verl", "static_configs": [{"targets": [exporter.url[7:]]}]}],
    }
    with start_prometheus(work, json.dumps(config), rule_files=rule_files) as prometheus:
        wait_for(lambda: _query_scalar(prometheus, 'count(verl_training_last_step)') == runs,
                 timeout=60 + 5 * interval, interval=0.5, what="Prometheus to scrape every run")
        groups = set(_prometheus_metric(prometheus.url, "prometheus_rule_group_iterations_total"))
        durations: dict[str, list[float]] = {group: [] for group in groups}
        seen_iterations: dict[str, float] = {}
        started, cpu_start = time.monotonic(), _prometheus_cpu_seconds(prometheus)
        deadline = started + (evaluations + 3) * interval + 30
        while any(len(values) < evaluations for values in durations.values()) \
                or time.monotonic() - started < evaluations * interval:
            if time.monotonic() > deadline:
                raise BenchmarkError(f"rule groups did not evaluate {evaluations} times in time")
            iterations = _prometheus_metric(prometheus.url, "prometheus_rule_group_iterations_total")
            last = _prometheus_metric(prometheus.url, "prometheus_rule_group_last_duration_seconds")
            for group in durations:
                if iterations.get(group, 0) > seen_iterations.get(group, 0):
                    seen_iterations[group] = iterations[group]
                    durations[group].append(last.get(group, float("nan")))
            time.sleep(interval / 2)
        cpu_per_interval = (_prometheus_cpu_seconds(prometheus) - cpu_start) / (time.monotonic() - started) * interval
        figures = {
            # All of Prometheus's CPU time (scrapes, rules, this script's reads) per evaluation interval:
            # unlike the groups' wall-clock durations, it does not grow when groups wait for a CPU.
            "prometheus_cpu_seconds_per_interval": cpu_per_interval,
            "runs": runs,
            "run_series": _query_scalar(prometheus, 'count({__name__=~"verl_[^:]+", experiment!=""})'),
            "all_series_scraped": _query_scalar(prometheus, 'scrape_samples_scraped{job="verl"}'),
            "recorded_series": _query_scalar(prometheus, 'count({__name__=~".+:.+"})'),
            "alerts": _query_scalar(prometheus, 'count(ALERTS{alertstate="firing"})'),
            # Pending and firing: Prometheus expands each one's annotations at every evaluation.
            "active_alerts": _query_scalar(prometheus, "count(ALERTS)"),
            "scrape_seconds": _query_scalar(prometheus, 'scrape_duration_seconds{job="verl"}'),
            "groups": {group: summary(values) for group, values in sorted(durations.items())},
            "costliest_rules": _costliest_rules(prometheus),
            "most_active_alerts": _active_alerts_by_name(prometheus),
        }
    medians = [stats["median"] for stats in figures["groups"].values()]
    figures["rule_eval_seconds_total"] = sum(medians)
    # Rule time per minute with each group at its own interval (else the shipped global one).
    global_interval = shipped_evaluation_interval()
    figures["group_intervals"] = group_intervals
    figures["rule_eval_seconds_per_minute"] = sum(
        stats["median"] * 60 / group_intervals.get(group.rpartition(";")[2], global_interval)
        for group, stats in figures["groups"].items())
    figures["rule_eval_seconds_slowest_group"] = max(medians, default=0.0)
    figures["series_per_run"] = figures["run_series"] / runs
    return figures


def rule_cpu(with_rules: dict, without: dict) -> float:
    """Prometheus CPU seconds per evaluation interval that the rules add."""
    return with_rules["prometheus_cpu_seconds_per_interval"] - without["prometheus_cpu_seconds_per_interval"]


def run(work: Path, *, runs: list[int], steps: int, interval: float, evaluations: int,
        reference: str | None = None) -> Result:
    # No rules at all: what Prometheus spends on the scrapes alone, so that the CPU the rules take shows.
    rule_sets = {"shipped": shipped_rule_files(), "none": []}
    notes = [f"rule files: {', '.join(str(p.relative_to(REPO)) for p in rule_sets['shipped']) or 'none found'}"]
    if reference:
        try:
            rule_sets["reference"] = reference_rule_files(reference, work / "reference-rules")
        except BenchmarkError as exc:  # a checkout without that commit (a shallow clone, a tarball)
            notes.append(f"no reference: {exc}")
            reference = None
    if reference:
        notes.append(f"reference: the rule files of {reference} ({len(rule_sets['reference'])} files), "
                     "measured after the shipped ones against the same exporter")
    figures = {"rule_files": [str(p.relative_to(REPO)) for p in rule_sets["shipped"]], "reference": reference,
               "by_runs": {}, "reference_by_runs": {}, "no_rules_by_runs": {}}
    rows = []
    for count in runs:
        results = measure(work, count, rule_sets, steps=steps, interval=interval, evaluations=evaluations)
        result = results["shipped"]
        figures["by_runs"][str(count)] = result
        notes.append(f"{count} runs, costliest rules: " + ", ".join(
            f"{rule['rule']} {rule['seconds'] * 1000:.0f} ms" for rule in result["costliest_rules"]))
        notes.append(f"{count} runs, most pending or firing: " + ", ".join(
            f"{row['alert']} {row['state']} {row['count']}" for row in result["most_active_alerts"]))
        rows += [
            Row(f"{count} runs: rule evaluation, all groups", result["rule_eval_seconds_total"] * 1000, "ms",
                "< 1000 ms at 1000 runs" if count == 1000 else ""),
            Row(f"{count} runs: rule evaluation per minute, shipped intervals",
                result["rule_eval_seconds_per_minute"] * 1000, "ms"),
            Row(f"{count} runs: slowest group", result["rule_eval_seconds_slowest_group"] * 1000, "ms"),
            Row(f"{count} runs: series per run", result["series_per_run"], "series"),
            Row(f"{count} runs: recorded series", result["recorded_series"], "series"),
            Row(f"{count} runs: firing alerts", result["alerts"], "alerts"),
            Row(f"{count} runs: pending and firing alerts", result["active_alerts"], "alerts"),
            Row(f"{count} runs: scrape duration", result["scrape_seconds"] * 1000, "ms"),
            Row(f"{count} runs: Prometheus CPU per evaluation interval, rules",
                rule_cpu(result, results["none"]) * 1000,
                "ms", "CPU with the rules minus CPU without any"),
        ]
        figures["no_rules_by_runs"][str(count)] = results["none"]
        if "reference" in results:
            before = results["reference"]
            figures["reference_by_runs"][str(count)] = before
            rows += [
                Row(f"{count} runs: reference rules, all groups", before["rule_eval_seconds_total"] * 1000, "ms"),
                Row(f"{count} runs: reference rules, per minute", before["rule_eval_seconds_per_minute"] * 1000, "ms"),
                Row(f"{count} runs: reference rules, recorded series", before["recorded_series"], "series"),
                Row(f"{count} runs: reference rules, firing alerts", before["alerts"], "alerts"),
                Row(f"{count} runs: reference rules, pending and firing", before["active_alerts"], "alerts"),
                Row(f"{count} runs: reference rules, Prometheus CPU per interval, rules",
                    rule_cpu(before, results["none"]) * 1000, "ms"),
                Row(f"{count} runs: shipped / reference", result["rule_eval_seconds_total"]
                    / before["rule_eval_seconds_total"] if before["rule_eval_seconds_total"] else float("nan"), "x"),
            ]
    if len(runs) >= 2:
        first, last = str(runs[0]), str(runs[-1])
        by = figures["by_runs"]
        growth = by[last]["rule_eval_seconds_total"] / by[first]["rule_eval_seconds_total"] \
            if by[first]["rule_eval_seconds_total"] else float("nan")
        figures["rule_eval_growth"] = growth
        rows.append(Row(f"rule evaluation {last} runs / {first} runs", growth, "x",
                        f"runs grew {int(last) / int(first):g}x"))
    params = {"runs": runs, "steps_per_run": steps, "interval_s": interval, "evaluations": evaluations, "gpus": 8,
              "reference": reference}
    return Result(NAME, params, figures, rows, notes)
