"""The ``verl-exporter`` command: wire sources, store, collectors and the HTTP server together."""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from . import config
from .catalog import default_catalog
from .collectors import CollectorRunner
from .collectors.exporter import ExporterCollector
from .server import parse_listen_address, serve
from .store import RunStore

log = logging.getLogger("verl_exporter")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:
        from . import simulate

        return simulate.main(argv[1:]) or 0
    if argv[:1] in (["backfill"], ["replay"]):
        from .history import backfill, replay

        return (backfill if argv[0] == "backfill" else replay).main(argv[1:])
    try:
        settings = config.load(argv)
        address = parse_listen_address(settings.web_listen_address)
    except (config.ConfigError, ValueError) as exc:
        print(f"verl-exporter: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level={"warn": "WARNING"}.get(settings.log_level.lower(), settings.log_level.upper()),
        format="%(asctime)s level=%(levelname)s source=%(name)s msg=%(message)s",
    )
    try:
        app = Exporter(settings)
    except config.ConfigError as exc:
        print(f"verl-exporter: error: {exc}", file=sys.stderr)
        return 2
    try:
        app.start(address)
    except OSError as exc:
        print(f"verl-exporter: error: cannot listen on {settings.web_listen_address}: {exc.strerror or exc}",
              file=sys.stderr)
        app.stop()
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    log.info("shutting down")
    app.stop()
    return 0


class Exporter:
    """The running exporter: everything ``main`` starts, so tests can start it in-process too."""

    def __init__(self, settings: config.Settings):
        from .sources import Ingestor, Source

        self.settings = settings
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.store = RunStore(default_catalog(), max_series_per_run=settings.store_max_series_per_run,
                              max_runs=settings.store_max_runs)
        patterns = list(settings.source)
        if settings.simulate:
            patterns.append(self._start_simulation())
        sources = [
            Source(pattern, self.store, fmt=settings.source_format, project=settings.project,
                   experiment=settings.experiment)
            for pattern in patterns
        ]
        self.ingestor = Ingestor(sources, interval=settings.source_poll_interval)
        self.gpu_backend = None
        self.registry = CollectorRegistry()
        self.registry.register(CollectorRunner(self._collectors()))
        self.registry.register(ExporterCollector())
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.server = None

    def _collectors(self) -> dict:
        settings = self.settings
        collectors = {}
        job = None
        if settings.job_pid is not None or settings.job_match:
            from .job import JobSelector

            job = JobSelector(pid=settings.job_pid, match=settings.job_match)
        if settings.collector_training:
            from .collectors.training import TrainingCollector

            collectors["training"] = TrainingCollector(self.store)
        if settings.collector_gpu:
            from .collectors.gpu import GpuCollector

            if settings.gpu_fake:
                from .fake_nvml import fake_backend_from_spec

                try:
                    self.gpu_backend = fake_backend_from_spec(settings.gpu_fake,
                                                              pcie_throughput=settings.gpu_pcie_throughput)
                except ValueError as exc:
                    raise config.ConfigError(f"--gpu.fake: {exc}") from None
            else:
                from .nvml import NvmlBackend

                self.gpu_backend = NvmlBackend(pcie_throughput=settings.gpu_pcie_throughput)
            collectors["gpu"] = GpuCollector(self.gpu_backend, job=job, timeout_seconds=settings.gpu_timeout)
        if settings.collector_host:
            from .collectors.host import HostCollector

            collectors["host"] = HostCollector(job=job)
        return collectors

    def _start_simulation(self) -> str:
        from . import simulate

        settings = self.settings
        root = Path(settings.simulate_dir or tempfile.mkdtemp(prefix="verl-simulated-"))
        suffix = "jsonl" if settings.simulate_format == "jsonl" else "log"
        path = root / "demo" / f"{settings.simulate}.{suffix}"
        if settings.simulate not in simulate.SCENARIOS:
            raise config.ConfigError(
                f"--simulate: unknown scenario {settings.simulate!r}; one of {', '.join(simulate.SCENARIOS)}")
        thread = threading.Thread(
            target=simulate.write_run, name="simulate", daemon=True,
            args=(path, settings.simulate),
            kwargs={"fmt": settings.simulate_format, "interval": settings.simulate_interval,
                    "stop_event": self.stop_event},
        )
        thread.start()
        self.threads.append(thread)
        log.info("simulating a verl run (%s) in %s", settings.simulate, path)
        return str(path)

    def ready(self) -> bool:
        """Ready once every source has read the lines that existed when it started."""
        return not any(source.behind for source in self.ingestor.sources)

    def start(self, address: tuple[str, int]) -> None:
        if not self.ingestor.sources and self.settings.collector_training:
            log.warning("no --source given: serving GPU and host metrics only")
        self.ingestor.poll_all()  # a first bounded read, so /-/ready means something at once
        self.ingestor.start()
        if self.gpu_backend is not None and hasattr(self.gpu_backend, "start"):
            self.gpu_backend.start()
        self.server, _ = serve(address, self.registry, self.settings.web_telemetry_path,
                               ready=self.ready)
        host, port = self.server.server_address[:2]
        log.info("listening on %s:%s%s", host, port, self.settings.web_telemetry_path)

    def stop(self) -> None:
        self.stop_event.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.ingestor.stop()
        if self.gpu_backend is not None and hasattr(self.gpu_backend, "stop"):
            self.gpu_backend.stop()
