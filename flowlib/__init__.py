"""flowlib: the client library of flownet.
May import only the wire layer of flowrouter (flowrouter.wire); applications build on it.

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

:class:`FlowClient` is an asyncio shell around a sans-I/O protocol object
(:class:`flowlib.protocol.ClientProtocol`: bytes and time in, events and bytes out); its
options are one :class:`ClientOptions`, given as keywords to :func:`connect` or whole.
A router address is TCP (``"host:port"``) or a datagram link (``"udp://host:port"``,
:mod:`flowlib.dgram`). With several router addresses the client fails over to the next
router when its router dies (:mod:`flowlib.failover`); messages larger than a frame are
fragmented and reassembled (:mod:`flowlib.fragment`); receive-queue overflows are
reported on the overflow band (:mod:`flowlib.notices`);
:class:`flowlib.heartbeat.Heartbeat` tracks a flow's members.
Capability, policy and link-key files are read by :mod:`flowlib.credentials`; every tool
takes the same connection flags from :mod:`flowlib.cliopts`.
"""

from flowrouter.wire.bands import BandMask
from flowrouter.wire.control import Fault, FaultKind, JoinStatus
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import Locality

from .client import (
                     DEFAULT_FAILOVER_TIMEOUT,
                     DEFAULT_REQUEST_TIMEOUT,
                     ClientOptions,
                     FailoverEvent,
                     FlowClient,
                     connect,
                     listen_mask,
)
from .errors import (
                     ConnectError,
                     ConnectionLost,
                     Empty,
                     FailoverInProgress,
                     FlowError,
                     FlowTimeout,
                     JoinRefused,
                     ListenerClosed,
                     MessageTooLarge,
)
from .fragment import DEFAULT_MAX_MESSAGE_SIZE
from .heartbeat import Heartbeat, MembershipChange, Peer, PeerState
from .members import Member, MemberUpdate, MemberView, MemberWatch
from .message import Message, decode_fault
from .queue import DEFAULT_QUEUE_SIZE, Listener, Overflow
from .sync import SyncFlowClient, flow_connect

__all__ = [
    # async API
    "connect", "FlowClient", "ClientOptions", "Listener", "Message", "Overflow", "decode_fault",
    "listen_mask",
    "FailoverEvent", "Heartbeat", "MembershipChange", "Peer", "PeerState",
    "Member", "MemberUpdate", "MemberView", "MemberWatch",
    # sync facade
    "flow_connect", "SyncFlowClient",
    # errors
    "FlowError", "ConnectError", "JoinRefused", "FlowTimeout", "MessageTooLarge",
    "ConnectionLost", "FailoverInProgress", "Empty", "ListenerClosed",
    # re-exported protocol names an application needs
    "FlowID", "BandMask", "Locality", "Fault", "FaultKind", "JoinStatus",
    "DEFAULT_QUEUE_SIZE", "DEFAULT_REQUEST_TIMEOUT", "DEFAULT_FAILOVER_TIMEOUT",
    "DEFAULT_MAX_MESSAGE_SIZE",
]
