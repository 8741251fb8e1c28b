"""Exporter.reload (what SIGHUP runs), in-process: all or nothing, on the same listener."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from certs import PASSWORD, password_hash, write_web_config
from servers import http_get
from verl_exporter import config
from verl_exporter.cli import Exporter


@pytest.fixture
def app(tmp_path):
    runs = tmp_path / "runs" / "gsm8k"
    runs.mkdir(parents=True)
    for name in ("a", "b"):
        (runs / f"{name}.jsonl").write_text(json.dumps({"step": 1, "data": {"actor/pg_clipfrac": 0.1}}) + "\n")
    config_file = tmp_path / "exporter.yml"
    web_file = write_web_config(tmp_path / "web.yml", {})
    settings = {"source": [str(runs / "a.jsonl")], "gpu.fake": "healthy:1", "collector.host": False,
                "web.config.file": str(web_file)}
    config_file.write_text(yaml.safe_dump(settings))
    argv = ["--config.file", str(config_file)]
    exporter = Exporter(config.load(argv), argv=argv)
    exporter.start(("127.0.0.1", 0))
    exporter.test = {"config_file": config_file, "web_file": web_file, "settings": settings, "runs": runs}
    yield exporter
    exporter.stop()
    logging.getLogger().setLevel(logging.WARNING)


def url(app, path: str) -> str:
    return f"http://127.0.0.1:{app.server.server_address[1]}{path}"


def rewrite(app, **changes) -> None:
    app.test["settings"].update(changes)
    app.test["config_file"].write_text(yaml.safe_dump(app.test["settings"]))


def test_a_good_config_file_takes_effect(app):
    server, source_a = app.server, next(iter(app.sources.values()))
    rewrite(app, **{"web.telemetry-path": "/verl-metrics", "log.level": "debug",
                    "source": [str(app.test["runs"] / "a.jsonl"), str(app.test["runs"] / "b.jsonl")]})
    assert app.reload()
    assert app.server is server and http_get(url(app, "/verl-metrics"))[0] == 200
    assert http_get(url(app, "/metrics"))[0] == 404
    assert logging.getLogger().level == logging.DEBUG
    assert len(app.sources) == 2 and source_a in app.sources.values()  # kept, not re-read
    assert app.ingestor.running and len(app.ingestor.sources) == 2
    rewrite(app, source=[str(app.test["runs"] / "b.jsonl")])
    assert app.reload() and [key[0] for key in app.sources] == [str(app.test["runs"] / "b.jsonl")]


def test_a_bad_config_file_changes_nothing(app, caplog):
    before = vars(app.settings).copy()
    for bad in ("source: [\n", "no.such-setting: 1\n", "store.max-runs: -1\n", "log.level: loud\n"):
        app.test["config_file"].write_text(bad)
        assert not app.reload()
        assert vars(app.settings) == before and http_get(url(app, "/metrics"))[0] == 200
    assert caplog.text.count("reloading the configuration failed") == 4


def test_a_bad_web_config_keeps_the_config_file_too(app):
    rewrite(app, **{"web.telemetry-path": "/other"})
    app.test["web_file"].write_text("basic_auth_users: {alice: plain}\n")
    assert not app.reload()
    assert app.server.telemetry_path == "/metrics" and app.settings.web_telemetry_path == "/metrics"


def test_settings_that_need_a_restart_keep_their_running_value(app, caplog):
    rewrite(app, **{"store.max-runs": 3, "collector.gpu": False, "log.level": "warn"})
    assert app.reload()
    assert app.settings.store_max_runs == 1000 and app.settings.collector_gpu is True
    assert app.settings.log_level == "warn"
    assert "only after a restart: collector.gpu, store.max-runs" in caplog.text


def test_a_new_web_config_applies_to_the_next_request(app):
    write_web_config(app.test["web_file"], {"basic_auth_users": {"alice": password_hash()}})
    assert app.reload()
    assert http_get(url(app, "/metrics"))[0] == 401
    import base64

    header = {"Authorization": "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()}
    assert http_get(url(app, "/metrics"), headers=header)[0] == 200
