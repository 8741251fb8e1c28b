"""The ``verl-exporter`` command: the exporter itself (``app.Exporter``), or one of its subcommands.

``verl-exporter [FLAGS]`` runs the exporter until SIGTERM or SIGINT; SIGHUP reloads its options
files. ``verl-exporter COMMAND ...`` runs one of ``COMMANDS`` (argparse subcommands; each module
gives its ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args, parser)``), and
``verl-exporter COMMAND --help`` describes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Protocol, cast

from verl_exporter import reload
from verl_exporter.app import Exporter
from verl_exporter.config.options import LOG_FORMAT, OptionsError, load_options, log_level
from verl_exporter.http import web_config
from verl_exporter.http.server import parse_listen_address

log = logging.getLogger("verl_exporter")


class CommandModule(Protocol):
    """What a subcommand's module gives."""

    DESCRIPTION: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int: ...


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: its name and the module that implements it (imported only when it runs)."""

    name: str
    module: str
    help: str

    def load(self) -> CommandModule:
        return cast(CommandModule, importlib.import_module(self.module))


COMMANDS = (
    Command("simulate", "verl_exporter.simulate.logs", "write a simulated verl run to a file, step by step"),
    Command("backfill", "verl_exporter.history.backfill", "turn verl logs into timestamped samples and TSDB blocks"),
    Command("replay", "verl_exporter.history.replay", "evaluate the alert rules over a run's history"),
    Command("rules", "verl_mixin.generate", "write the shipped rules with another runbook base"),
    Command("slurm-sd", "verl_exporter.schedulers.slurm_sd", "Prometheus HTTP service discovery for Slurm jobs"),
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and not argv[0].startswith("-"):
        return run_command(argv)
    return run_exporter(argv)


def run_command(argv: list[str]) -> int:
    """``verl-exporter COMMAND ARGS``: the subcommand's own arguments, help and exit status. Only
    the named command's module is imported."""
    parser = argparse.ArgumentParser(prog="verl-exporter", description="verl-exporter's subcommands; without "
                                     "one, it runs the exporter (verl-exporter --help).")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = None
    for command in COMMANDS:
        if command.name == argv[0]:
            module = command.load()
            sub = commands.add_parser(command.name, help=command.help, description=module.DESCRIPTION)
            module.add_arguments(sub)
            chosen = module, sub
        else:
            commands.add_parser(command.name, help=command.help)
    args = parser.parse_args(argv)  # exits 2 on a name that is no command
    assert chosen is not None
    module, sub = chosen
    return module.run(args, sub) or 0


def run_exporter(argv: list[str]) -> int:
    """The exporter, until SIGTERM or SIGINT; exit status 2 with one error line if it cannot start."""
    signals = _Signals()
    app = None
    try:
        try:
            options = load_options(argv)
            address = parse_listen_address(options.web_listen_address)
            web = web_config.load(options.web_config_file)
        except (OptionsError, ValueError, web_config.WebConfigError) as exc:
            return _error(str(exc))
        logging.basicConfig(level=log_level(options), format=LOG_FORMAT)
        try:
            app = Exporter(options, argv=argv, web=web)
        except OptionsError as exc:
            return _error(str(exc))
        try:
            app.start(address)
        except OSError as exc:
            app.stop()
            return _error(f"cannot listen on {options.web_listen_address}: {exc.strerror or exc}")
        signals.started = True
        while signals.wait() == "reload":
            if _reload_in_background(app, signals) == "stop":
                break
    except _Shutdown:
        pass
    log.info("shutting down")
    if app is not None:
        app.stop()
    _settle_stderr()
    return 0


def _error(message: str) -> int:
    """Print ``message`` as the one error line and give exit status 2, also when stderr cannot be
    written (a full disk, /dev/full, a closed pipe): the status is what a supervisor reads."""
    try:
        print(f"verl-exporter: error: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    _settle_stderr()
    return 2


def _settle_stderr() -> None:
    """Flush stderr now; if it cannot be written, swap it for /dev/null, so that what it still holds
    (log lines, the error) does not fail the interpreter's last flush, which would exit 120."""
    try:
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        try:
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (lives until the process ends)
        except OSError:
            sys.stderr = None


# The longest a reload may take to read and check its files before it is given up (a hung network
# file system): the exporter keeps its running options, and reloads again at the next SIGHUP.
RELOAD_READ_SECONDS = 30.0


def _reload_in_background(app: Exporter, signals: _Signals) -> str:
    """Read and check the new files in a thread while the main thread keeps answering signals, so
    a read that hangs never holds up SIGTERM; apply them here once checked. "stop" if a stop came."""
    busy = [thread for thread in threading.enumerate() if thread.name == "reload" and thread.is_alive()]
    if busy:
        log.error("reloading the options failed, keeping the running ones: the last reload is still reading "
                  "its files")
        return "reload"
    result: dict = {}

    def prepare() -> None:
        try:
            result["plan"] = reload.prepare(app.argv or [], app.options, app.web)
        except reload.ReloadError as exc:
            result["error"] = exc
        except Exception as exc:  # noqa: BLE001 (a reload must never stop a serving exporter)
            result["error"] = reload.ReloadError(f"{type(exc).__name__}: {exc}".replace("\n", " "))

    thread = threading.Thread(target=prepare, name="reload", daemon=True)
    thread.start()
    deadline = time.monotonic() + RELOAD_READ_SECONDS
    while thread.is_alive():
        if signals.stopping:
            return "stop"
        if time.monotonic() > deadline:
            log.error("reloading the options failed, keeping the running ones: reading the files took more "
                      "than %gs", RELOAD_READ_SECONDS)
            return "reload"
        thread.join(SIGNAL_CHECK_SECONDS)
    if signals.stopping:
        return "stop"
    try:
        if "error" in result:
            reload.report(result["error"])
        else:
            app.reload(result["plan"])
    except Exception:  # a reload must never stop a serving exporter
        log.exception("reloading the options failed, keeping the running ones")
    return "reload"


SIGNAL_CHECK_SECONDS = 0.25


class _Shutdown(BaseException):
    """SIGTERM or SIGINT while the exporter is still starting (reading a backlog, say)."""


class _Signals:
    """SIGTERM and SIGINT stop the exporter, SIGHUP reloads its options files (as Prometheus does).

    Installed before anything else starts, so no signal finds Python's default action. Until the
    exporter is serving, a stop interrupts whatever it is doing; after that the main loop acts.
    """

    def __init__(self) -> None:
        self.started = False
        self._stop = self._reload = False
        self._wake = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop = True
        self._wake.set()
        if not self.started:
            self.started = True  # once: a second signal must not interrupt the stop itself
            raise _Shutdown

    def _on_reload(self, signum: int, frame: FrameType | None) -> None:
        self._reload = True
        self._wake.set()

    @property
    def stopping(self) -> bool:
        """SIGTERM or SIGINT has come."""
        return self._stop

    def wait(self) -> str:
        """Block until a signal: "stop" or "reload"."""
        while True:
            # With a timeout: a signal the kernel hands to another thread does not interrupt a
            # blocked wait, and Python runs its handler only when the main thread runs again.
            if not self._wake.wait(SIGNAL_CHECK_SECONDS):
                continue
            self._wake.clear()
            if self._stop:
                return "stop"
            if self._reload:
                self._reload = False
                return "reload"
