# verl-exporter. `make demo` and `make test` do all set-up on a fresh Debian/Ubuntu machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SCENARIO ?= lr-too-high
PORT ?= 9945

.PHONY: install tools slurm-tools bench-tools demo exporter-demo lint check test bench generate fixtures clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dashboards]'
	touch $(STAMP)

install: $(STAMP)

# promtool, amtool and the real Prometheus, Alertmanager and node_exporter servers, VictoriaMetrics with
# vmagent and vmalert, and jsonnet (the mixin's tests), from Debian.
tools:
	@if ! command -v promtool >/dev/null || ! command -v amtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null || ! command -v prometheus-node-exporter >/dev/null \
	    || ! command -v victoria-metrics >/dev/null || ! command -v vmagent >/dev/null || ! command -v vmalert >/dev/null \
	    || ! command -v jsonnet >/dev/null; then \
	  echo "installing Debian's prometheus, prometheus-alertmanager, prometheus-node-exporter, victoria-metrics and jsonnet"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends prometheus prometheus-alertmanager prometheus-node-exporter victoria-metrics jsonnet >/dev/null; \
	fi

# Slurm (slurmctld, slurmd, munge and the clients) from Debian, for the tests that start a one-node cluster.
slurm-tools:
	@if ! PATH="$$PATH:/usr/sbin" command -v slurmctld >/dev/null || ! PATH="$$PATH:/usr/sbin" command -v slurmd >/dev/null \
	    || ! PATH="$$PATH:/usr/sbin" command -v munged >/dev/null || ! command -v sbatch >/dev/null; then \
	  echo "installing Debian's slurmctld, slurmd, munge and slurm-client"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends slurmctld slurmd munge slurm-client >/dev/null; \
	fi

# mtail from Debian: the ingest benchmark's reference, measured in the same run; wrk, a C client, for
# the fleet benchmark's concurrent scrapers (100 Python threads measure themselves as much as the server).
bench-tools:
	@if ! command -v mtail >/dev/null || ! command -v wrk >/dev/null; then \
	  echo "installing Debian's mtail and wrk"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends mtail wrk >/dev/null; \
	fi

# The exporter following a simulated verl run (SCENARIO, default lr-too-high) with 8 fake GPUs, a
# real Prometheus with the shipped rules and a real Alertmanager, all on 127.0.0.1; prints the URLs.
demo: install tools
	$(PY) scripts/demo.py --scenario $(SCENARIO) --exporter-port $(PORT)

# Only the exporter, following a simulated healthy run.
exporter-demo: install
	$(PY) -m verl_exporter --simulate healthy --gpu.fake healthy:8 --web.listen-address :$(PORT)

# Lint and type checks (ruff, mypy; settings in pyproject.toml), then the whole test suite.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The loop to run while editing: lint, then the unit tests (no servers, no real runs), in under a minute.
check: lint
	$(PY) -m pytest -q tests/unit

test: install tools slurm-tools lint
	$(PY) -m pytest -q

# Benchmarks (not part of `make test`): scrape cost against node_exporter, ingestion, overhead,
# rule evaluation at scale, a fleet of runs, the dashboards and rule groups at 1,000 nodes. Prints tables and
# writes bench-results/*.json. About 35 minutes.
bench: install tools bench-tools
	$(PY) tests/benchmarks/run.py

# Regenerate the shipped files (grafana/dashboards/; alerts/: alert and recording rules, Alertmanager
# config, runbook), docs/alerts.md and prometheus/kubernetes/prometheusrule.yml from their code. Every alert's
# runbook_url is RUNBOOK_URL#anchor: by default the exporter's own /runbook; set it to where the
# runbook is hosted, e.g. make generate RUNBOOK_URL=https://wiki.example/verl/RUNBOOK.md
RUNBOOK_URL ?= http://localhost:9945/runbook
# Every alert's dashboard_url opens a shipped dashboard (the run's, the node's or the fleet's) in this Grafana.
DASHBOARD_URL ?= http://localhost:3000
generate: install
	$(PY) -m verl_mixin.dashboards
	$(PY) -m verl_mixin --runbook-url '$(RUNBOOK_URL)' --dashboard-url '$(DASHBOARD_URL)'

# Regenerate tests/fixtures/verl/ with each verl release's own code (not part of `make test`).
# Installs the releases from PyPI under /tmp/verl-fixtures; RELEASES="0.9.1 0.6.1" for some.
fixtures:
	$(PYTHON) scripts/verl_fixtures.py $(RELEASES)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .demo bench-results
