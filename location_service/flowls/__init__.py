"""Location services: the cores of the flows' shared trees.
A router in the LS role: builds on flowrouter (its CLI and daemon) and flowlib.

A location service (LS) for an LSID is a group of member routers, each configured as a core
for that LSID. Members announce the LSID at distance 0 in the routers' distance vector, so
every router learns a route to the nearest member without hand configuration; a join
travels to that member, which roots the flow's subtree there. Members need not be linked in
a full mesh, only connected by links among themselves: they flood who links to whom, all
compute the same spanning tree over those links, and pass each flow's band masks and
traffic along it with split horizon (flowrouter.core.lstree), so a message entering the LS
at one member reaches the other members whose subtrees want its band, once each. When a
member dies, the routers below it re-graft their subtrees onto the next nearest member
(the distance vector reconverges and each orphaned entry re-joins), and the members
recompute the tree around it.

:mod:`flowls.service` runs a member (``flowls run``) and answers lookups
(``flowls lookup``, ``flowls members``, ``flowls flows``) through a router's control interface.
"""

from .service import LocationServiceConfig, flows_of, lookup, main, member_config, members_of

__all__ = ["LocationServiceConfig", "member_config", "lookup", "members_of", "flows_of",
           "main"]
