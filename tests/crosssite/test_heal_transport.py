"""The tier's heal path (agent.crosssite.transport) against a hostile peer: nothing a peer serves is executed,
an outsider neither reads nor serves the global model, and a member's state is checked before it is used.
Real HTTP on loopback; the attack payloads are the ones issue 26 ran against torchft's default transport."""
from __future__ import annotations

import io
import os
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from agent.crosssite.transport import (
    SignedStateTransport,
    StateCheck,
    StateRejected,
    body_mac,
    decode_state,
    encode_state,
)
from tests.proc_net import listening

KEY = b"k" * 32
T = timedelta(seconds=5)
EPOCH_MS, ROUND_MS, NOW = 1_000_000_000_000, 1000, 1_000_000_100.0   # 100 rounds since the tier's epoch


def state(w=None, rounds=40, total=10_000, step=40):
    w = torch.ones(64) if w is None else w
    return {"user": {"default": {"global": w, "outer": {"momentum": torch.zeros(64), "has_momentum": False},
                                 "ledger": {"committed_rounds": rounds, "committed_total": total}}},
            "torchft": {"step": step, "batches_committed": 3}}


def check(**kw):
    return StateCheck(template=state, max_weight_norm=100.0, round_ms=ROUND_MS, round_epoch_ms=EPOCH_MS,
                      clock=lambda: NOW, **kw)


@pytest.fixture
def pair():
    a, b = SignedStateTransport(KEY, check(), offer_wait_s=0.5), SignedStateTransport(KEY, check(), offer_wait_s=0.5)
    yield a, b
    a.shutdown()
    b.shutdown()


class _Rogue:
    """A peer that serves whatever body it is given for any step (what a rogue quorum member does)."""

    def __init__(self, body: bytes, mac: str = ""):
        class H(BaseHTTPRequestHandler):
            def do_GET(self):   # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Weaver-Mac", mac)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):   # what unpickling runs
        return (open, (self.path, "w"))


def test_a_fetch_before_the_offer_waits_for_it(pair):
    a, b = pair
    got = []
    t = threading.Thread(target=lambda: got.append(b.recv_checkpoint(0, a.metadata(), 5, T)))
    t.start()
    threading.Event().wait(0.1)            # the joiner asks first, as torchft's quorum lets it
    a.send_checkpoint([1], 5, state(), T)
    t.join(5)
    assert got and got[0]["torchft"]["step"] == 40


def test_a_member_heals_from_a_member_exactly(pair):
    a, b = pair
    sent = state(torch.arange(64, dtype=torch.float32) / 64)
    a.send_checkpoint([1], 40, sent, T)
    got = b.recv_checkpoint(0, a.metadata(), 40, T)
    torch.testing.assert_close(got["user"]["default"]["global"], sent["user"]["default"]["global"])
    assert got["torchft"] == {"step": 40, "batches_committed": 3}
    assert got["user"]["default"]["ledger"]["committed_total"] == 10_000
    a.disallow_checkpoint()          # the round moved on: nothing is served any more
    with pytest.raises(StateRejected, match="409"):
        b.recv_checkpoint(0, a.metadata(), 40, T)


def test_a_pickle_served_by_a_peer_is_never_executed(tmp_path):
    marker = tmp_path / "ran"
    from torchft.checkpointing._serialization import _streaming_save  # torchft's own wire format
    buf = io.BytesIO()
    _streaming_save({"user": {"default": _Payload(str(marker))}, "torchft": {"step": 10**6}}, buf)
    body = buf.getvalue()
    # the peer even holds the key and signs it: still no code runs, it is not a safetensors state
    rogue = _Rogue(body, body_mac(KEY, 40, body))
    me = SignedStateTransport(KEY, check())
    try:
        with pytest.raises(StateRejected, match="not a safetensors state"):
            me.recv_checkpoint(0, rogue.url, 40, T)
        assert not marker.exists()
        # the attack on torchft's default transport, for contrast: the same body runs the payload
        from torchft.checkpointing.http_transport import HTTPTransport
        theirs = HTTPTransport(timeout=T, num_chunks=0)
        try:
            theirs.recv_checkpoint(0, rogue.url + "/checkpoint/", 40, T)
        finally:
            theirs.shutdown()
        assert marker.exists()
    finally:
        rogue.close()
        me.shutdown()


def test_an_outsider_neither_reads_nor_serves_the_model(pair):
    a, _ = pair
    a.send_checkpoint([1], 40, state(), T)
    outsider = SignedStateTransport(b"x" * 32, check())
    try:
        with pytest.raises(StateRejected, match="403"):        # no key: no model
            outsider.recv_checkpoint(0, a.metadata(), 40, T)
        assert a.refused == 1
        forged = encode_state(state(torch.full((64,), 1234.5)))
        rogue = _Rogue(forged, body_mac(b"x" * 32, 40, forged))   # signed, but not with the tier key
        with pytest.raises(StateRejected, match="not signed"):
            SignedStateTransport(KEY, check()).recv_checkpoint(0, rogue.url, 40, T)
        rogue.close()
    finally:
        outsider.shutdown()


@pytest.mark.parametrize("bad, why", [
    (state(torch.full((64,), float("nan"))), "non-finite"),
    (state(torch.full((64,), 1234.5)), "norm"),                 # the crafted all-1234.5 weights
    (state(torch.ones(65)), "expected torch.float32"),
    (state(torch.ones(64, dtype=torch.float64)), "expected torch.float32"),
    (state(step=10**6), "more rounds than the tier's clock allows"),
    (state(rounds=10**6), "more rounds"),
    (state(total=2**52 + 2**60), "token ledger"),
    ({"torchft": {"step": 1}}, "names differ"),
])
def test_a_members_state_is_checked_before_use(bad, why):
    body = encode_state(bad)
    rogue = _Rogue(body, body_mac(KEY, 7, body))
    me = SignedStateTransport(KEY, check())
    try:
        with pytest.raises(StateRejected, match=why):
            me.recv_checkpoint(0, rogue.url, 7, T)
    finally:
        rogue.close()
        me.shutdown()


@pytest.mark.parametrize("meta", ["https://127.0.0.1:1", "http://evil.example:80", "http://127.0.0.1",
                                  "http://127.0.0.1:1/x?y", "http://u:p@127.0.0.1:1", "file:///etc/passwd"])
def test_a_peers_address_must_be_plain_http_to_an_ip_and_port(meta):
    me = SignedStateTransport(KEY, check())
    try:
        with pytest.raises(StateRejected, match="not http://IP:PORT"):
            me.recv_checkpoint(0, meta, 1, T)
    finally:
        me.shutdown()


def test_the_wire_format_carries_tensors_and_plain_scalars_only():
    s = state()
    assert decode_state(encode_state(s))["torchft"]["step"] == 40
    with pytest.raises(TypeError, match="only tensors and scalars"):
        encode_state({"x": object()})
    with pytest.raises(StateRejected):
        decode_state(os.urandom(64))


def _listening_addresses() -> set[str]:
    return {a for a, _ in listening({os.getpid()})}


def test_the_tier_heals_only_through_the_signed_transport_on_its_own_interface():
    import time

    from agent.crosssite.lighthouse import Lighthouse, LighthouseConfig
    from agent.crosssite.tier import CrossSiteTier, TierConfig
    with Lighthouse(LighthouseConfig.for_rounds(1000)) as lh:
        tier = CrossSiteTier(torch.nn.Linear(4, 2), TierConfig(lighthouse_addr=lh.addr, site_id="s0", round_ms=1000,
                                                               round_epoch_ms=int(time.time() * 1000),
                                                               tier_key=KEY))
        try:
            assert isinstance(tier.manager._checkpoint_transport, SignedStateTransport)
            assert tier.transport.metadata().startswith("http://127.0.0.1:")
            assert tier.transport.key == KEY
            # every socket this process listens on is loopback: the Manager (quorum, Kill) and the state server
            assert _listening_addresses() and all(a in ("127.0.0.1", "::1") for a in _listening_addresses())
            # what it would serve a joiner passes its own check (the template is the state it sends)
            tier.transport.send_checkpoint([1], 0, tier.manager._manager_state_dict(), T)
            peer = SignedStateTransport(KEY, tier.transport.check)
            got = peer.recv_checkpoint(0, tier.transport.metadata(), 0, T)
            torch.testing.assert_close(got["user"]["default"]["global"], tier.global_flat)
            peer.shutdown()
        finally:
            tier.close()
