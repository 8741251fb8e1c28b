"""Exporter.reload (what SIGHUP runs), in-process: all or nothing, on the same listener; a value of
the wrong type changes nothing and stops nothing."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from certs import PASSWORD, password_hash, write_web_config
from servers import http_get
from verl_exporter.app import Exporter
from verl_exporter.config.options import OPTIONS, Options, load_options


@pytest.fixture
def app(tmp_path):
    runs = tmp_path / "runs" / "gsm8k"
    runs.mkdir(parents=True)
    for name in ("a", "b"):
        (runs / f"{name}.jsonl").write_text(json.dumps({"step": 1, "data": {"actor/pg_clipfrac": 0.1}}) + "\n")
    config_file = tmp_path / "exporter.yml"
    web_file = write_web_config(tmp_path / "web.yml", {})
    written = {"source": [str(runs / "a.jsonl")], "gpu.fake": "healthy:1", "collector.host": False,
               "web.config.file": str(web_file)}
    config_file.write_text(yaml.safe_dump(written))
    argv = ["--config.file", str(config_file)]
    exporter = Exporter(load_options(argv), argv=argv)
    exporter.start(("127.0.0.1", 0))
    exporter.test = {"config_file": config_file, "web_file": web_file, "written": written, "runs": runs}
    yield exporter
    exporter.stop()
    logging.getLogger().setLevel(logging.WARNING)


def url(app, path: str) -> str:
    return f"http://127.0.0.1:{app.server.server_address[1]}{path}"


def rewrite(app, **changes) -> None:
    app.test["written"].update(changes)
    app.test["config_file"].write_text(yaml.safe_dump(app.test["written"]))


def test_a_good_options_file_takes_effect(app):
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


def test_a_bad_options_file_changes_nothing(app, caplog):
    before = app.options
    for bad in ("source: [\n", "no.such-option: 1\n", "store.max-runs: -1\n", "log.level: loud\n"):
        app.test["config_file"].write_text(bad)
        assert not app.reload()
        assert app.options is before and http_get(url(app, "/metrics"))[0] == 200
    assert caplog.text.count("reloading the options failed") == 4


@pytest.mark.parametrize("bad, option", [
    ({"web.telemetry-path": None}, "web.telemetry-path"),
    ({"source.poll-interval": None}, "source.poll-interval"),
    ({"log.level": None}, "log.level"),
    ({"log.level": ["a"]}, "log.level"),
    ({"store.max-runs": "x"}, "store.max-runs"),
    ({"gpu.timeout": {"a": 1}}, "gpu.timeout"),
    ({"store.max-runs": True}, "store.max-runs"),
    ({"source.poll-interval": False}, "source.poll-interval"),
    ({"collector.gpu": 1}, "collector.gpu"),
    ({"source": None}, "source"),
    ({"source.format": ["jsonl"]}, "source.format"),
    ({"project": {"a": 1}}, "project"),
])
def test_a_value_of_the_wrong_type_is_logged_and_changes_nothing(app, caplog, bad, option):
    before, server, ingestor = app.options, app.server, app.ingestor
    rewrite(app, **{"log.level": "debug", **bad})  # with a good change: all or nothing
    with caplog.at_level(logging.INFO):
        assert not app.reload()
    failed = [record for record in caplog.records if "reloading the options failed" in record.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR and option in failed[0].getMessage()
    assert app.options is before and app.server is server and app.ingestor is ingestor and ingestor.running
    assert app.server.telemetry_path == "/metrics" and logging.getLogger().level != logging.DEBUG
    assert http_get(url(app, "/metrics"))[0] == 200


def test_a_bad_web_config_keeps_the_config_file_too(app):
    rewrite(app, **{"web.telemetry-path": "/other"})
    app.test["web_file"].write_text("basic_auth_users: {alice: plain}\n")
    assert not app.reload()
    assert app.server.telemetry_path == "/metrics" and app.options.web_telemetry_path == "/metrics"


def test_options_that_need_a_restart_keep_their_running_value(app, caplog):
    rewrite(app, **{"store.max-runs": 3, "collector.gpu": False, "log.level": "warn", "gpu.timeout": "500ms"})
    assert app.reload()
    assert app.options.store_max_runs == 1000 and app.options.collector_gpu is True and app.options.gpu_timeout == 2
    assert app.options.log_level == "warn"
    assert "only after a restart: collector.gpu, gpu.timeout, store.max-runs" in caplog.text


def _another_value(option, app):
    """A good value of ``option`` other than its running one, as the options file writes it."""
    special = {
        "web.listen-address": "127.0.0.1:1", "web.telemetry-path": "/other",
        "web.config.file": str(write_web_config(app.test["web_file"].with_name("other-web.yml"), {})),
        "source": [str(app.test["runs"] / "b.jsonl")], "source.format": "jsonl", "log.level": "error",
        "simulate.format": "jsonl", "job.match": "train.py", "job.pid": 4242, "gpu.backend": "nvml",
    }
    if option.flag in special:
        return special[option.flag]
    running = getattr(app.options, option.name)
    if isinstance(running, bool):
        return not running
    if isinstance(running, int):
        return running + 1
    if isinstance(running, float):
        return f"{int(running * 1000) + 1000}ms"
    return "other"


def test_every_option_is_either_reloaded_or_named_as_needing_a_restart(app, caplog):
    original = dict(app.test["written"])
    for option in OPTIONS:
        caplog.clear()
        running = getattr(app.options, option.name)
        rewrite(app, **{option.flag: _another_value(option, app)})
        assert app.reload(), option.flag
        if option.reloadable:
            assert getattr(app.options, option.name) != running, option.flag
            assert "only after a restart" not in caplog.text, option.flag
        else:
            assert getattr(app.options, option.name) == running, option.flag
            assert f"only after a restart: {option.flag}" in caplog.text, option.flag
        app.test["written"] = dict(original)  # back to the start, restart options included
        app.test["config_file"].write_text(yaml.safe_dump(original))
        caplog.clear()
        assert app.reload() and "only after a restart" not in caplog.text, option.flag
    assert isinstance(app.options, Options)


def test_a_new_web_config_applies_to_the_next_request(app):
    write_web_config(app.test["web_file"], {"basic_auth_users": {"alice": password_hash()}})
    assert app.reload()
    assert http_get(url(app, "/metrics"))[0] == 401
    import base64

    header = {"Authorization": "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()}
    assert http_get(url(app, "/metrics"), headers=header)[0] == 200


# --- fail closed: all or nothing, and no protection lost by accident ------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


def tls(pki, **extra) -> dict:
    return {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **extra}


def protect(app, pki, **tls_extra) -> None:
    """Turn TLS and basic auth on (a reload may always add protection)."""
    write_web_config(app.test["web_file"], {"tls_server_config": tls(pki, **tls_extra),
                                            "basic_auth_users": {"alice": password_hash()}})
    assert app.reload()
    assert app.web.tls_context is not None and app.web.users


def kept(app, web, before, caplog, *lost: str) -> None:
    """Nothing of the reload applied: the web config, the options, the log level; a WARNING names ``lost``."""
    assert app.web is web and app.server.web is web and app.options is before
    assert app.server.telemetry_path == "/metrics" and logging.getLogger().level != logging.DEBUG
    refused = [record for record in caplog.records if "reload refused" in record.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.WARNING, caplog.text
    assert all(what in refused[0].getMessage() for what in lost), refused[0].getMessage()


ACCIDENTALLY_EMPTY = {
    "empty": "",
    "comments only": "# tls_server_config:\n#   cert_file: server.crt\n# basic_auth_users:\n#   alice: x\n",
    "sections left null": "tls_server_config:\n  # cert_file: server.crt\nbasic_auth_users:\n  # alice: x\n",
    "a header only": "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
}


@pytest.mark.parametrize("text", ACCIDENTALLY_EMPTY.values(), ids=list(ACCIDENTALLY_EMPTY))
def test_a_web_config_that_would_turn_tls_and_auth_off_by_accident_is_refused(app, pki, caplog, text):
    protect(app, pki)
    web, before = app.web, app.options
    rewrite(app, **{"log.level": "debug", "web.telemetry-path": "/other"})  # all or nothing
    app.test["web_file"].write_text(text)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert not app.reload()
    kept(app, web, before, caplog, "TLS", "basic auth", "tls_server_config: {}", "basic_auth_users: {}")
    assert "options reloaded" not in caplog.text


def test_an_explicit_empty_section_turns_tls_or_auth_off_on_purpose(app, pki):
    protect(app, pki)
    write_web_config(app.test["web_file"], {"tls_server_config": {}, "basic_auth_users": {"alice": password_hash()}})
    assert app.reload()
    assert app.server.web.tls_context is None and app.server.web.users
    assert http_get(url(app, "/metrics"))[0] == 401
    write_web_config(app.test["web_file"], {"basic_auth_users": {}})
    assert app.reload()
    assert http_get(url(app, "/metrics"))[0] == 200


@pytest.mark.parametrize("case", ["file deleted", "file unreadable YAML", "web.config.file unset"])
def test_a_web_config_that_goes_away_keeps_the_running_one(app, pki, caplog, case):
    protect(app, pki)
    web, before = app.web, app.options
    rewrite(app, **{"log.level": "debug"})
    caplog.clear()
    if case == "file deleted":
        app.test["web_file"].unlink()
    elif case == "file unreadable YAML":
        app.test["web_file"].write_text("tls_server_config: [\n")
    else:
        del app.test["written"]["web.config.file"]
        rewrite(app)
    with caplog.at_level(logging.INFO):
        assert not app.reload()
    assert app.web is web and app.server.web is web and app.options is before
    assert logging.getLogger().level != logging.DEBUG and "options reloaded" not in caplog.text
    if case == "web.config.file unset":
        assert "reload refused" in caplog.text and "no longer set" in caplog.text
    else:
        assert "reloading the options failed" in caplog.text


def test_client_certificate_checks_are_not_dropped_by_accident(app, pki, caplog):
    protect(app, pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca))
    web = app.web
    write_web_config(app.test["web_file"], {"tls_server_config": tls(pki),  # client_auth_type commented out
                                            "basic_auth_users": {"alice": password_hash()}})
    assert not app.reload() and app.web is web
    assert "client certificate verification" in caplog.text
    write_web_config(app.test["web_file"], {"tls_server_config": tls(pki, client_auth_type="NoClientCert"),
                                            "basic_auth_users": {"alice": password_hash()}})
    assert app.reload() and app.web is not web


def test_a_good_options_file_with_a_bad_web_config_changes_nothing(app, caplog):
    before, sources, ingestor, web = app.options, dict(app.sources), app.ingestor, app.web
    rewrite(app, **{"log.level": "debug", "web.telemetry-path": "/other",
                    "source": [str(app.test["runs"] / "b.jsonl")]})
    for bad in ("basic_auth_users: {alice: plain}\n", "tls_server_config: {cert_file: /nope, key_file: /nope}\n",
                "nonsense: 1\n", "[\n"):
        app.test["web_file"].write_text(bad)
        assert not app.reload(), bad
        assert app.options is before and app.sources == sources and app.ingestor is ingestor and app.web is web
        assert logging.getLogger().level != logging.DEBUG and app.server.telemetry_path == "/metrics"
    assert caplog.text.count("reloading the options failed") == 4


def test_a_bad_options_file_with_a_good_web_config_changes_nothing(app):
    before, web = app.options, app.web
    write_web_config(app.test["web_file"], {"basic_auth_users": {"alice": password_hash()}})
    rewrite(app, **{"log.level": "loud"})
    assert not app.reload()
    assert app.options is before and app.web is web and app.server.web is web
    assert http_get(url(app, "/metrics"))[0] == 200  # no auth: the new users did not apply


def test_a_source_that_cannot_be_made_changes_nothing(app, monkeypatch, caplog):
    before, sources, ingestor = app.options, dict(app.sources), app.ingestor

    def broken(pattern, options):
        raise ValueError("no follower for this pattern")

    monkeypatch.setattr(app, "make_source", broken)
    rewrite(app, **{"log.level": "debug", "web.telemetry-path": "/other",
                    "source": [str(app.test["runs"] / "a.jsonl"), str(app.test["runs"] / "b.jsonl")]})
    assert not app.reload()
    assert app.options is before and app.sources == sources and app.ingestor is ingestor and ingestor.running
    assert logging.getLogger().level != logging.DEBUG and app.server.telemetry_path == "/metrics"
    assert "reloading the options failed" in caplog.text and "no follower" in caplog.text


def test_a_new_listen_address_is_named_and_the_listener_kept(app, caplog):
    server, port = app.server, app.server.server_address[1]
    rewrite(app, **{"web.listen-address": "127.0.0.1:1", "log.level": "debug"})
    assert app.reload()
    assert "only after a restart: web.listen-address" in caplog.text
    assert app.server is server and app.server.server_address[1] == port
    assert app.options.web_listen_address != "127.0.0.1:1"
    assert http_get(url(app, "/metrics"))[0] == 200 and logging.getLogger().level == logging.DEBUG


def test_a_listen_address_that_could_never_be_served_is_an_error_now(app, caplog):
    before = app.options
    rewrite(app, **{"web.listen-address": "nonsense", "log.level": "debug"})
    assert not app.reload() and app.options is before
    assert "reloading the options failed" in caplog.text and "listen address" in caplog.text
