#!/bin/sh
# Render docs/img/*.png from live data: three simulated verl runs (one with a hot GPU) scraped by
# Debian's Prometheus with the shipped recording and alert rules, for MINUTES minutes (default 15).
#   grafana/preview-stack.sh            needs .venv with matplotlib, and prometheus in PATH
set -eu
cd "$(dirname "$0")/.."
MINUTES=${MINUTES:-15}
PY=${PY:-.venv/bin/python}
work=$(mktemp -d)
pids=""
cleanup() { for pid in $pids; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT INT TERM

port=19945
targets=""
for run in healthy:healthy lr-too-high:healthy critic-underfit:hot; do
  scenario=${run%%:*} gpus=${run##*:}
  $PY -m verl_exporter --web.listen-address "127.0.0.1:$port" --simulate "$scenario" --simulate.interval 2 \
      --simulate.dir "$work/runs" --gpu.fake "$gpus:8" --log.level warn &
  pids="$pids $!"
  targets="$targets'127.0.0.1:$port',"
  port=$((port + 1))
done

cat > "$work/prometheus.yml" <<YAML
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: ['$PWD/alerts/rules/recording-rules.yml', '$PWD/alerts/rules/verl-*.rules.yml']
scrape_configs:
  - job_name: verl
    static_configs: [{targets: [${targets%,}]}]
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
    --web.listen-address=127.0.0.1:19090 --log.level=warn &
pids="$pids $!"

echo "collecting data for $MINUTES minutes..."
sleep $((MINUTES * 60))
$PY -m verl_mixin.dashboards.preview --prometheus http://127.0.0.1:19090 --out docs/img \
    --minutes "$MINUTES" --var verl-run:experiment=lr-too-high --var verl-gpu:instance=127.0.0.1:19947
