"""Shards of sites across xApp replicas (xapp.shards, xapp.shardkeeper, xapp.state's claims), on a real Redis.

The claims are the fencing: each test drives replicas' keepers against one SDL namespace and checks what
each replica believes it controls against what SDL says, tick by tick (a fake wall clock: the claims'
expiries are wall times, and the tests move it instead of sleeping)."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from xapp.shardkeeper import REPLICA_TTL_S, SHARD_TTL_S, ShardKeeper
from xapp.shards import Acquire, HandOver, Renew, ShardClaim, assign, plan, shard_map, shard_of
from xapp.state import StateError, open_store

ROOT = Path(__file__).resolve().parents[2]
NS = "weaver-shards-test"
SITES = [f"site-{i}" for i in range(1000)]


def test_a_site_is_in_the_same_shard_in_every_process():
    # blake2b, not Python's salted hash: another interpreter with another hash seed agrees
    code = "from xapp.shards import shard_of; print([shard_of(f'site-{i}', 16) for i in range(50)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={"PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == str([shard_of(f"site-{i}", 16) for i in range(50)])
    # pinned: a release that moved sites to other shards would move their leases at an upgrade
    assert [shard_of(f"site-{i}", 16) for i in range(6)] == [5, 6, 4, 9, 2, 0]
    counts = Counter(shard_of(s, 16) for s in SITES)
    assert len(counts) == 16 and min(counts.values()) > 35 and max(counts.values()) < 95, counts
    with pytest.raises(ValueError):
        shard_of("site-0", 0)


def test_a_joining_or_leaving_replica_moves_only_its_own_shards():
    before = assign(64, ["a", "b", "c"])
    assert set(before.values()) == {"a", "b", "c"}
    joined = assign(64, ["a", "b", "c", "d"])
    moved = [k for k in before if before[k] != joined[k]]
    assert moved and all(joined[k] == "d" for k in moved)          # only to the newcomer
    left = assign(64, ["a", "c"])
    assert all(left[k] == before[k] for k in before if before[k] != "b")   # only b's shards moved
    assert assign(4, []) == {}
    m = shard_map(SITES[:20], 8)
    assert m["site-7"] == shard_of("site-7", 8) and len(m) == 20 and set(m.values()) <= set(range(8))


def test_plan_takes_what_is_assigned_renews_what_it_holds_and_hands_over_the_rest():
    wanted = assign(8, ["a", "b"])
    mine = [k for k, r in wanted.items() if r == "a"]
    theirs = [k for k, r in wanted.items() if r == "b"]
    assert mine and theirs
    now = 100.0
    # nothing claimed: a acquires its own shards only
    assert plan("a", 8, ["a", "b"], {}, now) == [Acquire(k) for k in mine]
    # a holds everything (b just joined): renew its own, hand b's over; b waits for them
    claims = {k: ShardClaim(k, "a", now + 2, 5) for k in range(8)}
    steps = plan("a", 8, ["a", "b"], claims, now)
    assert [s for s in steps if isinstance(s, Renew)] == [Renew(k, 5) for k in mine]
    assert [s for s in steps if isinstance(s, HandOver)] == [HandOver(k, 5) for k in theirs]
    assert plan("b", 8, ["a", "b"], claims, now) == []              # held by a until a hands them over
    # a's claims expired (a died): b takes only what the assignment without a gives it: everything
    assert plan("b", 8, ["b"], claims, now + 3) == [Acquire(k) for k in range(8)]


@pytest.fixture()
def clock():
    return {"t": 1_000_000.0}


def _keepers(n_replicas, n_shards, events):
    def make(name):
        return ShardKeeper(
            open_store(NS), name, n_shards,
            gained=lambda k, c: events.append(("gained", name, k, c.epoch)),
            lost=lambda k, why: events.append(("lost", name, k, why)),
            handing_over=lambda k: events.append(("handing-over", name, k)))
    return [make(f"r{i}") for i in range(n_replicas)]


def _sdl_owners(now):
    return {k: c.owner for k, c in open_store(NS).shard_claims().items() if c.live(now)}


def _check_fenced(keepers, now):
    """No shard is acted on by two replicas, and whoever acts on one holds its live claim at that epoch."""
    claims = open_store(NS).shard_claims()
    acting = Counter(k for kp in keepers for k in kp.held if kp.controls(k, now))
    assert all(v == 1 for v in acting.values()), acting
    for kp in keepers:
        for k, epoch in kp.held.items():
            if kp.controls(k, now):
                assert claims[k].owner == kp.me and claims[k].epoch == epoch and claims[k].live(now), (k, claims[k])


def _ticks(keepers, clock, n, dt=1.0):
    for _ in range(n):
        clock["t"] += dt
        for kp in keepers:
            kp.tick(clock["t"])
            _check_fenced(keepers, clock["t"])


def test_three_replicas_split_the_shards_and_a_killed_ones_are_taken_over_after_its_claims_end(redis_env, clock):
    events: list = []
    ks = _keepers(3, 12, events)
    _ticks(ks, clock, 4)       # the first ticks see fewer members: shards move once all three beat
    owners = _sdl_owners(clock["t"])
    assert owners == assign(12, ["r0", "r1", "r2"]) and len(owners) == 12
    assert all(kp.held for kp in ks)
    dead = ks.pop(1)           # SIGKILL: no hand-over, no release; its claims run to their end
    dead_shards = set(dead.held)
    t_kill, n_before = clock["t"], len(events)
    for _ in range(int(SHARD_TTL_S) + 2):
        _ticks(ks, clock, 1)
        live = {k for kp in ks for k in kp.held}
        if clock["t"] < t_kill + min(SHARD_TTL_S, REPLICA_TTL_S):
            assert not live & dead_shards, "a dead replica's shard was taken while its claim was live"
    owners = _sdl_owners(clock["t"])
    assert owners == assign(12, ["r0", "r2"]) and set(owners) == set(range(12))
    took = [e for e in events[n_before:] if e[0] == "gained" and e[2] in dead_shards]
    assert {e[2] for e in took} == dead_shards
    first = {k: dead.held[k] for k in dead_shards}
    assert all(e[3] == first[e[2]] + 1 for e in took)                 # a takeover is a new epoch
    # the dead replica's view, had it come back with its old epochs: every renewal refused
    s = open_store(NS)
    assert not any(s.renew_shard(k, "r1", first[k], SHARD_TTL_S, clock["t"]) for k in dead_shards)


def test_a_joining_replica_gets_its_shards_only_after_the_holder_hands_them_over(redis_env, clock):
    events: list = []
    a, b = _keepers(2, 8, events)
    _ticks([a], clock, 2)
    assert set(a.held) == set(range(8))
    _ticks([a, b], clock, 3)
    owners = _sdl_owners(clock["t"])
    assert owners == assign(8, ["r0", "r1"])
    moved = {k for k, r in owners.items() if r == "r1"}
    assert moved and set(b.held) == moved and a.handovers == len(moved)
    order = [(e[0], e[2]) for e in events if e[2] in moved and e[:2] in (("handing-over", "r0"), ("gained", "r1"))]
    for k in moved:            # revoked by the old owner before the new one took it
        assert order.index(("handing-over", k)) < order.index(("gained", k))
    # a clean leave hands everything back
    b.leave(clock["t"])
    _ticks([a], clock, 2)
    assert set(a.held) == set(range(8)) and "r1" not in open_store(NS).live_replicas(clock["t"])


def test_a_replica_that_cannot_reach_sdl_stops_acting_before_its_claims_can_be_taken(redis_env, clock):
    events: list = []
    a, b = _keepers(2, 4, events)
    _ticks([a, b], clock, 3)
    held = set(a.held)
    assert held

    class Down:
        def __getattr__(self, name):
            def fail(*args, **kwargs):
                raise StateError("SDL unreachable")
            return fail
    a.store = Down()
    t_cut = clock["t"]
    while clock["t"] < t_cut + SHARD_TTL_S + 2:
        clock["t"] += 0.25
        a.tick(clock["t"])
        b.tick(clock["t"])
        acting_a = {k for k in held if a.controls(k, clock["t"])}
        acting_b = {k for k in held if b.controls(k, clock["t"])}
        assert not acting_a & acting_b
        if clock["t"] >= t_cut + SHARD_TTL_S - 0.5:
            assert not acting_a, "acting past the claim's expiry less the skew"
    assert {e[2] for e in events if e[0] == "lost" and e[1] == "r0"} == held
    assert held <= set(b.held)


def test_two_contenders_for_one_expired_claim_one_wins(redis_env, clock):
    s1, s2 = open_store(NS), open_store(NS)
    t = clock["t"]
    c = s1.acquire_shard(0, "x", SHARD_TTL_S, t)
    assert c is not None and c.epoch == 1
    assert s2.acquire_shard(0, "y", SHARD_TTL_S, t + 1) is None            # live: refused
    raw = s1.sdl.get(s1.ns, "shard/0", usemsgpack=False)
    # both read the expired claim; the first compare-and-set wins, the second finds other bytes
    won = s1._cas("shard/0", raw, b"\x83\xa5owner\xa1y\xa5until\xcbA\xd0\x00\x00\x00\x00\x00\x00\xa5epoch\x02")
    assert won and s2.acquire_shard(0, "z", SHARD_TTL_S, t + SHARD_TTL_S + 0.1) is None
    assert s1.release_shard(0, "y", 2) and not s1.release_shard(0, "y", 1)


def test_an_unreadable_claim_is_a_clear_error(redis_env):
    s = open_store(NS)
    s.sdl.set(s.ns, "shard/3", b"\x00not msgpack", usemsgpack=False)
    with pytest.raises(StateError, match="unreadable claim of shard 3"):
        s.shard_claims()
