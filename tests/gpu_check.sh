#!/usr/bin/env bash
# Checks the exporter's GPU series on a machine with an NVIDIA driver:
# runs the real-NVML tests, then starts the exporter and checks what /metrics serves.
# Usage: tests/gpu_check.sh   (uses .venv if present, else the python on PATH with the package installed)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
WORK=$(mktemp -d /tmp/verl-gpu-check.XXXXXX)
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
: > "$WORK/x.jsonl"

echo "== real NVML tests"
"$PY" -m pytest -q -m gpu -p no:cacheprovider tests/gpu

echo "== exporter on 127.0.0.1:$PORT"
"$PY" -m verl_exporter --web.listen-address "127.0.0.1:$PORT" --source "$WORK/x.jsonl" >"$WORK/exporter.log" 2>&1 &
EXPORTER=$!
trap 'kill "$EXPORTER" 2>/dev/null || true; wait "$EXPORTER" 2>/dev/null || true' EXIT

for _ in $(seq 1 60); do
  if curl -fsS "http://127.0.0.1:$PORT/metrics" -o "$WORK/metrics.txt" 2>/dev/null; then break; fi
  if ! kill -0 "$EXPORTER" 2>/dev/null; then echo "exporter exited:"; cat "$WORK/exporter.log"; exit 1; fi
  sleep 0.5
done
[ -s "$WORK/metrics.txt" ] || { echo "no /metrics after 30 s:"; cat "$WORK/exporter.log"; exit 1; }
curl -fsS "http://127.0.0.1:$PORT/metrics" -o "$WORK/metrics.txt"  # a second scrape: NVML is up by now

"$PY" - "$WORK/metrics.txt" <<'PYCHECK'
import sys
from prometheus_client.parser import text_string_to_metric_families

samples = [s for f in text_string_to_metric_families(open(sys.argv[1]).read()) for s in f.samples]
def values(name):
    return {s.labels.get("gpu"): s.value for s in samples if s.name == name}

problems = []
def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        problems.append(what)

success = [s.value for s in samples if s.name == "verl_exporter_collector_success" and s.labels == {"collector": "gpu"}]
check(success == [1.0], f"gpu collector success {success}")
count = values("verl_gpus").get(None, 0)
check(count > 0, f"verl_gpus {count:g} > 0")
for name, low, high in [("verl_gpu_memory_total_bytes", 1, float("inf")), ("verl_gpu_utilization_ratio", 0, 1),
                        ("verl_gpu_temperature_celsius", 0, 120), ("verl_gpu_up", 1, 1)]:
    found = values(name)
    check(len(found) == count, f"{name} for all {count:g} GPUs")
    for gpu, value in sorted(found.items()):
        check(low <= value <= high, f"{name}{{gpu={gpu}}} {value:g} in [{low}, {high}]")
sys.exit(1 if problems else 0)
PYCHECK
echo "GPU check passed"
