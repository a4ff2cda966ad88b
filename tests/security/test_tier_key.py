"""Issue 26 item 1/2: the cross-site tier's key reaches only the sites the broker admitted.

The key signs every heal-state transfer between sites (agent.crosssite.transport): with it a member reads and
serves the global model, without it a peer gets a 403 and its state is refused. The broker puts it in the
Welcome's CrossSiteConfig of an authenticated session only, derived from the broker secret and the epoch (a
restarted xApp's epoch has another); the REST API never shows it. Real grpc.aio broker on loopback."""
from __future__ import annotations

import hashlib
import hmac

import grpc

from schemas.credential import tier_key
from tests.security.test_broker_identity import SECRET, Peer, make_cfg, register, site_credential, with_broker


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
