"""The whole alerting pipeline on loopback, for end-to-end tests: the exporter, a real Prometheus with
the shipped rules (durations scaled), a real Alertmanager with the shipped config, and a receiver
standing in for Slack and PagerDuty (scripts/stand_in_receiver.py), wired by verl_mixin.local."""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path
from typing import Callable

import yaml

from servers import prom_query, start_alertmanager, start_exporter, start_prometheus
from stand_in_receiver import Receiver
from verl_mixin import local


class AlertingStack:
    """Exporter (``exporter_args``) -> Prometheus (rules scaled by ``time_scale``) -> Alertmanager
    -> ``receiver``. ``close`` stops everything it started."""

    def __init__(self, tmp_path: Path, exporter_args: list[str], *, time_scale: float,
                 exporter_env: dict | None = None, am_config_edit: Callable[[dict, str], dict] | None = None):
        self.receiver = Receiver().__enter__()
        am_config = tmp_path / "alertmanager.yml"
        config = local.alertmanager_config(self.receiver.url, tmp_path / "secrets")
        if am_config_edit is not None:  # (config, the receiver's URL) -> the config to run
            config = am_config_edit(config, self.receiver.url)
        am_config.write_text(yaml.safe_dump(config))
        self.alertmanager = start_alertmanager(tmp_path, am_config)
        self.exporter = start_exporter(tmp_path, *exporter_args, env=exporter_env)
        # Every runbook_url at this exporter's /runbook, as the shipped rules point at localhost:9945.
        self.runbook_url = f"{self.exporter.url}/runbook"
        rules = local.write_rules(tmp_path / "rules", time_scale=time_scale, min_range=3, runbook_url=self.runbook_url)
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


class ChatReceiver(Receiver):
    """The stand-in receiver, also answering like the chat APIs that Alertmanager calls itself, so its
    WeCom and Telegram notifiers complete: WeCom's ``GET .../gettoken`` gets an access token and
    ``POST .../message/send`` errcode 0; Telegram's ``POST .../bot<token>/sendMessage`` gets the sent
    message. GETs are recorded too (payload: the query's parameters); everything else is as before."""

    ACCESS_TOKEN = "dummy-access-token"

    def __init__(self, port: int = 0):
        super().__init__(port)
        receiver = self

        class Handler(self.server.RequestHandlerClass):
            def _reply(self, reply: dict) -> None:
                body = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                url = urllib.parse.urlsplit(self.path)
                receiver._record(self.path, dict(urllib.parse.parse_qsl(url.query)))
                if url.path.endswith("/gettoken"):
                    self._reply({"errcode": 0, "errmsg": "ok", "access_token": receiver.ACCESS_TOKEN,
                                 "expires_in": 7200})
                else:
                    self._reply({})

            def do_POST(self) -> None:  # noqa: N802
                path = urllib.parse.urlsplit(self.path).path
                if not (path.endswith("/message/send") or re.search(r"/bot[^/]+/sendMessage$", path)):
                    super().do_POST()
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                payload = json.loads(body or b"{}")
                receiver._record(self.path, payload)
                if path.endswith("/message/send"):
                    self._reply({"errcode": 0, "errmsg": "ok"})
                else:
                    chat = payload.get("chat_id", "0")
                    self._reply({"ok": True, "result": {
                        "message_id": len(receiver.received()), "date": 0, "text": payload.get("text", ""),
                        "chat": {"id": int(chat) if str(chat).lstrip("-").isdigit() else 0, "type": "group"}}})

        self.server.RequestHandlerClass = Handler
