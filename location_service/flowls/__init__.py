"""Location services: the cores of the flows' shared trees.
A router in the LS role: builds on flowrouter (its CLI and daemon) and flowlib.

A location service (LS) for an LSID is a group of member routers, each configured as a core
for that LSID and linked to the others in a full mesh. Members announce the LSID at distance 0
in the routers' distance vector, so every router learns a route to the nearest member without
hand configuration; a join travels to that member, which roots the flow's subtree there.
Members exchange the band masks of their subtrees (MASK on the LS band), so a message entering
the core at one member is passed to the other members only when their subtrees want its band.
When a member dies, the routers below it re-graft their subtrees onto the next nearest member
(the distance vector reconverges and each orphaned entry re-joins).

:mod:`flowls.service` runs a member (``flowls run``) and answers lookups
(``flowls lookup``, ``flowls flows``) through a router's control interface.
"""

from .service import LocationServiceConfig, flows_of, lookup, main, member_config

__all__ = ["LocationServiceConfig", "member_config", "lookup", "flows_of", "main"]
