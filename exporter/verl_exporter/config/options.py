"""The exporter's options: command-line flags in the node_exporter style, optionally from a YAML file.

One table, the fields of :class:`Options`, defines every option: its flag, type, default, help,
environment variable and whether SIGHUP applies it without a restart. Every flag ``--a.b-c`` can
also be set in the ``--config.file`` options file as ``a.b-c: value``; flags given on the command
line win over the file, the file over the environment variables some options read
(``VERL_EXPORTER_PROJECT``, ``VERL_EXPORTER_EXPERIMENT``), those over the defaults.

Every value is checked against its option's type wherever it comes from, so a mistyped value in
the file (``null``, a list, ``true`` for a number) is an :class:`OptionsError` that names the
option, at start as on a reload. Durations are written in the project's one grammar
(:func:`verl_exporter.config.durations.parse_duration`: ``500ms``, ``30s``, ``1h30m``; a bare number is
seconds) and held as floats of seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, NoReturn

import yaml

from verl_exporter import __version__
from verl_exporter.config.bounded_files import FileTooLarge, NotRegularFile, read_regular_file
from verl_exporter.config.option_kinds import (
    COUNT,
    DURATION,
    SWITCH,
    TEXT,
    Choice,
    Count,
    Duration,
    Kind,
    Paths,
    Switch,
    Text,
    _shown,
)
from verl_exporter.config.yaml_files import AliasRefused, NoAliasLoader

DEFAULT_PORT = 9945
SOURCE_FORMATS = ("auto", "jsonl", "console", "config")  # the formats sources.Source reads
GPU_BACKENDS = ("auto", "nvml", "amdsmi")  # the choices gpu_backends.make_backend takes


class OptionsError(Exception):
    """An option value that cannot be used; the message is shown to the user as is."""


def _telemetry_path(path: str) -> None:
    if not path.startswith("/") or path.startswith("/-/"):
        raise ValueError(f"must start with / (and not /-/), not {_shown(path)}")
    if path == "/debug/evidence":
        raise ValueError("cannot be /debug/evidence: the evidence of stalled runs is served there")


def _regex(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"is not a valid regular expression: {exc}") from None


# -- the table -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    flag: str
    kind: Kind
    default: Any
    help: str
    env: str | None = None  # environment variable read when neither a flag nor the file sets it
    reloadable: bool = False  # SIGHUP applies a new value without a restart

    @property
    def name(self) -> str:
        """The attribute of :class:`Options` that holds it."""
        return attr(self.flag)

    def parse(self, value: Any) -> Any:
        """The value of ``value`` for this option; ValueError says what is wrong with it."""
        if value is None and self.default is None:
            return None  # an option that is unset by default may be unset explicitly (``null``)
        return self.kind.parse(value)


def attr(flag: str) -> str:
    """The Options attribute of a flag: ``web.listen-address`` -> ``web_listen_address``."""
    return flag.replace(".", "_").replace("-", "_")


def _option(flag: str, kind: Kind, default: Any, help: str, env: str | None = None,
            reloadable: bool = False) -> Any:
    option = Option(flag, kind, default, help, env, reloadable)
    return field(default=default, metadata={"option": option})


@dataclass(frozen=True)
class Options:
    """The exporter's options, typed; durations are floats of seconds."""

    web_listen_address: str = _option(
        "web.listen-address", Text("[HOST]:PORT"), f":{DEFAULT_PORT}", "address to serve on, [HOST]:PORT")
    web_telemetry_path: str = _option(
        "web.telemetry-path", Text("PATH", check=_telemetry_path), "/metrics", "path under which to expose metrics",
        reloadable=True)
    web_config_file: str | None = _option(
        "web.config.file", Text("FILE"), None,
        "exporter-toolkit web config (YAML): TLS, basic auth, response headers", reloadable=True)
    source: tuple[str, ...] = _option(
        "source", Paths(), (), "verl FileLogger JSONL file or console log to follow; a path or a glob (repeatable)",
        reloadable=True)
    source_format: str = _option(
        "source.format", Choice(*SOURCE_FORMATS), "auto",
        "jsonl, console, config (a run's config), or auto (.jsonl/.json are JSONL, .yaml a run's config, "
        "others console)", reloadable=True)
    run_config: str | None = _option(
        "run.config", Text("FILE"), None, "the run config: hydra's .hydra/config.yaml or a saved config print, "
        "when the logs followed do not print it (a JSONL-only run)")
    source_poll_interval: float = _option(
        "source.poll-interval", Duration(positive=True), 0.5, "time between reads of the sources", reloadable=True)
    source_max_open_files: int = _option(
        "source.max-open-files", COUNT, 256, "cap on log files held open at once; others are reopened by path "
        "and inode when they grow")
    project: str | None = _option(
        "project", TEXT, None, "trainer.project_name of the run; on a node without logs, the run its GPUs work for "
        "(default: $VERL_EXPORTER_PROJECT, else from the run config verl prints, else the source file's directory "
        "name)", env="VERL_EXPORTER_PROJECT", reloadable=True)
    experiment: str | None = _option(
        "experiment", TEXT, None, "trainer.experiment_name of the run; on a node without logs, the run its GPUs "
        "work for (default: $VERL_EXPORTER_EXPERIMENT, else from the run config verl prints, else the source "
        "file's name)", env="VERL_EXPORTER_EXPERIMENT", reloadable=True)
    node_max_runs: int = _option(
        "node.max-runs", COUNT, 8, "most unfinished runs followed for which this node's GPUs and host still count "
        "as theirs; an exporter following more reads a shared log directory and is none of their nodes (then "
        "only the run of --project/--experiment counts)")
    collector_training: bool = _option("collector.training", SWITCH, True, "training metrics from the sources")
    collector_gpu: bool = _option("collector.gpu", SWITCH, True, "GPU metrics through NVML or amdsmi")
    collector_host: bool = _option("collector.host", SWITCH, True, "host and job metrics through psutil")
    job_pid: int | None = _option(
        "job.pid", Count(), None, "PID of the training job; its child processes count too")
    job_match: str | None = _option(
        "job.match", Text("REGEX", check=_regex), None, "regular expression on the command line of the job's processes")
    slurm: bool = _option(
        "slurm", SWITCH, False, "daemon mode for a Slurm compute node: find every Slurm job running on it (its "
        "processes' SLURM_JOB_ID or job cgroup), follow the output files scontrol names for it without --source, "
        "and serve verl_job_info for its runs; excludes --job.pid and --job.match")
    slurm_poll_interval: float = _option(
        "slurm.poll-interval", Duration(positive=True), 10.0, "time between looks for Slurm jobs starting and "
        "ending on this node (with --slurm)", reloadable=True)
    owner_teams: str | None = _option(
        "owner.teams", Text("FILE"), None, "YAML file mapping each team to its users (team: [user, ...]): the team "
        "label of the runs they own, which the shipped Alertmanager routes training alerts by; a user it does not "
        "name is in their Slurm job's account, else the pod's Kubernetes namespace, else in none")
    gpu_backend: str = _option(
        "gpu.backend", Choice(*GPU_BACKENDS), "auto", "GPU library: nvml (NVIDIA), amdsmi (AMD ROCm), or auto (NVML "
        "when it initialises, else amdsmi)")
    gpu_timeout: float = _option("gpu.timeout", Duration(positive=True), 2.0, "time one scrape may spend in NVML")
    gpu_pcie_throughput: bool = _option(
        "gpu.pcie-throughput", SWITCH, False, "also sample PCIe throughput (NVML takes ~20 ms per GPU and "
        "direction for it)")
    gpu_fake: str | None = _option(
        "gpu.fake", Text("SCENARIO[:COUNT]"), None,
        "serve fake GPUs instead of NVML, SCENARIO[:COUNT] (demo and tests)")
    store_max_series_per_run: int = _option(
        "store.max-series-per-run", COUNT, 2000, "cap on exported series per run")
    store_max_runs: int = _option("store.max-runs", COUNT, 1000, "cap on runs followed")
    store_retention: float = _option(
        "store.retention", DURATION, 0.0, "drop a finished run this long after its last line was written; 0 keeps it")
    store_idle_retention: float = _option(
        "store.idle-retention", DURATION, 0.0, "drop a run with no new step for this long; 0 keeps it")
    forensics: bool = _option(
        "forensics", SWITCH, True, "capture evidence (py-spy stacks, log tails, errors, GPUs) once per stall of a "
        "run, served at /debug/evidence")
    forensics_stall_after: float = _option(
        "forensics.stall-after", Duration(positive=True), 600.0, "a run stalls after no step for this long, or "
        "for 5 times its median step time where that is longer")
    forensics_check_interval: float = _option(
        "forensics.check-interval", Duration(positive=True), 15.0, "how often the runs are checked for a stall")
    forensics_dir: str | None = _option(
        "forensics.dir", Text("DIR"), None, "directory to write each capture to, one file each (default: memory "
        "only)")
    forensics_retention: int = _option(
        "forensics.retention", COUNT, 50, "evidence files kept in --forensics.dir: the newest N")
    forensics_remote: bool = _option(
        "forensics.remote", SWITCH, False, "serve /debug/evidence (log lines, command lines, stacks) to clients "
        "other than this host's loopback without basic auth; off: they need basic auth (--web.config.file)")
    simulate: str | None = _option(
        "simulate", Text("SCENARIO"), None, "also write a simulated verl run with this scenario and follow it")
    simulate_format: str = _option(
        "simulate.format", Choice("jsonl", "console"), "console", "format of the simulated run")
    simulate_interval: float = _option("simulate.interval", DURATION, 1.0, "time between simulated steps")
    simulate_dir: str | None = _option(
        "simulate.dir", Text("DIR"), None, "directory for the simulated run's file (default: a temp dir)")
    log_level: str = _option(
        "log.level", Choice("debug", "info", "warn", "error", aliases={"warning": "warn"}), "info",
        "how much to log", reloadable=True)


OPTIONS: tuple[Option, ...] = tuple(item.metadata["option"] for item in dataclasses.fields(Options))
_BY_FLAG = {option.flag: option for option in OPTIONS}
assert all(item.name == option.name for item, option in zip(dataclasses.fields(Options), OPTIONS))


def changed(old: Options, new: Options) -> list[Option]:
    """The options whose values differ between ``old`` and ``new``, in table order."""
    return [option for option in OPTIONS if getattr(old, option.name) != getattr(new, option.name)]


# -- reading ---------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line and exit code 2, not the whole usage text."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


RELOAD_MARK = "reloaded on SIGHUP"


def _help(option: Option) -> str:
    notes = [f"default: {option.kind.show(option.default)}"] if option.default not in (None, ()) else []
    if option.reloadable:
        notes.append(RELOAD_MARK)
    text = f"{option.help} ({'; '.join(notes)})" if notes else option.help
    return text.replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="verl-exporter",
        description="Prometheus exporter for verl training runs, their GPUs and host. "
                    "Subcommand: 'verl-exporter simulate --help' writes a simulated run.",
        epilog=f"Durations: 500ms, 30s, 10m, 1h30m, 7d, or a bare number of seconds. SIGHUP reads --config.file "
               f"and --web.config.file again: options marked '{RELOAD_MARK}' take effect at once, the others at "
               f"the next start.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--version", action="version", version=f"verl-exporter {__version__}")
    parser.add_argument("--config.file", dest="config_file", metavar="FILE",
                        help=f"YAML options file: any of these options by flag name, e.g. 'gpu.timeout: 2s' "
                             f"({RELOAD_MARK})")
    for option in OPTIONS:
        kwargs: dict[str, Any] = {"dest": option.name, "help": _help(option)}
        if isinstance(option.kind, Switch):
            kwargs["action"] = argparse.BooleanOptionalAction
        elif isinstance(option.kind, Paths):
            kwargs["action"] = "append"
            kwargs["metavar"] = option.kind.metavar
        else:
            kwargs["metavar"] = option.kind.metavar
        parser.add_argument(f"--{option.flag}", **kwargs)
    return parser


def load_options(argv: list[str]) -> Options:
    """Options from flags, the options file and the environment; argparse exits 2 on an unknown
    flag, OptionsError for a value that cannot be used."""
    given = vars(build_parser().parse_args(argv))
    from_file, path = _read_file(given.get("config_file")), given.get("config_file")
    values = {}
    for option in OPTIONS:
        if option.name in given:
            where, value = f"--{option.flag}", given[option.name]
        elif option.flag in from_file:
            where, value = f"options file {path}: {option.flag}", from_file[option.flag]
        elif option.env and os.environ.get(option.env):
            where, value = f"${option.env} (--{option.flag})", os.environ[option.env]
        else:
            values[option.name] = option.default
            continue
        try:
            values[option.name] = option.parse(value)
        except ValueError as exc:
            if where.startswith("options file"):
                raise OptionsError(_file_value_error(path, from_file, option.flag, exc)) from None
            raise OptionsError(f"{where} {exc}".replace("\n", " ")) from None
    return Options(**values)


LOG_FORMAT = "%(asctime)s level=%(levelname)s source=%(name)s msg=%(message)s"  # logfmt, as Prometheus logs


def log_level(options: Options) -> str:
    """The logging module's name of ``--log.level``."""
    return {"warn": "WARNING"}.get(options.log_level, options.log_level.upper())


MAX_OPTIONS_FILE_BYTES = 256 << 10  # an options file is a few dozen lines
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


class _OptionsFile(dict):
    """The options file's mapping, and the line each option is set on (``line(flag)``)."""

    def __init__(self, data: dict, lines: dict[str, int]):
        super().__init__(data)
        self.lines = lines

    def line(self, flag: str) -> int | None:
        return self.lines.get(flag)


def _file_value_error(path: str | None, from_file: dict, flag: str, exc: ValueError) -> str:
    """What is wrong with an option the file sets: the option and its line, never the value (a file
    symlinked to a secret must not end up in the log)."""
    line = from_file.line(flag) if isinstance(from_file, _OptionsFile) else None
    reason = _QUOTED.sub("...", str(exc).split(", not ", 1)[0])
    return f"options file {path}: {flag} {reason}{f' (line {line})' if line else ''}".replace("\n", " ")


def _read_file(path: str | None) -> dict:
    """The options file's mapping (with the line of each option). Error messages name the file, the
    line and the option, never what the file holds."""
    if not path:
        return {}
    try:
        text = read_regular_file(path, MAX_OPTIONS_FILE_BYTES).decode("utf-8")
    except (NotRegularFile, FileTooLarge) as exc:
        raise OptionsError(f"cannot read options file {path}: {exc}") from None
    except OSError as exc:
        raise OptionsError(f"cannot read options file {path}: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError as exc:
        raise OptionsError(f"cannot read options file {path}: not UTF-8 (byte {exc.start})") from None
    loader = NoAliasLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except AliasRefused as exc:
        raise OptionsError(f"options file {path} uses a YAML alias (line {exc.mark.line + 1}), which is not "
                           "read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise OptionsError(f"options file {path} is not valid YAML{line}") from None
    except RecursionError:
        raise OptionsError(f"options file {path} is nested too deeply") from None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise OptionsError(f"options file {path}: want a mapping of options, got {type(data).__name__}")
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, _ in node.value:
            lines.setdefault(str(getattr(key, "value", "")), key.start_mark.line + 1)
    unknown = sorted(lines.get(str(key), 0) for key in data if key not in _BY_FLAG)
    if unknown:
        where = ", ".join(f"line {line}" for line in unknown[:10])
        raise OptionsError(f"options file {path}: unknown option(s) at {where}")
    return _OptionsFile(data, lines)
