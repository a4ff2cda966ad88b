"""A replica's shard claims, kept in SDL (`xapp.state`) by the steps `xapp.shards.plan` gives.

`ShardKeeper.tick(now_unix)`, once a second or so: heartbeat, read the members and the claims, then acquire,
renew or hand over. What a replica controls is `held` (shard -> the claim's epoch), and it acts on a shard
only until `acting_until` (the claim's expiry less the clock skew, as the leader lease does), so a replica
that cannot reach SDL stops before anyone can take its shards over. The caller supplies what a change
means to it:
- `gained(shard, claim)`: start controlling (after waiting out the shard's earlier leases: `xapp.app`);
- `lost(shard, why)`: stop at once, revoke the shard's leases (the claim is not ours any more);
- `handing_over(shard)`: stop granting and revoke the shard's leases; the claim is released right after.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from xapp.shards import Acquire, HandOver, Renew, ShardClaim, plan

log = logging.getLogger("weaver.xapp.shards")

SHARD_TTL_S = 3.0        # a claim's lifetime in SDL; renewed at every tick
REPLICA_TTL_S = 3.0      # a replica's heartbeat lifetime: a silent replica leaves the assignment after this
SHARD_SKEW_S = 0.5       # act until the claim's expiry less this: host clocks may disagree by this much


@dataclass
class ShardKeeper:
    store: object                      # xapp.state.XappStore
    me: str
    n_shards: int
    gained: Callable[[int, ShardClaim], None] = lambda k, c: None
    lost: Callable[[int, str], None] = lambda k, why: None
    handing_over: Callable[[int], None] = lambda k: None
    held: dict[int, int] = field(default_factory=dict)           # shard -> epoch
    acting_until: dict[int, float] = field(default_factory=dict)  # shard -> wall
    address: str = ""                  # this replica's lease broker, named in the other replicas' redirects
    handovers: int = 0

    def controls(self, shard: int, now_unix: float) -> bool:
        return shard in self.held and now_unix < self.acting_until.get(shard, -math.inf)

    def tick(self, now_unix: float) -> None:
        """One look at SDL. An SDL error leaves the claims as they are: each expires on its own clock."""
        try:
            self.store.beat_replica(self.me, REPLICA_TTL_S, now_unix, self.address)
            members = self.store.live_replicas(now_unix)
            claims = self.store.shard_claims()
        except Exception as exc:  # noqa: BLE001 - SDL down: act only until our claims expire
            log.warning("shard claims not read: %s", exc)
            self._expire(now_unix)
            return
        for k in [k for k in self.held if claims.get(k) is None or claims[k].owner != self.me
                  or claims[k].epoch != self.held[k]]:
            self._drop(k, "taken over")
        for step in plan(self.me, self.n_shards, members, claims, now_unix):
            try:
                if isinstance(step, Renew):
                    if step.shard not in self.held:
                        # ours in SDL, but we stopped acting on it (its local lifetime ran out): a claim
                        # resumed without `gained` would skip the wait. Release it; the next tick takes it
                        # afresh, under a new epoch
                        self.store.release_shard(step.shard, self.me, step.epoch)
                        continue
                    if self.store.renew_shard(step.shard, self.me, step.epoch, SHARD_TTL_S, now_unix):
                        self.held[step.shard] = step.epoch
                        self.acting_until[step.shard] = now_unix + SHARD_TTL_S - SHARD_SKEW_S
                        continue
                    self._drop(step.shard, "renewal refused")
                elif isinstance(step, Acquire):
                    c = self.store.acquire_shard(step.shard, self.me, SHARD_TTL_S, now_unix)
                    if c is not None and step.shard not in self.held:
                        self.held[step.shard] = c.epoch
                        self.acting_until[step.shard] = now_unix + SHARD_TTL_S - SHARD_SKEW_S
                        self.gained(step.shard, c)
                elif isinstance(step, HandOver):
                    self.handing_over(step.shard)
                    self.held.pop(step.shard, None)
                    self.acting_until.pop(step.shard, None)
                    self.store.release_shard(step.shard, self.me, step.epoch)
                    self.handovers += 1
            except Exception as exc:  # noqa: BLE001 - this step waits for the next tick
                log.warning("shard %d: %s failed: %s", step.shard, type(step).__name__, exc)
        self._expire(now_unix)

    def leave(self, now_unix: float) -> None:
        """A clean stop: hand every shard over and leave the assignment."""
        for k, epoch in sorted(self.held.items()):
            self.handing_over(k)
            try:
                self.store.release_shard(k, self.me, epoch)
            except Exception as exc:  # noqa: BLE001 - it expires on its own
                log.warning("shard %d not released: %s", k, exc)
        self.held.clear()
        self.acting_until.clear()
        try:
            self.store.leave_replica(self.me)
        except Exception as exc:  # noqa: BLE001 - its heartbeat expires on its own
            log.warning("replica record not removed: %s", exc)

    def _expire(self, now_unix: float) -> None:
        for k in [k for k in self.held if now_unix >= self.acting_until.get(k, -math.inf)]:
            self._drop(k, "not renewed within its lifetime")

    def _drop(self, k: int, why: str) -> None:
        self.held.pop(k, None)
        self.acting_until.pop(k, None)
        log.error("shard %d lost (%s): its sites are not ours; revoking their leases", k, why)
        self.lost(k, why)
