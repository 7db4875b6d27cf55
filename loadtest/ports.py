"""Loopback ports for the servers the load test, the benchmarks and the tests start.

Layer: I/O, the load test's lowest (it binds sockets to learn what is free; it reads the
kernel's ephemeral port range). It must not start or stop anything.

A port learnt by binding port 0 comes from the kernel's ephemeral range: the very range
every outbound connection takes its source port from. Between picking a port and the
server binding it, a client connection may take it, and the server dies with "address
already in use". sched-perf met it: kube-scheduler's port, picked with the control plane,
was bound a minute later, after creating 5,000 nodes had opened thousands of connections.
So ports come from below the ephemeral range (above it on a machine whose range starts
low), where the kernel never hands one to a connection, and each is checked free by
binding it. A port is given out once a process: two servers picked before either starts
must not get the same one.
"""

from __future__ import annotations

import random
import socket
from functools import cache
from pathlib import Path
from typing import Final

LOOPBACK: Final = "127.0.0.1"
EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST: Final = 10_000
"""Below this, ports some machines' own services listen on by convention."""
HIGHEST: Final = 65_535
SMALLEST_SPAN: Final = 2_048
"""Fewer quiet ports than this and a pick is too likely to meet another process's server:
fall back to the kernel's choice."""
_TRIES: Final = 64


def quiet_ports(ephemeral: str) -> range | None:
    """The ports outside the ephemeral range ``ephemeral`` ("LOW HIGH", as the kernel
    writes it) to pick from: below it if there is room, else above it; None if neither
    side has ``SMALLEST_SPAN`` ports."""
    low, high = (int(part) for part in ephemeral.split())
    if low - LOWEST >= SMALLEST_SPAN:
        return range(LOWEST, low)
    if HIGHEST - high >= SMALLEST_SPAN:
        return range(high + 1, HIGHEST + 1)
    return None


class PortPicker:
    """Free loopback ports from ``span``, never the same one twice."""

    __slots__ = ("_given", "_random", "_span")

    def __init__(self, span: range | None, rng: random.Random | None = None) -> None:
        self._span = span
        self._random = rng or random.Random()
        self._given: set[int] = set()

    def pick(self) -> int:
        """A port nothing listens on or is connected from now, not given before."""
        if self._span is not None:
            for _ in range(_TRIES):
                port = self._random.choice(self._span)
                if port not in self._given and _bindable(port):
                    self._given.add(port)
                    return port
        while True:  # the kernel's choice: no quiet range, or it is crowded
            port = _kernel_port()
            if port not in self._given:
                self._given.add(port)
                return port


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


@cache
def _picker() -> PortPicker:
    # One picker a process, because "given out once" must hold whichever caller asks.
    try:
        span = quiet_ports(EPHEMERAL_RANGE.read_text())
    except (OSError, ValueError):
        span = None
    return PortPicker(span)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, outside the ephemeral range
    where possible, and not given out before in this process."""
    return _picker().pick()
