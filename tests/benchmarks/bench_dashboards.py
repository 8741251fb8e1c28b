"""The shipped dashboards and rule groups at datacenter size, in Prometheus and in VictoriaMetrics.

``python tests/benchmarks/bench_dashboards.py [--nodes 1000] [--runs 200] [--hours 3]``

The fleet is cloned from one real exporter: ``python -m verl_exporter --simulate healthy --gpu.fake
healthy:8`` runs until its simulated run has passed a validation step, and its own ``/metrics`` is
the template. Every node of the fleet serves the template's node series (GPUs, host, the exporter
itself) with its own ``instance`` and GPU uuids; the nodes are split evenly between the runs, and the
first node of each run (its head) also serves the run's training series, every worker its
``verl_node_run_info``. Values move as a fleet's do: gauges wander within a few percent, counters
grow, timestamps follow the clock, steps advance one a minute; a few GPUs count ECC and XID
errors; a few runs have a firing alert (``ALERTS``).

Prometheus (Debian's, with promtool): the fleet is written as OpenMetrics, one file per two-hour
block, and backfilled with ``promtool tsdb create-blocks-from openmetrics``; the shipped recording
rules are backfilled over the window with ``promtool tsdb create-blocks-from rules`` against that
Prometheus, level by level (a rule that reads another rule's series waits for that rule's blocks).
VictoriaMetrics (Debian's): the same samples through ``/api/v1/import/prometheus``, and the recorded
series copied from Prometheus through ``/api/v1/import``.

Then, against each, as Grafana asks at the end of the window: every variable query
(``/api/v1/label/<label>/values``), every panel query and annotation of the three dashboards (range
queries over the window at a 60 s step, ``$__rate_interval`` 4m; instant queries where the panel asks
for one), with the fleet and GPU dashboards' variables at All where they offer it and otherwise at
their first value, the run dashboard on one run; and every expression of every shipped rule group
as an instant query, the group's time being their sum (a group evaluates its rules one after the
other). The reference of the same run is a trivial range query over the same series
(``count(verl_gpu_up)``). Each query runs ``--repeat`` times; its median counts.

The TSDBs are cached under ``--cache`` (raw samples by fleet size; the recorded series, the
compacted Prometheus data and the VictoriaMetrics data by the recording rules' digest), so a second
run with the same rules only queries. ``--baseline OLD.json`` prints every query's time next to an
earlier result's.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import io
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402

from common import (  # noqa: E402
    REPO,
    BenchmarkError,
    Result,
    Row,
    environment,
    metrics_text,
    percentile,
    print_table,
    rss_bytes,
    wait_for,
    write_json,
)
from servers import Server, free_port, require_binary, start_exporter  # noqa: E402

NAME = "dashboards"
FULL = {"nodes": 1000, "runs": 200, "hours": 3.0, "step": 60, "repeat": 3, "scrape_interval": 15}
QUICK = {"nodes": 20, "runs": 4, "hours": 1.0, "step": 60, "repeat": 1, "scrape_interval": 1}
# Bump when the fleet's make-up changes, so cached TSDBs are rebuilt.
FLEET_VERSION = "1"
BLOCK = 7200  # Prometheus' two-hour blocks: one OpenMetrics file each
TARGETS = {"p95_query_seconds": 1.0, "max_query_seconds": 3.0, "max_group_seconds": 1.0}
REFERENCE = "count(verl_gpu_up)"
# A few GPUs with errors, a few runs with a firing alert: the panels that show "which have any" have rows.
ECC_EVERY, XID_EVERY, ALERT_EVERY = 97, 131, 10



# -- the fleet -------------------------------------------------------------------------------------


def capture_template(work: Path) -> str:
    """One exporter's own /metrics: a simulated healthy PPO run past a validation step, 8 fake GPUs, host."""
    with start_exporter(work, "--simulate", "healthy", "--simulate.interval", "0.2",
                        "--simulate.dir", str(work / "template-run"), "--gpu.fake", "healthy:8") as exporter:
        wait_for(lambda: "verl_val_core{" in metrics_text(exporter.url), timeout=120,
                 what="a validation step of the simulated run")
        return metrics_text(exporter.url)


def parse_template(text: str) -> list[tuple[str, dict, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text) for sample in family.samples]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series(name: str, labels: dict) -> str:
    inner = ",".join(f'{key}="{_escape(str(value))}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class Fleet:
    """The fleet's series and their values at each timestamp, from the template's samples."""

    def __init__(self, template: list[tuple[str, dict, float]], nodes: int, runs: int, start: int, end: int,
                 step: int, captured_at: float):
        if nodes < runs or runs < 1:
            raise BenchmarkError(f"need at least one node per run (nodes {nodes}, runs {runs})")
        self.nodes, self.runs, self.start, self.end, self.step = nodes, runs, start, end, step
        self.captured_at = captured_at
        self.node_samples = [(n, lab, v) for n, lab, v in template if "project" not in lab]
        self.run_samples = [(n, lab, v) for n, lab, v in template if "project" in lab]
        self.node_run_info = [(n, lab, v) for n, lab, v in self.run_samples if n == "verl_node_run_info"]

    def times(self) -> list[int]:
        return list(range(self.start, self.end + 1, self.step))

    def run_of(self, node: int) -> int:
        return node * self.runs // self.nodes

    def is_head(self, node: int) -> bool:
        return node == 0 or self.run_of(node - 1) != self.run_of(node)

    @staticmethod
    def instance(node: int) -> str:
        return f"gpu-node-{node:04d}:9945"

    @staticmethod
    def run_labels(run: int) -> dict:
        return {"project": f"team-{run % 20:02d}", "experiment": f"exp-{run:04d}"}

    def series_of_node(self, node: int):
        """(name, labels, value, kind) of every series the node's exporter serves."""
        base = {"job": "verl", "instance": self.instance(node)}
        run = self.run_labels(self.run_of(node))
        for name, labels, value in self.node_samples:
            labels = {**labels, **base}
            if "uuid" in labels:
                labels["uuid"] = f"GPU-{node:08x}" + labels["uuid"][12:]
            yield name, labels, value, self._kind(name, value)
        extra = self.run_samples if self.is_head(node) else self.node_run_info
        for name, labels, value in extra:
            labels = {**labels, **base, **run}
            if "source" in labels:
                labels["source"] = f"/logs/{run['project']}/{run['experiment']}.log"
            yield name, labels, value, self._kind(name, value)
        gpu = str(node % 8)
        uuid = f"GPU-{node:08x}-0000-0000-0000-000000000000"
        if node % ECC_EVERY == 3:
            yield ("verl_gpu_ecc_errors_total", {**base, "gpu": gpu, "uuid": uuid, "type": "corrected_new"}, 0.0,
                   "errors")
        if node % XID_EVERY == 5:
            yield "verl_gpu_xid_errors_total", {**base, "gpu": gpu, "uuid": uuid, "xid": "13"}, 1.0, "errors"
        if self.is_head(node) and self.run_of(node) % ALERT_EVERY == 1:
            yield ("ALERTS", {**run, "job": "verl", "instance": self.instance(node), "alertname":
                              "VerlLearningRateTooHigh", "alertstate": "firing", "severity": "warning"}, 1.0, "const")

    @staticmethod
    def _kind(name: str, value: float) -> str:
        if name.endswith("_timestamp_seconds"):
            return "clock"
        if name in ("verl_training_last_step", "verl_training_global_step"):
            return "steps"
        if name.endswith("_total") or name.endswith("_count") or name.endswith("_sum"):
            return "counter" if value else "const"
        if value in (0.0, 1.0) or name.endswith("_info") or math.isnan(value) or math.isinf(value):
            return "const"
        return "gauge"

    def values(self, kind: str, value: float, seed: int, times: list[int]) -> list[str]:
        """The series' values at ``times``."""
        if kind == "const":
            text = _number(value)
            return [text] * len(times)
        first = (self.start - self.end) / self.step  # steps before the end (the template's moment)
        out = []
        for t in times:
            index = (t - self.end) / self.step  # <= 0
            if kind == "clock":
                out.append(_number(round(value - self.captured_at + t, 3)))
            elif kind == "steps":
                out.append(_number(max(1.0, value + 20 + index - first)))
            elif kind == "counter":
                out.append(_number(value + (index - first) * max(1.0, abs(value) / 1000)))
            elif kind == "errors":
                out.append(_number(value + (index - first) // 10))
            else:
                wobble = ((seed + int(index)) * 2654435761 % 1000) / 1000  # 0..1, per series and step
                out.append(_number(value * (0.96 + 0.04 * wobble)))
        return out

    def write(self, out, times: list[int], *, milliseconds: bool) -> int:
        """Every series' samples at ``times``, one line each ("series value timestamp"); the line count."""
        stamps = [str(t * 1000) if milliseconds else str(t) for t in times]
        lines = 0
        seed = 0
        for node in range(self.nodes):
            chunk = []
            for name, labels, value, kind in self.series_of_node(node):
                seed += 1
                head = _series(name, labels) + " "
                chunk.extend(f"{head}{v} {s}\n" for v, s in zip(self.values(kind, value, seed, times), stamps))
            out.write("".join(chunk))
            lines += len(chunk)
        return lines

    def series_count(self) -> int:
        return sum(1 for node in range(self.nodes) for _ in self.series_of_node(node))


# -- processes -------------------------------------------------------------------------------------


def start_prometheus_on(data: Path, work: Path) -> Server:
    """Prometheus serving the TSDB at ``data``: no scrapes, no rules, two-hour blocks only (no compaction
    into larger ones while measured), a query timeout above anything measured."""
    port = free_port()
    config = work / f"prometheus-{port}.yml"
    config.write_text("global: {scrape_interval: 1h, evaluation_interval: 1h}\n")
    cmd = [require_binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
           f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y",
           "--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h",
           "--query.timeout=5m", "--query.max-samples=500000000"]
    return Server("prometheus", cmd, port, work / f"prometheus-{port}.log", "/-/ready", cwd=work)


def start_vm_on(data: Path, work: Path) -> Server:
    from victoriametrics import start_victoria_metrics

    return start_victoria_metrics(work, f"-storageDataPath={data}", "-retentionPeriod=100y",
                                  "-search.maxUniqueTimeseries=2000000", "-search.maxQueryDuration=5m")


def post(url: str, path: str, params: dict | list, body: bytes | None = None, timeout: float = 600,
         method: str = "POST") -> tuple[int, bytes, float]:
    """POST ``params`` as a form (or ``body`` with ``params`` in the URL; or GET them); (status, body, seconds)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    encoded = urllib.parse.urlencode(params, doseq=True)
    started = time.perf_counter()
    try:
        if method == "GET":
            connection.request("GET", f"{path}?{encoded}")
        elif body is None:
            connection.request("POST", path, body=encoded,
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
        else:
            connection.request("POST", f"{path}?{encoded}", body=body)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    return response.status, data, time.perf_counter() - started


def api(url: str, path: str, params: dict | list, method: str = "POST") -> tuple[object, float]:
    status, body, seconds = post(url, path, params, method=method)
    try:
        data = json.loads(body)
    except ValueError:
        data = {"status": "error", "error": body[:300].decode("utf-8", "replace")}
    if status != 200 or data.get("status") != "success":
        raise BenchmarkError(f"{path} {str(params)[:300]} answered {status}: {str(data.get('error', body[:300]))}")
    return data["data"], seconds


def _metric(url: str, name: str) -> float:
    text = metrics_text(url)
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"))


# -- building the TSDBs ----------------------------------------------------------------------------


# Where the dashboards and rule files measured are: the shipped ones unless --dashboards/--rules say.
SOURCES: dict[str, Path] = {}


def rule_files() -> list[Path]:
    from verl_exporter import shipped

    if "rules" in SOURCES:
        return sorted(SOURCES["rules"].glob("*.yml"))
    return list(shipped.rule_files())


def recording_rules() -> list[dict]:
    return [rule for path in rule_files() for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "record" in rule]


def rules_digest() -> str:
    return hashlib.sha256(json.dumps(recording_rules(), sort_keys=True).encode()).hexdigest()[:12]


def recording_levels() -> list[list[dict]]:
    """The recording rules in levels: each level reads only raw series and the levels before it."""
    rules = recording_rules()
    names = {rule["record"] for rule in rules}
    levels: list[list[dict]] = []
    done: set[str] = set()
    pending = list(rules)
    while pending:
        ready = [rule for rule in pending
                 if not any(re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", rule["expr"])
                            for name in names - done if name != rule["record"])]
        if not ready:
            raise BenchmarkError("recording rules read each other in a cycle")
        levels.append(ready)
        done |= {rule["record"] for rule in ready}
        pending = [rule for rule in pending if rule not in ready]
    return levels


def build_raw(cache: Path, work: Path, fleet: Fleet) -> Path:
    """Blocks of the fleet's raw samples (promtool, from OpenMetrics), cached by fleet size."""
    blocks = cache / "raw-blocks"
    if (blocks / "done").exists():
        return blocks
    shutil.rmtree(blocks, ignore_errors=True)
    blocks.mkdir(parents=True)
    times = fleet.times()
    for block_start in range(fleet.start // BLOCK * BLOCK, fleet.end + 1, BLOCK):
        part = [t for t in times if block_start <= t < block_start + BLOCK]
        if not part:
            continue
        path = work / f"fleet-{block_start}.om"
        started = time.perf_counter()
        with path.open("w", buffering=1 << 22) as out:
            lines = fleet.write(out, part, milliseconds=False)
            out.write("# EOF\n")
        written = time.perf_counter() - started
        print(f"    {lines:,} samples ({path.stat().st_size / 1e9:.1f} GB) written in {written:.0f}s; "
              "promtool ...", flush=True)
        started = time.perf_counter()
        done = subprocess.run([require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                               str(path), str(blocks)], capture_output=True, text=True)
        path.unlink()
        if done.returncode != 0:
            raise BenchmarkError(f"promtool create-blocks-from openmetrics failed: {done.stderr[-2000:]}")
        print(f"    backfilled in {time.perf_counter() - started:.0f}s", flush=True)
    (blocks / "done").write_text("")
    return blocks


def build_prometheus(cache: Path, work: Path, fleet: Fleet, raw: Path, *, merge: bool = True) -> tuple[Path, dict]:
    """Raw blocks plus the recording rules backfilled over the window, compacted (``merge``: Prometheus
    starts merging a minute after its start; a smoke run does without); cached by the rules."""
    data = cache / f"prometheus-{rules_digest()}{'' if merge else '-unmerged'}"
    meta = data / "bench-meta.json"
    if meta.exists():
        return data, json.loads(meta.read_text())
    shutil.rmtree(data, ignore_errors=True)  # an interrupted build
    shutil.copytree(raw, data, ignore=shutil.ignore_patterns("done"))
    levels = recording_levels()
    timings = {}
    for index, level in enumerate(levels):
        rule_file = work / f"level-{index}.yml"
        rule_file.write_text(yaml.safe_dump({"groups": [{"name": f"level-{index}", "rules": level}]},
                                            sort_keys=False))
        output = work / f"rule-blocks-{index}"
        shutil.rmtree(output, ignore_errors=True)
        with start_prometheus_on(data, work) as prometheus:
            started = time.perf_counter()
            done = subprocess.run([require_binary("promtool"), "tsdb", "create-blocks-from", "rules",
                                   f"--url={prometheus.url}", f"--start={fleet.start}", f"--end={fleet.end + 1}",
                                   f"--eval-interval={fleet.step}s", f"--output-dir={output}", str(rule_file)],
                                  capture_output=True, text=True)
            took = time.perf_counter() - started
        if done.returncode != 0 or re.search(r"level=(error|warn)", done.stderr):
            raise BenchmarkError(f"promtool create-blocks-from rules failed: {(done.stderr + done.stdout)[-2000:]}")
        timings[f"level {index} ({len(level)} rules)"] = took
        print(f"    recording rules, level {index}: {len(level)} rules backfilled in {took:.0f}s", flush=True)
        for block in output.iterdir():
            if block.is_dir():
                shutil.move(str(block), str(data / block.name))
    if merge:
        with start_prometheus_on(data, work) as prometheus:  # merges the overlapping blocks once, here
            wait_for(lambda: _compacted(prometheus), timeout=1800, interval=5,
                     what="Prometheus to merge the recorded series' blocks into the raw ones")
    info = {"rule_levels": len(levels), "rule_backfill_seconds": timings, "merged": merge}
    meta.write_text(json.dumps(info))
    return data, info


def _compacted(prometheus: Server) -> bool:
    """True once Prometheus has merged the overlapping blocks (it starts a minute after its own start)."""
    data = Path(next(arg.split("=", 1)[1] for arg in prometheus.process.args if arg.startswith("--storage.tsdb.path")))
    return _overlaps(data) == 0


def _overlaps(data: Path) -> int:
    """How many blocks share a time range with another (from the data folder's meta.json files)."""
    ranges = sorted((meta["minTime"], meta["maxTime"]) for meta in
                    (json.loads(path.read_text()) for path in data.glob("*/meta.json")))
    return sum(1 for a, b in zip(ranges, ranges[1:]) if b[0] < a[1])


def build_victoria_metrics(cache: Path, work: Path, fleet: Fleet, prometheus_data: Path) -> Path:
    """The same raw samples (import API), and the recorded series copied from Prometheus; cached by the rules."""
    data = cache / f"victoria-metrics-{rules_digest()}"
    if (data / "bench-done").exists():
        return data
    shutil.rmtree(data, ignore_errors=True)  # an interrupted import
    data.mkdir(parents=True)
    with start_vm_on(data, work) as vm:
        times = fleet.times()
        started = time.perf_counter()
        for first in range(0, len(times), 30):  # about 30 x 350k lines per request
            part = times[first:first + 30]

            buffer = io.StringIO()
            fleet.write(buffer, part, milliseconds=True)
            status, body, _ = post(vm.url, "/api/v1/import/prometheus", {}, buffer.getvalue().encode())
            if status not in (200, 204):
                raise BenchmarkError(f"VictoriaMetrics import answered {status}: {body[:300]!r}")
        print(f"    raw samples imported in {time.perf_counter() - started:.0f}s", flush=True)
        with start_prometheus_on(prometheus_data, work) as prometheus:
            for level in recording_levels():
                for name in sorted({rule["record"] for rule in level}):
                    result, _ = api(prometheus.url, "/api/v1/query",
                                    {"query": f'{{__name__="{name}"}}[{fleet.end - fleet.start + fleet.step}s]',
                                     "time": fleet.end})
                    lines = []
                    for series in result["result"]:
                        kept = [(int(float(t) * 1000), float(v)) for t, v in series["values"] if v != "NaN"]
                        lines.append(json.dumps({"metric": series["metric"], "values": [v for _, v in kept],
                                                 "timestamps": [t for t, _ in kept]}) + "\n")
                    lines = "".join(lines)
                    status, body, _ = post(vm.url, "/api/v1/import", {}, lines.encode())
                    if status not in (200, 204):
                        raise BenchmarkError(f"VictoriaMetrics import of {name} answered {status}: {body[:300]!r}")
        vm.get("/internal/force_flush")
    (data / "bench-done").write_text("")
    return data


# -- what Grafana asks -----------------------------------------------------------------------------


def dashboards() -> dict[str, dict]:
    from verl_exporter import shipped

    folder = SOURCES.get("dashboards") or shipped.dashboards_dir()
    return {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def builtins(fleet: Fleet) -> dict[str, str]:
    window = fleet.end - fleet.start
    return {"__rate_interval": f"{4 * fleet.step // 60}m", "__interval": f"{fleet.step}s",
            "__range": f"{window}s", "__range_s": str(window)}


class Backend:
    """One TSDB's HTTP API, timed."""

    def __init__(self, name: str, url: str, fleet: Fleet, repeat: int):
        self.name, self.url, self.fleet, self.repeat = name, url, fleet, repeat

    def timed(self, path: str, params: dict, method: str = "POST") -> tuple[float, object]:
        times, result = [], None
        for _ in range(self.repeat):
            result, seconds = api(self.url, path, params, method)
            times.append(seconds)
        return sorted(times)[len(times) // 2], result

    def range_query(self, expr: str) -> tuple[float, object]:
        f = self.fleet
        return self.timed("/api/v1/query_range", {"query": expr, "start": f.start, "end": f.end, "step": f.step})

    def instant_query(self, expr: str) -> tuple[float, object]:
        return self.timed("/api/v1/query", {"query": expr, "time": self.fleet.end})

    def label_values(self, selector: str, label: str) -> tuple[float, list]:
        f = self.fleet
        seconds, values = self.timed(f"/api/v1/label/{label}/values",
                                     {"match[]": selector, "start": f.start, "end": f.end}, "GET")
        return seconds, list(values)


def fill_variables(backend: Backend, dashboard: dict, *, pick_all: bool) -> tuple[dict, list[dict]]:
    """Each variable's value, as Grafana picks it (All where offered and asked for or the default, else the
    first value; a constant or custom variable's current value), and the time of each variable query."""
    from verl_mixin.dashboards.model import (
        label_values_query,
        may_be_empty,
        substitute,
        variable_query,
        variable_value,
        variables,
    )

    values: dict[str, str] = {}
    timings = []
    for variable in variables(dashboard):
        name = variable["name"]
        if variable["type"] == "datasource":
            values[name] = "prometheus"
            continue
        if variable["type"] != "query":
            values[name] = str((variable.get("current") or {}).get("value") or variable.get("query", ""))
            continue
        selector, label = label_values_query(substitute(variable_query(variable), values))
        seconds, found = backend.label_values(selector, label)
        timings.append({"what": f"variable {name}", "expr": f"label_values({selector}, {label})",
                        "kind": "variable", "seconds": seconds, "series": len(found)})
        if not found and not may_be_empty(variable):
            raise BenchmarkError(f"{backend.name}: variable {name} ({selector}) has no values")
        values[name] = variable_value(variable, found, pick_all=pick_all)
    return values, timings


def dashboard_queries(backend: Backend, filename: str, dashboard: dict) -> list[dict]:
    from verl_mixin.dashboards.model import BUILTINS, panels, substitute

    values, timings = fill_variables(backend, dashboard, pick_all=filename != "run-detail.json")
    saved = dict(BUILTINS)
    BUILTINS.update(builtins(backend.fleet))
    try:
        found = [(panel["title"], target) for panel in panels(dashboard) for target in panel.get("targets", [])]
        found += [("annotation " + a["name"], {"expr": a["expr"], "refId": "A"})
                  for a in dashboard.get("annotations", {}).get("list", []) if a.get("expr")]
        for title, target in found:
            expr = substitute(target["expr"], values)
            instant = target.get("instant", False) and not target.get("range", False)
            seconds, result = (backend.instant_query if instant else backend.range_query)(expr)
            timings.append({"what": f"{title} [{target.get('refId', 'A')}]", "expr": expr,
                            "kind": "instant" if instant else "range", "seconds": seconds,
                            "series": len(result["result"])})
    finally:
        BUILTINS.clear()
        BUILTINS.update(saved)
    return timings


def rule_groups(backend: Backend) -> dict[str, dict]:
    groups = {}
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules = []
            for rule in group["rules"]:
                seconds, result = backend.instant_query(rule["expr"])
                rules.append({"rule": rule.get("record") or rule.get("alert"), "seconds": seconds,
                              "series": len(result["result"])})
            groups[group["name"]] = {"file": path.name, "seconds": sum(rule["seconds"] for rule in rules),
                                     "interval": group.get("interval", "15s"), "rules": rules}
    return groups


def stats(values: list[float]) -> dict:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "max": max(values, default=float("nan")),
            "n": len(values)}


def measure(backend: Backend) -> dict:
    reference, _ = backend.range_query(REFERENCE)
    figures = {"reference_seconds": reference, "dashboards": {}, "groups": {}}
    for filename, dashboard in dashboards().items():
        queries = dashboard_queries(backend, filename, dashboard)
        panel_times = [q["seconds"] for q in queries if q["kind"] != "variable"]
        figures["dashboards"][filename] = {"queries": queries, **stats(panel_times),
                                           "variables_seconds": sum(q["seconds"] for q in queries
                                                                    if q["kind"] == "variable")}
        print(f"    {backend.name} {filename}: p50 {figures['dashboards'][filename]['p50']:.3f}s "
              f"p95 {figures['dashboards'][filename]['p95']:.3f}s max {figures['dashboards'][filename]['max']:.3f}s",
              flush=True)
    figures["groups"] = rule_groups(backend)
    every = [q["seconds"] for d in figures["dashboards"].values() for q in d["queries"] if q["kind"] != "variable"]
    figures["all_panels"] = stats(every)
    figures["reference_after"], _ = backend.range_query(REFERENCE)
    return figures


# -- Prometheus scraping the fleet: memory -----------------------------------------------------------

HALVE_SERIES = REPO / "prometheus" / "victoriametrics" / "halve-series.yml"
_FLEET_SERVER = """
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
folder = sys.argv[2]
bodies = {name[:-4]: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = bodies.get(self.path.split("/")[2]) if self.path.startswith("/node/") else None
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def write_node_bodies(fleet: Fleet, folder: Path) -> None:
    """Each node's /metrics at the end of the window, as its exporter serves it (no job, instance or ALERTS)."""
    folder.mkdir(parents=True, exist_ok=True)
    seed = 0
    for node in range(fleet.nodes):
        lines = []
        for name, labels, value, kind in fleet.series_of_node(node):
            seed += 1
            if name == "ALERTS":
                continue
            labels = {key: val for key, val in labels.items() if key not in ("job", "instance")}
            lines.append(f"{_series(name, labels)} {fleet.values(kind, value, seed, [fleet.end])[0]}\n")
        (folder / f"{node:04d}.txt").write_text("".join(lines))


def scraping_memory(work: Path, fleet: Fleet, *, rounds: int, drop: bool, interval: int = 15) -> dict:
    """A Prometheus scraping every node of the fleet every ``interval`` s (a fleet simulator serves each
    node's /metrics) and evaluating the shipped rules as often: its memory after ``rounds`` scrapes of each
    target, its head series and its own rule group durations. ``drop``: with halve-series.yml as
    metric_relabel_configs."""
    from servers import start_prometheus

    bodies = work / "bodies"
    if not bodies.exists():
        write_node_bodies(fleet, bodies)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", _FLEET_SERVER, str(port), str(bodies)])
    try:
        job = {"job_name": "verl", "scrape_interval": f"{interval}s", "scrape_timeout": f"{min(10, interval)}s",
               "static_configs": [{"targets": [fleet.instance(node) for node in range(fleet.nodes)]}],
               "relabel_configs": [
                   {"source_labels": ["__address__"], "target_label": "instance"},
                   {"source_labels": ["__address__"], "regex": r"gpu-node-(\d+):9945",
                    "target_label": "__metrics_path__", "replacement": "/node/$1/metrics"},
                   {"target_label": "__address__", "replacement": f"127.0.0.1:{port}"}]}
        if drop:
            job["metric_relabel_configs"] = yaml.safe_load(HALVE_SERIES.read_text())
        rules = rule_files()
        config = {"global": {"scrape_interval": f"{interval}s", "evaluation_interval": f"{interval}s"},
                  "rule_files": [path.name for path in rules], "scrape_configs": [job]}
        with start_prometheus(work, config, rule_files=rules) as prometheus:
            wait_for(lambda: _query_value(prometheus.url, 'count(up{job="verl"} == 1)') == fleet.nodes,
                     timeout=120, interval=2, what=f"{fleet.nodes} targets up")
            evaluations: dict[str, list[float]] = {}
            rule_seconds: dict[str, dict[str, list[float]]] = {}
            for _ in range(rounds):
                time.sleep(interval)
                for group in rule_group_timings(prometheus.url):
                    evaluations.setdefault(group["name"], []).append(group["seconds"])
                    for rule, seconds in group["rules"].items():
                        rule_seconds.setdefault(group["name"], {}).setdefault(rule, []).append(seconds)
            return {"rss_bytes": rss_bytes(prometheus.process.pid),
                    "heap_inuse_bytes": _metric(prometheus.url, "go_memstats_heap_inuse_bytes"),
                    "head_series": _metric(prometheus.url, "prometheus_tsdb_head_series"),
                    "scrapes_per_target": rounds,
                    "rule_groups": {name: {"median_seconds": statistics.median(values), "max_seconds": max(values),
                                           "evaluations": len(values),
                                           "slowest_rules": sorted(((rule, statistics.median(times)) for rule, times
                                                                    in rule_seconds.get(name, {}).items()),
                                                                   key=lambda item: -item[1])[:3]}
                                    for name, values in evaluations.items()}}
    finally:
        server.terminate()
        server.wait()


def rule_group_timings(url: str) -> list[dict]:
    """Each rule group's last evaluation as Prometheus reports it (/api/v1/rules): seconds, and per rule."""
    result, _ = api(url, "/api/v1/rules", {}, method="GET")
    return [{"name": group["name"], "seconds": group["evaluationTime"],
             "rules": {rule["name"]: rule["evaluationTime"] for rule in group["rules"]}}
            for group in result["groups"]]


def _query_value(url: str, expr: str) -> float:
    result, _ = api(url, "/api/v1/query", {"query": expr})
    return float(result["result"][0]["value"][1]) if result["result"] else 0.0


# -- the benchmark ---------------------------------------------------------------------------------


def run(work: Path, cache: Path, *, nodes: int, runs: int, hours: float, step: int, repeat: int,
        scrape_interval: int = 15, backends: tuple[str, ...] = ("prometheus", "victoriametrics"),
        rounds: int = 8, merge: bool = True) -> Result:
    cache = cache.resolve() / f"fleet-v{FLEET_VERSION}-{nodes}n-{runs}r-{hours:g}h-{step}s"
    cache.mkdir(parents=True, exist_ok=True)
    template_file = cache / "template.json"
    if template_file.exists():
        template_info = json.loads(template_file.read_text())
    else:
        print("  one exporter's /metrics ...", flush=True)
        template_info = {"text": capture_template(work), "captured_at": time.time()}
        template_info["end"] = int(template_info["captured_at"]) // step * step
        template_file.write_text(json.dumps(template_info))
    end = template_info["end"]
    fleet = Fleet(parse_template(template_info["text"]), nodes, runs, end - int(hours * 3600), end, step,
                  template_info["captured_at"])
    series = fleet.series_count()
    print(f"  fleet: {nodes} nodes x 8 GPUs, {runs} runs, {series:,} series, {len(fleet.times())} samples each",
          flush=True)
    figures: dict = {"series": series, "template_series": len(parse_template(template_info["text"])),
                     "window": {"start": fleet.start, "end": fleet.end, "step": step}}
    if {"prometheus", "victoriametrics"} & set(backends):
        print("  Prometheus: raw blocks ...", flush=True)
        raw = build_raw(cache, work, fleet)
        print("  Prometheus: recording rules ...", flush=True)
        prometheus_data, figures["build"] = build_prometheus(cache, work, fleet, raw, merge=merge)
    if "prometheus" in backends:
        with start_prometheus_on(prometheus_data, work) as prometheus:
            print("  Prometheus: queries ...", flush=True)
            figures["prometheus"] = measure(Backend("prometheus", prometheus.url, fleet, repeat))
            figures["prometheus"]["rss_bytes"] = rss_bytes(prometheus.process.pid)
    if "victoriametrics" in backends:
        print("  VictoriaMetrics: import ...", flush=True)
        vm_data = build_victoria_metrics(cache, work, fleet, prometheus_data)
        with start_vm_on(vm_data, work) as vm:
            print("  VictoriaMetrics: queries ...", flush=True)
            figures["victoriametrics"] = measure(Backend("victoriametrics", vm.url, fleet, repeat))
            figures["victoriametrics"]["rss_bytes"] = rss_bytes(vm.process.pid)
    if "memory" in backends:
        print("  Prometheus scraping the fleet: memory ...", flush=True)
        figures["memory"] = {name: scraping_memory(work / f"memory-{name}", fleet, rounds=rounds, drop=drop,
                                                   interval=scrape_interval)
                             for name, drop in (("all", False), ("halved", True))}
    return Result(NAME, {"nodes": nodes, "runs": runs, "hours": hours, "step": step, "repeat": repeat,
                         "scrape_interval": scrape_interval},
                  figures, rows(figures, nodes))


def rows(figures: dict, nodes: int) -> list[Row]:
    out = [Row("series in the fleet", figures["series"], "series")]
    for backend in ("prometheus", "victoriametrics"):
        if backend not in figures:
            continue
        got = figures[backend]
        ms = 1000
        out.append(Row(f"{backend}: reference range query {REFERENCE}", got["reference_seconds"] * ms, "ms"))
        for filename, dash in got["dashboards"].items():
            out.append(Row(f"{backend} {filename}: p50 / p95 / max query",
                           f"{dash['p50'] * ms:.0f} / {dash['p95'] * ms:.0f} / {dash['max'] * ms:.0f}", "ms",
                           "p95 < 1000, max < 3000",
                           dash["p95"] < TARGETS["p95_query_seconds"] and dash["max"] < TARGETS["max_query_seconds"]))
        every = got["all_panels"]
        out.append(Row(f"{backend} every panel query: p50 / p95 / max",
                       f"{every['p50'] * ms:.0f} / {every['p95'] * ms:.0f} / {every['max'] * ms:.0f}", "ms",
                       "p95 < 1000, max < 3000",
                       every["p95"] < TARGETS["p95_query_seconds"] and every["max"] < TARGETS["max_query_seconds"]))
        out.append(Row(f"{backend}: median panel query over the reference",
                       every["p50"] / got["reference_seconds"], "x"))
        for name, group in got["groups"].items():
            slowest = max(group["rules"], key=lambda rule: rule["seconds"])
            out.append(Row(f"{backend} group {name} ({len(group['rules'])} rules, slowest {slowest['rule']} "
                           f"{slowest['seconds'] * ms:.0f} ms)", group["seconds"] * ms, "ms", "< 1000",
                           group["seconds"] < TARGETS["max_group_seconds"]))
        out.append(Row(f"{backend}: RSS after the queries", got["rss_bytes"] / 2**20, "MiB"))
    for mode, got in figures.get("memory", {}).items():
        what = f"Prometheus scraping {nodes} nodes, {got['scrapes_per_target']} scrapes each" + (
            ", halve-series.yml dropped" if mode == "halved" else "")
        out.append(Row(f"{what}: head series", got["head_series"], "series"))
        out.append(Row(f"{what}: RSS", got["rss_bytes"] / 2**20, "MiB"))
        out.append(Row(f"{what}: Go heap in use", got["heap_inuse_bytes"] / 2**20, "MiB"))
        for name, group in sorted(got["rule_groups"].items(), key=lambda item: -item[1]["median_seconds"]):
            rule, seconds = group["slowest_rules"][0] if group["slowest_rules"] else ("", 0.0)
            out.append(Row(f"{what}: group {name}, median / max of {group['evaluations']} evaluations "
                           f"(slowest rule {rule} {seconds * 1000:.0f} ms)",
                           f"{group['median_seconds'] * 1000:.0f} / {group['max_seconds'] * 1000:.0f}", "ms",
                           "median < 1000", group["median_seconds"] < TARGETS["max_group_seconds"]))
    return out


def print_queries(figures: dict, baseline: dict | None, stream=sys.stdout, limit: int | None = None) -> None:
    """Every query's median time per backend (and the baseline's, matched by dashboard and panel)."""
    for backend in ("prometheus", "victoriametrics"):
        if backend not in figures:
            continue
        old = (baseline or {}).get(backend, {})
        print(f"\n-- {backend}: queries (median of repeats, ms){'; before -> after' if old else ''} --", file=stream)
        for filename, dash in figures[backend]["dashboards"].items():
            before = {q["what"]: q["seconds"] for q in old.get("dashboards", {}).get(filename, {}).get("queries", [])}
            print(f"  {filename}", file=stream)
            for q in sorted(dash["queries"], key=lambda q: -q["seconds"])[:limit]:
                was = f"{before[q['what']] * 1000:8.0f} -> " if q["what"] in before else ("     new -> " if old else "")
                print(f"    {was}{q['seconds'] * 1000:8.0f}  {q['series']:6d} series  {q['what']}", file=stream)
        before_groups = old.get("groups", {})
        print("  rule groups (sum of the rules' instant queries)", file=stream)
        for name, group in figures[backend]["groups"].items():
            was = (f"{before_groups[name]['seconds'] * 1000:8.0f} -> " if name in before_groups
                   else ("     new -> " if old else ""))
            print(f"    {was}{group['seconds'] * 1000:8.0f}  {name}", file=stream)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"tiny sizes {QUICK}, a smoke run")
    for name, default in FULL.items():
        parser.add_argument(f"--{name}", type=type(default), default=None, help=f"default {default}")
    parser.add_argument("--only", default="prometheus,victoriametrics",
                        help="comma-separated: prometheus, victoriametrics (the queries), memory (a Prometheus "
                             "scraping the fleet, with and without halve-series.yml)")
    parser.add_argument("--rounds", type=int, default=None, help="scrapes per target before memory is read "
                                                                  "(default 8, --quick 2)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--cache", type=Path, default=None, help="default OUT/cache")
    parser.add_argument("--baseline", type=Path, help="an earlier dashboards.json: before -> after per query")
    parser.add_argument("--dashboards", type=Path, help="a folder of dashboard JSON files (default: the shipped)")
    parser.add_argument("--rules", type=Path, help="a folder of rule files (default: the shipped)")
    args = parser.parse_args(argv)
    SOURCES.update({key: getattr(args, key).resolve() for key in ("dashboards", "rules") if getattr(args, key)})
    preset = QUICK if args.quick else FULL
    sizes = {name: getattr(args, name) if getattr(args, name) is not None else preset[name] for name in FULL}
    baseline = json.loads(args.baseline.read_text())["figures"] if args.baseline else None
    with tempfile.TemporaryDirectory(prefix="verl-bench-dashboards-", dir=os.environ.get("TMPDIR")) as work:
        result = run(Path(work), args.cache or args.out / "cache", **sizes,
                     backends=tuple(part.strip() for part in args.only.split(",") if part.strip()),
                     rounds=args.rounds or (2 if args.quick else 8), merge=not args.quick)
    print_queries(result.figures, baseline)
    print_table(result)
    env = environment()
    env["quick"] = args.quick
    print("  wrote", write_json(result, args.out, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
