"""The ``verl-exporter`` command: wire sources, store, collectors and the HTTP server together."""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from verl_exporter.config.options import Options, OptionsError, load_options, log_level
from verl_exporter.http import web_config
from verl_exporter.http.server import ExporterHTTPServer, parse_listen_address, serve
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore

from .collectors import Collector, CollectorRunner
from .collectors.evidence import EvidenceCollector
from .collectors.exporter import ExporterCollector
from .exposition import Exposition

if TYPE_CHECKING:
    from verl_exporter.collectors.job_processes import JobSelector
    from verl_exporter.gpu.backends import SelectedGpuBackend
    from verl_exporter.gpu.fake import FakeNvmlBackend

    from .schedulers.slurm import SlurmWatcher

log = logging.getLogger("verl_exporter")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:
        from . import simulate

        return simulate.main(argv[1:]) or 0
    if argv[:1] in (["backfill"], ["replay"]):
        from .history import backfill, replay

        return (backfill if argv[0] == "backfill" else replay).main(argv[1:])
    if argv[:1] == ["rules"]:
        from .alerting import generate

        return generate.rules_main(argv[1:])
    if argv[:1] == ["slurm-sd"]:
        from .schedulers import slurm_sd

        return slurm_sd.main(argv[1:], log_format=LOG_FORMAT)
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


def _reload_in_background(app: "Exporter", signals: "_Signals") -> str:
    """Read and check the new files in a thread while the main thread keeps answering signals, so
    a read that hangs never holds up SIGTERM; apply them here once checked. "stop" if a stop came."""
    from verl_exporter.config import reload

    busy = [thread for thread in threading.enumerate() if thread.name == "reload" and thread.is_alive()]
    if busy:
        log.error("reloading the options failed, keeping the running ones: the last reload is still reading "
                  "its files")
        return "reload"
    result: dict = {}

    def prepare() -> None:
        try:
            result["plan"] = reload.prepare(app)
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
            reload.commit(app, result["plan"])
    except Exception:  # a reload must never stop a serving exporter
        log.exception("reloading the options failed, keeping the running ones")
    return "reload"


LOG_FORMAT = "%(asctime)s level=%(levelname)s source=%(name)s msg=%(message)s"
SIGNAL_CHECK_SECONDS = 0.25


class _Shutdown(BaseException):
    """SIGTERM or SIGINT while the exporter is still starting (reading a backlog, say)."""


class _Signals:
    """SIGTERM and SIGINT stop the exporter, SIGHUP reloads its options files (as Prometheus does).

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

    def __init__(self, options: Options, argv: list[str] | None = None,
                 web: web_config.WebConfig | None = None):
        from .sources import Ingestor

        self.options = options
        self.argv = argv  # what reload() parses again
        self.web = web or web_config.WebConfig()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        from .sources.open_files import OpenFiles

        self.store = RunStore(default_catalog(), max_series_per_run=options.store_max_series_per_run,
                              max_runs=options.store_max_runs, retention=options.store_retention,
                              idle_retention=options.store_idle_retention)
        self.open_files = OpenFiles(_open_file_cap(options.source_max_open_files))
        patterns = list(options.source)
        if options.simulate:
            patterns.append(self._start_simulation())
        if options.run_config:  # like a simulated run, not one of --source: a reload keeps it
            patterns.append(options.run_config)
        self.simulated = patterns[len(options.source):]
        self.sources = {self.source_key(pattern, options): self._source(pattern, options) for pattern in patterns}
        self.ingestor = Ingestor(list(self.sources.values()), interval=options.source_poll_interval)
        self.gpu_backend: SelectedGpuBackend | FakeNvmlBackend | None = None
        self.job: JobSelector | None = None
        self.slurm: SlurmWatcher | None = self._slurm() if options.slurm else None
        collectors = self._collectors()
        self.forensics = self._forensics(collectors["node"]) if options.forensics else None
        scratch = CollectorRegistry()  # client_python's collectors register themselves somewhere
        served = [CollectorRunner(collectors), ExporterCollector(), ProcessCollector(registry=scratch),
                  PlatformCollector(registry=scratch), GCCollector(registry=scratch)]
        if self.forensics is not None:
            served.append(EvidenceCollector(self.forensics))
        self.exposition = Exposition(served)
        self.registry = self.exposition.registry
        self.server: ExporterHTTPServer | None = None

    @staticmethod
    def source_key(pattern: str, options: Options) -> tuple:
        """What makes two sources the same: a reload keeps (and does not re-read) an unchanged one."""
        return pattern, options.source_format, options.project, options.experiment

    def _source(self, pattern: str, options: Options):
        from .sources import Source

        fmt = "config" if pattern == self.options.run_config else options.source_format  # --run.config
        return Source(pattern, self.store, fmt=fmt, project=options.project, experiment=options.experiment,
                      open_files=self.open_files)

    def _slurm(self) -> SlurmWatcher:
        """--slurm: the watcher of this node's Slurm jobs, which follows their output itself."""
        from .schedulers.slurm import SlurmWatcher

        if self.options.job_pid is not None or self.options.job_match:
            raise OptionsError("--slurm finds the jobs' processes itself: drop --job.pid and --job.match")
        return SlurmWatcher(self.store, interval=lambda: self.options.slurm_poll_interval,
                            source_interval=self.options.source_poll_interval, open_files=self.open_files)

    def _collectors(self) -> dict:
        options = self.options
        collectors: dict[str, Collector] = {}
        job = None
        if options.job_pid is not None or options.job_match or self.slurm is not None:
            from verl_exporter.collectors.job_processes import JobSelector

            job = self.job = JobSelector(pid=options.job_pid, match=options.job_match,
                                         pids=self.slurm.pids if self.slurm is not None else None)
        if options.collector_training:
            from .collectors.training import TrainingCollector

            collectors["training"] = TrainingCollector(self.store)
        if options.collector_gpu:
            from .collectors.gpu import GpuCollector

            if options.gpu_fake:
                from verl_exporter.gpu.fake import fake_backend_from_spec

                try:
                    self.gpu_backend = fake_backend_from_spec(options.gpu_fake,
                                                              pcie_throughput=options.gpu_pcie_throughput)
                except ValueError as exc:
                    raise OptionsError(f"--gpu.fake: {exc}") from None
            else:
                from verl_exporter.gpu.backends import make_backend

                self.gpu_backend = make_backend(options.gpu_backend, pcie_throughput=options.gpu_pcie_throughput)
            collectors["gpu"] = gpu = GpuCollector(self.gpu_backend, job=job, timeout_seconds=options.gpu_timeout)
            if self.slurm is not None:
                self.slurm.gpus_in_use = gpu.gpus_used_by
        from .collectors.node import NodeCollector

        collectors["node"] = NodeCollector(self.store if options.collector_training else None,
                                           lambda: (self.options.project, self.options.experiment),
                                           max_runs=lambda: self.options.node_max_runs,
                                           job_runs=self.slurm.node_runs if self.slurm is not None else None)
        if options.collector_host:
            from .collectors.host import HostCollector

            # Under --slurm, verl_job_running is per run (the job info collector's), not the node's.
            collectors["host"] = HostCollector(job=job, job_running=self.slurm is None)
        job_info = self._job_info()
        if job_info is not None:
            collectors["job_info"] = job_info
        return collectors

    def _job_info(self) -> Collector | None:
        """verl_job_info: the Slurm jobs of --slurm, or the Kubernetes pod the environment names."""
        from .collectors.job_info import JobInfoCollector

        if self.slurm is not None:
            return JobInfoCollector(self.slurm.rows, serves_running=True)
        from .schedulers.kubernetes import KubernetesPod, KubernetesRuns

        pod = KubernetesPod.from_env()
        if pod is None:
            return None
        return JobInfoCollector(KubernetesRuns(pod, self.store).rows)

    def _forensics(self, node):
        """Evidence on a stall, with the job, GPU backend and node runs the collectors use."""
        from .forensics import Forensics

        options, gpu = self.options, None
        if self.gpu_backend is not None:
            from .collectors.gpu import GpuCollector

            gpu = GpuCollector(self.gpu_backend, job=self.job, timeout_seconds=options.gpu_timeout)
        try:
            return Forensics(self.store, job=self.job, gpu=gpu, node_runs=node.runs, ready=self.ready,
                             stall_after=options.forensics_stall_after,
                             interval=options.forensics_check_interval,
                             directory=options.forensics_dir, retention=options.forensics_retention,
                             open_files=self.open_files,
                             pids_of_run=self.slurm.pids_of if self.slurm is not None else None)
        except OSError as exc:
            raise OptionsError(f"--forensics.dir {options.forensics_dir}: {exc.strerror or exc}") from None

    def _start_simulation(self) -> str:
        from . import simulate

        options = self.options
        root = Path(options.simulate_dir or tempfile.mkdtemp(prefix="verl-simulated-"))
        suffix = "jsonl" if options.simulate_format == "jsonl" else "log"
        path = root / "demo" / f"{options.simulate}.{suffix}"
        if options.simulate not in simulate.SCENARIOS:
            raise OptionsError(
                f"--simulate: unknown scenario {options.simulate!r}; one of {', '.join(simulate.SCENARIOS)}")
        thread = threading.Thread(
            target=simulate.write_run, name="simulate", daemon=True,
            args=(path, options.simulate),
            kwargs={"fmt": options.simulate_format, "interval": options.simulate_interval,
                    "stop_event": self.stop_event},
        )
        thread.start()
        self.threads.append(thread)
        log.info("simulating a verl run (%s) in %s", options.simulate, path)
        return str(path)

    def ready(self) -> bool:
        """Ready once every source has read all the lines its files held when it started."""
        return all(source.caught_up for source in self.ingestor.sources)

    def start(self, address: tuple[str, int]) -> None:
        """Listen first, then read the sources' backlogs in the background (/-/ready says when done)."""
        if not self.ingestor.sources and self.options.collector_training and self.slurm is None:
            log.warning("no --source given: serving GPU and host metrics only")
        self.server, _ = serve(address, self.exposition, self.options.web_telemetry_path, ready=self.ready,
                               web=self.web, evidence=self.forensics.evidence if self.forensics is not None else None,
                               evidence_remote=self.options.forensics_remote)
        host, port = self.server.server_address[:2]
        log.info("listening on %s:%s%s (%s)", host, port, self.options.web_telemetry_path, self.web.describe())
        if self.ingestor.sources:
            log.info("reading what the sources hold")
        self.ingestor.start()
        if self.slurm is not None:
            self.slurm.start()
        if self.gpu_backend is not None and hasattr(self.gpu_backend, "start"):
            self.gpu_backend.start()
        if self.forensics is not None:
            self.forensics.start()

    def reload(self) -> bool:
        """Read --config.file and --web.config.file again (SIGHUP). All or nothing: a file that does
        not load is logged and the running options are kept. The listener stays up."""
        from verl_exporter.config.reload import apply

        return apply(self)

    def stop(self) -> None:
        self.stop_event.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.ingestor.stop()
        if self.slurm is not None:
            self.slurm.stop()
        if self.forensics is not None:
            self.forensics.stop()
        if self.gpu_backend is not None and hasattr(self.gpu_backend, "stop"):
            self.gpu_backend.stop()
