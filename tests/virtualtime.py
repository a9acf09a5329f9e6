"""An asyncio event loop on virtual time, for testing the client's asyncio shell.

:func:`run_virtual` runs a coroutine on a loop whose clock starts at 0 and jumps straight to
the next timer whenever nothing is ready (trio's autojump clock does the same): sleeps and
timeouts cost no wall-clock time and their outcome does not depend on the machine's load.
Only timers advance the clock; a test that waits on real I/O should not use it.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector loop whose ``time()`` is virtual: an idle wait advances it instead of
    sleeping."""

    def __init__(self) -> None:
        selector = selectors.DefaultSelector()
        super().__init__(selector)
        self.now = 0.0
        real_select = selector.select

        def select(timeout: float | None = None) -> list[Any]:
            ready = real_select(0)
            if not ready and timeout is not None and timeout > 0:
                self.now += timeout  # nothing to do until the next timer: jump to it
            return ready

        selector.select = select  # type: ignore[method-assign]

    def time(self) -> float:
        return self.now


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
