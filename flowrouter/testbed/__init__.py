"""Rehearsal tools: topology files, the launcher that runs a topology as local processes
(``flowrouter up``), the demo and the deterministic simulator (``flowrouter sim``).

May import :mod:`flowrouter.net`, :mod:`flowrouter.core` and :mod:`flowrouter.wire`.
"""
