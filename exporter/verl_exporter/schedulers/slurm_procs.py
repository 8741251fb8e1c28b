"""The Slurm jobs with a process on this node, read from ``/proc``: a process belongs to a job by
``SLURM_JOB_ID`` in its environment (read with a bound) or a cgroup path holding ``job_<id>``. Who
runs each process is the owner of its ``/proc/PID``; what a job's environment says (its GPUs, the
node's name in Slurm) is taken only from processes of the job's own user (``LocalJob.of_user``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .slurm_jobs import gpu_list

MAX_ENVIRON_BYTES = 256 << 10  # of /proc/PID/environ: the kernel caps argv + env at a few MiB, jobs use less
# Of one variable kept: a GPU list is short, and every process of every user may hold 128 KiB ones.
MAX_VALUE_BYTES = 4096
# A job id as Slurm writes it (a uint32, no leading zero): "0042", "４２" or "²" would be a second
# name for a job, or one scontrol cannot read.
JOB_ID = re.compile(r"[1-9][0-9]{0,9}")
_CGROUP_JOB = re.compile(r"/job_([0-9]+)(?:/|$)")


@dataclass
class LocalJob:
    """A job's processes on this node, who runs them, and what their environment says: the GPUs
    (``SLURM_JOB_GPUS``, else ``CUDA_VISIBLE_DEVICES``) and this node's name in Slurm
    (``SLURMD_NODENAME``). Only ``of_user(uid)`` fills ``gpus`` and ``node``, from that user's
    processes, and its ``pids`` keep only the processes of that user or of the job's cgroup: anyone
    can put a job's id in the environment of a process of theirs, only the job's user runs its tasks."""

    pids: set[int] = field(default_factory=set)
    uids: set[int] = field(default_factory=set)  # of its processes (slurmstepd's root among them)
    # pid -> (uid, environment) of the processes whose environment names the job
    environments: dict[int, tuple[int | None, dict[str, str]]] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()
    node: str = ""

    def add(self, pid: int, uid: int | None, env: dict[str, str]) -> None:
        self.pids.add(pid)
        if uid is not None:
            self.uids.add(uid)
        if env:
            self.environments[pid] = (uid, env)

    def of_user(self, uid: int) -> "LocalJob":
        """The job as the processes of ``uid`` describe it: another user's process that names the
        job in its environment is none of its processes (its memory, CPU and GPUs are not the job's)."""
        pids = {pid for pid in self.pids if self.environments.get(pid, (uid,))[0] == uid}
        job = LocalJob(pids, self.uids, self.environments)
        for owner, env in self.environments.values():
            if owner != uid:
                continue
            job.node = job.node or env.get("SLURMD_NODENAME", "")
            gpus = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES")
            if gpus and (not job.gpus or "SLURM_JOB_GPUS" in env):
                job.gpus = gpu_list(gpus)
        return job


def job_owner(slurm_uid: int | None, uids: set[int]) -> int | None:
    """The uid whose files are the job's: Slurm's word (``UserId``) where the job's processes agree,
    None where they do not (a job name can hold `` UserId=root(0)``, and scontrol's one line does
    not escape it). A root job is believed only when all of its processes run as root."""
    if slurm_uid is None:
        return next(iter(uids)) if len(uids) == 1 else None
    if slurm_uid == 0:
        return 0 if uids == {0} else None
    return slurm_uid if slurm_uid in uids else None


def read_environ(path: str, limit: int = MAX_ENVIRON_BYTES) -> dict[str, str]:
    """The environment in ``path`` (``/proc/PID/environ``), at most ``limit`` bytes of it."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit)
    except OSError:
        return {}
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"SLURM_JOB_ID", b"SLURM_JOBID", b"SLURM_JOB_GPUS", b"CUDA_VISIBLE_DEVICES",
                              b"SLURMD_NODENAME") and len(value) <= MAX_VALUE_BYTES:
            env[key.decode("ascii")] = value.decode("utf-8", "replace")
    return env


def scan_proc(proc_root: str = "/proc", own_pid: int | None = None) -> dict[str, LocalJob]:
    """The Slurm jobs with a process on this node, by job id."""
    own = os.getpid() if own_pid is None else own_pid
    jobs: dict[str, LocalJob] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return jobs
    for entry in entries:
        if not entry.isdigit() or int(entry) == own:
            continue
        base = os.path.join(proc_root, entry)
        env = read_environ(os.path.join(base, "environ"))
        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or _cgroup_job(os.path.join(base, "cgroup"))
        if not job_id or not JOB_ID.fullmatch(job_id):
            continue
        named = env if env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") else {}
        jobs.setdefault(job_id, LocalJob()).add(int(entry), _uid(base), named)
    return jobs


def _uid(path: str) -> int | None:
    """The uid a process runs as: the owner of its ``/proc/PID``."""
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def _cgroup_job(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            text = handle.read(64 << 10).decode("utf-8", "replace")
    except OSError:
        return None
    match = _CGROUP_JOB.search(text)
    return match.group(1) if match else None
