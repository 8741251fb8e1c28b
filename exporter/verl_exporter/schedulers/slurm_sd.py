"""``verl-exporter slurm-sd``: Prometheus HTTP service discovery for verl jobs on a Slurm cluster.

Serves ``/targets`` in the format of Prometheus's ``http_sd_configs``: one target group per running
job, its nodes as targets (``node:9945``, where each node's sidecar exporter listens) and the job as
labels (``slurm_job_id``, ``slurm_job_name``, ``slurm_user``, ``slurm_partition``). A node that
runs several jobs at once is a target once, in the group of its oldest job (the lowest job id): a
node listed twice would be scraped twice, and every per-node sum of the rules would count it twice.
Each run's own job is in the exporter's ``verl_job_info``. The jobs come
from ``squeue --noheader --states=RUNNING --format=...`` (no ``--json``: it needs plugins not every
22.05 install has), their names from a second squeue call that prints each name in a field of fixed
width, compressed node lists are expanded by ``scontrol show hostnames``.

An answer is reused for ``--cache-ttl``, so many Prometheus servers (or a short ``refresh_interval``)
cost slurmctld one ``squeue`` per TTL. A Slurm command that fails or outlives ``--slurm.timeout`` is
logged and the last good answer is served; before any good answer the request fails (500), so
Prometheus keeps what it had. The HTTP side is the exporter's own server (``server.py``): the same
limits, TLS and basic auth (``--web.config.file``), and ``/-/healthy``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from verl_exporter.config.durations import parse_duration
from verl_exporter.config.options import LOG_FORMAT
from verl_exporter.http import web_config
from verl_exporter.http.server import ExporterHTTPServer, parse_listen_address

from ..exposition import Exposition

log = logging.getLogger(__name__)

TARGETS_PATH = "/targets"
DEFAULT_LISTEN = ":9946"
DEFAULT_EXPORTER_PORT = 9945
# %i job id, %u user, %P partition, %N node list: nothing a job's owner writes, one line per job.
SQUEUE_FIELDS = ("slurm_job_id", "slurm_user", "slurm_partition", "nodes")
SQUEUE_JOBS_FORMAT = "%i|%u|%P|%N"
# The names: a name may hold the separator and line breaks, even another job's whole line, so it is
# read by position, never by its lines. squeue cuts a %<width>j field to width bytes and pads it with
# spaces, and Slurm refuses names over 1024 bytes: each line is the id, exactly NAME_WIDTH bytes of
# name, and the id again.
NAME_WIDTH = 1024
SQUEUE_NAMES_FORMAT = f"%i|%{NAME_WIDTH}j|%i"
JSON_TYPE = "application/json"

Runner = Callable[[list[str], float], str]  # (argv, timeout seconds) -> stdout; raises on failure


class SlurmError(Exception):
    """A Slurm command failed, hung or printed something unreadable."""


def run_command(argv: list[str], timeout: float) -> str:
    """Run a Slurm client command; its stdout, or SlurmError with its stderr (or the timeout)."""
    try:
        # its own process group: a site's wrapper script that hangs is killed with what it started;
        # surrogateescape keeps the bytes of a name that is not UTF-8 (names are read by their length
        # in bytes), and _text turns them into U+FFFD
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   encoding="utf-8", errors="surrogateescape", start_new_session=True)
    except OSError as exc:
        raise SlurmError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        process.kill()
        process.communicate()
        raise SlurmError(f"{argv[0]} did not answer within {timeout:g}s") from None
    if process.returncode != 0:
        detail = stderr.strip().splitlines()
        raise SlurmError(f"{' '.join(argv[:2])} exited with {process.returncode}: "
                         f"{detail[-1] if detail else 'no message'}")
    return stdout


@dataclass(frozen=True)
class Job:
    labels: dict[str, str]  # the four slurm_* labels
    nodes: str  # Slurm's compressed node list, e.g. "gpu[01-04],cpu7"


def parse_squeue(jobs_text: str, names_text: str) -> list[Job]:
    """The jobs of ``squeue --noheader --format=SQUEUE_JOBS_FORMAT`` (``jobs_text``; lines without
    the four fields or a node are skipped with a warning), each named from
    ``--format=SQUEUE_NAMES_FORMAT`` (``names_text``, see ``parse_names``). A job left unnamed (it
    started in between, or the names did not parse) has an empty name. So a name can forge no job,
    host or user, nor another job's name."""
    jobs: dict[str, Job] = {}
    for line in jobs_text.split("\n"):
        if not line.strip():
            continue
        values = [_text(value).strip() for value in line.split("|")]
        if len(values) != len(SQUEUE_FIELDS) or not values[0] or not values[3]:
            log.warning("skipping an squeue line that is not %s: %r", SQUEUE_JOBS_FORMAT, _text(line[:200]))
            continue
        fields = dict(zip(SQUEUE_FIELDS, values))
        nodes = fields.pop("nodes")
        jobs.setdefault(fields["slurm_job_id"], Job({**fields, "slurm_job_name": ""}, nodes))
    for job_id, name in parse_names(names_text).items():
        if job_id in jobs:
            jobs[job_id].labels["slurm_job_name"] = name
    return list(jobs.values())


def parse_names(text: str) -> dict[str, str]:
    """Job id -> name from ``squeue --noheader --format=SQUEUE_NAMES_FORMAT``: per job the id, ``|``,
    NAME_WIDTH bytes of name (trailing spaces are squeue's padding), ``|``, the same id and a line
    break. The name's bytes are never searched, so whatever they hold names only their own job. An
    answer that is not all such lines names no job (a warning): past the first bad one it cannot be
    told where a name ends, nor, before it, that squeue padded as expected."""
    data = text.encode("utf-8", "surrogateescape")
    names: dict[str, str] = {}
    start = 0
    while start < len(data):
        bar = data.find(b"|", start)
        job_id = data[start:bar] if bar > start else b""
        end = bar + 1 + NAME_WIDTH
        line_end = data.find(b"\n", end)
        if (not job_id or b"\n" in job_id or line_end < 0 or data[end:end + 1] != b"|"
                or data[end + 1:line_end] != job_id or _text(job_id) in names):
            log.warning("cannot read the job names: squeue printed no %s line at byte %d: %r",
                        SQUEUE_NAMES_FORMAT, start, _text(data[start:start + 80]))
            return {}
        names[_text(job_id)] = _text(data[bar + 1:end].rstrip(b" "))
        start = line_end + 1
    return names


def _text(value: str | bytes) -> str:
    """``value`` (bytes, or text decoded with surrogateescape) as text, U+FFFD for bytes not UTF-8."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    return value.decode("utf-8", "replace")


def split_node_list(nodes: str) -> list[str]:
    """Split a node list at the commas outside brackets: ``"a[1-2],b"`` -> ``["a[1-2]", "b"]``."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(nodes):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(nodes[start:index])
            start = index + 1
    parts.append(nodes[start:])
    return [part.strip() for part in parts if part.strip()]


def parse_hostnames(text: str) -> list[str]:
    """Host names from ``scontrol show hostnames``: one per line."""
    return [_text(line).strip() for line in text.splitlines() if line.strip()]


@dataclass
class Discovery:
    """The target groups of the running jobs, from Slurm through ``run`` (injected in tests)."""

    exporter_port: int = DEFAULT_EXPORTER_PORT
    job_match: str = ".*"  # a job name must match all of it (anchored, as in Prometheus relabelling)
    partitions: tuple[str, ...] = ()  # empty: every partition
    squeue: str = "squeue"
    scontrol: str = "scontrol"
    timeout: float = 10.0
    run: Runner = run_command
    _pattern: re.Pattern = field(init=False, repr=False)
    _hostnames: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)

    MAX_CACHED_NODE_LISTS = 4096

    def __post_init__(self) -> None:
        self._pattern = re.compile(self.job_match)

    def squeue_argv(self, fmt: str) -> list[str]:
        argv = [self.squeue, "--noheader", "--states=RUNNING", f"--format={fmt}"]
        if self.partitions:
            argv.append("--partition=" + ",".join(self.partitions))
        return argv

    def hostnames(self, nodes: str) -> list[str]:
        """The node names of a compressed node list; ``scontrol show hostnames`` only for the parts
        with brackets, and once per distinct list."""
        names: list[str] = []
        for part in split_node_list(nodes):
            if "[" not in part:
                names.append(part)
                continue
            cached = self._hostnames.get(part)
            if cached is None:
                cached = parse_hostnames(self.run([self.scontrol, "show", "hostnames", part], self.timeout))
                if not cached:
                    raise SlurmError(f"scontrol show hostnames {part} printed no host")
                if len(self._hostnames) >= self.MAX_CACHED_NODE_LISTS:
                    self._hostnames.clear()
                self._hostnames[part] = cached
            names.extend(cached)
        return names

    def target_groups(self) -> list[dict]:
        """One group per running job whose name matches, oldest job first, each node in one group
        only; SlurmError if Slurm fails."""
        groups = []
        listed: set[str] = set()
        jobs = self.run(self.squeue_argv(SQUEUE_JOBS_FORMAT), self.timeout)
        named = self.run(self.squeue_argv(SQUEUE_NAMES_FORMAT), self.timeout)
        for job in sorted(parse_squeue(jobs, named), key=_age):
            if not self._pattern.fullmatch(job.labels["slurm_job_name"]):
                continue
            if self.partitions and job.labels["slurm_partition"] not in self.partitions:
                continue  # squeue filtered already; a job in several partitions prints the one it runs in
            targets = [f"{_host(name)}:{self.exporter_port}" for name in self.hostnames(job.nodes)]
            targets = [target for target in targets if target not in listed]  # an older job's node already
            listed.update(targets)
            if targets:
                groups.append({"targets": targets, "labels": dict(job.labels)})
        return groups


def _age(job: Job) -> tuple[int, str]:
    """Oldest first: the job id's number (``4213`` of an array task ``4213_5``), then the id."""
    job_id = job.labels["slurm_job_id"]
    digits = re.match(r"\d+", job_id)
    return (int(digits.group()) if digits else 1 << 62, job_id)


def _host(name: str) -> str:
    return f"[{name}]" if ":" in name else name


class CachedTargets:
    """The ``/targets`` body, rebuilt at most once per ``ttl`` seconds; on a Slurm failure the last
    good body is kept (and the failure logged), before any good one the failure is raised."""

    def __init__(self, discovery: Discovery, ttl: float, clock: Callable[[], float] = time.monotonic):
        self.discovery, self.ttl, self.clock = discovery, ttl, clock
        self._lock = threading.Lock()
        self._checked: float | None = None  # when Slurm was last asked, good answer or not
        self._body: bytes | None = None
        self._gzipped: bytes | None = None
        self._error: str | None = None

    def body(self, compressed: bool = False) -> bytes:
        with self._lock:  # one Slurm call at a time; concurrent requests share its answer
            now = self.clock()
            if self._checked is None or now - self._checked >= self.ttl:
                self._checked = now
                self._refresh()
            if self._body is None:
                raise SlurmError(self._error or "no answer from Slurm yet")
            if not compressed:
                return self._body
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._body, compresslevel=1)
            return self._gzipped

    def _refresh(self) -> None:
        started = time.monotonic()
        try:
            groups = self.discovery.target_groups()
        except (SlurmError, re.error) as exc:
            self._error = str(exc)
            if self._body is None:
                log.error("service discovery failed, no earlier answer to serve: %s", exc)
            else:
                log.error("service discovery failed, serving the last good answer: %s", exc)
            return
        body = (json.dumps(groups, separators=(",", ":"), sort_keys=False) + "\n").encode()
        if body != self._body:
            self._body, self._gzipped = body, None
            log.info("%d jobs, %d targets (Slurm answered in %.2fs)", len(groups),
                     sum(len(group["targets"]) for group in groups), time.monotonic() - started)
        if self._error is not None:
            log.info("Slurm answers again")
            self._error = None


class TargetsExposition(Exposition):
    """What the exporter's HTTP server serves at its telemetry path, here ``/targets``: the JSON of
    ``CachedTargets`` (gzipped when the client accepts it)."""

    def __init__(self, targets: CachedTargets):
        super().__init__(())
        self.targets = targets

    def encode(self, accept: str, names: list[str] | None = None,
               compressed: bool = False, arrived: float | None = None) -> tuple[bytes, str]:
        return self.targets.body(compressed), JSON_TYPE


def serve(address: tuple[str, int], targets: CachedTargets,
          web: web_config.WebConfig | None = None) -> tuple[ExporterHTTPServer, threading.Thread]:
    """Bind (OSError if taken) and serve ``/targets`` and ``/-/healthy`` in a daemon thread."""
    server = ExporterHTTPServer(address, TargetsExposition(targets), TARGETS_PATH, lambda: True, web)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return server, thread


def _partitions(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


DESCRIPTION = ("Prometheus HTTP service discovery (http_sd_configs) for verl jobs on a Slurm cluster: "
                    f"{TARGETS_PATH} lists each running job's nodes as targets, with the job as labels.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``verl-exporter slurm-sd``."""
    p.add_argument("--web.listen-address", dest="listen", default=DEFAULT_LISTEN,
                   help=f"address to serve {TARGETS_PATH} and /-/healthy on (default {DEFAULT_LISTEN})")
    p.add_argument("--web.config.file", dest="web_config", default="",
                   help="TLS and basic auth, in the exporter's (exporter-toolkit's) web config format")
    p.add_argument("--exporter-port", type=int, default=DEFAULT_EXPORTER_PORT,
                   help=f"port of the verl exporter on each node (default {DEFAULT_EXPORTER_PORT})")
    p.add_argument("--job.match", dest="job_match", default=".*", metavar="REGEX",
                   help="only jobs whose whole name matches (default: every job)")
    p.add_argument("--partition", action="append", default=[], metavar="NAME[,NAME]",
                   help="only jobs in these partitions (repeatable; default: every partition)")
    p.add_argument("--cache-ttl", default="5s", metavar="DURATION",
                   help="ask Slurm at most once per DURATION; requests in between get the last answer (default 5s)")
    p.add_argument("--slurm.timeout", dest="timeout", default="10s", metavar="DURATION",
                   help="a Slurm command running longer is killed; the last good answer is served (default 10s)")
    p.add_argument("--squeue", default=shutil.which("squeue") or "squeue", help="squeue binary (default: from PATH)")
    p.add_argument("--scontrol", default=shutil.which("scontrol") or "scontrol",
                   help="scontrol binary (default: from PATH)")
    p.add_argument("--log.level", dest="log_level", default="info", choices=("debug", "info", "warn", "error"))


def run(args: argparse.Namespace, args_parser: argparse.ArgumentParser) -> int:
    try:
        address = parse_listen_address(args.listen)
        ttl, timeout = parse_duration(args.cache_ttl), parse_duration(args.timeout)
        discovery = Discovery(exporter_port=args.exporter_port, job_match=args.job_match,
                              partitions=_partitions(args.partition), squeue=args.squeue,
                              scontrol=args.scontrol, timeout=timeout)
        web = web_config.load(args.web_config)
    except re.error as exc:
        args_parser.error(f"--job.match {args.job_match!r}: {exc}")
    except (ValueError, web_config.WebConfigError) as exc:
        args_parser.error(str(exc))
    if not 0 < args.exporter_port < 65536:
        args_parser.error(f"--exporter-port {args.exporter_port}: not a port")
    logging.basicConfig(level=args.log_level.upper().replace("WARN", "WARNING"), format=LOG_FORMAT)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        server, thread = serve(address, CachedTargets(discovery, ttl), web)
    except OSError as exc:
        log.error("cannot listen on %s: %s", args.listen, exc.strerror or exc)
        return 2
    log.info("serving %s on %s (exporters on port %d, job names matching %r, partitions %s)", TARGETS_PATH,
             args.listen, args.exporter_port, args.job_match, ",".join(discovery.partitions) or "all")
    stop.wait()
    log.info("shutting down")
    server.shutdown()
    server.server_close()
    thread.join(5)
    return 0
