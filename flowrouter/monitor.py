"""HTTP monitoring for every long-running flownet process: ``/livez`` (alive), ``/readyz``
(ready for work; ``/healthz`` is the same), ``/status``, ``/metrics`` (Prometheus text
format) and any extra pages a process adds (the dashboard).

A deliberately small HTTP/1.1 server on asyncio streams (GET and HEAD, one request per
connection, bounded request size and time, and at most ``max_connections`` connections at
once: more are answered 503 and closed, counted in ``rejected``): monitoring needs no web
framework, and every request is hostile until parsed. A process that budgets its
descriptors passes a :class:`ConnectionCheck` (a router's connection gate) that admits each
connection instead. What to serve comes from a :class:`Monitored` source, so a
router, a location-service member, a directory member and a chat server share one server.

Metrics use ``prometheus_client``: a source returns metric families built at scrape time
(nothing on the forwarding path), and :func:`render_metrics` writes the standard text format.

Like :mod:`flowrouter.console` this module imports only the standard library, asyncio and
prometheus_client, so wire-only packages (directory) may use it; pyproject's import-linter
contracts keep it so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flowrouter import __version__

log = logging.getLogger("flowrouter.monitor")

#: longest request head (request line and headers) read before answering 431
MAX_REQUEST_HEAD = 16 * 1024
#: seconds a client may take to send its request head
REQUEST_TIMEOUT = 10.0
#: connections served at once (without a ConnectionCheck)
MAX_CONNECTIONS = 64

#: status code, content type, body (or its pieces, written one after the other: a large
#: body is never joined whole)
Page = tuple[int, str, bytes | list[bytes]]
#: on every response: pages load script, style and data from this server only and nothing
#: inline, so a name that slipped into markup still could not run script
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'")
Handler = Callable[[str], Page | Awaitable[Page]]  #: query string -> page


@dataclass
class Monitored:
    """What one process serves. *status* returns its JSON document (without the common
    fields, which are added here); *metrics* yields prometheus metric families; *health*
    says whether the process is ready to serve and why not (``/readyz``, and its alias
    ``/healthz``: a load balancer sends it no work while not); *live* whether it is alive at
    all (``/livez``: an orchestrator restarts it when not); *pages* adds paths (e.g. ``/``)."""

    kind: str  #: router, location-service, directory, chat-server
    name: str
    status: Callable[[], dict[str, Any]]
    metrics: Callable[[], Iterable[Metric]] = lambda: ()
    health: Callable[[], tuple[bool, str]] = lambda: (True, "ok")
    live: Callable[[], tuple[bool, str]] = lambda: (True, "alive")
    pages: dict[str, Handler] = field(default_factory=dict)
    started: float = field(default_factory=time.time)


class _SourceCollector(Collector):
    def __init__(self, source: Monitored) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        info = GaugeMetricFamily("flownet_info", "flownet process: version, kind and name",
                                 labels=["version", "kind", "name"])
        info.add_metric([__version__, self.source.kind, self.source.name], 1)
        yield info
        yield GaugeMetricFamily("flownet_uptime_seconds", "seconds since the process started",
                                value=time.time() - self.source.started)
        yield from self.source.metrics()


#: the content type of /metrics (Prometheus's text exposition)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render_metrics(source: Monitored) -> bytes:
    """The Prometheus text exposition of *source* (a fresh registry per scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SourceCollector(source))
    return generate_latest(registry)


def status_document(source: Monitored, status: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The common /status fields first (version, kind, name, uptime, health), then the
    source's own document (*status*, when the caller made it already)."""
    ok, why = source.health()
    doc: dict[str, Any] = {"version": __version__, "kind": source.kind, "name": source.name,
                           "uptime": round(time.time() - source.started, 3),
                           "healthy": ok, "health": why}
    doc.update(source.status() if status is None else status)
    return doc


def _json(code: int, doc: Any) -> Page:
    return code, "application/json", json.dumps(doc, indent=1, default=str).encode() + b"\n"


class ConnectionCheck(Protocol):
    """Who may connect now (a router's connection gate, flowrouter.net.connlimits): *port*
    names the kind of connection (``"http"``)."""

    def admit(self, port: str, now: float) -> str | None:
        """None: serve it (counted until :meth:`release`); else why not."""
    def release(self, port: str) -> None: ...


class MonitorServer:
    """Serves a :class:`Monitored` source over HTTP. ``await start()``, ``await stop()``."""

    def __init__(self, source: Monitored, address: tuple[str, int], *,
                 request_timeout: float = REQUEST_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS,
                 check: ConnectionCheck | None = None) -> None:
        self.source = source
        self.address = address
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.check = check
        self._server: asyncio.base_events.Server | None = None
        self.requests = 0
        #: malformed, oversized, too slow or over-the-limit requests (counted, not logged)
        self.rejected = 0
        self.open = 0  #: connections being served

    async def start(self) -> None:
        host, port = self.address
        self._server = await asyncio.start_server(self._client, host, port,
                                                  limit=MAX_REQUEST_HEAD)
        self.address = self._server.sockets[0].getsockname()[:2]
        log.info("%s %s: HTTP monitoring on http://%s:%d/ (/livez /readyz /status /metrics)",
                 self.source.kind, self.source.name, *self.address)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def route(self, path: str, query: str) -> Page | Awaitable[Page]:
        source = self.source
        if path in source.pages:
            return source.pages[path](query)
        if path in ("/readyz", "/healthz"):  # /healthz: the older name, same meaning
            ok, why = source.health()
            return _json(200 if ok else 503, {"status": "ok" if ok else "unhealthy",
                                              "ready": ok, "detail": why})
        if path == "/livez":
            ok, why = source.live()
            return _json(200 if ok else 503, {"status": "ok" if ok else "dead",
                                              "live": ok, "detail": why})
        if path == "/status":
            return _json(200, status_document(source))
        if path == "/metrics":
            return 200, METRICS_TYPE, render_metrics(source)
        return _json(404, {"error": f"no page {path}; try /livez, /readyz, /healthz, "
                           "/status, /metrics"
                           + (", " + ", ".join(sorted(source.pages)) if source.pages else "")})

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        refused = (self.check.admit("http", time.monotonic()) if self.check is not None
                   else None if self.open < self.max_connections
                   else f"{self.max_connections} connections at once already (limit)")
        if refused is not None:
            self.rejected += 1
            await self._reply(writer, _json(503, {"error": f"connection refused: {refused}"}),
                              False)
            return
        self.open += 1
        try:
            try:
                page, head_only = await self._answer(reader)
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()
                return
            except asyncio.CancelledError:
                # the process stops with this connection open: close it quietly (asyncio
                # 3.11 logs a traceback for every connection handler that ends cancelled)
                writer.close()
                return
            await self._reply(writer, page, head_only)
        finally:
            self.open -= 1
            if self.check is not None:
                self.check.release("http")

    async def _reply(self, writer: asyncio.StreamWriter, page: Page, head_only: bool) -> None:
        code, ctype, body = page
        pieces = body if isinstance(body, list) else [body]
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  408: "Request Timeout", 431: "Request Header Fields Too Large",
                  500: "Internal Server Error", 503: "Service Unavailable"}.get(code, "OK")
        head = (f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {sum(map(len, pieces))}\r\nCache-Control: no-store\r\n"
                f"Content-Security-Policy: {CONTENT_SECURITY_POLICY}\r\n"
                "X-Content-Type-Options: nosniff\r\n"
                "Connection: close\r\n\r\n").encode()
        try:
            writer.write(head)
            for piece in () if head_only else pieces:
                writer.write(piece)
                await writer.drain()
            await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass  # gone, or the process stops (as above)
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[Page, bool]:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.request_timeout)
        except TimeoutError:
            self.rejected += 1
            return _json(408, {"error": "request head not received in time"}), False
        except (asyncio.LimitOverrunError, ValueError):
            self.rejected += 1
            return _json(431, {"error": f"request head over {MAX_REQUEST_HEAD} bytes"}), False
        parts = raw.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self.rejected += 1
            return _json(400, {"error": "malformed request line"}), False
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"{method} not allowed; this server is read-only"}), \
                False
        self.requests += 1
        path, _, query = target.partition("?")
        try:
            page = self.route(path, query)
            if not isinstance(page, tuple):
                page = await page
        except Exception as exc:  # a bug in one page must not take monitoring down
            log.exception("monitoring page %s failed", path)
            page = _json(500, {"error": f"{type(exc).__name__}: {exc}"})
        return page, method == "HEAD"


async def start_monitor(source: Monitored, address: str | tuple[str, int] | None,
                        **options: Any) -> MonitorServer | None:
    """Start HTTP monitoring at *address* (``HOST:PORT``); None or "" starts nothing;
    *options* go to :class:`MonitorServer` (time-out, connection limit, check).

    A port already in use is logged as a warning and the process runs on without HTTP:
    monitoring must never be the reason a router does not start.
    """
    if not address:
        return None
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        address = (host.strip("[]") or "127.0.0.1", int(port))
    server = MonitorServer(source, address, **options)
    try:
        await server.start()
    except OSError as exc:
        log.warning("%s %s: no HTTP monitoring: cannot listen on %s:%d: %s", source.kind,
                    source.name, address[0], address[1], exc.strerror or exc)
        return None
    return server


__all__ = ["MAX_REQUEST_HEAD", "METRICS_TYPE", "ConnectionCheck", "MonitorServer", "Monitored",
           "render_metrics", "start_monitor", "status_document"]
