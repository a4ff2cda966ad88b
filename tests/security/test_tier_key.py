"""Issue 26 item 1/2: the cross-site tier's key reaches only the sites the broker admitted.

The key signs every heal-state transfer between sites (agent.crosssite.transport): with it a member reads and
serves the global model, without it a peer gets a 403 and its state is refused. The broker puts it in the
Welcome's CrossSiteConfig of an authenticated session only, derived from the broker secret and the epoch (a
restarted xApp's epoch has another); the REST API never shows it. Real grpc.aio broker on loopback."""
from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import replace

import grpc
import pytest

from schemas import tierpass
from schemas.credential import tier_key
from tests.security.test_broker_identity import (
    SECRET,
    Peer,
    heartbeat,
    make_cfg,
    register,
    site_credential,
    with_broker,
)


def test_the_welcome_of_an_admitted_site_carries_the_epochs_tier_key_and_a_refused_one_gets_nothing(monkeypatch):
    monkeypatch.setenv("TEST_BROKER_SECRET", SECRET)

    async def body(broker, ch, ledger, port):
        refused = await Peer(ch, register("s1", "not-the-credential")).error()
        agent = Peer(ch, register("s1", site_credential(SECRET, "s1")))
        welcome = (await agent.read()).welcome
        agent.call.cancel()
        return refused, welcome

    refused, welcome = with_broker(make_cfg("TEST_BROKER_SECRET"), body)
    assert refused[0] == grpc.StatusCode.UNAUTHENTICATED
    want = hmac.new(SECRET.encode(), b"weaver-tier 7", hashlib.sha256).digest()   # epoch 7 (with_broker's book)
    assert welcome.cross_site.tier_key == want
    assert tier_key(SECRET, 8) != want                 # the next epoch's key is another
    assert len(tier_key(None, 7)) == 32 and tier_key(None, 7) != tier_key(None, 7)   # dev mode: random per start


def _pass_of(cs, site: str):
    """The TierPass a site's CrossSiteConfig carries, checked under its CA key; PassRefused if it does not hold."""
    p = tierpass.TierPass(site, cs.tier_epoch, cs.tier_pass_expiry_unix, tierpass.public_key(bytes(cs.tier_site_key)),
                          bytes(cs.tier_pass_signature))
    tierpass.check_pass(p, bytes(cs.tier_ca), time.time())
    return p


def test_each_admitted_site_gets_a_pass_of_its_own_and_it_is_renewed_while_the_site_is_admitted(monkeypatch):
    """Issue 26 item 1, per site: the Welcome carries the site's own tier pass (schemas.tierpass), signed by the
    epoch's CA key, which the gated Lighthouse derives from the same secret; it names that site and no other (a
    site cannot pass for another at a gate), and the broker renews it on the site's heartbeat at half its life."""
    monkeypatch.setenv("TEST_BROKER_SECRET", SECRET)
    cfg = make_cfg("TEST_BROKER_SECRET")
    cfg = replace(cfg, broker=replace(cfg.broker, tier_pass_s=10, lighthouse_addr="gate://127.0.0.2:29510"))

    async def body(broker, ch, ledger, port):
        s1 = Peer(ch, register("s1", site_credential(SECRET, "s1"), agent="a1"))
        s2 = Peer(ch, register("s2", site_credential(SECRET, "s2"), agent="a2"))
        w1, w2 = (await s1.read()).welcome, (await s2.read()).welcome
        await s1.read()
        broker.wall = lambda: time.time() + 6           # past half the pass's life: the next heartbeat renews it
        s1.q.put_nowait(heartbeat(1))
        got = []
        while len(got) < 2:
            got.append(await s1.read())
        s1.call.cancel()
        s2.call.cancel()
        return w1, w2, got

    w1, w2, got = with_broker(cfg, body)
    p1, p2 = _pass_of(w1.cross_site, "s1"), _pass_of(w2.cross_site, "s2")
    assert w1.cross_site.tier_ca == w2.cross_site.tier_ca == tierpass.public_key(tierpass.ca_seed(SECRET, 7))
    assert p1.site_public != p2.site_public and w1.cross_site.tier_site_key != w2.cross_site.tier_site_key
    assert time.time() + 5 < p1.expiry_unix <= time.time() + 10
    with pytest.raises(tierpass.PassRefused):            # s1's pass does not name s2
        _pass_of(w1.cross_site, "s2")
    renewed = [m.cross_site for m in got if m.WhichOneof("body") == "cross_site"]
    assert len(renewed) == 1 and renewed[0].tier_pass_expiry_unix > p1.expiry_unix
    assert renewed[0].tier_site_key == w1.cross_site.tier_site_key     # the same key: only the expiry moves
    _pass_of(renewed[0], "s1")


def test_a_broker_with_no_tier_hands_out_no_pass(monkeypatch):
    """No Lighthouse configured: no tier, so no site key, no pass and no renewals on the stream."""
    monkeypatch.setenv("TEST_BROKER_SECRET", SECRET)

    async def body(broker, ch, ledger, port):
        agent = Peer(ch, register("s1", site_credential(SECRET, "s1")))
        welcome = (await agent.read()).welcome
        agent.call.cancel()
        return welcome, broker.sessions.get("s1")

    welcome, _ = with_broker(make_cfg("TEST_BROKER_SECRET"), body)
    cs = welcome.cross_site
    assert not cs.lighthouse_addr and not cs.tier_site_key and not cs.tier_pass_signature and cs.tier_pass_expiry_unix == 0
