"""CrossSiteAgent when the coordinator's cross-site config is absent, bad, or names a Lighthouse that is
not there: it trains alone under its leases (exactly a SiteAgent), never stalls its lease loop for long,
and joins once the config is good. In-process agent against the agent tests' real gRPC broker."""
from __future__ import annotations

import socket
import threading
from dataclasses import replace

import pytest

import agent.crosssite.agent as xs_agent
from agent.config import LeaseClientConfig, tiny_cpu
from agent.crosssite.agent import CrossSiteAgent
from agent.monitors import cpu_facts
from schemas.proto.weaver.v1 import lease_pb2
from tests.agent.broker import ScriptedBroker, wait_for

pytestmark = [pytest.mark.agent]


def _agent(port: int, tmp_path, **kw) -> CrossSiteAgent:
    cfg = tiny_cpu()
    cfg = replace(cfg, modes=replace(cfg.modes, mode="gpu"), checkpoint_dir=str(tmp_path / "ckpt"),
                  inspect_addr="127.0.0.1:0",
                  lease=LeaseClientConfig(broker=f"127.0.0.1:{port}", site_id="site-0", heartbeat_ms=100,
                                          backoff_initial_s=0.05, backoff_max_s=0.2))
    return CrossSiteAgent(cfg, device=cpu_facts(1), **kw)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]   # nothing listens once the socket is closed


@pytest.mark.parametrize("cs", [
    lease_pb2.CrossSiteConfig(),                                               # tier disabled
    lease_pb2.CrossSiteConfig(lighthouse_addr="garbage", round_ms=1000),        # not a URL
    lease_pb2.CrossSiteConfig(lighthouse_addr="http://127.0.0.1:1", round_ms=7),  # round too short
])
def test_no_or_bad_config_means_training_alone(tmp_path, cs):
    agent = _agent(1, tmp_path)
    agent.cross_site = cs
    assert agent._current_tier() is None and agent.tier is None and agent.tier_failures == 0


def test_joins_are_retried_only_after_1_2_4_rounds_and_at_most_a_minute(tmp_path, monkeypatch):
    now, attempts = [0.0], []

    class Unreachable:          # a Lighthouse that refuses at once: only the backoff spaces the tries
        def __init__(self, *a, **kw):
            attempts.append(now[0])
            raise ConnectionRefusedError("no Lighthouse")
    monkeypatch.setattr(xs_agent, "CrossSiteTier", Unreachable)
    agent = _agent(1, tmp_path, clock=lambda: now[0])
    agent.cross_site = lease_pb2.CrossSiteConfig(lighthouse_addr="http://127.0.0.1:1", round_ms=500)
    tick = 1 / 64                                            # fake time, exact in binary: 32 ticks a round
    for k in range(int(130 / tick)):
        now[0] = k * tick
        tried = len(attempts)
        assert agent._current_tier() is None
        if agent._join is not None:                          # a try started at this tick: let it fail
            assert agent._join.done.wait(10)
            assert agent._current_tier() is None and agent._join is None
        assert len(attempts) - tried <= 1 and agent.tier_failures == len(attempts)
    gaps = [b - a for a, b in zip(attempts[:-1], attempts[1:], strict=True)]
    # 1, 2, 4 ... rounds of 0.5 s after each failure, capped at a minute; no try in between
    assert attempts[0] == 0.0 and gaps == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert agent.tier_failures == len(attempts) and agent.tier is None


def test_unreachable_lighthouse_trains_alone_under_leases_and_backs_off(tmp_path, monkeypatch):
    gate = threading.Event()

    class Gated(xs_agent.CrossSiteTier):    # the real connect to a closed port, once the test lets it start
        def __init__(self, *a, **kw):
            gate.wait(60)
            super().__init__(*a, **kw)
    monkeypatch.setattr(xs_agent, "CrossSiteTier", Gated)
    broker = ScriptedBroker(heartbeat_ms=100)
    broker.start()
    agent = _agent(broker.port, tmp_path)
    thread = threading.Thread(target=agent.run, kwargs={"max_seconds": 60}, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: agent.client.connected, 15)
        broker.renew_every_period(sm_count=1, period_ms=100, valid_for_ms=300, duty=0.5)
        broker.push(lease_pb2.BrokerMessage(cross_site=lease_pb2.CrossSiteConfig(
            lighthouse_addr=f"http://127.0.0.1:{_closed_port()}", round_ms=400)))
        assert wait_for(lambda: agent._join is not None, 15)
        step = agent.trainer.step
        # the join (torchft's connect, 5 s timeout) runs off the loop thread: leased training goes on meanwhile
        assert wait_for(lambda: agent.trainer.step >= step + 3, timeout=20) and agent.tier_failures == 0
        gate.set()
        assert wait_for(lambda: agent.tier_failures >= 1, timeout=30)     # the connect timed out
        step = agent.trainer.step
        assert wait_for(lambda: agent.trainer.step >= step + 5, timeout=20)   # ...and it kept training, leased
        assert agent.tier is None and not agent.rounds
        # the next try waits for the backoff (a round, then 2, 4, ...; see the test above)
        assert agent.tier_failures <= 2
        # the coordinator turns the tier off: plain SiteAgent from then on, no more join attempts
        broker.push(lease_pb2.BrokerMessage(cross_site=lease_pb2.CrossSiteConfig()))
        assert wait_for(lambda: agent.tier_config is None, 15)
        failures = agent.tier_failures
        step = agent.trainer.step
        assert wait_for(lambda: agent.trainer.step >= step + 5, timeout=20)
        assert agent.tier_failures == failures
        usage = broker.usage()
        assert usage and sum(u.steps for u in usage) > 0 and all(u.overrun_ms < 1000 for u in usage)
    finally:
        gate.set()
        agent.stop()
        thread.join(30)
        broker.stop()
    assert not thread.is_alive()
