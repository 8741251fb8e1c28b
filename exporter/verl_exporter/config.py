"""Settings: command-line flags in the node_exporter style, optionally from a YAML file.

Every flag ``--a.b-c`` can also be set in the ``--config.file`` YAML as ``a.b-c: value``; flags
given on the command line win over the file, the file over the environment variables some
settings read (`VERL_EXPORTER_PROJECT`, `VERL_EXPORTER_EXPERIMENT`), those over the defaults.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import __version__

DEFAULT_PORT = 9945


class ConfigError(Exception):
    """A setting that cannot be used; the message is shown to the user as is."""


@dataclass(frozen=True)
class Option:
    flag: str
    default: Any
    help: str
    type: Any = str
    multiple: bool = False
    switch: bool = False
    env: str | None = None  # environment variable read when neither a flag nor the file sets it


OPTIONS = [
    Option("web.listen-address", f":{DEFAULT_PORT}", "address to serve on, [HOST]:PORT"),
    Option("web.telemetry-path", "/metrics", "path under which to expose metrics"),
    Option("web.config.file", None, "exporter-toolkit web config (YAML): TLS, basic auth, response headers"),
    Option("source", [], "verl FileLogger JSONL file or console log to follow; a path or a glob "
           "(repeatable)", multiple=True),
    Option("source.format", "auto", "jsonl, console, or auto (.jsonl/.json are JSONL, others console)"),
    Option("run.config", None, "the run's config: hydra's .hydra/config.yaml or a saved config print, when "
           "the logs followed do not print it (a JSONL-only run)"),
    Option("source.poll-interval", 0.5, "seconds between reads of the sources", float),
    Option("source.max-open-files", 256, "cap on log files held open at once; others are reopened by "
           "path and inode when they grow", int),
    Option("project", None, "trainer.project_name of the run; on a node without logs, the run its GPUs "
           "work for (default: $VERL_EXPORTER_PROJECT, else from the config verl prints, else the source "
           "file's directory name)", env="VERL_EXPORTER_PROJECT"),
    Option("experiment", None, "trainer.experiment_name of the run; on a node without logs, the run its "
           "GPUs work for (default: $VERL_EXPORTER_EXPERIMENT, else from the config verl prints, else the "
           "source file's name)", env="VERL_EXPORTER_EXPERIMENT"),
    Option("node.max-runs", 8, "most unfinished runs followed for which this node's GPUs and host still count "
           "as theirs; an exporter following more reads a shared log directory and is none of their nodes "
           "(then only the run of --project/--experiment counts)", int),
    Option("collector.training", True, "training metrics from the sources", switch=True),
    Option("collector.gpu", True, "GPU metrics through NVML", switch=True),
    Option("collector.host", True, "host and job metrics through psutil", switch=True),
    Option("job.pid", None, "PID of the training job; its child processes count too", int),
    Option("job.match", None, "regular expression on the command line of the job's processes"),
    Option("gpu.timeout", 2.0, "seconds one scrape may spend in NVML", float),
    Option("gpu.pcie-throughput", False, "also sample PCIe throughput (NVML takes ~20 ms per GPU and "
           "direction for it)", switch=True),
    Option("gpu.fake", None, "serve fake GPUs instead of NVML, SCENARIO[:COUNT] (demo and tests)"),
    Option("store.max-series-per-run", 2000, "cap on exported series per run", int),
    Option("store.max-runs", 1000, "cap on runs followed", int),
    Option("store.retention", "0", "drop a finished run this long after its last line was written (0: keep it)"),
    Option("store.idle-retention", "0", "drop a run with no new step for this long (0: keep it)"),
    Option("forensics", True, "capture evidence (py-spy stacks, log tails, errors, GPUs) once per stall of a "
           "run, served at /debug/evidence", switch=True),
    Option("forensics.stall-after", "10m", "a run stalls after no step for this long, or for 5 times its median "
           "step time where that is longer"),
    Option("forensics.check-interval", "15s", "how often the runs are checked for a stall"),
    Option("forensics.dir", None, "directory to write each capture to, one file each (default: memory only)"),
    Option("forensics.retention", 50, "evidence files kept in --forensics.dir: the newest N", int),
    Option("simulate", None, "also write a simulated verl run with this scenario and follow it"),
    Option("simulate.format", "console", "format of the simulated run: jsonl or console"),
    Option("simulate.interval", 1.0, "seconds between simulated steps", float),
    Option("simulate.dir", None, "directory for the simulated run's file (default: a temp dir)"),
    Option("log.level", "info", "debug, info, warn or error"),
]
_BY_FLAG = {option.flag: option for option in OPTIONS}


def attr(flag: str) -> str:
    """The Settings attribute of a flag: ``web.listen-address`` -> ``web_listen_address``."""
    return flag.replace(".", "_").replace("-", "_")


class Settings(argparse.Namespace):
    """Parsed settings; attributes named by :func:`attr`."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line and exit code 2, not the whole usage text."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="verl-exporter",
        description="Prometheus exporter for verl training runs, their GPUs and host. "
                    "Subcommand: 'verl-exporter simulate --help' writes a simulated run.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--version", action="version", version=f"verl-exporter {__version__}")
    parser.add_argument("--config.file", dest="config_file", metavar="FILE",
                        help="YAML file with any of these settings")
    for option in OPTIONS:
        kwargs: dict[str, Any] = {"dest": attr(option.flag), "help": f"{option.help} (default: {option.default})"}
        if option.switch:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif option.multiple:
            kwargs["action"] = "append"
            kwargs["metavar"] = "PATH"
        else:
            kwargs["type"] = option.type
            kwargs["metavar"] = option.flag.rpartition(".")[2].upper().replace("-", "_")
        parser.add_argument(f"--{option.flag}", **kwargs)
    return parser


def load(argv: list[str]) -> Settings:
    """Settings from flags and the config file; argparse exits 2 on a bad flag, ConfigError otherwise."""
    parser = build_parser()
    given = parser.parse_args(argv, namespace=Settings())
    from_file = _read_file(getattr(given, "config_file", None))
    settings = Settings()
    for option in OPTIONS:
        name = attr(option.flag)
        if hasattr(given, name):
            value = getattr(given, name)
        elif option.flag in from_file:
            value = _convert(option, from_file[option.flag])
        elif option.env and os.environ.get(option.env):
            value = _convert(option, os.environ[option.env])
        else:
            value = list(option.default) if option.multiple else option.default
        setattr(settings, name, value)
    _check(settings)
    return settings


def log_level(settings: Settings) -> str:
    """The logging module's name of ``--log.level``."""
    return {"warn": "WARNING"}.get(settings.log_level.lower(), settings.log_level.upper())


def _read_file(path: str | None) -> dict:
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: want a mapping of settings, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_BY_FLAG))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(map(str, unknown))}")
    return data


def _convert(option: Option, value: Any) -> Any:
    try:
        if option.multiple:
            return [str(item) for item in (value if isinstance(value, list) else [value])]
        if option.switch:
            if not isinstance(value, bool):
                raise ValueError("want true or false")
            return value
        return None if value is None else option.type(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config setting {option.flag}: {value!r} is not valid ({exc})") from None


def _check(settings: Settings) -> None:
    if settings.source_format not in ("auto", "jsonl", "console"):
        raise ConfigError(f"--source.format must be auto, jsonl or console, not {settings.source_format!r}")
    if settings.simulate_format not in ("jsonl", "console"):
        raise ConfigError(f"--simulate.format must be jsonl or console, not {settings.simulate_format!r}")
    if settings.log_level.lower() not in ("debug", "info", "warn", "warning", "error"):
        raise ConfigError(f"--log.level must be debug, info, warn or error, not {settings.log_level!r}")
    if not settings.web_telemetry_path.startswith("/") or settings.web_telemetry_path.startswith("/-/"):
        raise ConfigError(f"--web.telemetry-path must start with / (and not /-/): {settings.web_telemetry_path!r}")
    if settings.web_telemetry_path == "/debug/evidence":
        raise ConfigError("--web.telemetry-path cannot be /debug/evidence: the evidence of stalled runs is "
                          "served there")
    if settings.job_match:
        try:
            re.compile(settings.job_match)
        except re.error as exc:
            raise ConfigError(f"--job.match is not a valid regular expression: {exc}") from None
    for flag in ("source.poll-interval", "gpu.timeout", "store.max-series-per-run", "store.max-runs",
                 "source.max-open-files", "node.max-runs", "forensics.retention"):
        if getattr(settings, attr(flag)) <= 0:
            raise ConfigError(f"--{flag} must be positive")
    for flag in ("store.retention", "store.idle-retention"):
        setattr(settings, attr(flag) + "_seconds", parse_duration(flag, getattr(settings, attr(flag))))
    for flag in ("forensics.stall-after", "forensics.check-interval"):
        seconds = parse_duration(flag, getattr(settings, attr(flag)))
        if seconds <= 0:
            raise ConfigError(f"--{flag} must be positive")
        setattr(settings, attr(flag) + "_seconds", seconds)


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(flag: str, text) -> float:
    """Seconds of a Prometheus-style duration (``90s``, ``30m``, ``24h``, ``7d``; a bare number is
    seconds); ConfigError if it is none or negative."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d|w)?\s*", str(text))
    if not match:
        raise ConfigError(f"--{flag} must be a duration such as 30m, 24h or 7d, not {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]
