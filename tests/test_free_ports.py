"""Ports named up front (topology files, configs, the launcher's control ports) come from
below the kernel's ephemeral range: a port from that range may be given to any outgoing
connection (a router dialling a peer, say) between the check and the bind, and the router
meant to listen on it exits with "address in use" (launcher routers exiting with code 1
when many test processes ran at once)."""

from __future__ import annotations

import socket

from flowrouter.testbed import ports


def test_ports_named_up_front_are_free_and_below_the_ephemeral_range() -> None:
    low = ports.ephemeral_low()
    assert low > ports.LOWEST
    for n in (1, 10, 40):
        base = ports.free_port_block(n)
        assert base >= ports.LOWEST and base + n <= low
        for port in range(base, base + n):  # each one free just now
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
    udp = ports.free_port(kind=socket.SOCK_DGRAM)
    assert ports.LOWEST <= udp < low
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", udp))


def test_a_port_in_use_is_never_handed_out() -> None:
    """Every port of a block is checked: with ports taken here, none of them comes back."""
    held = []
    try:
        for _ in range(50):
            s = socket.socket()
            s.bind(("127.0.0.1", ports.free_port()))
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        for _ in range(50):
            base = ports.free_port_block(3)
            assert not taken & {base, base + 1, base + 2}
    finally:
        for s in held:
            s.close()
