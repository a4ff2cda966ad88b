"""A lease's hard end (sent_unix_ms + valid_for_ms on the broker's clock) that transit cannot extend:
the causal clock-offset bound, its mapping onto the agent's clock, and the agent refusing a lease that
arrives past its end. Virtual time for the arithmetic; one real stream against the scripted broker."""
from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config import LeaseClientConfig, tiny_cpu
from agent.enforcer import LeaseTerms
from agent.lease_client import (
    SENT_KEPT,
    ClockOffsetBound,
    LeaseClient,
    LeaseGranted,
    lease_hard_end,
    lease_terms,
)
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent
from schemas.proto.weaver.v1 import lease_pb2
from tests.agent.broker import ScriptedBroker, record_releases, wait_for


class Link:
    """Agent clock a(t) = t, broker wall b(t) = t + theta (ms); messages take the given delays."""

    def __init__(self, theta_ms: float):
        self.theta = theta_ms
        self.bound = ClockOffsetBound()

    def echo(self, sent_at: float, up_ms: float) -> None:
        """A request sent at agent time `sent_at`, stamped by the broker on arrival (whole ms, floored)."""
        self.bound.observe(sent_at, math.floor(sent_at + up_ms + self.theta))

    def lease_end(self, sent_at: float, valid_for_ms: int) -> tuple[float | None, float]:
        """(computed hard end, true hard end) on the agent's clock, in ms, for a lease stamped at `sent_at`."""
        stamped = math.floor(sent_at + self.theta)
        end = lease_hard_end(stamped, valid_for_ms, self.bound.max_offset_ms)
        return (None if end is None else end * 1e3), stamped - self.theta + valid_for_ms


def test_a_lease_delayed_5_s_in_transit_expires_at_once():
    link = Link(theta_ms=3_600_000.0)            # broker clock an hour ahead of the agent's
    link.echo(sent_at=10_000.0, up_ms=2.0)       # one heartbeat echo, 2 ms upward
    end, true_end = link.lease_end(sent_at=20_000.0, valid_for_ms=2_000)
    received = 20_000.0 + 5_000.0                # 5 s on the way down
    assert end <= true_end < received            # ended before it arrived
    t = lease_terms(lease_pb2.Lease(lease_id="late", sm_count=1, period_ms=50, valid_for_ms=2_000),
                    received / 1e3, end / 1e3)
    assert t.expires_at <= t.received_at         # grants nothing
    # Without the stamp the fallback (receipt + valid_for) would have granted 2 s more.
    assert lease_terms(lease_pb2.Lease(lease_id="late", period_ms=50, valid_for_ms=2_000),
                       received / 1e3).expires_at == pytest.approx(received / 1e3 + 2.0)


@pytest.mark.parametrize("up_ms,down_ms", [(5.0, 5.0), (1.0, 40.0), (40.0, 1.0)])
def test_symmetric_and_asymmetric_delays_only_ever_shorten_a_lease(up_ms, down_ms):
    link = Link(theta_ms=-123_456.7)
    for k in range(10):
        link.echo(sent_at=1_000.0 * k, up_ms=up_ms)
    end, true_end = link.lease_end(sent_at=50_000.0, valid_for_ms=300)
    # The bound exceeds the true offset by the upward delay (+1 ms for the broker's whole-ms stamps);
    # the downward delay of the lease itself does not enter the hard end at all.
    assert true_end - (up_ms + 1.0) - 1e-6 <= end <= true_end
    received = 50_000.0 + down_ms
    remaining = end - received
    assert remaining == pytest.approx(300 - down_ms - up_ms, abs=1.0 + 1e-6)


def test_the_fastest_of_the_last_samples_sets_the_bound():
    b = ClockOffsetBound(window=4)
    assert b.max_offset_ms is None
    for up in (30.0, 2.0, 9.0, 9.0, 9.0):
        b.observe(0.0, int(up))
    assert b.max_offset_ms == 3.0                # 2 ms + 1, still among the last four
    b.observe(0.0, 9)
    assert b.max_offset_ms == 10.0               # the 2 ms sample has left the window


def test_no_sample_or_an_unstamped_lease_falls_back_to_receipt_plus_valid_for():
    assert lease_hard_end(0, 1000, 5.0) is None
    assert lease_hard_end(123, 1000, None) is None
    t = LeaseTerms("L", 1, 0.05, 0.2, 1.0, received_at=7.0, not_after=None)
    assert t.expires_at == pytest.approx(7.2)
    assert replace(t, not_after=7.1).expires_at == pytest.approx(7.1)
    assert replace(t, not_after=9.0).expires_at == pytest.approx(7.2)   # never longer than valid_for


@settings(max_examples=300, deadline=None)
@given(theta=st.floats(-1e9, 1e9, allow_nan=False), base=st.floats(2e9, 2e12, allow_nan=False),
       ups=st.lists(st.floats(0, 5_000, allow_nan=False), min_size=1, max_size=80),
       lease_at=st.floats(0, 1e6, allow_nan=False), valid=st.integers(0, 60_000))
def test_the_offset_bound_is_never_below_the_true_offset(theta, base, ups, lease_at, valid):
    link = Link(theta)
    for i, up in enumerate(ups):
        link.echo(base + 10.0 * i, up)
    assert link.bound.max_offset_ms >= theta - 1e-6 * max(1.0, abs(theta) + base)   # float rounding only
    end, true_end = link.lease_end(base + lease_at, valid)
    assert end <= true_end + 1e-6 * max(1.0, abs(theta) + base + lease_at)


def test_the_client_bounds_the_offset_from_welcome_and_heartbeat_echoes():
    broker = ScriptedBroker(heartbeat_ms=20, offset_ms=3_600_000.0)   # an hour ahead
    broker.start()
    client = LeaseClient(LeaseClientConfig(broker=f"127.0.0.1:{broker.port}", site_id="site-0"),
                         cpu_facts(1)).start()
    try:
        assert wait_for(lambda: client.max_offset_ms is not None, 10)
        assert wait_for(lambda: sum(m.WhichOneof("body") == "heartbeat" for m in broker.received) >= 5, 10)
        true = time.time() * 1e3 + 3_600_000.0 - time.monotonic() * 1e3
        assert true - 5 <= client.max_offset_ms <= true + 500   # above the truth by one-way delays only
        broker.lease(lease_id="fresh", valid_for_ms=2_000)
        broker.lease(lease_id="late", valid_for_ms=2_000, transit_ms=5_000)
        got = []
        assert wait_for(lambda: got.extend(client.poll(0.0)) or len(got) >= 2, 10)
        fresh, late = (e.terms for e in got if isinstance(e, LeaseGranted))
        assert fresh.not_after is not None
        assert fresh.received_at + 1.5 < fresh.expires_at <= fresh.received_at + 2.0
        assert late.expires_at < late.received_at
    finally:
        client.stop()
        broker.stop()


def test_a_broker_that_does_not_echo_leaves_the_welcome_s_bound_and_a_bounded_send_log():
    broker = ScriptedBroker(heartbeat_ms=5, echo_heartbeats=False)
    broker.start()
    client = LeaseClient(LeaseClientConfig(broker=f"127.0.0.1:{broker.port}", site_id="site-0"),
                         cpu_facts(1)).start()
    try:
        assert wait_for(lambda: client.max_offset_ms is not None, 10)
        welcome_bound = client.max_offset_ms
        heartbeats = lambda: sum(m.WhichOneof("body") == "heartbeat" for m in broker.received)  # noqa: E731
        assert wait_for(lambda: heartbeats() > SENT_KEPT + 10, 20)
        sent = list(client._stream.heartbeat_ms)          # (one more while a send is being trimmed)
        assert SENT_KEPT <= len(sent) <= SENT_KEPT + 1 and sent == list(range(sent[0], sent[0] + len(sent)))
        assert sent[-1] > SENT_KEPT + 10
        assert client.max_offset_ms == welcome_bound                    # no echo: no new sample
        assert time.time() * 1e3 - time.monotonic() * 1e3 - 5 <= welcome_bound   # still above the truth
    finally:
        client.stop()
        broker.stop()


def test_an_agent_refuses_a_lease_that_arrives_past_its_hard_end(tmp_path):
    agent = SiteAgent(replace(tiny_cpu(), checkpoint_dir=str(tmp_path)), device=cpu_facts(1))
    sent = record_releases(agent)
    now = agent.clock()
    ok = LeaseTerms("ok", 1, 0.05, 10.0, 1.0, now, epoch=1, seq=1)
    late = LeaseTerms("late", 1, 0.05, 10.0, 1.0, now + 0.01, epoch=1, seq=2, not_after=now - 1.0)
    agent._handle([LeaseGranted(ok)])
    assert agent.enforcer.lease is not None
    agent._handle([LeaseGranted(late)])
    assert agent.enforcer.lease is None          # the newest lease is dead, and it supersedes "ok"
    assert agent.refused == {"expired": 1}
    assert sent == [("late", "expired", 0.0, 0)]
    assert [r.end for r in agent.history] == ["active", "refused"]
    agent._handle([LeaseGranted(replace(ok, seq=1, received_at=now + 0.02))])
    assert agent.enforcer.lease is None          # an older lease arriving later stays stale
