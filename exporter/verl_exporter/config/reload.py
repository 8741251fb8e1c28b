"""Reloading the options on SIGHUP, the way Prometheus does: all or nothing, listener kept.

A reload reads and checks the whole new set first (:func:`prepare`: ``--config.file``, the listen
address it names, ``--web.config.file``), and changes nothing unless all of it is good. Then
(:func:`commit`) a good set applies at once every option whose table entry says ``reloadable``
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

from verl_exporter.config.options import Option, Options, OptionsError, changed, load_options, log_level
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


def apply(app) -> bool:
    """Apply the options files as they are now to the running ``app``; False (and logged) if they
    do not load or would turn protection off, in which case nothing changes."""
    try:
        plan = prepare(app)
    except ReloadError as exc:
        report(exc)
        return False
    return commit(app, plan)


def report(exc: ReloadError) -> None:
    if exc.refused:
        log.warning("reload refused, keeping the running options and web config: %s", exc)
    else:
        log.error("reloading the options failed, keeping the running ones: %s", exc)


def prepare(app) -> Plan:
    """Read and check everything the reload would apply; changes nothing (it may run in a thread)."""
    try:
        options = load_options(app.argv or [])
        parse_listen_address(options.web_listen_address)  # needs a restart, but must be good for it
        web = web_config.load(options.web_config_file)
    except (OptionsError, ValueError, web_config.WebConfigError) as exc:
        raise ReloadError(str(exc)) from None
    lost = lost_protection(app.web, web)
    if lost:
        named = (f"the web config file {options.web_config_file}" if options.web_config_file
                 else "no web config file (--web.config.file is no longer set)")
        raise ReloadError(
            f"{named} would turn {' and '.join(lost)} off; to turn {'it' if len(lost) == 1 else 'them'} off on "
            f"purpose, write {' and '.join(_HOW_TO_TURN_OFF[what] for what in lost)} in the web config file",
            refused=True)
    old: Options = app.options
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


def commit(app, plan: Plan) -> bool:
    """Apply a checked plan. The new sources are made first: if one cannot be, nothing changes."""
    try:
        added = _new_sources(app, plan.options)
    except Exception as exc:  # noqa: BLE001 (reported, one line; the running set is kept)
        report(ReloadError(f"cannot follow a new source: {exc}".replace("\n", " ")))
        return False
    options = plan.options
    if plan.fixed:
        log.warning("changed options that take effect only after a restart: %s",
                    ", ".join(option.flag for option in plan.fixed))
    logging.getLogger().setLevel(log_level(options))
    if app.server is not None:
        app.server.telemetry_path = options.web_telemetry_path
        plan.web.keep_verified(app.web)
        app.server.web = plan.web
    app.web = plan.web
    if added is not None:
        _swap_sources(app, options, added)
    app.options = options
    log.info("options reloaded (%s; %s)",
             f"applied: {', '.join(plan.applied)}" if plan.applied else "none to apply", plan.web.describe())
    return True


def _new_sources(app, options: Options) -> dict | None:
    """The sources the new options add, made but not started; None when the sources do not change."""
    wanted = {app.source_key(pattern, options): pattern for pattern in [*options.source, *app.simulated]}
    if wanted.keys() == app.sources.keys() and options.source_poll_interval == app.options.source_poll_interval:
        return None
    added: dict = {}
    try:
        for key, pattern in wanted.items():
            if key not in app.sources:
                added[key] = app._source(pattern, options)
    except Exception:
        for source in added.values():
            source.close()
        raise
    return {"wanted": wanted, "added": added}


def _swap_sources(app, options: Options, new: dict) -> None:
    from verl_exporter.sources import Ingestor

    wanted, added = new["wanted"], new["added"]
    app.ingestor.stop(timeout=None)  # let its round finish: no two threads read one source
    for key in [key for key in app.sources if key not in wanted]:
        app.sources.pop(key).close()
        log.info("no longer following %s", key[0])
    for key, pattern in wanted.items():
        if key not in app.sources:
            app.sources[key] = added[key]
            log.info("following %s", pattern)
    app.ingestor = Ingestor(list(app.sources.values()), interval=options.source_poll_interval)
    app.ingestor.start()
