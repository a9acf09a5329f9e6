"""The sans-I/O router: the state machine and its tables (forwarding, tree membership, garbage
collection, LS routing, admission). It takes events with the clock passed in and returns actions.

May import only :mod:`flowrouter.wire`; no asyncio, socket or threading. The asyncio daemon
(:mod:`flowrouter.net`) and the simulator (:mod:`flowrouter.testbed.sim`) drive the same core.
"""
