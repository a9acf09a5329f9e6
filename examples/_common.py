"""What every example shares: its ``--router`` flag (as every flownet tool spells it).

The examples are small programs against a running router, e.g. the README's quick start:
``flowrouter run --name r1 --listen 127.0.0.1:7001 --core-lsid 0x10``. Each takes
``--router HOST:PORT`` (repeatable: the others are failed over to) and exits 0 when it did
what its docstring says.
"""

from __future__ import annotations

import argparse


def routers(description: str | None) -> list[str]:
    """The ``--router`` addresses from the command line (default 127.0.0.1:7001)."""
    p = argparse.ArgumentParser(description=(description or "").split("\n\n")[0])
    p.add_argument("--router", action="append", metavar="HOST:PORT",
                   help="a flow router (repeatable; default 127.0.0.1:7001)")
    return p.parse_args().router or ["127.0.0.1:7001"]
