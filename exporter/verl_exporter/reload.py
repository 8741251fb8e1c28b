"""Reloading the options on SIGHUP, the way Prometheus does: all or nothing, listener kept.

A reload reads and checks the whole new set first (:func:`prepare`: ``--config.file``, the listen
address it names, ``--web.config.file``), and changes nothing unless all of it is good. Then
(``Exporter.reload``) a good set applies at once every option whose table entry says ``reloadable``
(the log level, the telemetry path, the sources: an unchanged source keeps its place in its files),
and the new web config takes effect for the next connection (users, certificates, headers). A
changed option that needs a new process (the listen address, collectors, caps) is named in a
WARNING and keeps its running value; the listener is never dropped.

A file that does not load, or holds a value of the wrong type, is logged at ERROR and changes
nothing. A new web config that would turn TLS, basic auth or the checking of client certificates
off is refused at WARNING, and changes nothing either, unless the file says so on purpose:
``tls_server_config: {}`` turns TLS off, ``basic_auth_users: {}`` turns basic auth off, a stated
``client_auth_type`` sets client certificates. An empty file, one whose sections are all
commented out, or an options file that no longer names a web config, is never read as "off".
"""

from __future__ import annotations

import dataclasses
import logging
import ssl

from verl_exporter.config.options import Option, Options, OptionsError, changed, load_options
from verl_exporter.http import web_config
from verl_exporter.http.server import parse_listen_address

log = logging.getLogger(__name__)


class ReloadError(Exception):
    """The new set cannot be applied; the message is one line. ``refused``: it loads, but would
    turn protection off (logged at WARNING rather than ERROR)."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checked new set: the options to run with (restart-only ones at their running value)."""

    options: Options
    web: web_config.WebConfig
    fixed: tuple[Option, ...]  # changed, but need a restart
    applied: tuple[str, ...]  # the flags of the changed options that apply now


def report(exc: ReloadError) -> None:
    if exc.refused:
        log.warning("reload refused, keeping the running options and web config: %s", exc)
    else:
        log.error("reloading the options failed, keeping the running ones: %s", exc)


def prepare(argv: list[str], running: Options, running_web: web_config.WebConfig) -> Plan:
    """Read and check everything a reload of the exporter started with ``argv``, now running with
    ``running`` and ``running_web``, would apply; changes nothing (it may run in a thread).
    ``Exporter.reload`` applies the plan."""
    try:
        options = load_options(argv)
        parse_listen_address(options.web_listen_address)  # needs a restart, but must be good for it
        web = web_config.load(options.web_config_file)
    except (OptionsError, ValueError, web_config.WebConfigError) as exc:
        raise ReloadError(str(exc)) from None
    lost = lost_protection(running_web, web)
    if lost:
        named = (f"the web config file {options.web_config_file}" if options.web_config_file
                 else "no web config file (--web.config.file is no longer set)")
        raise ReloadError(
            f"{named} would turn {' and '.join(lost)} off; to turn {'it' if len(lost) == 1 else 'them'} off on "
            f"purpose, write {' and '.join(_HOW_TO_TURN_OFF[what] for what in lost)} in the web config file",
            refused=True)
    old = running
    differ = changed(old, options)
    fixed = tuple(option for option in differ if not option.reloadable)
    if fixed:
        options = dataclasses.replace(options, **{option.name: getattr(old, option.name) for option in fixed})
    return Plan(options, web, fixed, tuple(option.flag for option in differ if option.reloadable))


_HOW_TO_TURN_OFF = {
    "TLS": "`tls_server_config: {}`",
    "basic auth": "`basic_auth_users: {}`",
    "client certificate verification": "`client_auth_type: NoClientCert` (or the mode wanted)",
}


def lost_protection(old: web_config.WebConfig, new: web_config.WebConfig) -> list[str]:
    """What ``new`` turns off that ``old`` has on, and the new file does not say it turns off on purpose."""
    lost = []
    if old.tls_context is not None and new.tls_context is None and "tls_server_config" not in new.stated:
        lost.append("TLS")
    if (old.tls_context is not None and new.tls_context is not None
            and _verifies(old.tls_context) and not _verifies(new.tls_context)
            and "client_auth_type" not in new.stated):
        lost.append("client certificate verification")
    if old.users and not new.users and "basic_auth_users" not in new.stated:
        lost.append("basic auth")
    return lost


def _verifies(context: ssl.SSLContext) -> bool:
    return context.verify_mode != ssl.CERT_NONE
