"""A real Slurm cluster for tests: munged, slurmctld and slurmd from Debian, in a temp dir.

``slurm_cluster(workdir)`` is a context manager: it writes a munge key and a ``slurm.conf`` (the
node's real CPUs and memory from ``slurmd -C``, free loopback ports, every state, spool, log and pid
path under ``workdir``), starts ``munged -F``, ``slurmctld -D`` and ``slurmd -D`` as children of
the test process, waits until ``sinfo`` shows the node idle and yields a :class:`SlurmCluster`.
On the way out it cancels every job, stops the daemons and kills whatever still carries the
cluster's marker in its environment (the job steps ``slurmstepd`` forks off and the jobs' own
processes), so nothing outlives the cluster, also when the body raised.

With ``nodes=N`` (N > 1) the cluster has N compute nodes ``node1``..``nodeN``, each a slurmd in
namespaces of its own (``slurm_nodes.py``: its own address, host name and ``/proc``), each with two
GPUs in Slurm's eyes (``Gres=gpu:2``, device files that are ``/dev/null``'s twins), so that a job of
several nodes runs the way verl's Ray-on-Slurm example runs: ``cluster.on_node(name, argv)`` starts a
process inside a node (a per-node exporter), ``cluster.with_hosts(argv)`` one on the machine that
resolves the nodes' names (a Prometheus that scrapes them).

Where the daemons cannot start (not root, packages missing, the container forbids something) it
raises :class:`SlurmUnavailable` with the reason and the daemon's log tail; the ``slurm`` fixture in
``conftest.py`` turns that into a skip. Slurm client calls need ``cluster.env`` (``SLURM_CONF``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from slurm_nodes import NodeNetwork, NodesUnavailable, enter_command, init_pid, kill_node

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "squeue", "sbatch", "scontrol", "scancel")
MARKER = "VERL_TEST_SLURM_CLUSTER"  # in the environment of the daemons and the jobs: what to sweep
START_TIMEOUT = 30.0


class SlurmUnavailable(Exception):
    """The cluster cannot run here; the message says why (with the daemon's log tail)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _binary(name: str) -> str:
    candidates = (f"/usr/sbin/{name}", f"/usr/bin/{name}")  # sbin is not on every PATH
    path = shutil.which(name) or next((p for p in candidates if os.access(p, os.X_OK)), None)
    if path is None:
        raise SlurmUnavailable(f"{name} is not installed; `make tools` installs Debian's slurmctld, slurmd, "
                               "munge and slurm-client")
    return path


def node_resources(slurmd: str) -> dict[str, str]:
    """This machine as ``slurmd -C`` sees it: ``{"NodeName": ..., "CPUs": ..., "RealMemory": ...}``."""
    try:
        out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmUnavailable(f"`slurmd -C` failed: {exc}") from exc
    line = next((line for line in out.splitlines() if line.startswith("NodeName=")), "")
    fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
    if "CPUs" not in fields or "RealMemory" not in fields:
        raise SlurmUnavailable(f"`slurmd -C` printed no node line: {out!r}")
    return fields


def node_name(node: dict[str, str]) -> str:
    """The name slurmd and slurmctld know this machine by (the short host name), as ``slurmd -C`` says."""
    return node.get("NodeName") or socket.gethostname().split(".")[0]


def write_conf(workdir: Path, *, node: dict[str, str], ctld_port: int, slurmd_port: int, munge_socket: Path,
               network: NodeNetwork | None = None) -> Path:
    """``slurm.conf`` for this machine as the one node, or for the nodes of ``network`` (two GPUs each)."""
    hostname = node_name(node)
    dirs = {name: workdir / name for name in ("state", "spool", "log", "run")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    # The node's words from `slurmd -C` past CPUs and memory (sockets, cores, threads) must agree with
    # CPUs, so they are kept as printed; UpTime is not a node setting.
    hardware = " ".join(f"{key}={value}" for key, value in node.items() if key not in ("NodeName", "UpTime"))
    if network is None:
        controller = "127.0.0.1"
        nodes = f"NodeName={hostname} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN"
        partition, per_node = hostname, ""
    else:
        controller = network.controller_address
        nodes = "\n".join(f"NodeName={name} NodeAddr={address} {hardware} Gres=gpu:2 State=UNKNOWN"
                          for name, address in network.addresses.items())
        partition, per_node = ",".join(network.addresses), "-%n"
        devices = workdir / "dev"
        devices.mkdir(exist_ok=True)
        for index in range(2):  # GPUs in Slurm's eyes: character devices, /dev/null's numbers
            path = devices / f"nvidia{index}"
            if not path.exists():
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (workdir / "gres.conf").write_text(f"Name=gpu File={devices}/nvidia[0-1]\n")
        for name in network.addresses:
            (dirs["spool"] / name).mkdir(exist_ok=True)
    conf = f"""\
ClusterName=verltest
SlurmctldHost={hostname}({controller})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
KillWait=2
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
StateSaveLocation={dirs['state']}
SlurmdSpoolDir={dirs['spool']}{'/%n' if network else ''}
SlurmctldPidFile={dirs['run'] / 'slurmctld.pid'}
SlurmdPidFile={dirs['run'] / 'slurmd'}{per_node}.pid
SlurmctldLogFile={dirs['log'] / 'slurmctld.log'}
SlurmdLogFile={dirs['log'] / 'slurmd'}{per_node}.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={workdir / 'plugstack.conf'}
{"GresTypes=gpu" if network else ""}
{nodes}
PartitionName=debug Nodes={partition} Default=YES MaxTime=INFINITE State=UP
"""
    (workdir / "plugstack.conf").write_text("")
    path = workdir / "slurm.conf"
    path.write_text(conf)
    return path


@dataclass
class SlurmCluster:
    """A running cluster: ``env`` for Slurm client commands, and helpers over them."""

    workdir: Path
    conf: Path
    env: dict[str, str]
    node: str  # the first node's name
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    network: NodeNetwork | None = None  # with several nodes
    nodes: list[str] = field(default_factory=list)

    def address(self, node: str) -> str:
        """Where the machine reaches ``node`` (127.0.0.1 for the one-node cluster)."""
        return self.network.addresses[node] if self.network else "127.0.0.1"

    def on_node(self, node: str, command: list[str]) -> list[str]:
        """``command`` to run inside ``node`` (its network, host name and processes)."""
        if self.network is None:
            return command
        pid = init_pid(self.processes[f"slurmd-{node}"].pid)
        assert pid is not None, f"{node} has no init process"
        return enter_command(pid, command)

    def with_hosts(self, command: list[str]) -> list[str]:
        """``command`` on the machine, with the nodes' names resolving to their addresses."""
        return self.network.with_hosts(command) if self.network else command

    def run(self, *args: str, timeout: float = 20.0, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command with ``env``; raises with its stderr when it fails (``check``)."""
        result = subprocess.run(list(args), capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"{shlex.join(args)} exited with {result.returncode}: {result.stderr.strip()}")
        return result

    def sbatch(self, script_text: str | None, **options: object) -> str:
        """Submit ``script_text`` (a ``#!`` script; None with ``wrap="command"``) with ``--key=value``
        options (``job_name=`` is ``--job-name``; ``True`` is a bare flag); the job id. Unless given,
        the job runs in, and writes ``slurm-<id>.out`` to, the cluster's ``jobs/`` folder."""
        jobs = self.workdir / "jobs"
        jobs.mkdir(exist_ok=True)
        options.setdefault("chdir", jobs)
        options.setdefault("output", jobs / "slurm-%j.out")
        script = []
        if script_text is not None:
            path = jobs / f"job-{time.monotonic_ns()}.sh"
            path.write_text(script_text)
            script = [str(path)]
        flags = [f"--{key.replace('_', '-')}" + ("" if value is True else f"={value}")
                 for key, value in options.items()]
        out = self.run("sbatch", "--parsable", *flags, *script).stdout.strip()
        return out.split(";")[0]

    def squeue(self, *args: str) -> list[dict[str, str]]:
        """The jobs in the queue: id, name, user, partition, state, nodes (one dict each)."""
        keys = ("id", "name", "user", "partition", "state", "nodes")
        out = self.run("squeue", "--noheader", "--format=%i|%j|%u|%P|%T|%N", *args).stdout
        return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line.strip()]

    def scontrol_show_job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o``'s fields (``JobState``, ``StdOut``, ``NodeList``, ...); empty
        when Slurm no longer knows the job."""
        result = self.run("scontrol", "show", "job", "--oneliner", str(job_id), check=False)
        if result.returncode != 0:
            return {}
        # Paths (Command, WorkDir, StdOut) may hold spaces: a value runs up to the next " Key=".
        fields: dict[str, str] = {}
        key = r"[A-Za-z][A-Za-z0-9_:/]*"
        for match in re.finditer(rf"(?:^|\s)({key})=(.*?)(?=\s{key}=|$)", result.stdout.strip()):
            fields.setdefault(match.group(1), match.group(2))
        return fields

    def job_state(self, job_id: str) -> str:
        return self.scontrol_show_job(job_id).get("JobState", "")

    def wait_state(self, job_id: str, states: str | Iterable[str], timeout: float = 30.0) -> str:
        """Wait until the job is in one of ``states`` (``RUNNING``, ``COMPLETED``, ...); the state."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in wanted:
                return state
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not in {sorted(wanted)} after {timeout:g}s "
                             f"(last state {state or 'unknown'})\n{self.log_tail('slurmctld')}")

    def log_tail(self, daemon: str, lines: int = 20) -> str:
        path = self.workdir / "log" / f"{daemon}.log"
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        return f"--- {daemon} log ({path}) ---\n" + "\n".join(text)

    def node_state(self) -> str:
        """The nodes' state, one word where they agree (``idle``), else each node's."""
        result = self.run("sinfo", "--noheader", "--Node", "--format=%T", check=False)
        states = set(result.stdout.split())
        return states.pop() if len(states) == 1 else " ".join(sorted(states))


def _sweep(marker_value: str, *, exclude: set[int]) -> list[int]:
    """Kill every process whose environment carries ``MARKER=marker_value``; the pids killed."""
    needle = f"{MARKER}={marker_value}".encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def _stop(process: subprocess.Popen, timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def slurm_cluster(workdir: Path, *, start_timeout: float = START_TIMEOUT, nodes: int = 1) -> Iterator[SlurmCluster]:
    """Start a cluster of ``nodes`` nodes under ``workdir`` (must exist and be private to the caller)."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("the test Slurm cluster runs its daemons as root (SlurmUser=root); not root here")
    binaries = {name: _binary(name) for name in (*DAEMONS, *CLIENTS)}
    workdir = Path(workdir).resolve()
    # munged checks that every directory above its socket and key is not writable by others.
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)
    node = node_resources(binaries["slurmd"])
    munge_dir = workdir / "munge"
    munge_dir.mkdir(mode=0o700, exist_ok=True)
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    munge_socket = munge_dir / "munge.socket"
    network = None
    if nodes > 1:
        try:
            network = NodeNetwork.create([f"node{index}" for index in range(1, nodes + 1)], workdir)
        except NodesUnavailable as exc:
            raise SlurmUnavailable(f"no network namespaces for {nodes} nodes: {exc}") from exc
    try:
        conf = write_conf(workdir, node=node, ctld_port=_free_port(), slurmd_port=_free_port(),
                          munge_socket=munge_socket, network=network)
    except BaseException:
        if network is not None:
            network.remove()
        raise
    marker = str(workdir)
    env = {**os.environ, "SLURM_CONF": str(conf), MARKER: marker}
    for name in list(env):  # a job's settings in the caller's environment would leak into sbatch
        if name.startswith(("SLURM_", "SBATCH_", "SQUEUE_", "SINFO_")) and name != "SLURM_CONF":
            del env[name]
    names = list(network.addresses) if network else [node_name(node)]
    cluster = SlurmCluster(workdir=workdir, conf=conf, env=env, node=names[0], network=network, nodes=names)
    logs = workdir / "log"
    logs.mkdir(exist_ok=True)

    def start(name: str, args: list[str]) -> None:
        with open(logs / f"{name}.stdout", "wb") as out:
            cluster.processes[name] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                       cwd=workdir, start_new_session=True)

    def unavailable(reason: str, daemon: str) -> SlurmUnavailable:
        tail = cluster.log_tail(daemon)
        stdout = logs / f"{daemon}.stdout"
        if stdout.exists() and stdout.stat().st_size:
            tail += f"\n--- {daemon} output ---\n" + "\n".join(stdout.read_text(errors="replace").splitlines()[-20:])
        return SlurmUnavailable(f"{reason}\n{tail}")

    try:
        start("munged", [binaries["munged"], "--foreground", "--force", f"--key-file={key}",
                         f"--socket={munge_socket}", f"--pid-file={munge_dir / 'munged.pid'}",
                         f"--seed-file={munge_dir / 'munged.seed'}", f"--log-file={logs / 'munged.log'}"])
        _wait(lambda: munge_socket.exists(), cluster, "munged", 10, unavailable)
        start("slurmctld", [binaries["slurmctld"], "-D", "-f", str(conf)])
        _wait(lambda: cluster.run("scontrol", "ping", check=False, timeout=5).returncode == 0, cluster, "slurmctld",
              start_timeout, unavailable)
        if network is None:
            start("slurmd", [binaries["slurmd"], "-D", "-f", str(conf)])
        for name in names if network else ():
            start(f"slurmd-{name}", network.node_command(name, [binaries["slurmd"], "-D", "-f", str(conf)]))
        _wait(lambda: cluster.node_state() == "idle", cluster, "slurmd" if network is None else f"slurmd-{names[0]}",
              start_timeout, unavailable)
        yield cluster
    finally:
        _shutdown(cluster, marker)


def _wait(condition, cluster: SlurmCluster, daemon: str, timeout: float, unavailable) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, process in cluster.processes.items():
            if process.poll() is not None:
                raise unavailable(f"{name} exited with {process.returncode} while starting", name)
        with contextlib.suppress(subprocess.TimeoutExpired):
            if condition():
                return
        time.sleep(0.1)
    raise unavailable(f"{daemon} not ready after {timeout:g}s", daemon)


def _shutdown(cluster: SlurmCluster, marker: str) -> None:
    processes = cluster.processes
    if "slurmctld" in processes and processes["slurmctld"].poll() is None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            jobs = cluster.run("squeue", "--noheader", "--format=%i", check=False, timeout=5).stdout.split()
            if jobs:
                cluster.run("scancel", *jobs, check=False, timeout=5)
    for name, process in processes.items():
        if name.startswith("slurmd-"):
            kill_node(process.pid)
            _stop(process)
    for name in ("slurmd", "slurmctld", "munged"):
        if name in processes:
            _stop(processes[name])
    if cluster.network is not None:
        cluster.network.remove()
    # slurmstepd daemonizes, so jobs are nobody's children here: what carries the marker goes.
    exclude = {os.getpid(), *(p.pid for p in processes.values())}
    for _ in range(3):
        if not _sweep(marker, exclude=exclude):
            break
        time.sleep(0.1)
