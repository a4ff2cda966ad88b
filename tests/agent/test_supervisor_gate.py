"""The supervisor's rule (agent.supervisor.LeaseGate) and its link to the worker (agent.worker_link),
without processes: which state the worker's cgroup must be in for each lease event, and frames that are
refused rather than guessed at (nothing read from the worker is executed)."""
from __future__ import annotations

import base64
import json
import struct

import pytest

from agent import worker_link as wl
from agent.enforcer import LeaseTerms
from agent.monitors import DeviceFacts
from agent.supervisor import Freeze, LeaseGate, Run
from schemas.proto.weaver.v1 import lease_pb2

STANDIN = DeviceFacts("cpu", "x86_64", 1, 1, False, cores=0.5)   # a 0.5-core stand-in of a site GPU
GPU = DeviceFacts("cuda", "H100", 132, 8, True)


def terms(lease_id="L1", sm=80, duty=80 / 132, at=0.0, valid=0.3, seq=1):
    return LeaseTerms(lease_id, sm, 0.1, valid, duty, at, epoch=1, seq=seq)


def test_a_lease_sets_the_quota_to_its_share_of_the_stand_in_and_its_end_freezes():
    g = LeaseGate(STANDIN, worker_cores=2.0)
    assert g.grant(terms(), 0.0) == Run(pytest.approx(0.5 * 80 / 132))
    assert g.next_deadline() == pytest.approx(0.3)
    assert g.expired(0.29) is None
    assert g.expired(0.3) == Freeze("L1", "expired") and g.held is None


def test_a_renewal_moves_the_hard_end_and_a_revocation_of_an_older_lease_changes_nothing():
    g = LeaseGate(STANDIN, worker_cores=2.0)
    g.grant(terms("L1"), 0.0)
    assert g.grant(terms("L2", sm=40, duty=40 / 132, at=0.1, seq=2), 0.1) == Run(pytest.approx(0.5 * 40 / 132))
    assert g.expired(0.35) is None                       # L1's end passed; L2 holds until 0.4
    assert g.end(0.2, "L1", "revoked") is None and g.held.lease_id == "L2"
    assert g.end(0.2, "", "disconnected") == Freeze("L2", "disconnected")


def test_empty_and_already_expired_leases_freeze():
    g = LeaseGate(STANDIN, worker_cores=2.0)
    assert isinstance(g.grant(terms(sm=0, duty=0.0), 0.0), Freeze)
    assert g.grant(terms(at=0.0, valid=0.3), 0.5) == Freeze("", "expired")
    assert g.held is None


def test_quota_writes_are_spaced_a_window_apart_and_no_lease_is_exceeded_meanwhile():
    # every write refills a CFS period and forgives the tree's overrun: two in a window let it run beyond
    g = LeaseGate(STANDIN, worker_cores=2.0, spacing_s=0.1)
    share = lambda sm: 0.5 * sm / 132  # noqa: E731
    assert g.grant(terms("L1", sm=40, duty=40 / 132), 0.0) == Run(pytest.approx(share(40)))
    # a larger lease 30 ms later: the tree runs on at the smaller quota, the larger one is written at 0.1
    assert g.grant(terms("L2", sm=80, duty=80 / 132, at=0.03, seq=2), 0.03) == Run(pytest.approx(share(40)))
    assert g.next_deadline() == pytest.approx(0.1)
    assert g.expired(0.09) is None
    assert g.expired(0.1) == Run(pytest.approx(share(80)))
    # a smaller one 20 ms after that write: frozen (nothing above 24 SMs may run) until 0.2, then written
    assert g.grant(terms("L3", sm=24, duty=24 / 132, at=0.12, seq=3), 0.12) == Freeze("", "spacing")
    assert g.expired(0.19) is None
    assert g.expired(0.2) == Run(pytest.approx(share(24)))
    # the same bound renewed is no write: it is applied at once, whenever it comes
    assert g.grant(terms("L4", sm=24, duty=24 / 132, at=0.21, seq=4), 0.21) == Run(pytest.approx(share(24)))
    assert g.pending is None and g.applied_at == pytest.approx(0.2)


def test_a_revocation_drops_the_quota_waiting_for_its_spacing():
    g = LeaseGate(STANDIN, worker_cores=2.0, spacing_s=0.1)
    g.grant(terms("L1", sm=40, duty=40 / 132), 0.0)
    g.grant(terms("L2", sm=80, duty=80 / 132, at=0.03, seq=2), 0.03)
    assert g.end(0.05, "L2", "revoked") == Freeze("L2", "revoked")
    assert g.expired(0.1) is None and g.next_deadline() is None


def test_on_a_gpu_the_quota_is_the_workers_host_cores_and_the_partition_is_the_leases():
    g = LeaseGate(GPU, worker_cores=4.0)
    assert g.grant(terms(sm=64, duty=64 / 132), 0.0) == Run(4.0)


def test_frames_round_trip_and_lease_terms_survive_exactly():
    t = terms(at=1234.5678, valid=0.3)
    dec = wl.FrameDecoder(wl.TO_WORKER)
    data = wl.encode({"t": "lease", "terms": wl.terms_to_json(t)})
    assert dec.feed(data[:3]) == [] and dec.feed(data[3:] + data)[0]["t"] == "lease"
    assert wl.terms_from_json(json.loads(data[4:])["terms"]) == t
    st = lease_pb2.AgentStatus(site_id="s", step=7)
    assert wl.unpb(lease_pb2.AgentStatus, wl.pb(st)) == st


@pytest.mark.parametrize("frame, why", [
    (struct.pack(">I", wl.MAX_FRAME + 1), "exceeds"),
    (struct.pack(">I", 3) + b"{x}", "bad JSON"),
    (struct.pack(">I", 2) + b"[]", "unexpected"),
    (wl.encode({"t": "usage", "pb": ""}), "unexpected"),          # a worker's message sent to the worker
    (wl.encode({"t": "__import__"}), "unexpected"),
])
def test_bad_frames_are_refused(frame, why):
    with pytest.raises(wl.LinkError, match=why):
        wl.FrameDecoder(wl.TO_WORKER).feed(frame)


def test_bad_payloads_are_refused():
    with pytest.raises(wl.LinkError):
        wl.unpb(lease_pb2.UsageReport, "not base64!")
    with pytest.raises(wl.LinkError):
        wl.unpb(lease_pb2.UsageReport, base64.b64encode(b"\xff\xff\xff").decode())
    with pytest.raises(wl.LinkError):
        wl.terms_from_json({"lease_id": "x"})
    bad = wl.terms_to_json(terms())
    bad["duty"] = 7.0
    with pytest.raises(wl.LinkError):
        wl.terms_from_json(bad)
    with pytest.raises(wl.LinkError):
        wl.encode({"t": "snapshot", "metrics": "x" * (wl.MAX_FRAME + 1)})


def test_a_frozen_workers_queue_keeps_only_the_newest_leases(monkeypatch):
    """The lease loop never blocks on a worker that reads nothing (frozen): it queues, and past
    OUTBOX_COALESCE queued messages an older lease is dropped for the newer one (revokes are kept)."""
    from agent.config import tiny_cpu
    from agent.supervisor import OUTBOX_COALESCE, Supervisor
    monkeypatch.setenv("WEAVER_NO_CGROUP", "1")      # no process of this test is moved into a cgroup
    sup = Supervisor(tiny_cpu(), cooperative=True)
    for i in range(OUTBOX_COALESCE + 10):
        sup._to_worker({"t": "lease", "terms": {"n": i}})
        if i == 5:
            sup._to_worker({"t": "revoke", "at": 0.0, "lease_id": "", "reason": "x"})
    kinds = [m["t"] for m in sup._outbox]
    assert "revoke" in kinds and len(sup._outbox) <= OUTBOX_COALESCE + 1
    assert sup._outbox[-1]["terms"]["n"] == OUTBOX_COALESCE + 9


def test_a_mode_switch_in_the_worker_reaches_the_supervisor():
    """SiteAgent._apply_switch sets client.mode; over the link that is a `mode` message the supervisor
    registers on its next (re)connect (before, the worker kept the switch to itself)."""
    import socket

    from agent.config import LeaseClientConfig
    from agent.worker import LinkClient
    ours, theirs = socket.socketpair()
    link = LinkClient(theirs, LeaseClientConfig(), STANDIN, mode="gpu_preferred")
    link.mode = "gpu_preferred"           # no switch: nothing sent
    link.mode = "cpu_preferred"
    ours.settimeout(5)
    msgs = wl.FrameDecoder(wl.TO_SUPERVISOR).feed(ours.recv(1 << 16))
    assert msgs == [{"t": "mode", "mode": "cpu_preferred"}] and link.mode == "cpu_preferred"


@pytest.mark.parametrize("field", ["inspect_addr", "metrics_addr"])
@pytest.mark.parametrize("addr", ["0.0.0.0:9466", "[::]:9466", "10.0.0.5:9466", ":9466"])
def test_the_agents_unauthenticated_listeners_take_localhost_only(field, addr):
    from agent.config import AgentConfig
    with pytest.raises(ValueError, match=f"AgentConfig.{field} must be a localhost address"):
        AgentConfig.from_dict({field: addr})
    AgentConfig.from_dict({field: "127.0.0.1:0"})


def test_a_release_of_an_ended_sessions_lease_stays_with_the_supervisor(monkeypatch):
    """A worker frozen when its stream was lost (an xApp killed) says its release when it next runs, under
    the next session: that broker, a restarted xApp's, issued no such lease and ended the stream on it (a
    fresh-clone run: the new session dropped at its first lease, the worker mid-window). The session's
    leases end with it; the next one's seqs start again and are released as before."""
    from agent.config import tiny_cpu
    from agent.lease_client import Disconnected, LeaseGranted, LeaseRevoked
    from agent.supervisor import Supervisor
    monkeypatch.setenv("WEAVER_NO_CGROUP", "1")
    sup = Supervisor(tiny_cpu(), cooperative=True)
    sup.gate = LeaseGate(STANDIN, 0.5, spacing_s=0.0)
    sent = []

    class Client:
        connected = True

        def send_release(self, lease_id, reason, overrun_ms, held):
            sent.append(lease_id)
    sup.client = Client()
    def worker_releases(lease_id):
        sup._from_worker({"t": "release", "lease_id": lease_id, "reason": "revoked", "overrun_ms": 0.0,
                          "held_sm_count": 80})
    sup._on_event(LeaseGranted(terms("site-0.1.92", seq=92, at=10.0, valid=1e9)))
    sup._on_event(LeaseRevoked(10.1, "site-0.1.92", "revoked"))     # frozen: the supervisor says the release
    sup._on_event(LeaseGranted(terms("site-0.1.93", seq=93, at=10.2, valid=1e9)))
    sup._on_event(Disconnected(11.0, "stream lost"))
    worker_releases("site-0.1.92")
    worker_releases("site-0.1.93")
    assert sent == ["site-0.1.92"]
    sup._on_event(LeaseGranted(terms("site-0.2.1", seq=1, at=12.0, valid=1e9)))
    worker_releases("site-0.2.1")
    assert sent == ["site-0.1.92", "site-0.2.1"]
