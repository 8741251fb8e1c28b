"""The running exporter: sources into the store, the collectors over it, the HTTP server, and the
watchers (Slurm, forensics) around them. ``cli`` starts one; tests can start one in-process.

Which collectors run is one table, ``COLLECTORS`` (name, the ``--collector.*`` switch that turns it
off, the factory), as node_exporter registers its collectors. ``reload()`` (SIGHUP) applies the
options files as they are now: all or nothing; every part that uses a reloadable option reads it
from ``Exporter.options`` when it uses it, so a reload that passed its checks only swaps that
object (and the sources, when they changed, and the web config).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import threading
from pathlib import Path
from typing import Callable

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from verl_exporter import reload, simulate
from verl_exporter.collectors import Collector, CollectorRunner
from verl_exporter.collectors.evidence import EvidenceCollector
from verl_exporter.collectors.exporter import ExporterCollector
from verl_exporter.collectors.gpu import GpuCollector
from verl_exporter.collectors.host import HostCollector
from verl_exporter.collectors.job_info import JobInfoCollector
from verl_exporter.collectors.job_processes import JobSelector
from verl_exporter.collectors.node import NodeCollector
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.config.options import Options, OptionsError, log_level
from verl_exporter.config.teams import TeamsError, load_teams
from verl_exporter.exposition import Exposition
from verl_exporter.forensics import Forensics
from verl_exporter.gpu.backend import GpuBackend
from verl_exporter.gpu.backends import make_backend
from verl_exporter.gpu.fake import fake_backend_from_spec
from verl_exporter.http import web_config
from verl_exporter.http.server import ExporterHTTPServer, serve
from verl_exporter.schedulers import scheduler as schedulers
from verl_exporter.schedulers.kubernetes import KubernetesPod
from verl_exporter.schedulers.slurm import SlurmWatcher
from verl_exporter.sources import Ingestor, Source
from verl_exporter.sources.open_files import OpenFiles
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.owners import Owners
from verl_exporter.store.run_store import RunStore

log = logging.getLogger("verl_exporter")

SourceKey = tuple[str, str, "str | None", "str | None"]


def open_file_cap(wanted: int) -> int:
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
    """Everything ``verl-exporter`` runs, built from its options; ``start``, ``reload``, ``stop``."""

    def __init__(self, options: Options, argv: list[str] | None = None,
                 web: web_config.WebConfig | None = None):
        self.options = options
        self.argv = argv  # what reload() parses again
        self.web = web or web_config.WebConfig()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.store = RunStore(default_catalog(), max_series_per_run=options.store_max_series_per_run,
                              max_runs=options.store_max_runs, retention=options.store_retention,
                              idle_retention=options.store_idle_retention)
        self.open_files = OpenFiles(open_file_cap(options.source_max_open_files))
        self.owners = self._owners()
        patterns = list(options.source)
        if options.simulate:
            patterns.append(self._start_simulation())
        if options.run_config:  # like a simulated run, not one of --source: a reload keeps it
            patterns.append(options.run_config)
        self.simulated = patterns[len(options.source):]
        self.sources = {self.source_key(pattern, options): self.make_source(pattern, options) for pattern in patterns}
        self.ingestor = Ingestor(list(self.sources.values()), interval=options.source_poll_interval,
                                tick=self.store.tick)
        self.scheduler = self._scheduler()  # which job is the node's, its runs, processes and owners
        self.slurm = self.scheduler.watcher
        self.job = self.scheduler.job
        self.gpu_backend: GpuBackend | None = None
        self.collectors: dict[str, Collector] = {}
        for spec in COLLECTORS:
            if spec.enabled(options):
                collector = spec.build(self)
                if collector is not None:
                    self.collectors[spec.name] = collector
        self.forensics = self._forensics() if options.forensics else None
        scratch = CollectorRegistry()  # client_python's collectors register themselves somewhere
        served = [CollectorRunner(self.collectors), ExporterCollector(), ProcessCollector(registry=scratch),
                  PlatformCollector(registry=scratch), GCCollector(registry=scratch)]
        if self.forensics is not None:
            served.append(EvidenceCollector(self.forensics))
        self.exposition = Exposition(served)
        self.registry = self.exposition.registry
        self.server: ExporterHTTPServer | None = None

    # -- the parts ------------------------------------------------------------------------------

    @staticmethod
    def source_key(pattern: str, options: Options) -> SourceKey:
        """What makes two sources the same: a reload keeps (and does not re-read) an unchanged one."""
        return pattern, options.source_format, options.project, options.experiment

    def make_source(self, pattern: str, options: Options) -> Source:
        fmt = "config" if pattern == self.options.run_config else options.source_format  # --run.config
        return Source(pattern, self.store, fmt=fmt, project=options.project, experiment=options.experiment,
                      open_files=self.open_files, owners=self.owners)

    def _owners(self) -> Owners:
        """The team of each run's owner: --owner.teams, else the Slurm account, else the pod's namespace."""
        pod = KubernetesPod.from_env()
        namespace = pod.namespace if pod is not None else ""
        if not self.options.owner_teams:
            return Owners(default_team=namespace)
        try:
            return Owners(load_teams(self.options.owner_teams), default_team=namespace)
        except TeamsError as exc:
            raise OptionsError(f"--owner.teams: {exc}") from None

    def _scheduler(self) -> schedulers.Scheduler:
        """Chosen once: --slurm (the watcher of this node's Slurm jobs, which follows their output
        itself), else the job of --job.pid / --job.match, in a Kubernetes pod or not."""
        options = self.options
        if options.slurm:
            if options.job_pid is not None or options.job_match:
                raise OptionsError("--slurm finds the jobs' processes itself: drop --job.pid and --job.match")
            watcher = SlurmWatcher(self.store, interval=lambda: self.options.slurm_poll_interval,
                                   source_interval=options.source_poll_interval, open_files=self.open_files,
                                   owners=self.owners)
            return schedulers.slurm(self.store, self.owners, watcher)
        job = JobSelector(pid=options.job_pid, match=options.job_match) \
            if options.job_pid is not None or options.job_match else None
        return schedulers.local(self.store if options.collector_training else None, self.owners, job,
                                lambda: (self.options.project, self.options.experiment),
                                lambda: self.options.node_max_runs)

    def _training_collector(self) -> Collector:
        return TrainingCollector(self.store)

    def _gpu_collector(self) -> Collector:
        options = self.options
        if options.gpu_fake:
            try:
                self.gpu_backend = fake_backend_from_spec(options.gpu_fake, pcie_throughput=options.gpu_pcie_throughput)
            except ValueError as exc:
                raise OptionsError(f"--gpu.fake: {exc}") from None
        else:
            self.gpu_backend = make_backend(options.gpu_backend, pcie_throughput=options.gpu_pcie_throughput)
        gpu = GpuCollector(self.gpu_backend, job=self.job, timeout_seconds=options.gpu_timeout)
        if self.slurm is not None:
            self.slurm.gpus_in_use = gpu.gpus_used_by
        return gpu

    def _node_collector(self) -> Collector:
        return NodeCollector(self.scheduler.node_runs)

    def _host_collector(self) -> Collector:
        # Under --slurm, verl_job_running is per run (the job info collector's), not the node's.
        return HostCollector(job=self.job, job_running=not self.scheduler.serves_running)

    def _job_info_collector(self) -> Collector | None:
        """verl_job_info: the Slurm jobs of --slurm, or the Kubernetes pod the environment names."""
        if self.scheduler.rows is None:
            return None
        return JobInfoCollector(self.scheduler.rows, serves_running=self.scheduler.serves_running)

    def _forensics(self) -> Forensics:
        """Evidence on a stall, with the job, GPU collector and node runs the scrape uses."""
        options = self.options
        gpu = self.collectors.get("gpu")
        try:
            return Forensics(self.store, job=self.job, gpu=gpu if isinstance(gpu, GpuCollector) else None,
                             node_runs=self.scheduler.node_runs, ready=self.ready,
                             stall_after=options.forensics_stall_after,
                             interval=options.forensics_check_interval,
                             directory=options.forensics_dir, retention=options.forensics_retention,
                             open_files=self.open_files,
                             pids_of_run=self.scheduler.pids_of)
        except OSError as exc:
            raise OptionsError(f"--forensics.dir {options.forensics_dir}: {exc.strerror or exc}") from None

    def _start_simulation(self) -> str:
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

    # -- running --------------------------------------------------------------------------------

    def ready(self) -> bool:
        """Ready once every source has read all the lines its files held when it started."""
        return all(source.caught_up for source in self.ingestor.sources)

    def start(self, address: tuple[str, int]) -> None:
        """Listen first, then read the sources' backlogs in the background (/-/ready says when done)."""
        if not self.ingestor.sources and self.options.collector_training and self.slurm is None:
            log.warning("no --source given: serving GPU and host metrics only")
        self.server, _ = serve(address, self.exposition, lambda: self.options.web_telemetry_path, ready=self.ready,
                               web=self.web, evidence=self.forensics.evidence if self.forensics is not None else None,
                               evidence_remote=self.options.forensics_remote)
        host, port = self.server.server_address[:2]
        log.info("listening on %s:%s%s (%s)", host, port, self.options.web_telemetry_path, self.web.describe())
        if self.ingestor.sources:
            log.info("reading what the sources hold")
        self.ingestor.start()
        self.scheduler.start()
        if self.gpu_backend is not None:
            self.gpu_backend.start()
        if self.forensics is not None:
            self.forensics.start()

    def reload(self, plan: reload.Plan | None = None) -> bool:
        """Apply the options files as they are now (SIGHUP), or ``plan``, read and checked already
        (``reload.prepare``). All or nothing: a file that does not load is logged and the running
        options are kept; the listener stays up. The new sources are made first: if one cannot be,
        nothing changes."""
        if plan is None:
            try:
                plan = reload.prepare(self.argv or [], self.options, self.web)
            except reload.ReloadError as exc:
                reload.report(exc)
                return False
        try:
            swap = self._new_sources(plan.options)
        except Exception as exc:  # noqa: BLE001 (reported, one line; the running set is kept)
            reload.report(reload.ReloadError(f"cannot follow a new source: {exc}".replace("\n", " ")))
            return False
        if plan.fixed:
            log.warning("changed options that take effect only after a restart: %s",
                        ", ".join(option.flag for option in plan.fixed))
        logging.getLogger().setLevel(log_level(plan.options))
        plan.web.keep_verified(self.web)
        self.web = plan.web
        if self.server is not None:
            self.server.web = plan.web
        if swap is not None:
            self._swap_sources(plan.options, *swap)
        self.options = plan.options  # every part reads its reloadable options from here
        log.info("options reloaded (%s; %s)",
                 f"applied: {', '.join(plan.applied)}" if plan.applied else "none to apply", plan.web.describe())
        return True

    def _new_sources(self, options: Options) -> tuple[dict[SourceKey, str], dict[SourceKey, Source]] | None:
        """The sources ``options`` want and those of them that are new, made but not started; None
        when the sources do not change."""
        wanted = {self.source_key(pattern, options): pattern for pattern in [*options.source, *self.simulated]}
        if wanted.keys() == self.sources.keys() and options.source_poll_interval == self.options.source_poll_interval:
            return None
        added: dict[SourceKey, Source] = {}
        try:
            for key, pattern in wanted.items():
                if key not in self.sources:
                    added[key] = self.make_source(pattern, options)
        except Exception:
            for source in added.values():
                source.close()
            raise
        return wanted, added

    def _swap_sources(self, options: Options, wanted: dict[SourceKey, str], added: dict[SourceKey, Source]) -> None:
        self.ingestor.stop(timeout=None)  # let its round finish: no two threads read one source
        for key in [key for key in self.sources if key not in wanted]:
            self.sources.pop(key).close()
            log.info("no longer following %s", key[0])
        for key, pattern in wanted.items():
            if key not in self.sources:
                self.sources[key] = added[key]
                log.info("following %s", pattern)
        self.ingestor = Ingestor(list(self.sources.values()), interval=options.source_poll_interval,
                                tick=self.store.tick)
        self.ingestor.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.ingestor.stop()
        self.scheduler.stop()
        if self.forensics is not None:
            self.forensics.stop()
        if self.gpu_backend is not None:
            self.gpu_backend.stop()


@dataclasses.dataclass(frozen=True)
class CollectorSpec:
    """One collector: its name (``verl_exporter_collector_success{collector=...}``), whether the
    options turn it on (its ``--[no-]collector.NAME`` switch), and its factory (None from the
    factory: nothing to collect here, e.g. no scheduler to name the job)."""

    name: str
    enabled: Callable[[Options], bool]
    build: Callable[[Exporter], Collector | None]


def _always(options: Options) -> bool:
    return True


COLLECTORS: tuple[CollectorSpec, ...] = (
    CollectorSpec("training", lambda options: options.collector_training, Exporter._training_collector),
    CollectorSpec("gpu", lambda options: options.collector_gpu, Exporter._gpu_collector),
    CollectorSpec("node", _always, Exporter._node_collector),
    CollectorSpec("host", lambda options: options.collector_host, Exporter._host_collector),
    CollectorSpec("job_info", _always, Exporter._job_info_collector),
)
