"""PolicyStore: a router's access-control state: the flow policies in force and a cache of
verified capability tokens.

The token and policy formats, and their verification, are :mod:`flowrouter.wire.capabilities`;
this is what a router keeps of them (:mod:`flowrouter.core.admission` uses it).

May import :mod:`flowrouter.wire`.
"""

from __future__ import annotations

from flowrouter.wire.bands import BandMask
from flowrouter.wire.capabilities import (
    Capability,
    CapabilityError,
    Policy,
    VerifyCache,
    verify,
    verify_policy,
)
from flowrouter.wire.flowid import FlowID


class PolicyStore:
    """Router-side access control: installed policies plus a verification cache.

    * :meth:`install` a signed policy (from the creator, on create/advertise): verified,
      and kept only if newer than what is installed for the same target;
    * :meth:`authorize_join` / :meth:`authorize_send`: ``None`` when the flow is open (no
      policy, or the policy does not cover that operation), else the verified Capability;
      raises :class:`CapabilityError` (``missing`` when a token is needed and none came,
      ``band-denied``, ``locality-denied``, or any :func:`verify` reason).

    A per-flow policy takes precedence over the creator-wide one; revocations of both apply.
    """

    def __init__(self, cache_size: int = 4096, max_policies: int = 100_000) -> None:
        self.cache = VerifyCache(cache_size)
        self.max_policies = max_policies
        self._flow: dict[bytes, Policy] = {}  #: flow key -> policy
        self._creator: dict[bytes, Policy] = {}  #: creator (8 bytes) -> creator-wide policy

    def install(self, raw_or_policy: bytes | Policy) -> Policy:
        """Verify and install; returns the policy now in force for that target.

        Raises ``CapabilityError("stale-policy")`` for an older version, or for the same
        version with different contents (a creator must bump the version to change it).
        """
        pol = verify_policy(raw_or_policy)
        table, k = ((self._creator, pol.flow_key[:8]) if pol.creator_wide
                    else (self._flow, pol.flow_key))
        old = table.get(k)
        if old is not None:
            if pol.version < old.version or (pol.version == old.version
                                             and pol.raw != old.raw):
                raise CapabilityError("stale-policy", f"installed version {old.version}, "
                                                      f"offered {pol.version}")
            if pol.version == old.version:
                return old
        elif len(self._flow) + len(self._creator) >= self.max_policies:
            raise CapabilityError("malformed", "policy table is full")
        table[k] = pol
        return pol

    def remove_flow(self, flow_key: bytes) -> None:
        self._flow.pop(flow_key, None)

    def policy_for(self, flow_key: bytes) -> Policy | None:
        return self._flow.get(flow_key) or self._creator.get(flow_key[:8])

    def revoked_for(self, flow_key: bytes) -> frozenset[int]:
        a = self._flow.get(flow_key)
        b = self._creator.get(flow_key[:8])
        if a is None:
            return b.revoked if b else frozenset()
        return a.revoked | b.revoked if b else a.revoked

    def requires(self, flow_key: bytes, op: str) -> bool:
        pol = self.policy_for(flow_key)
        if pol is None:
            return False
        return pol.require_join if op == "join" else pol.require_send

    def _check(self, flow_key: bytes, op: str, token: bytes | None, subject: str | None,
               now: float) -> Capability | None:
        if not self.requires(flow_key, op):
            return None
        if not token:
            raise CapabilityError("missing", f"flow {FlowID.from_key(flow_key)} requires a "
                                             f"capability to {op}")
        return verify(token, flow_key=flow_key, subject=subject, now=now,
                      revoked=self.revoked_for(flow_key), cache=self.cache)

    def authorize(self, flow_key: bytes, op: str, token: bytes | None, subject: str | None,
                  now: float) -> Capability | None:
        """Check a token for *op* ("join" or "send") without a band: at advertise time."""
        return self._check(flow_key, op, token, subject, now)

    def authorize_join(self, flow_key: bytes, token: bytes | None, subject: str | None,
                       mask: int, now: float) -> Capability | None:
        cap = self._check(flow_key, "join", token, subject, now)
        if cap is not None and not cap.may_join(mask):
            raise CapabilityError("band-denied", f"join mask {BandMask(mask)} exceeds the "
                                                 f"granted {BandMask(cap.join)}")
        return cap

    def authorize_send(self, flow_key: bytes, token: bytes | None, subject: str | None,
                       band: int, loc_type: int, loc_value: int, now: float
                       ) -> Capability | None:
        cap = self._check(flow_key, "send", token, subject, now)
        if cap is not None:
            if not cap.may_send(band):
                raise CapabilityError("band-denied", f"band {band} not in the granted "
                                                     f"{BandMask(cap.send)}")
            if not cap.locality_ok(loc_type, loc_value):
                raise CapabilityError("locality-denied", f"locality {loc_type}:{loc_value} "
                                                         f"exceeds {cap.max_locality}")
        return cap

    def __len__(self) -> int:
        return len(self._flow) + len(self._creator)
