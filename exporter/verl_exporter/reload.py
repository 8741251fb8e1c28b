"""Reloading the options on SIGHUP, the way Prometheus does: all or nothing, listener kept.

A good ``--config.file`` options file applies at once every option whose table entry says
``reloadable`` (the log level, the telemetry path, the sources: an unchanged source keeps its
place in its files); a changed option that needs a new process (the listen address, collectors,
caps) is logged and keeps its running value. A good ``--web.config.file`` takes effect for the
next connection: new users, certificates and headers. A file that does not load, or holds a value
of the wrong type, is logged at ERROR and changes nothing.
"""

from __future__ import annotations

import dataclasses
import logging

from . import web_config
from .options import Options, OptionsError, changed, load_options, log_level

log = logging.getLogger(__name__)


def apply(app) -> bool:
    """Apply the options files as they are now to the running ``app``; False (and logged) if they
    do not load, in which case nothing changes."""
    try:
        options = load_options(app.argv or [])
        web = web_config.load(options.web_config_file)
    except (OptionsError, web_config.WebConfigError) as exc:
        log.error("reloading the options failed, keeping the running ones: %s", exc)
        return False
    old: Options = app.options
    differ = changed(old, options)
    fixed = [option for option in differ if not option.reloadable]
    if fixed:
        log.warning("changed options that take effect only after a restart: %s",
                    ", ".join(option.flag for option in fixed))
        options = dataclasses.replace(options, **{option.name: getattr(old, option.name) for option in fixed})
    logging.getLogger().setLevel(log_level(options))
    if app.server is not None:
        app.server.telemetry_path = options.web_telemetry_path
        app.server.web = web
    app.web = web
    _apply_sources(app, options)
    app.options = options
    applied = [option.flag for option in differ if option.reloadable]
    log.info("options reloaded (%s; %s)", f"applied: {', '.join(applied)}" if applied else "none to apply",
             web.describe())
    return True


def _apply_sources(app, options: Options) -> None:
    from .sources import Ingestor

    wanted = {app.source_key(pattern, options): pattern for pattern in [*options.source, *app.simulated]}
    if wanted.keys() == app.sources.keys() and options.source_poll_interval == app.options.source_poll_interval:
        return
    app.ingestor.stop(timeout=None)  # let its round finish: no two threads read one source
    for key in [key for key in app.sources if key not in wanted]:
        app.sources.pop(key).close()
        log.info("no longer following %s", key[0])
    for key, pattern in wanted.items():
        if key not in app.sources:
            app.sources[key] = app._source(pattern, options)
            log.info("following %s", pattern)
    app.ingestor = Ingestor(list(app.sources.values()), interval=options.source_poll_interval)
    app.ingestor.start()
