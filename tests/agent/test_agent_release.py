"""LeaseReleased: the agent acknowledges, between launches, that nothing more runs under a lease (nor
any earlier one) after a replacement, a revocation, an expiry, a refusal and at shutdown, with the
measured overrun past that instant and the partition it now runs in. In-process on a fake clock (the
lease client's send_release recorded), then once end to end against the scripted broker."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from agent.config import LeaseClientConfig, tiny_cpu
from agent.enforcer import BudgetEnforcer, LeaseTerms
from agent.lease_client import Disconnected, LeaseGranted, LeaseRevoked
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent
from tests.agent.broker import ScriptedBroker, record_releases, wait_for


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _agent(tmp_path, cores=4):
    clock = Clock()
    agent = SiteAgent(replace(tiny_cpu(), checkpoint_dir=str(tmp_path)), device=cpu_facts(cores), clock=clock)
    return agent, clock, record_releases(agent)


def lease(lease_id, seq, at, sm=2, valid=10.0, period=0.1):
    return LeaseTerms(lease_id, sm, period, valid, 0.5, at, epoch=1, seq=seq)


def test_a_replacement_releases_the_old_lease_with_the_new_partition(tmp_path):
    agent, clock, sent = _agent(tmp_path)
    agent._handle([LeaseGranted(lease("A", 1, clock.t, sm=4))])
    assert sent == []
    agent._busy_until = clock.t + 0.004          # a launch under A ran 4 ms past B's arrival
    clock.t += 0.01
    agent._handle([LeaseGranted(lease("B", 2, clock.t - 0.01, sm=2))])
    (lid, reason, overrun, held), = sent
    assert (lid, reason, held) == ("A", "replaced", 2) and overrun == pytest.approx(4.0)
    agent._handle([LeaseGranted(lease("B", 3, clock.t))])   # a renewal of B is no replacement
    assert len(sent) == 1


def test_a_revocation_is_released_with_its_measured_overrun_which_is_also_reported(tmp_path):
    agent, clock, sent = _agent(tmp_path)
    agent._handle([LeaseGranted(lease("A", 1, clock.t))])
    revoked_at = clock.t + 0.02
    agent._busy_until = revoked_at + 0.007       # the in-flight launch ended 7 ms after the revoke arrived
    clock.t = revoked_at + 0.008
    agent._handle([LeaseRevoked(revoked_at, "", "stale-kpm")])
    (lid, reason, overrun, held), = sent
    assert (lid, reason, held) == ("A", "revoked", 0) and overrun == pytest.approx(7.0)
    reports = agent.enforcer.close_windows(clock.t)
    assert reports[-1].end == "revoked" and reports[-1].overrun_s == pytest.approx(0.007)
    agent._publish(reports)
    assert agent.modes.overruns[-1][1] == pytest.approx(7.0)   # the mode controller sees it too
    agent._handle([LeaseRevoked(clock.t, "", "again")])        # nothing held: nothing to release
    assert len(sent) == 1


def test_an_idle_expiry_is_released_with_no_overrun(tmp_path):
    agent, clock, sent = _agent(tmp_path)
    agent._handle([LeaseGranted(lease("A", 1, clock.t, valid=0.25))])
    clock.t += 0.3
    agent._publish(agent.enforcer.close_windows(clock.t))
    assert sent == [("A", "expired", 0.0, 0)]
    clock.t += 0.3
    agent._publish(agent.enforcer.close_windows(clock.t))
    assert len(sent) == 1


def test_work_past_the_expiry_is_the_release_s_overrun(tmp_path):
    agent, clock, sent = _agent(tmp_path)
    agent._handle([LeaseGranted(lease("A", 1, clock.t, valid=0.25))])
    agent._busy_until = clock.t + 0.26           # measured end of the last launch: 10 ms past expiry
    clock.t += 0.27
    agent._publish(agent.enforcer.close_windows(clock.t))
    (lid, reason, overrun, _), = sent
    assert (lid, reason) == ("A", "expired") and overrun == pytest.approx(10.0)


def test_a_closed_stream_revokes_everything_and_releases_nothing(tmp_path):
    agent, clock, sent = _agent(tmp_path)
    agent._handle([LeaseGranted(lease("A", 1, clock.t))])
    agent._handle([Disconnected(clock.t + 0.01, "UNAVAILABLE")])
    assert agent.enforcer.lease is None and agent.enforcer.last_end_reason == "disconnected"
    assert agent.enforcer.decide(clock.t + 0.02).reason == "disconnected"    # launches nothing
    assert sent == []                                  # no stream to send it on
    agent._handle([LeaseRevoked(clock.t + 0.03, "", "late")])
    assert sent == []


def test_the_enforcer_counts_work_past_a_revocation_as_overrun():
    enf = BudgetEnforcer()
    enf.on_lease(LeaseTerms("A", 1, 0.1, 10.0, 1.0, 0.0))
    enf.record_micro_batch(4, 0.0, 0.05)
    enf.on_revoke(0.04, "", "x", in_flight_until=0.05)
    assert enf.close_windows(0.06)[-1].overrun_s == pytest.approx(0.01)


def test_releases_reach_the_broker_for_replacement_revocation_and_shutdown(tmp_path):
    broker = ScriptedBroker(heartbeat_ms=100)
    broker.start()
    cfg = tiny_cpu()
    cfg = replace(cfg, modes=replace(cfg.modes, mode="gpu"), checkpoint_dir=str(tmp_path / "ckpt"),
                  lease=LeaseClientConfig(broker=f"127.0.0.1:{broker.port}", site_id="site-0", heartbeat_ms=100,
                                          backoff_initial_s=0.05, backoff_max_s=0.2))
    agent = SiteAgent(cfg, device=cpu_facts(1))
    thread = threading.Thread(target=agent.run, kwargs={"max_seconds": 60}, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: agent.client.connected, 10)
        broker.lease(sm_count=1, period_ms=50, valid_for_ms=5000, duty=1.0, lease_id="A")
        broker.lease(sm_count=1, period_ms=50, valid_for_ms=5000, duty=1.0, lease_id="B")
        assert broker.wait_for(lambda: [(r.lease_id, r.reason) for r in broker.released()] == [("A", "replaced")])
        assert broker.released()[0].held_sm_count == 1 and broker.released()[0].sent_unix_ms > 0
        broker.revoke("", "stale-kpm")
        assert broker.wait_for(lambda: len(broker.released()) == 2)
        assert (broker.released()[1].lease_id, broker.released()[1].reason) == ("B", "revoked")
        broker.lease(sm_count=1, period_ms=50, valid_for_ms=5000, duty=1.0, lease_id="C")
        assert wait_for(lambda: agent.enforcer.lease is not None and agent.enforcer.lease.lease_id == "C", 10)
    finally:
        agent.stop()
        thread.join(20)
        broker.stop()
    assert not thread.is_alive()
    last = broker.released()[-1]
    assert (last.lease_id, last.reason, last.held_sm_count) == ("C", "shutdown", 0)


def test_the_lease_history_stays_bounded_and_each_lease_ends_once(tmp_path):
    agent, clock, sent = _agent(tmp_path)
    keep = agent.history.maxlen
    for seq in range(1, keep + 51):              # one lease a period, each replacing the one before
        agent._handle([LeaseGranted(lease(f"L{seq}", seq, clock.t))])
        clock.t += 0.1
        agent._publish(agent.enforcer.close_windows(clock.t))
    assert len(agent.history) == keep and len(agent._records) == keep      # what is shown is what is kept
    assert [r.end for r in agent.history] == ["replaced"] * (keep - 1) + ["active"]
    assert len(sent) == keep + 49
    # a window of X that closes only when Y arrives is reported after Y was adopted: X stays replaced
    agent._handle([LeaseGranted(lease("X", keep + 51, clock.t))])
    clock.t += 0.15
    agent._handle([LeaseGranted(lease("Y", keep + 52, clock.t))])
    agent._publish(agent.enforcer.close_windows(clock.t))
    assert [(r.lease_id, r.end) for r in list(agent.history)[-2:]] == [("X", "replaced"), ("Y", "active")]
    assert agent.leases(2)[0].granted_ms > 0
