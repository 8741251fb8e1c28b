"""Slurm's word on a job: ``scontrol show job -d -o <id>`` asked (``show_job``) and its one line read
(``SlurmJob``: name, user, partition, nodes, GPUs, state, output files), the output files'
replacement symbols (sbatch's ``--output`` grammar: ``%j`` ``%x`` ``%u`` ``%N`` ``%A`` ``%a`` ``%%``
and the rest) resolved, Slurm's host and GPU lists read."""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass

log = logging.getLogger("verl_exporter.schedulers.slurm")  # the --slurm daemon's one log

SCONTROL_TIMEOUT = 10.0
NO_VAL = "4294967294"  # what Slurm writes for %a outside an array job
MAX_GPUS = 128  # of one job on one node: a user's environment must not make thousands of series
PATH_MAX = 4096  # a longer resolved path names no file (a long %x many times over)
_FINAL_OK = ("COMPLETED",)

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_fields(text: str) -> dict[str, str]:
    """``Key=value`` pairs of ``scontrol show job -o``'s one line (a value may hold spaces: it runs
    to the next `` Key=``); the first of a key repeated (per-node details of ``-d``) wins."""
    # scontrol ends its line at "\n" only: str.splitlines() would also cut a job name at \x1c or U+2028.
    line = text.strip().split("\n")[0] if text.strip() else ""
    marks = list(_KEY.finditer(line))
    fields: dict[str, str] = {}
    for mark, following in zip(marks, [*marks[1:], None]):
        end = following.start() if following is not None else len(line)
        fields.setdefault(mark.group(1), line[mark.end():end].strip())
    return fields


@dataclass(frozen=True)
class SlurmJob:
    """What ``scontrol show job`` says of a job."""

    job_id: str
    job_name: str = ""
    user: str = ""
    uid: int | None = None
    account: str = ""  # "" where a job name could have forged it (two ``Account=`` on the line)
    partition: str = ""
    node_list: str = ""
    batch_host: str = ""
    work_dir: str = ""
    std_out: str = ""
    std_err: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    state: str = ""
    exit_code: str = ""
    reason: str = ""  # why the job waits or ended (TimeLimit, NonZeroExitCode, NodeDown); "" for None
    gres_gpus: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "SlurmJob | None":
        """The job of ``scontrol show job -o``'s output; None where it names none."""
        fields = parse_fields(text)
        if not fields.get("JobId"):
            return None
        gres = re.search(r"gpu[^\s(]*\(IDX:([^)]*)\)", fields.get("GRES", "") + " " + text)
        return cls(
            job_id=fields["JobId"], job_name=fields.get("JobName", ""),
            user=re.sub(r"\(\d+\)$", "", fields.get("UserId", "")), uid=_uid(fields.get("UserId", "")),
            account=_account(fields.get("Account", "")) if text.count(" Account=") == 1 else "",
            partition=fields.get("Partition", ""),
            node_list=fields.get("NodeList", ""), batch_host=fields.get("BatchHost", ""),
            work_dir=fields.get("WorkDir", ""), std_out=fields.get("StdOut", ""), std_err=fields.get("StdErr", ""),
            array_job_id=fields.get("ArrayJobId", ""), array_task_id=fields.get("ArrayTaskId", ""),
            state=fields.get("JobState", ""), exit_code=fields.get("ExitCode", ""),
            reason="" if fields.get("Reason", "None") == "None" else fields.get("Reason", ""),
            gres_gpus=gpu_list(gres.group(1)) if gres else (),
        )

    @property
    def finished_ok(self) -> bool:
        return self.state in _FINAL_OK and self.exit_code in ("0:0", "0")

    def output_files(self, hostname: str = "") -> list[str]:
        """The files the job's batch step writes, patterns resolved, /dev/null left out, each once."""
        paths: list[str] = []
        for pattern in (self.std_out, self.std_err):
            path = resolve_path(pattern, self, hostname)
            if path is not None and path not in paths:
                paths.append(path)
        return paths


def _uid(user_id: str) -> int | None:
    """The uid of scontrol's ``UserId=alice(1001)``; None where it names none."""
    match = re.search(r"\((\d+)\)$", user_id)
    return int(match.group(1)) if match else None


_USER_IDS = re.compile(r"(?:^|\s)UserId=[^\s(]*\((\d+)\)")


def named_uids(text: str) -> set[int]:
    """Every uid that a ``UserId=name(uid)`` of scontrol's answer names: Slurm's own, and any a job
    name holds (scontrol does not escape it)."""
    return {int(uid) for uid in _USER_IDS.findall(text)}


_PATTERN = re.compile(r"%(\d*)([%AaJjNnstux])")


def resolve_path(pattern: str, job: SlurmJob, hostname: str = "") -> str | None:
    """``pattern`` (sbatch's ``--output`` grammar) with its replacement symbols resolved, relative
    to the job's WorkDir; None for no file (empty, ``(null)``, ``/dev/null``)."""
    if not pattern or pattern in ("(null)", "/dev/null"):
        return None
    if "\\" in pattern:  # sbatch: a backslash turns the replacement symbols off
        path = pattern.replace("\\", "")
    else:
        node = job.batch_host or first_node(job.node_list) or hostname.split(".")[0]
        values = {"%": "%", "j": job.job_id, "J": f"{job.job_id}.batch", "A": job.array_job_id or job.job_id,
                  "a": job.array_task_id or NO_VAL, "N": node, "n": "0", "s": "batch", "t": "0",
                  "u": job.user, "x": job.job_name}

        def replace(match: re.Match[str]) -> str:
            width, symbol = match.group(1), match.group(2)
            value = values[symbol]
            if width and symbol != "%" and value.isdigit():
                return value.zfill(min(int(width), 10))
            return value

        path = _PATTERN.sub(replace, pattern)
    if path == "/dev/null":
        return None
    if not os.path.isabs(path) and job.work_dir:
        path = os.path.join(job.work_dir, path)
    path = os.path.normpath(path)
    return path if len(path) <= PATH_MAX else None


def first_node(node_list: str) -> str:
    """The first host of a Slurm host list: ``gpu[03-05,9],cpu1`` -> ``gpu03``."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", node_list.strip())
    if not match or not match.group(1) and not match.group(2):
        return ""
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def gpu_list(text: str) -> tuple[str, ...]:
    """GPU indices of ``0,1``, ``0-3``, ``0-1,4`` (SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES, gres IDX);
    other words (GPU UUIDs) are kept as they are."""
    gpus: list[str] = []
    for item in text.replace(" ", "").split(","):
        if not item or item.lower() in ("n/a", "(null)", "nodevfiles"):
            continue
        low, dash, high = item.partition("-")
        if dash and low.isdigit() and high.isdigit() and int(high) - int(low) < 1024:
            gpus += [str(index) for index in range(int(low), int(high) + 1)]
        else:
            gpus.append(item)
        if len(gpus) > MAX_GPUS:
            break
    return tuple(dict.fromkeys(gpus))[:MAX_GPUS]


def show_job(job_id: str) -> str | None:
    """``scontrol show job -d -o <id>``'s output; None where scontrol fails (no such job any more)."""
    try:
        # A job name or path is any bytes its user chose: decoding strictly would fail the whole look.
        done = subprocess.run(["scontrol", "show", "job", "-d", "-o", job_id], capture_output=True, encoding="utf-8",
                              errors="replace", timeout=SCONTROL_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("scontrol show job %s failed: %s", job_id, exc)
        return None
    if done.returncode != 0:
        log.debug("scontrol show job %s: %s", job_id, done.stderr.strip()[:200])
        return None
    return done.stdout


def _account(text: str) -> str:
    """Slurm's account of a job; "" for none (``(null)`` on a cluster without accounting)."""
    return "" if text in ("(null)", "None") else text
