"""What one client can hold of a router: connections per port, idle time-outs, descriptors.

:class:`ServerLimits` is the ``[limits]`` table of the router config (checked here, parsed
by :mod:`flowrouter.net.configtables`). :class:`ConnectionGate` keeps the counts and makes
the decisions for every connection the node accepts or dials; the shells (TCP links, the
control interface, the HTTP monitor) ask it when a connection arrives and tell it when one
goes. Limits, why:

* **Per port.** Each TCP listen port, the control port and the HTTP monitor admit at most
  so many connections at once (``listen_connections``, ``control_connections``,
  ``http_connections``). On a listen port a connection stops counting once it proves it
  is a router, so applications cannot fill a port routers need.
* **Idle time-outs.** A control connection silent for ``control_idle`` seconds and an HTTP
  request not received within ``http_idle`` seconds are closed; a link's handshake has its
  own time-out (the core's).
* **Descriptors.** At start the node raises its soft ``RLIMIT_NOFILE`` to the hard limit
  (:func:`raise_descriptor_limit`); ``descriptor_reserve`` of them are kept for routers,
  dialling out and fail-over. Once the descriptors in use reach the limit minus the
  reserve, applications are refused with that reason (the core's trust boundary answers
  their HELLO with it) and the control and HTTP ports take no new connection; a connection
  on a port routers may use is still accepted for its HELLO up to the limit minus half the
  reserve, so a router can always come back after a cut. The rest is for dialling.

Every refusal is counted (``refused.<kind>``: ``port-connections``, ``descriptors``) and
raised as an alert of that kind (the node hands it to the core: counted, logged at most once
per interval, listed under the status's alerts; without that hook, logged here at most once
per interval per kind); the counts are in the status (``connections``).

Sans-I/O apart from :func:`raise_descriptor_limit` and :func:`descriptors_open` (which read
the process's limit and its open descriptors); imports only the standard library.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

try:
    import resource
except ImportError:  # pragma: no cover - not on POSIX
    resource = None  # type: ignore[assignment]

log = logging.getLogger("flowrouter.net.runtime")

#: how often one kind of refusal is logged at most (seconds); all are counted
LOG_INTERVAL = 5.0
#: what a router assumes when the platform cannot say
FALLBACK_DESCRIPTORS = 1024


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The ``[limits]`` table: what one client can make the router hold or do."""

    #: digest entries processed per tick over all links (the rest wait: core.workbudget)
    work_per_tick: int = 20_000
    #: digest entries one application may have waiting before its further digests drop
    work_backlog: int = 65_536
    #: control messages (joins, digests, echoes, ...) one application may have handled per
    #: tick; more are dropped until the next tick
    control_per_tick: int = 1024
    #: connections at once per TCP listen port, proven routers not counted
    listen_connections: int = 4096
    #: connections at once on the control port and on the HTTP monitor
    control_connections: int = 64
    http_connections: int = 64
    #: seconds a control connection may stay silent; an HTTP request may take to arrive
    control_idle: float = 60.0
    http_idle: float = 10.0
    #: descriptors kept for routers, dialling out and fail-over
    descriptor_reserve: int = 64
    #: descriptors the router may use (0: the process limit, raised to the hard limit; never
    #: more than that)
    descriptors: int = 0

    def __post_init__(self) -> None:
        for key in ("work_per_tick", "control_per_tick", "listen_connections",
                    "control_connections", "http_connections"):
            if getattr(self, key) < 1:
                raise ValueError(f"[limits] {key} must be at least 1")
        if self.work_backlog < 0 or self.descriptor_reserve < 0 or self.descriptors < 0:
            raise ValueError("[limits] work_backlog, descriptor_reserve and descriptors "
                             "must not be negative")
        if not self.control_idle > 0 or not self.http_idle > 0:
            raise ValueError("[limits] control_idle and http_idle must be positive seconds")
        if self.descriptors and self.descriptors <= self.descriptor_reserve:
            raise ValueError("[limits] descriptors must exceed descriptor_reserve")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def raise_descriptor_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; the limit now in force."""
    if resource is None:  # pragma: no cover - not on POSIX
        return FALLBACK_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    target = soft if hard == resource.RLIM_INFINITY else hard
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target,
                        exc)
    return int(soft)


def descriptors_open() -> int:
    """Descriptors this process has open now (0 when the platform cannot say)."""
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(path))
        except OSError:
            continue
    return 0


#: connection kinds that are not listen ports
CONTROL, HTTP, DIAL = "control", "http", "dial"


class ConnectionGate:
    """Counts of open connections per port and kind, and who may connect now."""

    def __init__(self, limits: ServerLimits, counters: MutableMapping[str, int],
                 descriptors: int, baseline: int,
                 on_budget: Callable[[str | None], None] | None = None,
                 on_trip: Callable[[str, str], None] | None = None) -> None:
        self.limits = limits
        self.counters = counters
        #: the descriptors the router may use, and those open before it served anything
        self.descriptors = (min(limits.descriptors, descriptors) if limits.descriptors
                            else descriptors)  # never more than the process may open
        self.baseline = baseline
        #: told whether applications are refused now for lack of descriptors (the reason)
        self.on_budget = on_budget
        #: told of each refusal (kind, why): the router's alerts
        self.on_trip = on_trip
        #: open connections per port key ("listen HOST:PORT", CONTROL, HTTP, DIAL) and those
        #: of them that count against the port's cap
        self.open_by_port: dict[str, int] = {}
        self.counted: dict[str, int] = {}
        self._budget: str | None = None
        self._logged: dict[str, float] = {}

    # ------------------------------------------------------------------ state
    @property
    def in_use(self) -> int:
        """Descriptors in use: the baseline and every open connection."""
        return self.baseline + sum(self.open_by_port.values())

    @property
    def app_limit(self) -> int:
        """Descriptors in use at which applications are refused."""
        return max(1, self.descriptors - self.limits.descriptor_reserve)

    @property
    def hard_limit(self) -> int:
        """Descriptors in use at which only dialling out is left."""
        return max(1, self.descriptors - self.limits.descriptor_reserve // 2)

    def _cap(self, port: str) -> int:
        lim = self.limits
        if port == CONTROL:
            return lim.control_connections
        if port == HTTP:
            return lim.http_connections
        return lim.listen_connections

    # ------------------------------------------------------------------ events
    def admit(self, port: str, now: float, *, routers: bool = True) -> str | None:
        """A connection arrived on *port* (or we dialled: :data:`DIAL`). None: keep it
        (counted until :meth:`release`); else why it must be closed at once (counted,
        logged now and then). *routers*: routers may connect on this port (they may use
        the reserve for their HELLO)."""
        used = self.in_use
        why: str | None = None
        if port == DIAL:
            pass
        elif used >= self.hard_limit or (used >= self.app_limit
                                         and (port in (CONTROL, HTTP) or not routers)):
            why = (f"descriptor budget: {used} of {self.descriptors} in use, the last "
                   f"{self.limits.descriptor_reserve} kept for routers and fail-over")
            kind = "descriptors"
        elif self.counted.get(port, 0) >= self._cap(port):
            why = (f"{port}: {self._cap(port)} connections at once already (limit)")
            kind = "port-connections"
        if why is not None:
            self.counters[f"refused.{kind}"] += 1
            if self.on_trip is not None:
                self.on_trip(kind, why)
            else:
                self._log(kind, now, why)
            return why
        self.open_by_port[port] = self.open_by_port.get(port, 0) + 1
        if port != DIAL:
            self.counted[port] = self.counted.get(port, 0) + 1
        self._update_budget()
        return None

    def proven_router(self, port: str) -> None:
        """A connection on *port* proved it is a router: no longer counted against the
        port's cap (it still holds a descriptor)."""
        if self.counted.get(port, 0) > 0:
            self.counted[port] -= 1

    def release(self, port: str, counted: bool = True) -> None:
        """A connection admitted on *port* closed (*counted*: it still counted against
        the port's cap, i.e. it never proved it is a router)."""
        n = self.open_by_port.get(port, 0)
        if n <= 1:
            self.open_by_port.pop(port, None)
        else:
            self.open_by_port[port] = n - 1
        if counted and port != DIAL and self.counted.get(port, 0) > 0:
            self.counted[port] -= 1
        self._update_budget()

    def idle_closed(self, port: str, now: float, seconds: float) -> None:
        """A connection on *port* was closed for silence (counted, logged now and then)."""
        self.counters[f"closed.idle-{port}"] += 1
        self._log(f"idle-{port}", now, f"{port} connection silent for {seconds:g}s: closed")

    def _update_budget(self) -> None:
        used = self.in_use
        budget = None
        if used >= self.app_limit:
            budget = (f"descriptor budget: {used} of {self.descriptors} descriptors in use, "
                      f"the last {self.limits.descriptor_reserve} kept for routers and "
                      "fail-over")
        if (budget is None) != (self._budget is None) and self.on_budget is not None:
            self.on_budget(budget)
        self._budget = budget

    def _log(self, kind: str, now: float, text: str) -> None:
        last = self._logged.get(kind)
        if last is None or now - last >= LOG_INTERVAL:
            self._logged[kind] = now
            log.warning("connection refused or closed: %s", text)

    def status(self) -> dict[str, Any]:
        return {"descriptors": self.descriptors, "in_use": self.in_use,
                "reserve": self.limits.descriptor_reserve,
                "applications_refused": self._budget,
                "open": dict(sorted(self.open_by_port.items())),
                "limits": self.limits.as_dict()}
