"""flowlib: the client library of flownet.

Asyncio first::

    import flowlib

    async with await flowlib.connect(["127.0.0.1:7001", "127.0.0.1:7002"], name="app") as c:
        flow = await c.create()
        listener = await c.listen(flow, "data")
        await c.send(flow, b"hello", band=32)
        async for msg in listener:
            ...

and the seed's synchronous names (``flow_connect``, ``flow_addlistener``, ``flow_get``, ...)
through :class:`flowlib.sync.SyncFlowClient`.
"""

from flowrouter.bands import BandMask
from flowrouter.control import Fault, FaultKind, JoinStatus
from flowrouter.flowid import FlowID
from flowrouter.header import Locality

from .client import DEFAULT_REQUEST_TIMEOUT, FlowClient, connect, listen_mask
from .errors import (ConnectError, ConnectionLost, Empty, FlowError, FlowTimeout, JoinRefused,
                     ListenerClosed, MessageTooLarge)
from .message import Message, decode_fault
from .queue import DEFAULT_QUEUE_SIZE, Listener, Overflow
from .sync import SyncFlowClient, flow_connect

__all__ = [
    # async API
    "connect", "FlowClient", "Listener", "Message", "Overflow", "decode_fault", "listen_mask",
    # sync facade
    "flow_connect", "SyncFlowClient",
    # errors
    "FlowError", "ConnectError", "JoinRefused", "FlowTimeout", "MessageTooLarge",
    "ConnectionLost", "Empty", "ListenerClosed",
    # re-exported protocol names an application needs
    "FlowID", "BandMask", "Locality", "Fault", "FaultKind", "JoinStatus",
    "DEFAULT_QUEUE_SIZE", "DEFAULT_REQUEST_TIMEOUT",
]
