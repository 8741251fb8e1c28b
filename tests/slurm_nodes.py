"""Several Slurm compute nodes on one machine, for the test cluster: a network namespace per node.

Each node is a network namespace (``ip netns``) joined to the machine by a veth pair on a bridge of
its own, with an address on a private /24. Its ``slurmd`` runs in that namespace and in new UTS, PID
and mount namespaces: the node's host name is its Slurm name, it sees only its own processes in
``/proc`` (as a real node does), and its ``/etc/hosts`` (bind-mounted) names the controller and every
node. slurmctld stays on the machine itself, at the bridge's address. The file system is the
machine's: the nodes share it, as a Slurm cluster shares home and scratch.

``NodeNetwork.create(names, workdir)`` builds it (raises :class:`NodesUnavailable` with the command's
message where namespaces cannot be made); ``remove()`` takes it all down, also half-made.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


class NodesUnavailable(Exception):
    """Namespaces cannot be made here; the message says why."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if result.returncode != 0:
        raise NodesUnavailable(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")


@dataclass
class NodeNetwork:
    """The bridge, the nodes' namespaces and addresses, and the hosts file they share."""

    tag: str
    controller_address: str
    addresses: dict[str, str]  # node name -> address
    hosts_file: Path
    namespaces: dict[str, str] = field(default_factory=dict)  # node name -> netns name

    @property
    def bridge(self) -> str:
        return f"vtb{self.tag}"

    @classmethod
    def create(cls, names: list[str], workdir: Path) -> "NodeNetwork":
        for tool in ("ip", "nsenter", "unshare"):
            if shutil.which(tool) is None:
                raise NodesUnavailable(f"{tool} is not installed (iproute2, util-linux)")
        tag = f"{random.randrange(16**4):04x}"
        subnet = f"10.254.{random.randrange(256)}"
        hosts = workdir / "hosts"
        network = cls(tag, f"{subnet}.1", {name: f"{subnet}.{11 + index}" for index, name in enumerate(names)}, hosts)
        try:
            network._build()
        except BaseException:
            network.remove()
            raise
        controller = socket.gethostname().split(".")[0]
        lines = ["127.0.0.1 localhost", f"{network.controller_address} {controller}",
                 *(f"{address} {name}" for name, address in network.addresses.items())]
        hosts.write_text("\n".join(lines) + "\n")
        return network

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.controller_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index, (name, address) in enumerate(self.addresses.items()):
            netns, host_end, node_end = f"verl-{self.tag}-{name}", f"vth{self.tag}{index}", f"vtn{self.tag}{index}"
            _ip("netns", "add", netns)
            self.namespaces[name] = netns
            _ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
            _ip("link", "set", node_end, "netns", netns)
            _ip("link", "set", host_end, "master", self.bridge, "up")
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", node_end)
            _ip("-n", netns, "link", "set", node_end, "up")
            _ip("-n", netns, "link", "set", "lo", "up")

    def node_command(self, name: str, command: list[str]) -> list[str]:
        """``command`` started as the node's init: in its network namespace and new UTS, PID and mount
        namespaces, with its host name and the shared hosts file (``/proc`` is the node's own)."""
        script = f'hostname "$0" && mount --bind {self.hosts_file} /etc/hosts && exec "$@"'
        # nsenter, not `ip netns exec`: that remounts /sys, and slurmd wants the machine's cgroups.
        return ["nsenter", f"--net=/run/netns/{self.namespaces[name]}", "unshare", "--uts", "--pid", "--fork",
                "--mount", "--mount-proc", "sh", "-c", script, name, *command]

    def with_hosts(self, command: list[str]) -> list[str]:
        """``command`` on the machine, resolving the nodes' names (a mount namespace of its own)."""
        return ["unshare", "--mount", "sh", "-c", f'mount --bind {self.hosts_file} /etc/hosts && exec "$@"', "sh",
                *command]

    def remove(self) -> None:
        for netns in self.namespaces.values():  # a namespace takes its end of the veth pair with it
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True, timeout=10)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, timeout=10)


def enter_command(init_pid: int, command: list[str]) -> list[str]:
    """``command`` inside the namespaces of a node whose init process is ``init_pid``."""
    return ["nsenter", "-t", str(init_pid), "--net", "--uts", "--pid", "--mount", *command]


def init_pid(launcher_pid: int) -> int | None:
    """The node's init (``unshare --fork``'s child) from the launcher's pid, once it forked."""
    try:
        children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def kill_node(launcher_pid: int) -> None:
    """Stop a node: its init's death ends every process of its PID namespace."""
    pid = init_pid(launcher_pid)
    for target in (pid, launcher_pid):
        if target is not None:
            with contextlib.suppress(OSError):
                os.kill(target, 9)
