"""Reloading the config files on SIGHUP, the way Prometheus does: all or nothing, listener kept.

A good ``--config.file`` changes the log level, the telemetry path and the sources at once (an
unchanged source keeps its place in its files); settings that need a new process (the listen
address, collectors, caps) are logged and keep their running value. A good ``--web.config.file``
takes effect for the next connection: new users, certificates and headers.
"""

from __future__ import annotations

import logging

from . import config, web_config

log = logging.getLogger(__name__)

RELOADABLE = {"log.level", "web.telemetry-path", "web.config.file", "source", "source.format",
              "source.poll-interval", "project", "experiment"}


def apply(app) -> bool:
    """Apply the config files as they are now to the running ``app``; False (and logged) if they
    do not load, in which case nothing changes."""
    try:
        settings = config.load(app.argv or [])
        web = web_config.load(settings.web_config_file)
    except (config.ConfigError, web_config.WebConfigError) as exc:
        log.error("reloading the configuration failed, keeping the running one: %s", exc)
        return False
    old = app.settings
    changed = [option.flag for option in config.OPTIONS
               if getattr(old, config.attr(option.flag)) != getattr(settings, config.attr(option.flag))]
    fixed = [flag for flag in changed if flag not in RELOADABLE]
    if fixed:
        log.warning("changed settings that take effect only after a restart: %s", ", ".join(fixed))
        for flag in fixed:
            setattr(settings, config.attr(flag), getattr(old, config.attr(flag)))
    logging.getLogger().setLevel(config.log_level(settings))
    if app.server is not None:
        app.server.telemetry_path = settings.web_telemetry_path
        app.server.web = web
    app.web = web
    _apply_sources(app, settings)
    app.settings = settings
    log.info("configuration reloaded (%s)", web.describe())
    return True


def _apply_sources(app, settings) -> None:
    from .sources import Ingestor

    wanted = {app.source_key(pattern, settings): pattern for pattern in [*settings.source, *app.simulated]}
    if wanted.keys() == app.sources.keys() and settings.source_poll_interval == app.settings.source_poll_interval:
        return
    app.ingestor.stop(timeout=None)  # let its round finish: no two threads read one source
    for key in [key for key in app.sources if key not in wanted]:
        app.sources.pop(key).close()
        log.info("no longer following %s", key[0])
    for key, pattern in wanted.items():
        if key not in app.sources:
            app.sources[key] = app._source(pattern, settings)
            log.info("following %s", pattern)
    app.ingestor = Ingestor(list(app.sources.values()), interval=settings.source_poll_interval)
    app.ingestor.start()
