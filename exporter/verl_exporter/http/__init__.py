"""The HTTP front: ``server`` (``/metrics``, health, ``/debug/evidence``, ``/runbook``), the
listening socket and its connection cap (``listener``), one connection (``connection``), what is
read of a request (``request``), and exporter-toolkit's web config (``web_config``)."""
