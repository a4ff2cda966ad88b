"""The agent's histograms as the agent measures them, on a fake clock with a real SiteAgent (real enforcer,
real tiny model): lease grant -> first launch (once per unbroken chain of leases, not per renewal),
revocation / expiry -> idle, each closed window's overrun; read back through prometheus_client's parser
from the same exposition /metrics serves."""
from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import tiny_cpu
from agent.enforcer import LeaseTerms
from agent.lease_client import LeaseGranted, LeaseRevoked
from agent.metrics import render
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent
from tests.agent.broker import record_releases


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def lease(lease_id, seq, at, valid=10.0):
    return LeaseTerms(lease_id, 2, 0.1, valid, 0.5, at, epoch=1, seq=seq)


def scrape(agent) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted labels: value}} of the agent's exposition."""
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(render(agent)):
        assert fam.documentation and fam.type in ("counter", "gauge", "histogram"), fam.name
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def hist(m, name, **labels) -> tuple[float, float]:
    """(count, sum) of one histogram series."""
    key = tuple(sorted({"site": "site-0", **labels}.items()))
    return m.get(name + "_count", {}).get(key, 0.0), m.get(name + "_sum", {}).get(key, 0.0)


def launch(agent) -> None:
    """One leased iteration that must run leased work (the warm-up on the first, then micro-batches)."""
    before = len(agent.work_log)
    agent._leased_iteration()
    assert len(agent.work_log) > before, "the enforcer launched nothing"


@pytest.fixture()
def agent(tmp_path):
    clock = Clock()
    a = SiteAgent(replace(tiny_cpu(), checkpoint_dir=str(tmp_path)), device=cpu_facts(4), clock=clock)
    record_releases(a)
    return a


def test_first_launch_once_per_chain_and_yield_per_revocation(agent):
    clock = agent.clock
    agent._handle([LeaseGranted(lease("A", 1, clock.t))])
    clock.t += 0.03
    launch(agent)
    assert hist(scrape(agent), "weaver_agent_lease_first_launch_seconds") == (1, pytest.approx(0.03))
    agent._handle([LeaseGranted(lease("A", 2, clock.t))])          # a renewal: the same chain
    agent._handle([LeaseGranted(lease("B", 3, clock.t))])          # a replacement: still no idle gap
    launch(agent)
    assert hist(scrape(agent), "weaver_agent_lease_first_launch_seconds")[0] == 1
    revoked_at = clock.t
    clock.t += 0.008                                               # the event handled 8 ms after arrival
    agent._handle([LeaseRevoked(revoked_at, "", "stale-kpm")])
    m = scrape(agent)
    assert hist(m, "weaver_agent_yield_seconds", cause="revoked") == (1, pytest.approx(0.008))
    assert m["weaver_agent_yield_latency_ms_max"][(("site", "site-0"),)] == pytest.approx(8.0)
    agent._handle([LeaseRevoked(clock.t, "", "again")])           # nothing held: no second yield
    agent._handle([LeaseGranted(lease("C", 4, clock.t))])          # idle -> a new chain starts the clock
    clock.t += 0.01
    launch(agent)
    assert hist(scrape(agent), "weaver_agent_lease_first_launch_seconds") == (2, pytest.approx(0.04))
    assert hist(scrape(agent), "weaver_agent_yield_seconds", cause="revoked")[0] == 1


def test_expiry_yield_and_window_overruns(agent):
    clock = agent.clock
    agent._handle([LeaseGranted(lease("A", 1, clock.t, valid=0.25))])
    agent._busy_until = clock.t + 0.25 + 0.006      # work launched under A ended 6 ms past its hard end
    clock.t += 0.3
    reports = agent.enforcer.close_windows(clock.t)
    agent._publish(reports)
    m = scrape(agent)
    assert hist(m, "weaver_agent_yield_seconds", cause="expired") == (1, pytest.approx(0.006))
    count, total = hist(m, "weaver_agent_overrun_seconds")
    assert count == len(reports) > 0 and total == pytest.approx(sum(r.overrun_s for r in reports))
    assert m["weaver_agent_windows_total"][(("site", "site-0"),)] == len(reports)
    zero = m["weaver_agent_overrun_seconds_bucket"][(("le", "0.0"), ("site", "site-0"))]
    assert zero == sum(1 for r in reports if r.overrun_s == 0)      # a clean window lands in the 0 bucket
