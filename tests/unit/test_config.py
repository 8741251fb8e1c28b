import pytest

from verl_exporter import config
from verl_exporter.server import parse_listen_address


def test_defaults():
    settings = config.load([])
    assert settings.web_listen_address == ":9945"
    assert settings.web_telemetry_path == "/metrics"
    assert settings.source == []
    assert settings.collector_gpu is True and settings.collector_host is True


def test_flags_in_node_exporter_style():
    settings = config.load([
        "--web.listen-address", "127.0.0.1:9100", "--source", "/a/*.log", "--source", "/b.jsonl",
        "--no-collector.gpu", "--project", "p", "--experiment", "e", "--job.pid", "42", "--log.level", "debug",
    ])
    assert settings.web_listen_address == "127.0.0.1:9100"
    assert settings.source == ["/a/*.log", "/b.jsonl"]
    assert settings.collector_gpu is False
    assert (settings.project, settings.experiment, settings.job_pid) == ("p", "e", 42)


def test_config_file_with_flags_taking_precedence(tmp_path):
    path = tmp_path / "exporter.yml"
    path.write_text("web.listen-address: ':9999'\nsource: /runs/x.jsonl\ncollector.host: false\n"
                    "store.max-runs: 5\n")
    settings = config.load(["--config.file", str(path), "--web.listen-address", ":1234"])
    assert settings.web_listen_address == ":1234"
    assert settings.source == ["/runs/x.jsonl"]
    assert settings.collector_host is False
    assert settings.store_max_runs == 5


@pytest.mark.parametrize("text, message", [
    ("web.listen-address: [unclosed\n", "not valid YAML"),
    ("- a\n- b\n", "want a mapping"),
    ("no.such-setting: 1\n", "unknown setting"),
    ("collector.gpu: maybe\n", "collector.gpu"),
    ("store.max-runs: lots\n", "store.max-runs"),
])
def test_bad_config_file_gives_a_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(config.ConfigError, match=message):
        config.load(["--config.file", str(path)])


def test_unreadable_config_file(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot read config file"):
        config.load(["--config.file", str(tmp_path / "missing.yml")])


@pytest.mark.parametrize("argv, message", [
    (["--source.format", "xml"], "source.format"),
    (["--web.telemetry-path", "metrics"], "telemetry-path"),
    (["--store.max-runs", "0"], "max-runs"),
    (["--log.level", "chatty"], "log.level"),
    (["--job.match", "("], "job.match"),
])
def test_bad_values(argv, message):
    with pytest.raises(config.ConfigError, match=message):
        config.load(argv)


@pytest.mark.parametrize("address, parsed", [
    (":9945", ("", 9945)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9945", ("::1", 9945)),
])
def test_listen_address(address, parsed):
    assert parse_listen_address(address) == parsed


@pytest.mark.parametrize("address", ["9945", "host:", "host:http", ":70000"])
def test_bad_listen_address(address):
    with pytest.raises(ValueError, match="listen address"):
        parse_listen_address(address)
