"""On a CPU-only site the agent's own host work (checkpoint writes, a cross-site round's exchange) is
CPU the platform meters as the site GPU: it is reserved inside the lease before it runs, and a due
checkpoint waits for a lease instead of running beyond one."""
from __future__ import annotations

from dataclasses import replace

import pytest

from agent.config import tiny_cpu
from agent.enforcer import BudgetEnforcer, EnforcerConfig, Idle, LeaseTerms
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent

pytestmark = [pytest.mark.agent]


def test_a_host_reserve_is_kept_out_of_the_busy_budget_until_the_host_cpu_covers_it():
    enf = BudgetEnforcer(EnforcerConfig())
    enf.on_lease(LeaseTerms("L", 1, 0.1, 10.0, 0.5, 0.0))
    enf.decide(0.0)
    assert enf.busy_budget() == pytest.approx(0.05)
    enf.host_reserve_s = 0.02
    assert enf.busy_budget() == pytest.approx(0.03)
    enf.note_process_cpu(0.001, 0.0)
    enf.note_process_cpu(0.01, 0.025)      # the reserved work ran: 25 ms of host CPU in the window
    assert enf.busy_budget() == pytest.approx(0.025)


def _agent(tmp_path) -> SiteAgent:
    cfg = tiny_cpu()
    cfg = replace(cfg, modes=replace(cfg.modes, mode="gpu"), checkpoint_dir=str(tmp_path / "ckpt"))
    return SiteAgent(cfg, device=cpu_facts(1))


def test_a_due_checkpoint_is_reserved_and_waits_for_a_lease_on_a_cpu_site(tmp_path):
    agent = _agent(tmp_path)
    agent._checkpoint_due = True
    agent.reserve_host("checkpoint")
    assert agent.enforcer.host_reserve_s == 0.0      # no lease to reserve it in
    agent._wait(Idle(None, "no-lease"))              # no lease: nothing written
    assert agent._checkpoint_due and agent.last_checkpoint is None
    agent.enforcer.on_lease(LeaseTerms("Z", 0, 0.1, 10.0, 0.0, agent.clock()))
    agent.enforcer.decide(agent.clock())
    agent._wait(Idle(None, "zero-lease"))            # a zero lease holds no host work either
    assert agent._checkpoint_due and agent.last_checkpoint is None
    agent.enforcer.on_lease(LeaseTerms("S", 1, 0.1, 10.0, 0.05, agent.clock(), 0, 2))   # 5 ms: too small
    agent._apply_host_reserve()
    assert agent.enforcer.host_reserve_s == 0.0      # reserving it there would only stop training
    agent.enforcer.on_lease(LeaseTerms("L", 1, 0.1, 10.0, 1.0, agent.clock(), 0, 3))
    agent._apply_host_reserve()
    assert agent.enforcer.host_reserve_s == agent.host_work_s["checkpoint"] > 0
    agent.enforcer.decide(agent.clock())
    agent._wait(Idle(None, "budget"))               # an idle moment inside the lease: written there
    assert not agent._checkpoint_due and agent.last_checkpoint is not None
    assert agent.enforcer.host_reserve_s == 0.0


def test_an_exchange_in_flight_reserves_up_to_the_whole_budget(tmp_path):
    agent = _agent(tmp_path)
    agent.enforcer.on_lease(LeaseTerms("L", 1, 0.1, 10.0, 0.2, agent.clock()))      # 20 ms
    agent.host_work_s["exchange"] = 0.05
    agent.reserve_host("exchange")
    assert agent.enforcer.host_reserve_s == pytest.approx(0.02)
    agent.reserve_host("exchange", False)
    assert agent.enforcer.host_reserve_s == 0.0


def test_a_gpu_site_reserves_nothing_for_host_work(tmp_path):
    agent = _agent(tmp_path)
    agent.device = replace(agent.device, kind="cuda")
    agent.reserve_host("checkpoint")
    assert agent.enforcer.host_reserve_s == 0.0


def test_learned_host_work_follows_a_peak():
    cost = {"exchange": 0.01}
    agent = SiteAgent.__new__(SiteAgent)
    agent.host_work_s = cost
    agent.learn_host("exchange", 0.03)
    assert cost["exchange"] == 0.03                 # a larger one at once
    agent.learn_host("exchange", 0.0)
    assert 0.0 < cost["exchange"] < 0.03            # then forgotten slowly
