"""The sans-I/O router: a coordinator (:mod:`~flowrouter.core.router`) composing parts with one
job each (links, forwarding, tree membership, LS exchange, soft state, admission, application
membership, measured locality) over one shared table state (:mod:`~flowrouter.core.state`),
meeting through the small protocols of :mod:`~flowrouter.core.interfaces`. It takes events
with the clock passed in and returns actions; the forwarding fast path mirrors its tables.

May import only :mod:`flowrouter.wire`; no asyncio, socket or threading. The asyncio daemon
(:mod:`flowrouter.net`) and the simulator (:mod:`flowrouter.testbed.sim`) drive the same core.
"""
