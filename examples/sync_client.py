"""The synchronous facade (the seed's names, a thread-backed client): for scripts and
programs that do not use asyncio.

    python3 examples/sync_client.py --router 127.0.0.1:7001

prints ``got b'hi'`` and exits 0.
"""

from __future__ import annotations

from _common import routers

from flowlib import flow_connect


def main(addresses: list[str]) -> None:
    host, port = addresses[0].rsplit(":", 1)
    with flow_connect(host, int(port)) as rx, flow_connect(host, int(port)) as tx:
        flow = tx.flow_create()
        queue = rx.flow_addlistener(flow, "data")
        tx.flow_send(flow, b"hi", band=32)
        msg = rx.flow_get_blocked(queue, timeout=10)
        print(f"got {msg.payload!r}")
        rx.flow_removelistener(queue)


if __name__ == "__main__":
    main(routers(__doc__))
