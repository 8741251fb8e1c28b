# verl-exporter. `make demo` and `make test` do all set-up on a fresh Debian/Ubuntu machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SCENARIO ?= lr-too-high
PORT ?= 9945

.PHONY: install tools demo exporter-demo test bench dashboards clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dashboards]'
	touch $(STAMP)

install: $(STAMP)

# promtool, amtool and the real Prometheus, Alertmanager and node_exporter servers, from Debian.
tools:
	@if ! command -v promtool >/dev/null || ! command -v amtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null || ! command -v prometheus-node-exporter >/dev/null; then \
	  echo "installing Debian's prometheus, prometheus-alertmanager and prometheus-node-exporter"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends prometheus prometheus-alertmanager prometheus-node-exporter >/dev/null; \
	fi

# The exporter following a simulated verl run, with 8 fake GPUs.
exporter-demo: install
	$(PY) -m verl_exporter --simulate healthy --gpu.fake healthy:8 --web.listen-address :$(PORT)

demo: exporter-demo

test: install tools
	$(PY) -m pytest -q

# Regenerate grafana/dashboards/*.json from the dashboard code.
dashboards: install
	PYTHONPATH=grafana $(PY) -m verl_dashboards

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .demo bench-results
