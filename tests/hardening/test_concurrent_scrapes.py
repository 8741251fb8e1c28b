"""50 scrapers at once for 30 s: every scrape answers in full, and the exporter's memory stays flat."""

import http.client
import os
import threading
import time

import psutil
from hardening_helpers import jsonl, metrics_when, value

from servers import start_exporter

SCRAPERS = 50
SECONDS = float(os.environ.get("VERL_HARDENING_SCRAPE_SECONDS", "15"))
MIB = 1 << 20


def scrape_once(port: int) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", "/metrics", headers={"Accept-Encoding": "identity"})
        response = connection.getresponse()
        return response.status, response.read()  # raises IncompleteRead if the body is cut short
    finally:
        connection.close()


def test_fifty_concurrent_scrapers(tmp_path):
    run_file = tmp_path / "gsm8k" / "ppo.jsonl"
    run_file.parent.mkdir()
    run_file.write_text("".join(jsonl(step, {"actor/pg_clipfrac": 0.1, "critic/score/mean": step / 100,
                                             "val-core/openai/gsm8k/acc/mean@1": 0.5}) for step in range(1, 6)))
    with start_exporter(tmp_path, "--source", str(run_file), "--gpu.fake", "healthy:8") as exporter:
        first = metrics_when(exporter, lambda text: value(text, "verl_training_last_step") == 5, "step 5")
        families = {line for line in first.splitlines() if line.startswith("# TYPE ")}
        process = psutil.Process(exporter.process.pid)
        stop = threading.Event()
        counts = [0] * SCRAPERS
        problems: list[str] = []
        rss: list[tuple[float, int]] = []

        def scraper(index: int) -> None:
            while not stop.is_set():
                try:
                    status, body = scrape_once(exporter.port)
                except Exception as exc:  # every failure is a finding
                    problems.append(f"scraper {index}: {exc!r}")
                    continue
                text = body.decode()
                missing = families - {line for line in text.splitlines() if line.startswith("# TYPE ")}
                if status != 200 or missing or "verl_training_last_step{" not in text:
                    problems.append(f"scraper {index}: status {status}, families missing: {sorted(missing)[:3]}")
                counts[index] += 1

        threads = [threading.Thread(target=scraper, args=(index,), daemon=True) for index in range(SCRAPERS)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while time.monotonic() - started < SECONDS:
            rss.append((time.monotonic() - started, process.memory_info().rss))
            time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a scrape never returned"
        assert exporter.process.poll() is None, exporter.log()[-3000:]
        assert exporter.get("/-/healthy")[0] == 200

    assert not problems, f"{len(problems)} bad scrapes, e.g. {problems[:5]}"
    assert all(counts), f"scrapers that never completed a scrape: {[i for i, c in enumerate(counts) if not c]}"
    # Memory: after the first third (threads and buffers allocated), the peak must not keep rising.
    third = SECONDS / 3
    early = max(size for at, size in rss if at <= third)
    late = max(size for at, size in rss if at >= 2 * third)
    print(f"{sum(counts)} scrapes by {SCRAPERS} scrapers in {SECONDS:g}s; "
          f"RSS peak {early / MIB:.1f} MiB early, {late / MIB:.1f} MiB late")
    assert late <= early * 1.10 + 8 * MIB, f"RSS grew from {early / MIB:.1f} to {late / MIB:.1f} MiB"
