"""Free loopback ports for routers started as processes (the launcher, tests, benchmarks).

A port that is named up front (a topology file, a router's config, a peer's address) is
chosen here, then bound by another process a moment later. Asking the kernel for port 0
hands out a port of its *ephemeral range* (``/proc/sys/net/ipv4/ip_local_port_range``,
32768-60999 by default), the same range it takes the local end of every outgoing
connection from: a router dialling a peer that has not bound its port yet, or any other
connection on the machine, may be given that very port in between, and the router that
was to listen on it exits with "address in use" (seen as launcher routers exiting with
code 1 when many test processes run at once). So ports come from below that range, picked
at random and checked by binding each (only other processes choosing the same way can still
race, and a random pick makes that rare).

Imports only the standard library.
"""

from __future__ import annotations

import random
import socket

#: the lowest port handed out; the highest is just below the ephemeral range
LOWEST = 20000
_DEFAULT_EPHEMERAL = 32768


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL
    return low if low > LOWEST + 1000 else _DEFAULT_EPHEMERAL


def free_port_block(n: int = 1, host: str = "127.0.0.1", *,
                    kind: int = socket.SOCK_STREAM) -> int:
    """The first of *n* ports in a row, all free on *host* just now (each bound once, then
    released), below the ephemeral range (see the module docstring)."""
    top = ephemeral_low() - n
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(LOWEST, top)
        try:
            for port in range(base, base + n):
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind((host, port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n} free ports in a row on {host} between {LOWEST} and {top + n}")


def free_port(host: str = "127.0.0.1", *, kind: int = socket.SOCK_STREAM) -> int:
    """One port free on *host* just now, below the ephemeral range (the socket kind by
    keyword: given by position it would be read as the host)."""
    return free_port_block(1, host, kind=kind)
