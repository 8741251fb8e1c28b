"""The shipped rules and Alertmanager config, adapted to run on loopback (end-to-end tests, demo).

Only addresses, secrets, timings and durations change: the rules are the shipped definitions
rendered with a time scale, the Alertmanager config is alerts/alertmanager.yml with its secret
files, PagerDuty URL and group timings replaced. A ``Receiver`` stands in for Slack and PagerDuty.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import yaml

from . import render

ALERTMANAGER_CONFIG = render.REPO / "alerts" / "alertmanager.yml"
TEMPLATES = render.REPO / "alerts" / "templates"
DUMMY_ROUTING_KEY = "dummyroutingkey0123456789abcdef0"  # 32 characters, like a real one
PAGERDUTY_PATH = "/pagerduty/v2/enqueue"
SLACK_PATHS = {"slack-alerts": "/slack/alerts", "slack-low-priority": "/slack/low-priority"}


def write_rules(directory: Path, *, time_scale: float = 1.0, min_range: float = 0.0) -> list[Path]:
    """The alert and recording rules, durations scaled by ``time_scale``, written to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    texts = render.rule_files(time_scale=time_scale, min_range=min_range)
    texts[Path(render.RECORDING_RULES_FILE).name] = render.recording_rules(time_scale=time_scale,
                                                                           min_range=min_range)
    paths = []
    for name, text in texts.items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def alertmanager_config(receiver_url: str, secrets_dir: Path, *, group_wait: str = "1s",
                        group_interval: str = "2s", repeat_interval: str = "1h") -> dict:
    """alerts/alertmanager.yml sending to ``receiver_url``: dummy secrets in ``secrets_dir``."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text(encoding="utf-8"))
    secrets_dir.mkdir(parents=True, exist_ok=True)
    config.setdefault("global", {})["pagerduty_url"] = receiver_url + PAGERDUTY_PATH
    config["templates"] = [str(TEMPLATES / "*.tmpl")]
    config["route"].update(group_wait=group_wait, group_interval=group_interval, repeat_interval=repeat_interval)
    for route in config["route"].get("routes", []):
        route.pop("repeat_interval", None)
    for receiver in config["receivers"]:
        for pagerduty in receiver.get("pagerduty_configs", []):
            pagerduty["routing_key_file"] = _secret(secrets_dir, "pagerduty-routing-key", DUMMY_ROUTING_KEY)
        for slack in receiver.get("slack_configs", []):
            url = receiver_url + SLACK_PATHS[receiver["name"]]
            slack["api_url_file"] = _secret(secrets_dir, f"{receiver['name']}-webhook-url", url)
    return config


def _secret(directory: Path, name: str, value: str) -> str:
    path = directory / name
    path.write_text(value + "\n", encoding="utf-8")
    return str(path)


def prometheus_config(exporter: str, alertmanager: str, rule_files: list[Path], *, interval: str = "1s") -> dict:
    """Prometheus scraping ``exporter`` (host:port) as job "verl", alerting to ``alertmanager``."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{"job_name": "verl", "scrape_timeout": interval,
                            "static_configs": [{"targets": [exporter]}]}],
    }


class Receiver:
    """An HTTP server on 127.0.0.1 that records every JSON body POSTed to it (Slack, PagerDuty)."""

    def __init__(self, port: int = 0, on_notification: Callable[[str, dict], None] | None = None):
        self.notifications: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        self._callback = on_notification
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    payload = json.loads(body or b"{}")
                except ValueError:
                    payload = {"unparsed": body.decode("utf-8", "replace")}
                receiver._record(self.path, payload)
                pagerduty = self.path.startswith("/pagerduty")
                reply = b'{"status":"success","message":"Event processed"}' if pagerduty else b"ok"
                self.send_response(202 if pagerduty else 200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="receiver", daemon=True)

    def _record(self, path: str, payload: dict) -> None:
        with self._lock:
            self.notifications.append((path, payload))
        if self._callback:
            self._callback(path, payload)

    def received(self, prefix: str = "") -> list[dict]:
        """Bodies received on paths starting with ``prefix`` (``/slack``, ``/pagerduty``)."""
        with self._lock:
            return [payload for path, payload in self.notifications if path.startswith(prefix)]

    def __enter__(self) -> "Receiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def describe(path: str, payload: dict) -> str:
    """One notification as a short readable text (the demo prints it)."""
    if path.startswith("/pagerduty"):
        details = payload.get("payload", {})
        return (f"PagerDuty {payload.get('event_action', '?')}: {details.get('summary', '')}\n"
                f"{details.get('custom_details', {}).get('alerts', '')}")
    attachment = (payload.get("attachments") or [{}])[0]
    return f"Slack {payload.get('channel', path)}: {attachment.get('title', '')}\n{attachment.get('text', '')}"
