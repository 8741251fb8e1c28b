"""A stand-in for Slack and PagerDuty on 127.0.0.1: records (and hands to a callback) every JSON body
Alertmanager POSTs to it, and answers as they do. The demo prints what it receives; the end-to-end
tests read it. Alertmanager reaches it through the config of ``verl_mixin.local``
(``PAGERDUTY_PATH``, ``SLACK_PATHS``).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


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
