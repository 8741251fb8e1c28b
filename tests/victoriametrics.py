"""Debian's victoria-metrics package for tests and benchmarks: VictoriaMetrics, vmagent, vmalert.

Each ``start_*`` returns a :class:`servers.Server` on a free loopback port, ready once its
``/health`` answers; use them as context managers. ``vmalert_check`` runs ``vmalert -dryRun`` on rule
files (it parses every expression and template the way vmalert evaluates them), ``vmagent_check``
``vmagent -dryRun`` on a scrape config.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from servers import Server, free_port, require_binary


def _start(name: str, tmp_path: Path, *args: str) -> Server:
    binary = require_binary(name)
    port = free_port()
    workdir = tmp_path / f"{name}-{port}"
    workdir.mkdir()
    cmd = [binary, f"-httpListenAddr=127.0.0.1:{port}", *[arg.replace("{dir}", str(workdir)) for arg in args]]
    return Server(name, cmd, port, workdir / f"{name}.log", "/health", cwd=workdir)


def start_victoria_metrics(tmp_path: Path, *extra_args: str) -> Server:
    """Single-node VictoriaMetrics. Recent samples are searchable at once (``-search.latencyOffset=0s``,
    the default 30 s suits late remote-write data, not a test) and query results are not cached."""
    return _start("victoria-metrics", tmp_path, "-storageDataPath={dir}/data", "-retentionPeriod=1d",
                  "-search.latencyOffset=0s", "-search.disableCache", *extra_args)


def start_vmagent(tmp_path: Path, targets: list[str], remote_write_url: str, *, interval: str = "1s",
                  job: str = "verl", extra_args: tuple[str, ...] = ()) -> Server:
    """vmagent scraping ``targets`` (host:port) as ``job`` and remote-writing to ``remote_write_url``."""
    config = tmp_path / f"vmagent-scrape-{free_port()}.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}],
    }))
    return _start("vmagent", tmp_path, f"-promscrape.config={config}", f"-remoteWrite.url={remote_write_url}",
                  "-remoteWrite.tmpDataPath={dir}/queue", "-remoteWrite.flushInterval=1s", *extra_args)


def start_vmalert(tmp_path: Path, rule_files: list[Path], victoria_metrics: Server, alertmanager: Server, *,
                  interval: str = "1s", extra_args: tuple[str, ...] = ()) -> Server:
    """vmalert evaluating ``rule_files`` against ``victoria_metrics`` every ``interval``: recording rules
    and alert state (``ALERTS``, ``ALERTS_FOR_STATE``) are written back to it, alerts go to ``alertmanager``."""
    return _start("vmalert", tmp_path, *[f"-rule={path}" for path in rule_files],
                  f"-datasource.url={victoria_metrics.url}", f"-remoteWrite.url={victoria_metrics.url}",
                  f"-remoteRead.url={victoria_metrics.url}", f"-notifier.url={alertmanager.url}",
                  f"-evaluationInterval={interval}", "-remoteWrite.flushInterval=1s", *extra_args)


def vmagent_check(scrape_config: Path, *flags: str) -> subprocess.CompletedProcess:
    """``vmagent -dryRun``: exit 0 when vmagent accepts ``scrape_config`` as its -promscrape.config."""
    return subprocess.run([require_binary("vmagent"), "-dryRun", f"-promscrape.config={scrape_config}", *flags],
                          capture_output=True, text=True, timeout=60, cwd=scrape_config.parent)


def vmalert_check(rule_files: list[Path]) -> subprocess.CompletedProcess:
    """``vmalert -dryRun``: exit 0 when every rule file, expression and template is accepted."""
    return subprocess.run([require_binary("vmalert"), "-dryRun", *[f"-rule={path}" for path in rule_files]],
                          capture_output=True, text=True, timeout=60)
