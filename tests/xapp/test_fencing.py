"""The SDL leader lease: of two xApp replicas on one namespace only the holder controls the nodes and
grants; a holder that stops renewing is taken over once its lease expired, and a stale holder's renewal
fails, which stops it controlling and revokes its leases at once. Against a real Redis (vanilla: the
compare-and-set runs as a Lua script there) and the embedded store; wall clocks are passed in."""
from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest
from xapp_harness import standalone_controls, until

from xapp.app import XappApp
from xapp.config import XappConfig
from xapp.loop import GrantLease, LoopState, SendControl
from xapp.state import LEADER_TTL_S, open_store

ROOT = Path(__file__).resolve().parents[2]
NS = "weaver-fencing"


@pytest.fixture()
def no_dbaas(monkeypatch):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    monkeypatch.delenv("DBAAS_CLUSTER_ADDR_LIST", raising=False)


def test_exactly_one_of_two_stores_acquires(redis_env):
    a, b = open_store(NS), open_store(NS)
    assert a.backend.startswith("redis")
    assert a.acquire_leader("a", 3.0, now_unix=1000.0) is True
    assert b.acquire_leader("b", 3.0, now_unix=1000.5) is False          # held, not expired
    assert a.acquire_leader("a", 3.0, now_unix=1001.0) is True           # the holder may re-acquire
    assert b.renew_leader("b", 3.0, now_unix=1001.0) is False            # renewing what is not ours
    assert a.renew_leader("a", 3.0, now_unix=1002.0) is True
    assert b.leader() == ("a", 1005.0)


def test_expired_leader_is_taken_over_and_the_stale_holders_renewal_fails(redis_env):
    a, b = open_store(NS), open_store(NS)
    assert a.acquire_leader("a", 3.0, now_unix=1000.0)
    assert not b.acquire_leader("b", 3.0, now_unix=1002.9)              # 0.1 s before the expiry
    assert b.acquire_leader("b", 3.0, now_unix=1003.0)                  # expired: taken over
    assert a.renew_leader("a", 3.0, now_unix=1003.1) is False            # stale holder: refused
    assert a.acquire_leader("a", 3.0, now_unix=1003.1) is False
    assert a.release_leader("a") is False and b.leader() == ("b", 1006.0)
    assert b.release_leader("b") is True                                 # released: free at once
    assert a.acquire_leader("a", 3.0, now_unix=1003.2) is True


def test_two_contenders_for_an_expired_lease_one_wins(redis_env):
    """The takeover is a compare-and-set on the exact old value: both read the expired record, both try,
    only the first write lands."""
    a, b, c = open_store(NS), open_store(NS), open_store(NS)
    assert a.acquire_leader("a", 3.0, now_unix=1000.0)
    raw = b.sdl.get(NS, "leader", usemsgpack=False)
    from xapp.state import _leader_bytes
    assert b._cas("leader", raw, _leader_bytes("b", 1010.0)) is True
    assert c._cas("leader", raw, _leader_bytes("c", 1010.0)) is False    # c read the same old value
    assert a.leader() == ("b", 1010.0)


def test_concurrent_epochs_are_distinct(redis_env):
    """Two replicas starting at once get two epochs (compare-and-set, also on a vanilla Redis): a write
    based on a value read before the other replica advanced the epoch does not land."""
    a, b = open_store(NS), open_store(NS)
    for n in range(1, 4):
        cur = a.sdl.get(NS, "epoch", usemsgpack=False)
        assert b.next_epoch() == n                            # b advances between a's read and a's write
        assert a._cas("epoch", cur, msgpack.packb(n, use_bin_type=True)) is False
    assert a.next_epoch() == 4 and b.epoch() == 4


def test_embedded_store_has_the_same_semantics(no_dbaas):
    s = open_store(NS)
    assert s.backend == "embedded"
    assert s.acquire_leader("a", 3.0, 1000.0) and not s.acquire_leader("b", 3.0, 1001.0)
    assert s.acquire_leader("b", 3.0, 1003.0) and not s.renew_leader("a", 3.0, 1003.0)
    assert s.renew_leader("b", 3.0, 1004.0) and s.leader() == ("b", 1007.0)


def controls():
    return standalone_controls(NS)


class Clock:
    """A wall clock the test moves: `skew` is added to the real time."""

    def __init__(self) -> None:
        import time
        self.time, self.skew = time.time, 0.0

    def __call__(self) -> float:
        return self.time() + self.skew


def test_follower_controls_nothing_and_takes_over_an_expired_leader(redis_env):
    asyncio.run(_two_replicas())


async def _two_replicas():
    cfg = XappConfig.from_controls(controls())
    wall_a, wall_b = Clock(), Clock()
    a, b = XappApp(cfg, wall=wall_a), XappApp(cfg, wall=wall_b)
    try:
        await a.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
        await b.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
        assert a.state.control_leader is True and b.state.control_leader is False
        assert a.readiness()["leader"] is True and b.readiness()["leader"] is False
        # readiness reports the leader part but does not require it: a follower is not held back
        # (only RMR and SDL gate, READY_GATES)
        parts = b.readiness()
        assert parts["leader"] is False and b.ready() is True and b.ready() == (parts["rmr"] and parts["sdl"])
        assert open_store(NS).leader()[0] == a.leader_id

        revoked = []
        real = a.broker.revoke
        a.broker.revoke = lambda site, reason: revoked.append((site, reason)) or real(site, reason)
        a.state.sites["site-a"].grant_sms = 16      # as if a lease were out
        # b's clock runs past a's expiry (as when a stopped renewing): b takes over on its next renewal tick
        wall_b.skew = LEADER_TTL_S + 0.1
        await until(lambda: b.state.control_leader, 3, "the follower to take over")
        assert open_store(NS).leader()[0] == b.leader_id
        # b waits out a's leases before it grants: at least one lease lifetime from the takeover
        assert b.now() - 1.5 < b.state.grant_not_before <= b.now() + cfg.lease_valid_periods * cfg.period_s
        # a's next renewal is refused: it stops controlling at once and revokes every lease
        await until(lambda: not a.state.control_leader, 3, "the stale leader to step down")
        assert ("site-a", "lost-leadership") in revoked and a.state.sites["site-a"].grant_sms == 0
        # and stays a follower while b renews
        await asyncio.sleep(1.2)
        assert not a.state.control_leader and b.state.control_leader
    finally:
        await a.stop()
        await b.stop()
    assert open_store(NS).leader()[1] == 0.0         # b released it at stop


def test_leader_that_cannot_renew_steps_down_within_the_ttl(redis_env):
    asyncio.run(_sdl_down())


async def _sdl_down():
    cfg = XappConfig.from_controls(controls())
    a = XappApp(cfg)
    try:
        await a.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
        assert a.state.control_leader

        def down(*_a, **_k):
            raise ConnectionError("SDL unreachable")
        a.store.renew_leader = down
        t0 = a.now()
        await until(lambda: not a.state.control_leader, LEADER_TTL_S + 2, "the leader to step down")
        assert a.now() - t0 <= LEADER_TTL_S + 1.05      # its lease may have been taken over by then
    finally:
        await a.stop()


@pytest.mark.xfail("control_leader" not in LoopState.__dataclass_fields__, strict=True,
                   reason="needs LoopState.control_leader in xapp.loop")
def test_follower_loop_sends_no_control_and_grants_nothing():
    from test_xapp_loop import ack_all, cfg, kpm, of, run, setup
    st = setup(cfg())
    st.control_leader = False
    seen = []
    for i in range(1, 8):
        t = i / 10
        seen += run(st, t, [kpm("n1", t), kpm("n2", t)], results=ack_all(seen))
    assert not of(seen, SendControl) and not of(seen, GrantLease)
    st.control_leader = True                        # leadership taken: it controls and grants from now on
    a = run(st, 0.8, [kpm("n1", 0.8), kpm("n2", 0.8)])
    seen += a
    for i in range(9, 14):
        t = i / 10
        a = run(st, t, [kpm("n1", t), kpm("n2", t)], results=ack_all(a))
        seen += a
    assert of(seen, SendControl) and of(seen, GrantLease)
