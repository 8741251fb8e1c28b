"""The exporter's options: one table, typed values from flags, the options file and the
environment, one duration grammar, and a clear OptionsError for a value of the wrong type."""

import re
import signal
import subprocess
import sys

import pytest
import yaml

from verl_exporter.cli import main
from verl_exporter.config import options as options_module
from verl_exporter.config.option_kinds import Duration
from verl_exporter.config.options import OPTIONS, Options, OptionsError, load_options
from verl_exporter.http.server import parse_listen_address


def load_file(tmp_path, text: str, *argv: str) -> Options:
    path = tmp_path / "exporter.yml"
    path.write_text(text)
    return load_options(["--config.file", str(path), *argv])


def test_defaults():
    options = load_options([])
    assert options == Options()
    assert options.web_listen_address == ":9945"
    assert options.web_telemetry_path == "/metrics"
    assert options.source == ()
    assert options.collector_gpu is True and options.collector_host is True
    assert (options.source_poll_interval, options.gpu_timeout, options.simulate_interval) == (0.5, 2.0, 1.0)
    assert (options.store_retention, options.store_idle_retention) == (0.0, 0.0)
    assert (options.forensics_stall_after, options.forensics_check_interval) == (600.0, 15.0)


def test_options_are_frozen():
    with pytest.raises(AttributeError):
        load_options([]).gpu_timeout = 1.0


def test_flags_in_node_exporter_style():
    options = load_options([
        "--web.listen-address", "127.0.0.1:9100", "--source", "/a/*.log", "--source", "/b.jsonl",
        "--no-collector.gpu", "--project", "p", "--experiment", "e", "--job.pid", "42", "--log.level", "debug",
    ])
    assert options.web_listen_address == "127.0.0.1:9100"
    assert options.source == ("/a/*.log", "/b.jsonl")
    assert options.collector_gpu is False
    assert (options.project, options.experiment, options.job_pid) == ("p", "e", 42)
    assert options.log_level == "debug"


def test_options_file_with_flags_taking_precedence(tmp_path):
    options = load_file(tmp_path, "web.listen-address: ':9999'\nsource: /runs/x.jsonl\ncollector.host: false\n"
                        "store.max-runs: 5\nexperiment: 7\n", "--web.listen-address", ":1234")
    assert options.web_listen_address == ":1234"
    assert options.source == ("/runs/x.jsonl",)
    assert options.collector_host is False
    assert options.store_max_runs == 5
    assert options.experiment == "7"  # a number is a fine name


def test_environment_between_the_file_and_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_EXPORTER_PROJECT", "from-env")
    assert load_options([]).project == "from-env"
    assert load_file(tmp_path, "project: from-file\n").project == "from-file"
    assert load_file(tmp_path, "project: from-file\n", "--project", "from-flag").project == "from-flag"


def test_unset_by_default_may_be_unset_in_the_file(tmp_path):
    options = load_file(tmp_path, "web.config.file: null\njob.pid: null\nproject: ~\n")
    assert (options.web_config_file, options.job_pid, options.project) == (None, None, None)


# -- durations -------------------------------------------------------------------------------------

DURATIONS = [option.flag for option in OPTIONS if isinstance(option.kind, Duration)]


def test_the_durations():
    assert sorted(DURATIONS) == sorted([
        "store.retention", "store.idle-retention", "forensics.stall-after", "forensics.check-interval",
        "source.poll-interval", "gpu.timeout", "simulate.interval", "slurm.poll-interval"])


@pytest.mark.parametrize("flag", DURATIONS)
@pytest.mark.parametrize("text, seconds", [("2", 2.0), ("0.25", 0.25), ("500ms", 0.5), ("90s", 90.0),
                                           ("1h30m", 5400.0), ("7d", 604800.0)])
def test_a_duration_flag(flag, text, seconds):
    assert getattr(load_options([f"--{flag}", text]), options_module.attr(flag)) == seconds


@pytest.mark.parametrize("flag", DURATIONS)
@pytest.mark.parametrize("value, seconds", [(2, 2.0), (1.5, 1.5), ("250ms", 0.25), ("2m", 120.0)])
def test_a_duration_in_the_options_file(tmp_path, flag, value, seconds):
    options = load_file(tmp_path, yaml.safe_dump({flag: value}))
    assert getattr(options, options_module.attr(flag)) == seconds


@pytest.mark.parametrize("flag", DURATIONS)
@pytest.mark.parametrize("text", ["x", "-1", "-1s", "10 minutes", "1.5m", "1s1h", "5 s", "inf", "nan", "1e3",
                                  "1000y"])
def test_a_bad_duration_flag(flag, text):
    with pytest.raises(OptionsError, match=f"^--{flag} must be"):
        load_options([f"--{flag}={text}"])


@pytest.mark.parametrize("flag, positive", [("source.poll-interval", True), ("gpu.timeout", True),
                                            ("forensics.stall-after", True), ("forensics.check-interval", True),
                                            ("store.retention", False), ("store.idle-retention", False),
                                            ("simulate.interval", False)])
def test_zero_where_zero_means_nothing(flag, positive):
    if positive:
        with pytest.raises(OptionsError, match=f"--{flag} must be positive"):
            load_options([f"--{flag}", "0s"])
    else:
        assert getattr(load_options([f"--{flag}", "0"]), options_module.attr(flag)) == 0.0


# -- values of the wrong type ----------------------------------------------------------------------

MISTYPED = [
    ("web.telemetry-path: null\n", "web.telemetry-path must be a string"),
    ("web.telemetry-path: [a]\n", "web.telemetry-path must be a string"),
    ("web.telemetry-path: metrics\n", "web.telemetry-path must start with /"),
    ("source.poll-interval: null\n", "source.poll-interval must be a duration"),
    ("source.poll-interval: true\n", "source.poll-interval must be a duration"),
    ("log.level: null\n", "log.level must be one of debug, info, warn, error"),
    ("log.level: [a]\n", "log.level must be one of"),
    ("log.level: loud\n", "log.level must be one of"),
    ("store.max-runs: x\n", "store.max-runs must be a whole number"),
    ("store.max-runs: true\n", "store.max-runs must be a whole number"),
    ("store.max-runs: 2.5\n", "store.max-runs must be a whole number"),
    ("store.max-runs: null\n", "store.max-runs must be a whole number"),
    ("store.max-runs: -1\n", "store.max-runs must be positive"),
    ("gpu.timeout: {a: 1}\n", "gpu.timeout must be a duration"),
    ("gpu.timeout: false\n", "gpu.timeout must be a duration"),
    ("store.retention: .nan\n", "store.retention must be a duration"),
    ("store.retention: -5\n", "store.retention must be a duration"),
    ("collector.gpu: 1\n", "collector.gpu must be true or false"),
    ("collector.gpu: maybe\n", "collector.gpu must be true or false"),
    ("collector.gpu: null\n", "collector.gpu must be true or false"),
    ("forensics: 0\n", "forensics must be true or false"),
    ("source: null\n", "source must be a path or a list of paths"),
    ("source: [/a.jsonl, 3]\n", "source must be a path or a list of paths"),
    ("source.format: null\n", "source.format must be one of auto, jsonl, console, config"),
    ("simulate.format: yaml\n", "simulate.format must be one of jsonl, console"),
    ("project: true\n", "project must be a string"),
    ("job.match: '('\n", "job.match is not a valid regular expression"),
    ("job.pid: abc\n", "job.pid must be a whole number"),
]


@pytest.mark.parametrize("text, message", MISTYPED)
def test_a_value_of_the_wrong_type_names_the_option(tmp_path, text, message):
    with pytest.raises(OptionsError, match=message) as error:
        load_file(tmp_path, text)
    assert str(error.value).startswith(f"options file {tmp_path / 'exporter.yml'}: ")
    assert "\n" not in str(error.value)


@pytest.fixture
def signal_handlers():
    """main() installs its own; put pytest's back."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("text, message", MISTYPED[:14])
def test_a_value_of_the_wrong_type_at_start_is_one_line_and_exit_2(tmp_path, capsys, signal_handlers, text,
                                                                      message):
    path = tmp_path / "exporter.yml"
    path.write_text(text)
    assert main(["--config.file", str(path), "--web.listen-address", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("verl-exporter: error: options file ") and message in err


def test_a_bad_flag_value_exits_2_with_one_line():
    result = subprocess.run([sys.executable, "-m", "verl_exporter", "--gpu.timeout", "x"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("verl-exporter: error: --gpu.timeout must be a duration such as 500ms, 30s, 10m or "
                             "1h30m, not 'x'\n")


@pytest.mark.parametrize("text, message", [
    ("web.listen-address: [unclosed\n", "not valid YAML"),
    ("- a\n- b\n", "want a mapping"),
    ("no.such-option: 1\n", "unknown option"),
    ("1: 2\n", "unknown option"),
])
def test_bad_options_file_gives_a_clear_error(tmp_path, text, message):
    with pytest.raises(OptionsError, match=message):
        load_file(tmp_path, text)


def test_unreadable_options_file(tmp_path):
    with pytest.raises(OptionsError, match="cannot read options file"):
        load_options(["--config.file", str(tmp_path / "missing.yml")])
    (tmp_path / "binary.yml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(OptionsError, match="cannot read options file"):
        load_options(["--config.file", str(tmp_path / "binary.yml")])


@pytest.mark.parametrize("argv, message", [
    (["--source.format", "xml"], "source.format"),
    (["--web.telemetry-path", "metrics"], "telemetry-path"),
    (["--store.max-runs", "0"], "max-runs"),
    (["--log.level", "chatty"], "log.level"),
    (["--job.match", "("], "job.match"),
    (["--job.pid", "0"], "job.pid must be positive"),
    (["--source.max-open-files", "1.5"], "source.max-open-files must be a whole number"),
])
def test_bad_values(argv, message):
    with pytest.raises(OptionsError, match=message):
        load_options(argv)


def test_choices_any_case_and_the_documented_source_formats():
    from verl_exporter.sources import FORMATS

    assert options_module.SOURCE_FORMATS == FORMATS
    assert load_options(["--source.format", "config"]).source_format == "config"
    assert load_options(["--log.level", "WARNING"]).log_level == "warn"
    assert options_module.log_level(load_options(["--log.level", "warn"])) == "WARNING"


# -- the table, --help and docs/configuration.md ---------------------------------------------------


def test_every_option_is_typed_and_its_default_parses_as_itself():
    for option in OPTIONS:
        assert option.name == options_module.attr(option.flag)
        if option.default is not None:
            assert option.parse(option.default) == option.default, option.flag


def test_the_reloadable_options():
    assert {option.flag for option in OPTIONS if option.reloadable} == {
        "log.level", "web.telemetry-path", "web.config.file", "source", "source.format", "source.poll-interval",
        "project", "experiment", "slurm.poll-interval"}


def test_help_shows_durations_and_what_sighup_reloads(capsys):
    with pytest.raises(SystemExit) as exit_:
        load_options(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--gpu.timeout DURATION time one scrape may spend in NVML (default: 2s)" in text
    assert "(default: 500ms; reloaded on SIGHUP)" in text
    assert "--forensics.stall-after DURATION" in text and "(default: 10m)" in text
    assert text.count("reloaded on SIGHUP") == 1 + len([o for o in OPTIONS if o.reloadable]) + 1  # + config.file


def test_the_configuration_docs_table_lists_every_option_and_what_sighup_does_with_it():
    from servers import REPO

    docs = (REPO / "docs" / "configuration.md").read_text()
    table = docs[docs.index("| flag | default | on SIGHUP | meaning |"):]
    rows = [row.split(" | ") for row in table[:table.index("\n\n")].splitlines()[2:]]

    def mentions(cells, flag):  # the flag cell names it; the simulated run's row names its options in its text
        text = " ".join(cells) if flag.startswith("simulate.") else cells[0]
        return (re.search(rf"`--(\[no-\])?{re.escape(flag)}[` ]", text) is not None
                or (flag.startswith("collector.") and "`--[no-]collector." in cells[0]))

    for option in OPTIONS:
        marks = {cells[2] for cells in rows if mentions(cells, option.flag)}
        assert marks == {"reloads" if option.reloadable else "restart"}, option.flag
    assert [cells[2] for cells in rows if "`--config.file`" in cells[0]] == ["reloads"]


@pytest.mark.parametrize("address, parsed", [
    (":9945", ("", 9945)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9945", ("::1", 9945)),
])
def test_listen_address(address, parsed):
    assert parse_listen_address(address) == parsed


@pytest.mark.parametrize("address", ["9945", "host:", "host:http", ":70000"])
def test_bad_listen_address(address):
    with pytest.raises(ValueError, match="listen address"):
        parse_listen_address(address)
