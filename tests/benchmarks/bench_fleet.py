"""One exporter for a whole shared log directory: many runs, big backlogs, many files, many scrapers.

Each figure is taken against a reference measured in the same run, on the same machine load:

- ``runs``: scrape median with N runs of verl 0.9.1's PPO key set (the fixture run's training and
  validation keys), against a plain HTTP server
  (another process) sending the same bytes; once with nothing changing, once after every run logged
  a new step;
- ``backlog``: F files with M MB of backlog each (copies of one simulated JSONL file; hard links
  would be one file, which the exporter follows once): time to listen, time to /-/ready, time until
  every run's last step is served, peak RSS (the kernel's VmHWM), against an exporter started on an empty directory;
- ``descriptors``: D one-step files under an open-file limit (``RLIMIT_NOFILE`` set in the child):
  does it start and serve every run;
- ``concurrent``: S scrapers scraping one exporter (one run with every catalog metric, 8 fake GPUs,
  host) for T seconds: p50, p99, failures;
- ``ingest``: MB/s of a console and a JSONL run, from listening to every step served, against
  reading the same file line by line in Python.

``--exporter DIR`` runs the exporter (and the simulator) from another checkout's ``exporter/``,
e.g. a ``git worktree`` of an older commit: the before/after comparison. Flags only a newer exporter
knows are never passed, so both run with their defaults.

    python tests/benchmarks/bench_fleet.py --out bench-results/fleet [--exporter ../old/exporter]
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO,
    SCRAPE_HEADERS,
    BenchmarkError,
    Result,
    Row,
    print_table,
    scrape,
    simulated_file,
    summary,
    write_json,
)
from servers import Server, free_port  # noqa: E402

NAME = "fleet"
MB = 1_000_000
FULL = {"runs": 1000, "backlog_files": 100, "backlog_mb": 8.0, "many_files": 2000, "nofile": 1024,
        "scrapers": 100, "seconds": 10.0, "ingest_mb": 100.0}
QUICK = {"runs": 20, "backlog_files": 4, "backlog_mb": 0.5, "many_files": 60, "nofile": 48,
         "scrapers": 4, "seconds": 1.0, "ingest_mb": 1.0}
_LAST_STEP = re.compile(rb"^verl_training_last_step\{[^}]*\} (\S+)$", re.M)


class Exporter:
    """``python -m verl_exporter`` from ``code`` (an ``exporter/`` folder), with its own log."""

    def __init__(self, work: Path, code: Path, *args: str, nofile: int | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = work / f"exporter-{self.port}.log"
        self._log = open(self.log_path, "wb")
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "verl_exporter", "--web.listen-address", f"127.0.0.1:{self.port}", *args],
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=limit,
            env={**os.environ, "PYTHONPATH": str(code)}, cwd=work)

    def get(self, path: str, headers: dict | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
        try:
            status, body, _ = scrape(self.url + path, headers, timeout=timeout)
            return status, body
        except OSError:
            return 0, b""

    def wait(self, condition, timeout: float, what: str, interval: float = 0.02) -> float:
        """Seconds from start until ``condition()``; BenchmarkError if it exits or times out."""
        deadline = time.perf_counter() + timeout
        while not condition():
            if self.process.poll() is not None:
                raise BenchmarkError(f"exporter exited with {self.process.returncode} before {what}:\n"
                                     f"{self.log()[-1500:]}")
            if time.perf_counter() > deadline:
                raise BenchmarkError(f"no {what} after {timeout:g}s")
            time.sleep(interval)
        return time.perf_counter() - self.started

    def listening(self) -> bool:
        return self.get("/-/healthy", timeout=5)[0] == 200

    def last_steps(self) -> list[float]:
        status, body = self.get("/metrics?name[]=verl_training_last_step", timeout=60)
        return [float(value) for value in _LAST_STEP.findall(body)] if status == 200 else []

    def peak_rss(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        Server.stop(self)  # terminate, kill after 10 s, close the log: as the tests' servers stop


_PLAIN_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = open(sys.argv[2], "rb").read()
gzipped = body[:2] == b"\\x1f\\x8b"
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


VERL_09 = REPO / "tests" / "fixtures" / "verl" / "0.9.1" / "ppo" / "metrics.jsonl"


@functools.lru_cache(maxsize=1)
def _key_set() -> dict:
    """Every key verl 0.9.1's PPO trainer logged in the fixture run (training and validation), else
    the simulator's step."""
    if VERL_09.exists():
        values: dict = {}
        for line in VERL_09.read_text().splitlines():
            values.update(json.loads(line)["data"])
        return values
    from verl_exporter import simulate

    return simulate.step_values("healthy", 1)


def _step_line(step: int) -> str:
    data = {key: value * (1 + step / 1000) if isinstance(value, float) else value for key, value in _key_set().items()}
    return json.dumps({"step": step, "data": data}) + "\n"


def _touch_all(paths) -> None:
    now = time.time()
    for path in paths:
        os.utime(path, (now, now))


def bench_runs(work: Path, code: Path, runs: int, scrapes: int = 40) -> tuple[dict, list[Row]]:
    root = work / "runs"
    files = []
    for index in range(runs):
        path = root / f"team{index % 20}" / f"exp{index}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_step_line(1) + _step_line(2))
        files.append(path)
    args = ["--source", str(root / "*" / "*.jsonl"), "--no-collector.gpu", "--no-collector.host",
            "--store.max-runs", str(runs + 10)]
    with Exporter(work, code, *args, nofile=max(4096, runs * 2)) as exporter:
        exporter.wait(lambda: exporter.last_steps() == [2.0] * runs, 600, f"{runs} runs at step 2", 0.5)
        for _ in range(5):
            exporter.get("/metrics", SCRAPE_HEADERS)
        status, body = exporter.get("/metrics", SCRAPE_HEADERS)
        ours, theirs = _against_plain(work, exporter.url + "/metrics", body, SCRAPE_HEADERS, scrapes)
        identity = {**SCRAPE_HEADERS, "Accept-Encoding": "identity"}
        _, text_body = exporter.get("/metrics", identity)
        ours_text, theirs_text = _against_plain(work, exporter.url + "/metrics", text_body, identity, scrapes)
        changed = []
        for round_ in range(3):  # every run logs a step; the next full scrape renders all of them anew
            step = 3 + round_
            for path in files:
                with path.open("a") as out:
                    out.write(_step_line(step))
            for wait in (2, 4, 8, 16, 32):  # no scrape in between: it would render the changes itself
                time.sleep(wait)
                got, new_body, seconds = scrape(exporter.url + "/metrics", SCRAPE_HEADERS)
                new_text = gzip.decompress(new_body) if new_body[:2] == b"\x1f\x8b" else new_body
                if [float(value) for value in _LAST_STEP.findall(new_text)] == [float(step)] * runs:
                    changed.append(seconds)
                    break
    text = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
    figures = {"ours": summary(ours), "plain": summary(theirs), "after_every_run_changed": summary(changed),
               "ours_uncompressed": summary(ours_text), "plain_uncompressed": summary(theirs_text),
               "body_bytes": len(text), "gzip_bytes": len(body),
               "series": sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))}
    figures["ratio_median"] = figures["ours"]["median"] / figures["plain"]["median"]
    figures["ratio_median_uncompressed"] = (figures["ours_uncompressed"]["median"]
                                            / figures["plain_uncompressed"]["median"])
    ms = 1000
    rows = [
        Row(f"{runs} runs: scrape median", figures["ours"]["median"] * ms, "ms"),
        Row(f"{runs} runs: plain server, same bytes, median", figures["plain"]["median"] * ms, "ms"),
        Row(f"{runs} runs: ratio of medians", figures["ratio_median"], "x", "<= 3", figures["ratio_median"] <= 3),
        Row(f"{runs} runs: uncompressed scrape median", figures["ours_uncompressed"]["median"] * ms, "ms"),
        Row(f"{runs} runs: plain server, same bytes uncompressed, median",
            figures["plain_uncompressed"]["median"] * ms, "ms"),
        Row(f"{runs} runs: uncompressed ratio of medians", figures["ratio_median_uncompressed"], "x", "<= 5",
            figures["ratio_median_uncompressed"] <= 5),
        Row(f"{runs} runs: scrape after every run changed, median", figures["after_every_run_changed"]["median"] * ms,
            "ms"),
        Row(f"{runs} runs: series", figures["series"], "series"),
    ]
    return figures, rows


def _against_plain(work: Path, url: str, body: bytes, headers: dict, scrapes: int) -> tuple[list, list]:
    """Scrape times of ``url`` and of a plain HTTP server (another process) sending ``body``, in
    alternating order."""
    (work / "body").write_bytes(body)
    plain_port = free_port()
    plain = subprocess.Popen([sys.executable, "-c", _PLAIN_SERVER, str(plain_port), str(work / "body")])
    try:
        plain_url = f"http://127.0.0.1:{plain_port}/metrics"
        deadline = time.perf_counter() + 30
        while True:
            try:
                scrape(plain_url, timeout=2)
                break
            except OSError:
                if time.perf_counter() > deadline:
                    raise BenchmarkError("the plain HTTP server did not start") from None
                time.sleep(0.05)
        ours: list[float] = []
        theirs: list[float] = []
        for index in range(scrapes):
            pair = [(url, ours), (plain_url, theirs)]
            for target, times in (pair if index % 2 == 0 else pair[::-1]):
                got, _, seconds = scrape(target, headers)
                if got != 200:
                    raise BenchmarkError(f"{target} answered {got}")
                times.append(seconds)
    finally:
        plain.terminate()
        plain.wait()
    return ours, theirs


def bench_backlog(work: Path, code: Path, cache: Path, files: int, mb: float) -> tuple[dict, list[Row]]:
    source, steps = simulated_file(cache, "jsonl", int(mb * MB))
    _touch_all([source])
    root = work / "backlog"
    for index in range(files):
        path = root / f"team{index % 10}" / f"exp{index}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)  # copies: hard links are one file, which the exporter follows once
    with source.open("rb") as handle:  # from the page cache, for both
        while handle.read(8 << 20):
            pass
    empty = work / "empty"
    empty.mkdir()
    common = ["--no-collector.gpu", "--no-collector.host", "--store.max-runs", str(files + 10)]
    with Exporter(work, code, "--source", str(empty / "*.jsonl"), *common) as exporter:
        baseline_listen = exporter.wait(exporter.listening, 120, "listening")
        baseline_rss = exporter.peak_rss()
    with Exporter(work, code, "--source", str(root / "*" / "*.jsonl"), *common, nofile=4096) as exporter:
        listen = exporter.wait(exporter.listening, 900, "listening")
        ready = exporter.wait(lambda: exporter.get("/-/ready", timeout=60)[0] == 200, 900, "ready", 0.1)
        served_at_ready = exporter.last_steps()
        complete = exporter.wait(lambda: exporter.last_steps() == [float(steps)] * files, 900,
                                 "every run at its last step", 0.2)
        rss = exporter.peak_rss()
    honest = served_at_ready == [float(steps)] * files
    figures = {"files": files, "mb_each": source.stat().st_size / MB, "steps": steps, "listen_seconds": listen,
               "ready_seconds": ready, "complete_seconds": complete, "ready_was_complete": honest,
               "peak_rss_bytes": rss, "baseline_listen_seconds": baseline_listen, "baseline_rss_bytes": baseline_rss}
    size = f"{files} x {figures['mb_each']:.1f} MB"
    rows = [
        Row(f"{size}: time to listen", listen, "s", "< 1", listen < 1),
        Row("  empty directory: time to listen (reference)", baseline_listen, "s"),
        Row(f"{size}: time to /-/ready", ready, "s"),
        Row(f"{size}: every run served at /-/ready", "yes" if honest else "no", "", "yes", honest),
        Row(f"{size}: time to every step served", complete, "s"),
        Row(f"{size}: peak RSS", rss / 2**20, "MiB", "< 200", rss < 200 * 2**20),
        Row("  empty directory: peak RSS (reference)", baseline_rss / 2**20, "MiB"),
    ]
    return figures, rows


def bench_descriptors(work: Path, code: Path, count: int, nofile: int) -> tuple[dict, list[Row]]:
    root = work / "many"
    for index in range(count):
        path = root / f"team{index % 20}" / f"exp{index}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"step": 1, "data": {"actor/pg_loss": 0.5}}\n')
    args = ["--source", str(root / "*" / "*.jsonl"), "--no-collector.gpu", "--no-collector.host",
            "--store.max-runs", str(count + 10)]
    figures = {"files": count, "nofile": nofile, "started": False, "runs_served": 0, "error": ""}
    with Exporter(work, code, *args, nofile=nofile) as exporter:
        try:
            figures["seconds"] = exporter.wait(lambda: len(exporter.last_steps()) == count, 600,
                                               f"{count} runs served", 0.5)
            figures["started"] = True
            figures["open_fds"] = len(os.listdir(f"/proc/{exporter.process.pid}/fd"))
        except BenchmarkError as exc:
            figures["error"] = str(exc).splitlines()[0][:200]
            tail = [line for line in exporter.log().splitlines() if "Too many open files" in line]
            figures["error"] += (" / " + tail[-1][-160:]) if tail else ""
        figures["runs_served"] = len(exporter.last_steps()) if exporter.process.poll() is None else 0
    ok = figures["started"] and figures["runs_served"] == count
    rows = [Row(f"{count} files under ulimit -n {nofile}: serves every run", "yes" if ok else "no", "", "yes", ok),
            Row(f"{count} files: runs served", figures["runs_served"], "runs")]
    if figures["started"]:
        rows += [Row(f"{count} files: start to every run served", figures["seconds"], "s"),
                 Row(f"{count} files: open descriptors", figures["open_fds"], "fds")]
    else:
        rows.append(Row(f"{count} files: why not", figures["error"][-90:]))
    return figures, rows


def bench_concurrent(work: Path, code: Path, scrapers: int, seconds: float) -> tuple[dict, list[Row]]:
    from bench_scrape import write_run

    run_file = work / "one" / "every-metric.jsonl"
    write_run(run_file)
    with Exporter(work, code, "--source", str(run_file), "--gpu.fake", "healthy:8") as exporter:
        exporter.wait(lambda: exporter.last_steps() == [3.0], 120, "the run served", 0.1)
        latencies: list[float] = []
        failures = [0]
        lock = threading.Lock()
        stop = time.perf_counter() + seconds

        def scraper():
            while time.perf_counter() < stop:
                try:
                    status, _, took = scrape(exporter.url + "/metrics", SCRAPE_HEADERS, timeout=30)
                except OSError:
                    status, took = 0, 0.0
                with lock:
                    if status == 200:
                        latencies.append(took)
                    else:
                        failures[0] += 1

        threads = [threading.Thread(target=scraper) for _ in range(scrapers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        load = wrk_load(exporter.url + "/metrics", scrapers, seconds)
    stats = summary(latencies)
    figures = {"scrapers": scrapers, "seconds": seconds, "scrapes": stats["n"], "failed": failures[0], **stats,
               "wrk": load}
    rows = [Row(f"{scrapers} scrapers: p50", stats["median"] * 1000, "ms"),
            Row(f"{scrapers} scrapers: p99", stats["p99"] * 1000, "ms", "< 100", stats["p99"] < 0.1),
            Row(f"{scrapers} scrapers: scrapes served", stats["n"], "scrapes"),
            Row(f"{scrapers} scrapers: failed", failures[0], "scrapes", "0", failures[0] == 0)]
    if load:
        rows += [Row(f"{scrapers} connections (wrk): p50", load["p50_ms"], "ms"),
                 Row(f"{scrapers} connections (wrk): p99", load["p99_ms"], "ms", "< 100", load["p99_ms"] < 100),
                 Row(f"{scrapers} connections (wrk): scrapes per second", load["requests_per_second"], "/s")]
    return figures, rows


def wrk_load(url: str, connections: int, seconds: float) -> dict:
    """The same load from wrk (Debian's package), a C client that leaves the CPUs to the exporter: the
    Python scrapers above measure themselves as much as the server. Empty where wrk is not installed."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return {}
    done = subprocess.run([wrk, "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
                           "-H", "Accept-Encoding: gzip", url], capture_output=True, text=True, timeout=seconds + 60)
    units = {"us": 0.001, "ms": 1.0, "s": 1000.0}

    def latency(percent: str) -> float:
        value, unit = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s)$", done.stdout, re.M).groups()
        return float(value) * units[unit]

    rate = re.search(r"^Requests/sec:\s+([\d.]+)", done.stdout, re.M)
    if done.returncode != 0 or rate is None:
        return {"error": (done.stderr or done.stdout)[-500:]}
    return {"p50_ms": latency("50"), "p99_ms": latency("99"), "requests_per_second": float(rate.group(1))}


def bench_ingest(work: Path, code: Path, cache: Path, mb: float) -> tuple[dict, list[Row]]:
    figures, rows = {}, []
    empty = work / "empty-ingest"
    empty.mkdir()
    common = ["--no-collector.gpu", "--no-collector.host", "--source.poll-interval", "0.2"]
    with Exporter(work, code, "--source", str(empty / "*.log"), *common) as exporter:
        baseline = exporter.wait(exporter.listening, 120, "listening")
    for fmt in ("console", "jsonl"):
        path, steps = simulated_file(cache, fmt, int(mb * MB))
        _touch_all([path])
        size = path.stat().st_size
        started = time.perf_counter()
        with path.open(encoding="utf-8", errors="replace") as handle:
            for _ in handle:
                pass
        python = size / MB / (time.perf_counter() - started)
        with Exporter(work, code, "--source", str(path), "--source.format", fmt, *common) as exporter:
            done = exporter.wait(lambda steps=steps: exporter.last_steps() == [float(steps)], 900, "every step", 0.05)
        ours = size / MB / max(done - baseline, 1e-9)
        figures[fmt] = {"bytes": size, "steps": steps, "seconds": done, "baseline_seconds": baseline,
                        "mb_per_s": ours, "python_lines_mb_per_s": python}
        rows += [Row(f"{fmt}: ingestion ({size / MB:.0f} MB)", ours, "MB/s", ">= 100", ours >= 100),
                 Row(f"{fmt}: Python reading its lines (reference)", python, "MB/s"),
                 Row(f"{fmt}: share of the reference", ours / python, "x")]
    return figures, rows


PARTS = ("runs", "backlog", "descriptors", "concurrent", "ingest")


def run(work: Path, cache: Path, *, code: Path | None = None, only=PARTS, **sizes) -> Result:
    code = code or REPO / "exporter"
    sizes = {**FULL, **sizes}
    figures, rows = {}, []
    calls = {
        "runs": lambda: bench_runs(work, code, sizes["runs"]),
        "backlog": lambda: bench_backlog(work, code, cache, sizes["backlog_files"], sizes["backlog_mb"]),
        "descriptors": lambda: bench_descriptors(work, code, sizes["many_files"], sizes["nofile"]),
        "concurrent": lambda: bench_concurrent(work, code, sizes["scrapers"], sizes["seconds"]),
        "ingest": lambda: bench_ingest(work, code, cache, sizes["ingest_mb"]),
    }
    for part in only:
        print(f"  {part} ...", flush=True)
        part_work = work / part
        part_work.mkdir(parents=True, exist_ok=True)
        try:
            figures[part], got = calls[part]()
        except BenchmarkError as exc:
            figures[part] = {"error": str(exc)[:500]}
            got = [Row(f"{part}: could not measure", str(exc).splitlines()[0][:120], "", "", False)]
        rows += got
    return Result(NAME, {**sizes, "exporter": str(code), "parts": list(only)}, figures, rows)


def main(argv: list[str] | None = None) -> int:
    from common import environment

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exporter", type=Path, default=REPO / "exporter", help="the exporter/ folder to run")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "fleet")
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--quick", action="store_true")
    for name, default in FULL.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=None)
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    sizes = {name: getattr(args, name) if getattr(args, name) is not None else preset[name] for name in FULL}
    sys.path.insert(0, str(args.exporter.resolve()))  # the simulator of the exporter measured
    work = Path(tempfile.mkdtemp(prefix="verl-fleet-"))
    try:
        result = run(work, args.cache or args.out / "cache", code=args.exporter.resolve(),
                     only=[part for part in args.only.split(",") if part], **sizes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(result)
    env = environment()
    env["quick"] = args.quick
    print("  wrote", write_json(result, args.out, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
