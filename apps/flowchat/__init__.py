"""Robust multi-site chat with Intermittent Global Order (seed 003) on flownet.

Modules: :mod:`.igo` (the ordering layer, sans-I/O, reusable), :mod:`.loopnet` (an in-memory
network for it), :mod:`.sim_adapter` / :mod:`.flow_adapter` (running it in the simulator or on
flowlib), :mod:`.protocol` (chat message and client line formats), :mod:`.server`,
:mod:`.client`, :mod:`.experiment` (seed 003's Table 2), :mod:`.checks` (seed 4.3.6's ordering
properties), :mod:`.cli` (``flowchat``).
"""

from .igo import (
                  MODES,
                  Deliver,
                  Delivery,
                  IGOConfig,
                  MembershipChange,
                  PeerState,
                  Send,
                  SiteOrdering,
                  StateChange,
)

__all__ = ["MODES", "Deliver", "Delivery", "IGOConfig", "MembershipChange", "PeerState", "Send",
           "SiteOrdering", "StateChange"]
