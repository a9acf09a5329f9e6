"""Free loopback ports for tests that must name ports up front (topology files, configs)."""

from __future__ import annotations

import socket


def free_port_block(n: int = 1) -> int:
    """A port p with p .. p+n-1 all free on 127.0.0.1 just now (checked by binding each)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                x = socket.socket()
                socks.append(x)
                x.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for x in socks:
                x.close()
    raise RuntimeError(f"no block of {n} free ports found")
