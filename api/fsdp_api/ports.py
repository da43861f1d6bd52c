"""Free TCP ports on this machine, for the processes a local run or a test starts."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from .contract import RDZV_PORT

LOOPBACK = "127.0.0.1"

# Where free_port looks first: below the kernel's ephemeral range (Linux's default starts at
# 32768), above the ports services are usually configured on; never torch's own defaults
# (the rendezvous port, MASTER_PORT's), which processes bind without asking.
PORT_FLOOR = 20000
TORCH_DEFAULT_PORTS = frozenset({RDZV_PORT, 29500})
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_FREE_PORT_TRIES = 200


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands out to ``bind(0)`` and to outgoing connections (Linux's default where unreadable)."""
    try:
        low, high = (int(field) for field in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing is bound to right now, outside the kernel's ephemeral range where there is room.

    A port the kernel picks for ``bind(0)`` comes from the range it also takes the
    source port of every outgoing connection from: one picked now and bound by a
    child process seconds later (a torchrun, an etcd, a metrics server) can be taken
    meanwhile by any client's connection, and that bind fails. A port outside the
    range is only ever taken by an explicit bind, which the check here sees.
    """
    low, high = ephemeral_port_range()
    spans = [(PORT_FLOOR, low - 1), (high + 1, 65535)]
    ports = [
        port
        for first, last in spans
        if last - first >= 1000
        for port in range(first, last + 1)
        if port not in TORCH_DEFAULT_PORTS
    ]
    for port in random.sample(ports, min(len(ports), _FREE_PORT_TRIES)):
        if port_is_free(port, host):
            return port
    with socket.socket() as s:  # no room outside the range (or all taken): the kernel's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
