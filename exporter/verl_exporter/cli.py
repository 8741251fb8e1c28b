"""The ``verl-exporter`` command: wire sources, store, collectors and the HTTP server together."""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from . import config, web_config
from .catalog import default_catalog
from .collectors import CollectorRunner
from .collectors.evidence import EvidenceCollector
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
    signals = _Signals()
    app = None
    try:
        try:
            settings = config.load(argv)
            address = parse_listen_address(settings.web_listen_address)
            web = web_config.load(settings.web_config_file)
        except (config.ConfigError, ValueError, web_config.WebConfigError) as exc:
            print(f"verl-exporter: error: {exc}", file=sys.stderr)
            return 2
        logging.basicConfig(level=config.log_level(settings), format=LOG_FORMAT)
        try:
            app = Exporter(settings, argv=argv, web=web)
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
        signals.started = True
        while signals.wait() == "reload":
            app.reload()
    except _Shutdown:
        pass
    log.info("shutting down")
    if app is not None:
        app.stop()
    return 0


LOG_FORMAT = "%(asctime)s level=%(levelname)s source=%(name)s msg=%(message)s"
SIGNAL_CHECK_SECONDS = 0.25


class _Shutdown(BaseException):
    """SIGTERM or SIGINT while the exporter is still starting (reading a backlog, say)."""


class _Signals:
    """SIGTERM and SIGINT stop the exporter, SIGHUP reloads its config files (as Prometheus does).

    Installed before anything else starts, so no signal finds Python's default action. Until the
    exporter is serving, a stop interrupts whatever it is doing; after that the main loop acts.
    """

    def __init__(self):
        self.started = False
        self._stop = self._reload = False
        self._wake = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)

    def _on_stop(self, signum, frame) -> None:
        self._stop = True
        self._wake.set()
        if not self.started:
            self.started = True  # once: a second signal must not interrupt the stop itself
            raise _Shutdown

    def _on_reload(self, signum, frame) -> None:
        self._reload = True
        self._wake.set()

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


def _open_file_cap(wanted: int) -> int:
    """``--source.max-open-files``, lowered to half the process's descriptor limit where that is less
    (sockets, the GPU library and scrapes need descriptors too)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or wanted <= soft // 2:
        return wanted
    log.warning("--source.max-open-files=%d is more than half the descriptor limit (%d): using %d",
                wanted, soft, max(8, soft // 2))
    return max(8, soft // 2)


class Exporter:
    """The running exporter: everything ``main`` starts, so tests can start it in-process too."""

    def __init__(self, settings: config.Settings, argv: list[str] | None = None,
                 web: web_config.WebConfig | None = None):
        from .sources import Ingestor

        self.settings = settings
        self.argv = argv  # what reload() parses again
        self.web = web or web_config.WebConfig()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        from .sources.tail import OpenFiles

        self.store = RunStore(default_catalog(), max_series_per_run=settings.store_max_series_per_run,
                              max_runs=settings.store_max_runs, retention=settings.store_retention_seconds,
                              idle_retention=settings.store_idle_retention_seconds)
        self.open_files = OpenFiles(_open_file_cap(settings.source_max_open_files))
        patterns = list(settings.source)
        if settings.simulate:
            patterns.append(self._start_simulation())
        if settings.run_config:  # like a simulated run, not one of --source: a reload keeps it
            patterns.append(settings.run_config)
        self.simulated = patterns[len(settings.source):]
        self.sources = {self.source_key(pattern, settings): self._source(pattern, settings) for pattern in patterns}
        self.ingestor = Ingestor(list(self.sources.values()), interval=settings.source_poll_interval)
        self.gpu_backend = None
        self.job = None
        self.registry = CollectorRegistry()
        collectors = self._collectors()
        self.registry.register(CollectorRunner(collectors))
        self.registry.register(ExporterCollector())
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.forensics = self._forensics(collectors["node"]) if settings.forensics else None
        if self.forensics is not None:
            self.registry.register(EvidenceCollector(self.forensics))
        self.server = None

    @staticmethod
    def source_key(pattern: str, settings: config.Settings) -> tuple:
        """What makes two sources the same: a reload keeps (and does not re-read) an unchanged one."""
        return pattern, settings.source_format, settings.project, settings.experiment

    def _source(self, pattern: str, settings: config.Settings):
        from .sources import Source

        fmt = "config" if pattern == self.settings.run_config else settings.source_format  # --run.config
        return Source(pattern, self.store, fmt=fmt, project=settings.project, experiment=settings.experiment,
                      open_files=self.open_files)

    def _collectors(self) -> dict:
        settings = self.settings
        collectors = {}
        job = None
        if settings.job_pid is not None or settings.job_match:
            from .job import JobSelector

            job = self.job = JobSelector(pid=settings.job_pid, match=settings.job_match)
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
        from .collectors.node import NodeCollector

        collectors["node"] = NodeCollector(self.store if settings.collector_training else None,
                                           lambda: (self.settings.project, self.settings.experiment),
                                           max_runs=lambda: self.settings.node_max_runs)
        if settings.collector_host:
            from .collectors.host import HostCollector

            collectors["host"] = HostCollector(job=job)
        return collectors

    def _forensics(self, node):
        """Evidence on a stall, with the job, GPU backend and node runs the collectors use."""
        from .forensics import Forensics

        settings, gpu = self.settings, None
        if self.gpu_backend is not None:
            from .collectors.gpu import GpuCollector

            gpu = GpuCollector(self.gpu_backend, job=self.job, timeout_seconds=settings.gpu_timeout)
        try:
            return Forensics(self.store, job=self.job, gpu=gpu, node_runs=node.runs, ready=self.ready,
                             stall_after=settings.forensics_stall_after_seconds,
                             interval=settings.forensics_check_interval_seconds,
                             directory=settings.forensics_dir, retention=settings.forensics_retention)
        except OSError as exc:
            raise config.ConfigError(f"--forensics.dir {settings.forensics_dir}: {exc.strerror or exc}") from None

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
        """Ready once every source has read all the lines its files held when it started."""
        return all(source.caught_up for source in self.ingestor.sources)

    def start(self, address: tuple[str, int]) -> None:
        """Listen first, then read the sources' backlogs in the background (/-/ready says when done)."""
        if not self.ingestor.sources and self.settings.collector_training:
            log.warning("no --source given: serving GPU and host metrics only")
        from .collectors.training_render import SharedRender

        self.server, _ = serve(address, self.registry, self.settings.web_telemetry_path,
                               ready=self.ready, web=self.web, render_text=SharedRender(self.registry),
                               evidence=self.forensics.evidence if self.forensics is not None else None)
        host, port = self.server.server_address[:2]
        log.info("listening on %s:%s%s (%s)", host, port, self.settings.web_telemetry_path, self.web.describe())
        if self.ingestor.sources:
            log.info("reading what the sources hold")
        self.ingestor.start()
        if self.gpu_backend is not None and hasattr(self.gpu_backend, "start"):
            self.gpu_backend.start()
        if self.forensics is not None:
            self.forensics.start()

    def reload(self) -> bool:
        """Read --config.file and --web.config.file again (SIGHUP). All or nothing: a file that does
        not load is logged and the running settings are kept. The listener stays up."""
        from .reload import apply

        return apply(self)

    def stop(self) -> None:
        self.stop_event.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.ingestor.stop()
        if self.forensics is not None:
            self.forensics.stop()
        if self.gpu_backend is not None and hasattr(self.gpu_backend, "stop"):
            self.gpu_backend.stop()
