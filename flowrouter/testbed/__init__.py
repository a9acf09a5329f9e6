"""Rehearsal tools: topology files, the launcher that runs a topology's routers as local
processes (the router half of ``flowrouter up``; its applications are ``flownet.traffic``'s),
the deterministic simulator (``flowrouter sim``).

May import :mod:`flowrouter.net`, :mod:`flowrouter.core` and :mod:`flowrouter.wire`.
"""
