"""The whole alerting pipeline on loopback, for end-to-end tests: the exporter, a real Prometheus with
the shipped rules (durations scaled), a real Alertmanager with the shipped config, and a receiver
standing in for Slack and PagerDuty (alerts/generator/local.py)."""

from __future__ import annotations

import json
import sys
import urllib.parse
from pathlib import Path

import yaml

from servers import REPO, prom_query, start_alertmanager, start_exporter, start_prometheus

sys.path.insert(0, str(REPO / "alerts"))
from generator import local  # noqa: E402


class AlertingStack:
    """Exporter (``exporter_args``) -> Prometheus (rules scaled by ``time_scale``) -> Alertmanager
    -> ``receiver``. ``close`` stops everything it started."""

    def __init__(self, tmp_path: Path, exporter_args: list[str], *, time_scale: float):
        self.receiver = local.Receiver().__enter__()
        am_config = tmp_path / "alertmanager.yml"
        am_config.write_text(yaml.safe_dump(local.alertmanager_config(self.receiver.url, tmp_path / "secrets")))
        self.alertmanager = start_alertmanager(tmp_path, am_config)
        self.exporter = start_exporter(tmp_path, *exporter_args)
        rules = local.write_rules(tmp_path / "rules", time_scale=time_scale, min_range=3)
        config = local.prometheus_config(f"127.0.0.1:{self.exporter.port}", f"127.0.0.1:{self.alertmanager.port}",
                                         rules, interval="1s")
        # Prometheus learns its Alertmanager up to 5 s after start; alerts fired before are resent soon.
        self.prometheus = start_prometheus(tmp_path, config, extra_args=["--rules.alert.resend-delay=2s"])

    def query(self, expr: str) -> list[dict]:
        return prom_query(self.prometheus, expr)

    def am_alerts(self, matcher: str) -> list[dict]:
        """Alertmanager's alerts matching ``matcher`` (``experiment="healthy"``)."""
        query = urllib.parse.urlencode({"filter": matcher})
        status, body = self.alertmanager.get(f"/api/v2/alerts?{query}")
        assert status == 200, body
        return json.loads(body)

    def close(self) -> None:
        for server in (self.prometheus, self.alertmanager, self.exporter):
            server.stop()
        self.receiver.__exit__()
