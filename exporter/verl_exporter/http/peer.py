"""Who is at the other end of a connection from this host: the uid of the process that opened it.

An address says nothing of the user: every user of a node can connect from ``127.0.0.1``. For a
Unix socket the kernel tells (``SO_PEERCRED``); for TCP over loopback the client's socket is a row
of ``/proc/net/tcp`` (``tcp6``) whose local address is the client's and whose remote address is
ours, and that row names the uid that created it. None where it cannot be told (another host, a
client gone, another network namespace): then the connection is nobody's.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys

PROC_NET = "/proc/net"
MAX_TABLE_BYTES = 64 << 20  # of /proc/net/tcp6: about 400,000 sockets


def peer_uid(sock: socket.socket, proc_net: str = PROC_NET) -> int | None:
    """The uid of the process at the other end of ``sock``, where this host can tell it."""
    try:
        if sock.family == socket.AF_UNIX:
            credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return struct.unpack("3i", credentials)[1]
        peer, ours = sock.getpeername(), sock.getsockname()
    except OSError:
        return None
    for table, client, server in _rows_wanted(peer, ours):
        uid = _uid_in(f"{proc_net}/{table}", client, server)
        if uid is not None:
            return uid
    return None


def _rows_wanted(peer: tuple, ours: tuple) -> list[tuple[str, str, str]]:
    """(table, the client's socket's local address, its remote address), as /proc/net writes them;
    a client that reached an IPv6 listener over IPv4 (``::ffff:127.0.0.1``) has an IPv4 socket."""
    try:
        client = ipaddress.ip_address(peer[0].partition("%")[0])
        server = ipaddress.ip_address(ours[0].partition("%")[0])
    except ValueError:
        return []
    wanted = []
    if client.version == 6 and server.version == 6:
        mapped_client, mapped_server = client.ipv4_mapped, server.ipv4_mapped
        if mapped_client is not None and mapped_server is not None:
            wanted.append(("tcp", _entry(mapped_client, peer[1]), _entry(mapped_server, ours[1])))
    wanted.append(("tcp6" if client.version == 6 else "tcp", _entry(client, peer[1]), _entry(server, ours[1])))
    return wanted


def _entry(address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """``address:port`` as /proc/net/tcp writes it: each 32-bit word of the address in the host's
    byte order, in hex, then the port in hex."""
    packed = address.packed
    words = "".join(f"{int.from_bytes(packed[i:i + 4], sys.byteorder):08X}" for i in range(0, len(packed), 4))
    return f"{words}:{port:04X}"


def _uid_in(path: str, local: str, remote: str) -> int | None:
    try:
        with open(path, "rb") as table:
            text = table.read(MAX_TABLE_BYTES).decode("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and fields[1] == local and fields[2] == remote:
            try:
                return int(fields[7])
            except ValueError:
                return None
    return None
