"""The lease client against a real gRPC LeaseBroker (tests/agent/broker.py) over loopback."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config import LeaseClientConfig
from agent.lease_client import Connected, Disconnected, LeaseClient, LeaseGranted, LeaseRevoked, lease_terms
from agent.monitors import cpu_facts
from schemas.proto.weaver.v1 import lease_pb2
from tests.agent.broker import ScriptedBroker


def collect(client, want, timeout=10.0):
    got, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline and not want(got):
        got += client.poll(0.05)
    return got


@pytest.fixture()
def broker():
    b = ScriptedBroker(heartbeat_ms=50)
    b.start()
    yield b
    b.stop()


def make_client(port, **kw):
    cfg = LeaseClientConfig(broker=f"127.0.0.1:{port}", site_id="site-0", backoff_initial_s=0.05,
                            backoff_max_s=0.2, **kw)
    return LeaseClient(cfg, cpu_facts(2), mode="cpu_preferred").start()


def test_registers_with_device_facts_and_heartbeats(broker):
    client = make_client(broker.port)
    try:
        events = collect(client, lambda ev: any(isinstance(e, Connected) for e in ev))
        assert any(isinstance(e, Connected) and e.epoch == 1 for e in events)
        reg = broker.registers[0]
        assert reg.site_id == "site-0" and reg.device.kind == "cpu" and reg.device.sm_count == 2
        assert reg.device.granularity == 1 and reg.mode == "cpu_preferred" and reg.agent_id
        assert broker.wait_for(lambda: sum(m.WhichOneof("body") == "heartbeat" for m in broker.received) >= 3)
    finally:
        client.stop()


def test_leases_and_revocations_arrive_stamped_on_the_agent_clock(broker):
    client = make_client(broker.port)
    try:
        collect(client, lambda ev: any(isinstance(e, Connected) for e in ev))
        # The Register/Welcome sample includes connection set-up; heartbeat echoes tighten the bound.
        assert broker.wait_for(lambda: sum(m.WhichOneof("body") == "heartbeat" for m in broker.received) >= 3)
        before = time.monotonic()
        broker.lease(sm_count=2, period_ms=40, valid_for_ms=120, duty=0.25, lease_id="A")
        broker.revoke("A", "stale-kpm")
        events = collect(client, lambda ev: any(isinstance(e, LeaseRevoked) for e in ev))
        grant = next(e for e in events if isinstance(e, LeaseGranted)).terms
        assert grant.lease_id == "A" and grant.period_s == pytest.approx(0.04) and grant.duty == 0.25
        assert before <= grant.received_at <= time.monotonic()
        # the broker stamps the lease: its hard end is 120 ms after it was sent, a little before receipt +
        # 120 ms (transit and the offset bound's slack, given up to 80 ms on a loaded host)
        assert grant.not_after is not None
        assert grant.received_at + 0.04 <= grant.expires_at <= grant.received_at + 0.12
        assert next(e for e in events if isinstance(e, LeaseRevoked)).reason == "stale-kpm"
    finally:
        client.stop()


def test_malformed_lease_is_ignored_and_grants_nothing(broker):
    client = make_client(broker.port)
    try:
        collect(client, lambda ev: any(isinstance(e, Connected) for e in ev))
        broker.push(lease_pb2.BrokerMessage(lease=lease_pb2.Lease(lease_id="bad", sm_count=4, period_ms=0)))
        broker.lease(lease_id="good")
        events = collect(client, lambda ev: any(isinstance(e, LeaseGranted) for e in ev))
        assert [e.terms.lease_id for e in events if isinstance(e, LeaseGranted)] == ["good"]
    finally:
        client.stop()


def test_reports_reach_the_broker(broker):
    client = make_client(broker.port)
    try:
        collect(client, lambda ev: any(isinstance(e, Connected) for e in ev))
        assert client.send_usage(lease_pb2.UsageReport(lease_id="A", sm_ms_used=5.0, steps=2))
        assert client.send_transfer_plan(3, 1 << 20, 123, 2)
        assert client.send_round_report(3, True, 2, 1000, 1 << 20, 500.0, 20.0)
        assert broker.wait_for(lambda: {m.WhichOneof("body") for m in broker.received} >= {"usage", "transfer", "round"})
        assert broker.usage()[0].sm_ms_used == 5.0
    finally:
        client.stop()


def test_reconnects_after_the_broker_restarts():
    broker = ScriptedBroker(heartbeat_ms=50)
    port = broker.start()
    client = make_client(port)
    try:
        collect(client, lambda ev: any(isinstance(e, Connected) for e in ev))
        broker.stop()
        events = collect(client, lambda ev: any(isinstance(e, Disconnected) for e in ev))
        assert any(isinstance(e, Disconnected) for e in events) and not client.connected
        assert not client.send_usage(lease_pb2.UsageReport(lease_id="x"))    # nothing buffered for later
        restarted = ScriptedBroker(heartbeat_ms=50, epoch=2)
        restarted.start(port)
        try:
            events = collect(client, lambda ev: any(isinstance(e, Connected) for e in ev))
            assert any(isinstance(e, Connected) and e.epoch == 2 for e in events)
            assert client.sessions == 2 and restarted.registers[0].site_id == "site-0"
        finally:
            restarted.stop()
    finally:
        client.stop()


def test_unreachable_broker_is_retried_without_events():
    from tests.conftest import free_port
    client = make_client(free_port())
    try:
        assert collect(client, lambda ev: False, timeout=0.5) == []
        assert not client.connected
    finally:
        client.stop()


def test_wrong_token_is_refused_by_the_broker():
    broker = ScriptedBroker(token="s3cret")
    broker.start()
    client = make_client(broker.port, token="nope")
    try:
        assert collect(client, lambda ev: False, timeout=0.5) == [] and broker.sessions == 0
    finally:
        client.stop()
        broker.stop()


@given(st.builds(lease_pb2.Lease, lease_id=st.text(max_size=8), sm_count=st.integers(0, 2**32 - 1),
                 period_ms=st.integers(0, 2**32 - 1), valid_for_ms=st.integers(0, 2**32 - 1),
                 epoch=st.integers(0, 2**64 - 1), seq=st.integers(0, 2**64 - 1),
                 duty=st.floats(allow_nan=True, allow_infinity=True)))
@settings(max_examples=200, deadline=None)
def test_any_lease_message_gives_terms_or_a_clear_error(msg):
    try:
        t = lease_terms(msg, 5.0)
    except ValueError as exc:
        assert repr(msg.lease_id) in str(exc)
        return
    assert t.period_s > 0 and 0.0 <= t.duty <= 1.0 and t.expires_at >= 5.0


def test_garbage_bytes_to_the_inspection_service_are_refused_and_it_keeps_serving(tmp_path):
    import grpc

    from agent.config import tiny_cpu
    from agent.inspect_service import serve_inspect
    from agent.site_agent import SiteAgent
    agent = SiteAgent(replace(tiny_cpu(), checkpoint_dir=str(tmp_path)), device=cpu_facts(1))
    server, addr = serve_inspect(agent, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(addr) as ch:
            raw = ch.unary_unary("/weaver.v1.AgentInspect/Leases")
            with pytest.raises(grpc.RpcError) as err:
                raw(b"\xff\xff\xff\x00garbage", timeout=5)
            assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
            from schemas.proto.weaver.v1 import lease_pb2_grpc
            st_ = lease_pb2_grpc.AgentInspectStub(ch).Status(lease_pb2.StatusRequest(), timeout=5)
            assert st_.site_id == "site-0" and st_.step == 0
        with pytest.raises(ValueError, match="localhost"):
            serve_inspect(agent, "0.0.0.0:0")
    finally:
        server.stop(0)


def _brokers(n):
    bs = [ScriptedBroker(heartbeat_ms=50) for _ in range(n)]
    for b in bs:
        b.start()
    return bs


def _connected_to(client, broker, timeout=10.0):
    events = collect(client, lambda ev: any(isinstance(e, Connected) for e in ev), timeout)
    return any(isinstance(e, Connected) for e in events) and client.target == f"127.0.0.1:{broker.port}"


def test_a_replica_of_another_shard_redirects_the_agent_to_the_one_that_serves_it():
    a, b = _brokers(2)
    a.redirect_to = f"127.0.0.1:{b.port}"
    client = LeaseClient(LeaseClientConfig(broker=f"127.0.0.1:{a.port},127.0.0.1:{b.port}", site_id="site-0",
                                           backoff_initial_s=0.05, backoff_max_s=5.0), cpu_facts(2)).start()
    try:
        assert _connected_to(client, b, timeout=3.0)      # at once: a redirect is not a failure to back off from
        assert a.redirected == 1 and not a.registers and len(b.registers) == 1 and client.redirects == 1
    finally:
        client.stop()
        a.stop()
        b.stop()


def test_a_redirect_to_a_broker_the_operator_did_not_configure_is_not_followed():
    a, b, rogue = _brokers(3)
    a.redirect_to = f"127.0.0.1:{rogue.port}"           # a lease from there would be a lease from anyone
    client = make_client(f"{a.port},127.0.0.1:{b.port}")
    try:
        assert _connected_to(client, b)                  # the next configured broker instead
        assert rogue.sessions == 0 and not rogue.registers and client.redirects == 0
    finally:
        client.stop()
        for x in (a, b, rogue):
            x.stop()


def test_a_dead_replica_is_skipped_for_the_next_configured_broker():
    (b,) = _brokers(1)
    dead = ScriptedBroker()
    dead_port = dead.start()
    dead.stop()
    client = make_client(f"{dead_port},127.0.0.1:{b.port}")
    try:
        assert _connected_to(client, b)
        with pytest.raises(ValueError, match="comma-separated"):
            LeaseClientConfig(broker=f"127.0.0.1:{b.port},nonsense")
    finally:
        client.stop()
        b.stop()
