"""A real Prometheus (the one on PATH) over a folder of TSDB blocks, on a free loopback port, for
range queries: no scraping, no rules, retention long enough for old runs."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

MAX_POINTS = 10_000  # Prometheus refuses range queries of more than 11,000 points per series


class Prometheus:
    """A real Prometheus over ``data`` on a free loopback port, for range queries only."""

    def __init__(self, workdir: Path, data: Path, binary: str, lookback: float = 300.0):
        self.workdir, self.data, self.binary, self.lookback = workdir, data, binary, lookback
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        config = self.workdir / "prometheus.yml"
        config.write_text("global: {}\n", encoding="utf-8")
        self.log = self.workdir / f"prometheus-{port}.log"
        self.url = f"http://127.0.0.1:{port}"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.data}",
                 f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y",
                 f"--query.lookback-delta={round(self.lookback)}s"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}: {self._tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"prometheus did not get ready in {timeout:g}s: {self._tail()}")

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-1500:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict[tuple, dict[float, float]]:
        """label set -> {time: value} of ``expr`` evaluated every ``step`` from ``start`` to ``end``."""
        out: dict[tuple, dict[float, float]] = {}
        chunk_start = start
        while chunk_start <= end:
            chunk_end = min(end, round(chunk_start + step * (MAX_POINTS - 1), 3))
            query = urllib.parse.urlencode({"query": expr, "start": f"{chunk_start:.3f}",
                                            "end": f"{chunk_end:.3f}", "step": f"{step:g}"})
            request = urllib.request.Request(self.url + "/api/v1/query_range", data=query.encode(),
                                             headers={"Content-Type": "application/x-www-form-urlencoded"})
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    body = json.loads(response.read())
            except urllib.error.HTTPError as exc:
                body = json.loads(exc.read() or b"{}")
                raise RuntimeError(f"query failed: {body.get('error', exc)}: {expr.strip()[:200]}") from None
            for series in body["data"]["result"]:  # an alert's labels are its series' without the name
                key = tuple(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))
                points = out.setdefault(key, {})
                for moment, value in series["values"]:
                    points[round(float(moment), 3)] = float(value)
            chunk_start = round(chunk_end + step, 3)
        return out
