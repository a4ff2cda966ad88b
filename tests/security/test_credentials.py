"""Issue 26 item 5: credentials that end, and a captured Register that is worth nothing.

Before: the agent sent its site credential itself as a bearer token that never expired; after an xApp restart
a captured one was welcomed 7.9 s later, ahead of the real agent, and got 40 leases, and during a network cut a
captured one took the site. Now the credential carries an expiry (`weaver-xapp site-token`, 30 days) and never
goes on the wire: the Register carries a one-time proof of it (schemas.credential) that the broker takes once,
fresh, and only if made after the broker started. Real grpc.aio broker on loopback, raw gRPC clients."""
from __future__ import annotations

import asyncio
import time

import grpc

from schemas.credential import make_proof, site_credential
from tests.security.test_broker_identity import SECRET, Peer, make_cfg, register, with_broker
from xapp.agents import ProofBook


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_a_captured_register_is_refused_and_the_real_agent_is_welcomed(monkeypatch):
    monkeypatch.setenv("TEST_BROKER_SECRET", SECRET)
    cred = site_credential(SECRET, "s1", int(time.time()) + 3600)

    async def body(broker, ch, ledger, port):
        captured = register("s1", make_proof(cred, "s1", "agent-1", _now_ms()), raw=True)
        real = Peer(ch, captured)
        assert await real.welcomed() == "s1"
        real.call.cancel()                                    # a network cut: the real session is gone
        for _ in range(300):
            if not broker.sessions:
                break
            await asyncio.sleep(0.01)
        replay = await Peer(ch, captured).error()             # the attacker replays what it saw
        back = Peer(ch, register("s1", cred))                 # the real agent returns with a fresh proof
        welcomed = await back.welcomed()
        back.call.cancel()
        return replay, welcomed

    replay, welcomed = with_broker(make_cfg("TEST_BROKER_SECRET"), body)
    assert replay[0] == grpc.StatusCode.UNAUTHENTICATED and "already used" in replay[1]
    assert welcomed == "s1"


def test_a_restarted_broker_takes_no_proof_made_before_it_started_and_no_expired_credential(monkeypatch):
    monkeypatch.setenv("TEST_BROKER_SECRET", SECRET)
    cred = site_credential(SECRET, "s1", int(time.time()) + 3600)
    before_restart = make_proof(cred, "s1", "agent-1", _now_ms() - 2000)   # captured 2 s before the restart
    expired = site_credential(SECRET, "s1", int(time.time()) - 1)

    async def body(broker, ch, ledger, port):
        old = await Peer(ch, register("s1", before_restart, raw=True)).error()
        dead = await Peer(ch, register("s1", expired)).error()
        stale = await Peer(ch, register("s1", make_proof(cred, "s1", "agent-1", _now_ms() + 60_000), raw=True)).error()
        return old, dead, stale

    old, dead, stale = with_broker(make_cfg("TEST_BROKER_SECRET"), body)
    assert old[0] == grpc.StatusCode.UNAUTHENTICATED and "since it started" in old[1]
    assert dead[0] == grpc.StatusCode.UNAUTHENTICATED and "expired" in dead[1]
    assert stale[0] == grpc.StatusCode.UNAUTHENTICATED and "stale" in stale[1]


def test_the_proof_book_forgets_what_can_no_longer_be_fresh():
    book = ProofBook(started_unix_ms=0, fresh_ms=1000)
    cred = site_credential(SECRET, "s1")
    for t in range(0, 10_000, 100):
        book.check(make_proof(cred, "s1", "a", t), "s1", "a", SECRET, t)
    assert len(book._seen) <= 21        # at most two freshness windows of proofs are kept
