"""The asyncio shell around the core: TCP/UDP links, link-security streams, the control
interface, the daemon and its configuration. The only router code that does network I/O.

May import :mod:`flowrouter.core` and :mod:`flowrouter.wire`.
"""
