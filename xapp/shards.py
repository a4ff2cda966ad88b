"""Which xApp replica controls which sites (sans-IO): shards of sites, their assignment to the live
replicas, and what a replica must do about its claims each time it looks (issue 27, item 1).

A site belongs to one shard for good (`shard_of`: a hash of its id, the same in every process and every
release). A shard is assigned to one live replica by rendezvous hashing (`assign`): each replica ranks the
shards by hash(shard, replica), so a replica joining or leaving moves only the shards it takes or held,
and every replica computes the same assignment from the same member list, with no coordinator.

Who really controls a shard is its claim in SDL (`xapp.state` `shard/<k>`: owner, wall expiry and a fencing
epoch that grows by one at every change of owner), not the assignment: the assignment says what a replica
should hold, the claim what it does. `plan` turns the two into steps:
- a shard assigned to us and unclaimed (or its claim expired): acquire it. The new owner then waits out
  every lease of the shard's sites that the previous owner may have issued (their hard ends in the
  ledger, and one lease lifetime for a grant it may not have written) before it grants: the RAN-first sum
  holds across the hand-over as it does across a leader takeover (`xapp.app`);
- a shard we hold and that is still ours: renew it, under the epoch we took it at (a renewal under
  another epoch is refused: someone took it over while we were not looking, and we stop at once);
- a shard we hold that the assignment gives to another replica (one joined): hand it over: stop
  granting, revoke its sites' leases, then release the claim; the newcomer acquires it and waits out
  those leases. A shard assigned to a live replica that has not claimed it yet is left alone.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardClaim:
    """A shard's claim in SDL: `owner` controls its sites until `until_unix` (wall), under `epoch`."""

    shard: int
    owner: str
    until_unix: float
    epoch: int

    def live(self, now_unix: float) -> bool:
        return self.until_unix > now_unix


@dataclass(frozen=True)
class Acquire:
    shard: int


@dataclass(frozen=True)
class Renew:
    shard: int
    epoch: int


@dataclass(frozen=True)
class HandOver:
    """Stop controlling the shard's sites, revoke their leases, release the claim taken at `epoch`."""

    shard: int
    epoch: int


Step = Acquire | Renew | HandOver


def _h(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest(), "big")


def shard_of(site_id: str, n_shards: int) -> int:
    """The shard a site belongs to: stable across processes and versions (not Python's salted hash)."""
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    return _h("site", site_id) % n_shards


def assign(n_shards: int, replicas: Iterable[str]) -> dict[int, str]:
    """Shard -> the live replica that should hold it (rendezvous hashing; empty with no replica)."""
    members = sorted(set(replicas))
    if not members:
        return {}
    return {k: max(members, key=lambda r: (_h("shard", str(k), r), r)) for k in range(n_shards)}


def shard_map(site_ids: Iterable[str], n_shards: int) -> dict[str, int]:
    """Each site's shard: computed once (the sites and the shard count are start-up settings)."""
    return {s: shard_of(s, n_shards) for s in site_ids}


def plan(me: str, n_shards: int, replicas: Iterable[str], claims: dict[int, ShardClaim],
         now_unix: float) -> list[Step]:
    """What `me` must do now, given the live replicas (`me` among them) and every shard's claim."""
    members = set(replicas) | {me}
    wanted = assign(n_shards, members)
    steps: list[Step] = []
    for k in range(n_shards):
        c = claims.get(k)
        mine = c is not None and c.owner == me and c.live(now_unix)
        if wanted[k] == me:
            if mine:
                steps.append(Renew(k, c.epoch))
            elif c is None or not c.live(now_unix):
                steps.append(Acquire(k))
            # else: held by another replica until its claim ends (it hands over, or dies and expires)
        elif mine:
            steps.append(HandOver(k, c.epoch))
    return steps
