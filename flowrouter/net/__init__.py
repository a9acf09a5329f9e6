"""The asyncio shell around the core: TCP/UDP links, link-security streams, the control
interface, the daemon and its configuration. The only router code that does network I/O.

Inside, from the top (an import-linter contract in ``pyproject.toml`` checks it): the daemon
(``node``, with ``runtime`` and monitoring above it); one module per transport (``tcp``,
``udp``) and the control interface (``control``); a link's output (``output``) and the
node's flow control (``backpressure``); the node interface they all see the node through
(``nodeapi``); configuration and byte-level I/O helpers.

May import :mod:`flowrouter.core` and :mod:`flowrouter.wire`.
"""
