"""A deterministic in-memory network for driving the sans-I/O router core in tests.

``CoreNet`` holds :class:`flowrouter.core.router.Router` objects, router-router links and fake
endpoints. Every frame a router sends is checked (valid header, size matches the payload),
recorded on the wire it crossed, and either queued for the far router or handed to the far
endpoint. The queue is FIFO and pumped synchronously; time only moves when a test says so
(``net.tick(now)``), and every router call gets ``net.now``.

An :class:`Endpoint` is a link whose far side is a recorder: it says HELLO, records every frame
(decoding control messages and faults), answers ECHOs unless ``silent`` (which makes the router
hold it to the liveness rule), and has helpers to join / leave / change its mask / refresh its
joins / send data.
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

from flowrouter.core.router import Close, Router, RouterParams, Send
from flowrouter.core.tables import Modifiers
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_MEMBERSHIP, ROUTER_BANDS_END, mask_of
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import DEFAULT_TTL, Header, pack_header, parse_header

LINK_KEY = LINK_LOCAL_FLOW.key
CREATOR = 0xC0FFEE


def flow(lsid: int, local: int = 1, creator: int = CREATOR) -> FlowID:
    return FlowID(creator, lsid, local)


def bits(*bands: int) -> int:
    """The band mask holding *bands*."""
    return mask_of(list(bands))


def key_of(f: FlowID | bytes) -> bytes:
    return f if isinstance(f, bytes) else f.key


@dataclass
class Frame:
    header: Header
    payload: bytes
    msg: Any = None  #: decoded control message, or a decoded Fault on the fault band

    @property
    def band(self) -> int:
        return self.header.band

    @property
    def key(self) -> bytes:
        return self.header.key

    @property
    def is_data(self) -> bool:
        """Application-visible traffic of a flow (band >= 16, not link-local)."""
        return self.key != LINK_KEY and self.band >= ROUTER_BANDS_END


def make_frame(header: bytes, payload: bytes) -> Frame:
    h = parse_header(header)
    assert h.size == len(payload), f"header says {h.size} bytes, payload has {len(payload)}"
    msg = None
    if h.band < ROUTER_BANDS_END or h.key == LINK_KEY:
        msg = C.decode(payload)  # a router must never emit a control frame it cannot decode
    elif h.band == BAND_FAULT:
        try:
            msg = C.decode(payload)
        except ValueError:
            msg = None
    return Frame(h, payload, msg)


class Endpoint:
    """The far side of an endpoint link: a recorder with a tiny client."""

    def __init__(self, net: CoreNet, name: str, router: str, link_id: int,
                 silent: bool = False) -> None:
        self.net = net
        self.name = name
        self.router = router
        self.link_id = link_id
        self.silent = silent
        self.closed = False
        self.frames: list[Frame] = []
        self._req = itertools.count(1000)
        #: what this endpoint wants (key -> (mask, flags)), as its digests list it
        self.wanted: dict[bytes, tuple[int, int]] = {}
        self.refreshing = True  #: send a digest every refresh interval (unless silent)
        self.said_hello = False
        self.next_refresh = 0.0
        self._round = 0

    # ---------------------------------------------------------------- what arrived
    def deliver(self, frame: Frame) -> list[tuple[bytes, bytes]]:
        self.frames.append(frame)
        if self.silent or self.closed:
            return []
        if isinstance(frame.msg, C.Echo):
            body = C.EchoReply(frame.msg.seq, frame.msg.stamp).encode()
            return [(pack_header(LINK_KEY, len(body), BAND_MEMBERSHIP), body)]
        if isinstance(frame.msg, (C.NotOnTree, C.Prune)):
            out = []
            for key in frame.msg.keys:
                if key in self.wanted:
                    mask, flags = self.wanted[key]
                    body = C.Join(next(self._req), mask, flags).encode()
                    out.append((pack_header(key, len(body), BAND_MEMBERSHIP), body))
            return out
        return []

    def refresh(self, pump: bool = True) -> None:
        """Send one digest round (a single chunk) of what this endpoint wants."""
        self._round += 1
        entries = tuple((k, m, f) for k, (m, f) in sorted(self.wanted.items()))
        self.control(LINK_KEY, C.Refresh(self._round, 0, 1, 0, entries), pump=pump)

    def data(self, f: FlowID | bytes | None = None, band: int | None = None) -> list[Frame]:
        return [fr for fr in self.frames if fr.is_data
                and (f is None or fr.key == key_of(f))
                and (band is None or fr.band == band)
                and not isinstance(fr.msg, C.Fault)]

    def payloads(self, f: FlowID | bytes | None = None) -> list[bytes]:
        return [fr.payload for fr in self.data(f)]

    def bands(self, f: FlowID | bytes | None = None) -> set[int]:
        return {fr.band for fr in self.data(f)}

    def msgs(self, kind: type, f: FlowID | bytes | None = None) -> list[Any]:
        return [fr.msg for fr in self.frames if isinstance(fr.msg, kind)
                and (f is None or fr.key == key_of(f))]

    def acks(self, f: FlowID | bytes | None = None) -> list[C.JoinAck]:
        return self.msgs(C.JoinAck, f)

    def faults(self, f: FlowID | bytes | None = None) -> list[C.Fault]:
        return self.msgs(C.Fault, f)

    def pings(self, f: FlowID | bytes | None = None) -> list[C.Ping]:
        return self.msgs(C.Ping, f)

    def clear(self) -> None:
        self.frames.clear()

    # ---------------------------------------------------------------- what it sends
    def send_raw(self, header: bytes, payload: bytes, pump: bool = True) -> None:
        self.net.to_router(self.router, self.link_id, header, payload)
        if pump:
            self.net.pump()

    def control(self, f: FlowID | bytes, msg: Any, band: int = BAND_MEMBERSHIP,
                pump: bool = True) -> None:
        body = msg.encode()
        self.send_raw(pack_header(key_of(f), len(body), band), body, pump)

    def hello(self, role: C.Role = C.Role.ENDPOINT, max_payload: int = 65536,
              pump: bool = True, features: int = C.FEATURES) -> None:
        """Say HELLO, announcing *features* (0: a client from before soft state)."""
        self.said_hello = True
        body = C.Hello(self.link_id, role, self.name, max_payload).encode()
        self.send_raw(C.hello_header(len(body), features), body, pump)

    def join(self, f: FlowID, bands: Any = "data", flags: int = 0, pump: bool = True) -> int:
        """JOIN with *bands* (anything mask_of takes; a bare int is a raw 128-bit mask)."""
        req = next(self._req)
        mask = mask_of(bands) if not isinstance(bands, int) else bands
        self.wanted[key_of(f)] = (mask, flags)
        self.control(f, C.Join(req, mask, flags), pump=pump)
        return req

    def set_mask(self, f: FlowID, bands: Any, pump: bool = True) -> None:
        mask = mask_of(bands) if not isinstance(bands, int) else bands
        if key_of(f) in self.wanted:
            self.wanted[key_of(f)] = (mask, self.wanted[key_of(f)][1])
        self.control(f, C.Mask(mask), pump=pump)

    def leave(self, f: FlowID, pump: bool = True) -> None:
        self.wanted.pop(key_of(f), None)
        self.control(f, C.Leave(), pump=pump)

    def send(self, f: FlowID, band: int, payload: bytes, ttl: int = DEFAULT_TTL,
             loc_type: int = 0, loc_value: int = 0, pump: bool = True) -> None:
        self.send_raw(pack_header(f.key, len(payload), band, loc_type, loc_value, ttl),
                      payload, pump)

    def __repr__(self) -> str:
        return f"<Endpoint {self.name} on {self.router} link {self.link_id}>"


class CoreNet:
    """Routers, links and endpoints in one process, driven by a FIFO event queue."""

    def __init__(self, **defaults: Any) -> None:
        self.now = 0.0
        self.defaults = defaults
        self.routers: dict[str, Router] = {}
        self.endpoints: dict[str, Endpoint] = {}
        self._ids = itertools.count(1)
        #: (router, link) -> ("router", name, link) or ("endpoint", Endpoint)
        self.peer: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.rlink: dict[tuple[str, str], int] = {}  #: (router, neighbour) -> link id
        self.wire: dict[tuple[str, int], list[Frame]] = defaultdict(list)
        self.closes: list[tuple[str, int, str]] = []  #: Close actions, in order
        self.dead: set[tuple[str, int]] = set()
        self.lost: list[tuple[str, int, Frame]] = []  #: sent on a link already closed
        self.queue: deque[tuple[Any, ...]] = deque()
        self.events = 0
        #: frames for which this returns True are lost on the wire: (sender, link, frame)
        self.lossy: Any = None
        #: routers that are hung (SIGSTOP): they neither tick nor read
        self.frozen: set[str] = set()

    # ---------------------------------------------------------------- building
    def router(self, name: str, **params: Any) -> Router:
        kw = {**self.defaults, **params}
        r = Router(RouterParams(name=name, node_id=len(self.routers) + 1, **kw), now=self.now)
        self.routers[name] = r
        return r

    def connect(self, a: str, b: str, mods_a: Modifiers | None = None,
                mods_b: Modifiers | None = None) -> tuple[int, int]:
        """A router-router link; ``mods_a`` is what a's side charges for crossing it."""
        la, lb = next(self._ids), next(self._ids)
        self.peer[(a, la)] = ("router", b, lb)
        self.peer[(b, lb)] = ("router", a, la)
        self.rlink[(a, b)] = la
        self.rlink[(b, a)] = lb
        self.apply(a, self.routers[a].open_link(la, self.now, transport="sim", address=b,
                                                modifiers=mods_a, expected_peer=b))
        self.apply(b, self.routers[b].open_link(lb, self.now, transport="sim", address=a,
                                                modifiers=mods_b, expected_peer=a))
        self.pump()
        return la, lb

    def endpoint(self, name: str, router: str, modifiers: Modifiers | None = None,
                 silent: bool = False, role: C.Role = C.Role.ENDPOINT,
                 hello: bool = True, features: int = C.FEATURES) -> Endpoint:
        lid = next(self._ids)
        ep = Endpoint(self, name, router, lid, silent)
        self.endpoints[name] = ep
        self.peer[(router, lid)] = ("endpoint", ep)
        self.apply(router, self.routers[router].open_link(lid, self.now, transport="sim",
                                                          address=name, modifiers=modifiers))
        if hello:
            ep.hello(role, features=features)
        return ep

    def link(self, a: str, b: str) -> int:
        return self.rlink[(a, b)]

    # ---------------------------------------------------------------- failures
    def cut(self, a: str, b: str, reason: str = "cable cut") -> None:
        """Both transports of the a-b link fail (a notices first)."""
        self.queue.append(("close", a, self.rlink[(a, b)], reason))
        self.queue.append(("close", b, self.rlink[(b, a)], reason))
        self.pump()

    def disconnect(self, ep: Endpoint, reason: str = "endpoint went away") -> None:
        ep.closed = True
        self.queue.append(("close", ep.router, ep.link_id, reason))
        self.pump()

    def inject(self, src: str, dst: str, header: bytes, payload: bytes) -> None:
        """Deliver an arbitrary frame to *dst* as if *src* had sent it on their link."""
        self.queue.append(("rx", dst, self.rlink[(dst, src)], header, payload))
        self.pump()

    # ---------------------------------------------------------------- time
    def tick(self, now: float, step: float = 0.25) -> None:
        """Move time to *now*, ticking every router at least every *step* seconds on the way
        (as a daemon would: link liveness needs the echoes of the time in between)."""
        assert now >= self.now, "time never goes backwards"
        while self.now + step < now:
            self._tick_at(round(self.now + step, 9))
        self._tick_at(now)

    def _tick_at(self, now: float) -> None:
        self.now = now
        for name, r in self.routers.items():
            if name not in self.frozen:
                self.apply(name, r.tick(now))
        interval = self.defaults.get("refresh_interval", C.DEFAULT_REFRESH_INTERVAL)
        for ep in self.endpoints.values():
            if (ep.refreshing and ep.said_hello and not ep.silent and not ep.closed
                    and now >= ep.next_refresh):
                ep.next_refresh = now + interval
                ep.refresh(pump=False)
        self.pump()

    def run(self, until: float, step: float) -> None:
        t = self.now
        while t + step <= until + 1e-9:
            t = round(t + step, 9)
            self.tick(t)

    # ---------------------------------------------------------------- plumbing
    def to_router(self, router: str, link_id: int, header: bytes, payload: bytes) -> None:
        self.queue.append(("rx", router, link_id, bytes(header), bytes(payload)))

    def pump(self, limit: int = 200_000) -> None:
        """Deliver queued events (and everything they cause) until the network is quiet."""
        n = 0
        while self.step():
            n += 1
            assert n < limit, "event storm: the network does not settle"

    def step(self) -> bool:
        """Deliver one queued event; False if the queue was empty."""
        if not self.queue:
            return False
        ev = self.queue.popleft()
        self.events += 1
        if ev[0] == "rx":
            _, name, lid, hdr, payload = ev
            if (name, lid) not in self.dead and name not in self.frozen:
                self.apply(name, self.routers[name].receive(lid, hdr, payload, self.now))
        else:
            _, name, lid, reason = ev
            if (name, lid) not in self.dead:
                self.dead.add((name, lid))
                self.apply(name, self.routers[name].close_link(lid, self.now, reason))
        return True

    def apply(self, name: str, actions: list[Any]) -> None:
        for act in actions:
            if isinstance(act, Send):
                frame = make_frame(bytes(act.header), bytes(act.payload))
                if self.lossy is not None and self.lossy(name, act.link, frame):
                    self.lost.append((name, act.link, frame))
                    continue
                if (name, act.link) in self.dead:
                    self.lost.append((name, act.link, frame))
                    continue
                self.wire[(name, act.link)].append(frame)
                far = self.peer[(name, act.link)]
                if far[0] == "router":
                    self.queue.append(("rx", far[1], far[2], bytes(act.header),
                                       bytes(act.payload)))
                else:
                    ep: Endpoint = far[1]
                    if ep.closed:
                        self.lost.append((name, act.link, frame))
                        continue
                    for hdr, body in ep.deliver(frame):
                        self.to_router(name, act.link, hdr, body)
            elif isinstance(act, Close):
                self.closes.append((name, act.link, act.reason))
                self.dead.add((name, act.link))
                far = self.peer[(name, act.link)]
                if far[0] == "router":  # the peer sees its transport close
                    self.queue.append(("close", far[1], far[2], "peer closed the link"))
                else:
                    far[1].closed = True
            else:  # pragma: no cover
                raise AssertionError(f"unknown action {act!r}")

    # ---------------------------------------------------------------- inspection
    def sent(self, a: str, b: str) -> list[Frame]:
        """Every frame router *a* sent on its link to router *b*."""
        return self.wire[(a, self.rlink[(a, b)])]

    def data_sent(self, a: str, b: str, f: FlowID | None = None) -> list[Frame]:
        return [fr for fr in self.sent(a, b) if fr.is_data and (f is None or fr.key == f.key)]

    def control_sent(self, a: str, b: str, kind: type, f: FlowID | None = None) -> list[Any]:
        return [fr.msg for fr in self.sent(a, b) if isinstance(fr.msg, kind)
                and (f is None or fr.key == f.key)]

    def clear_wires(self) -> None:
        self.wire.clear()
        for ep in self.endpoints.values():
            ep.clear()

    def entry(self, router: str, f: FlowID) -> Any:
        return self.routers[router].flows.get(f.key)

    def has_state(self, f: FlowID) -> list[str]:
        """Names of the routers that hold a route entry for *f*."""
        return [n for n, r in self.routers.items() if f.key in r.flows]


# ---------------------------------------------------------------- stock topologies
LSID = 0x10
#: fast soft state: echo every 0.5 s, dead after 1.5 s, a digest round a second, hold 3 s
SOFT: dict[str, Any] = dict(liveness_interval=0.5, dead_after=1.5, refresh_interval=1.0,
                            hold_factor=3.0)


def chain(n: int = 3, core: int = 1, **defaults: Any) -> CoreNet:
    """r1 - r2 - ... - rn, with the core of LSID 0x10 on r<core>."""
    net = CoreNet(**defaults)
    for i in range(1, n + 1):
        net.router(f"r{i}", core_lsids=frozenset({LSID}) if i == core else frozenset())
    for i in range(1, n):
        net.connect(f"r{i}", f"r{i + 1}")
    return net


def star(leaves: tuple[str, ...] = ("a", "b", "c"), **defaults: Any) -> CoreNet:
    """A hub router ``hub`` (the core of LSID 0x10) with one router per leaf."""
    net = CoreNet(**defaults)
    net.router("hub", core_lsids=frozenset({LSID}))
    for leaf in leaves:
        net.router(leaf)
        net.connect("hub", leaf)
    return net


def diamond(**defaults) -> CoreNet:
    """r1 reaches the core r4 through r2 (preferred: lower link id) or through r3."""
    net = CoreNet(**defaults)
    for name in ("r1", "r2", "r3"):
        net.router(name)
    net.router("r4", core_lsids=frozenset({LSID}))
    net.connect("r1", "r2")
    net.connect("r1", "r3")
    net.connect("r2", "r4")
    net.connect("r3", "r4")
    return net


def filter_net() -> tuple[CoreNet, Endpoint, Endpoint, Endpoint, Endpoint]:
    """chain r1(core)-r2-r3; s on r1 sends; B on r2 wants 40; C, D on r3 want 32, 33."""
    net = chain(3)
    s = net.endpoint("s", "r1")
    b = net.endpoint("B", "r2")
    c = net.endpoint("C", "r3")
    d = net.endpoint("D", "r3")
    b.join(flow(LSID), [40])
    c.join(flow(LSID), [32])
    d.join(flow(LSID), [33])
    net.clear_wires()
    return net, s, b, c, d
