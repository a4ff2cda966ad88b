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
    assert agent.enforcer.host_reserve_s == agent.checkpoint_cpu_s > 0
    agent.enforcer.decide(agent.clock())
    agent._wait(Idle(None, "budget"))               # an idle moment inside the lease: written there
    assert not agent._checkpoint_due and agent.last_checkpoint is not None
    assert agent.enforcer.host_reserve_s == 0.0


def test_an_exchange_in_flight_reserves_the_whole_budget(tmp_path):
    agent = _agent(tmp_path)
    agent.enforcer.on_lease(LeaseTerms("L", 1, 0.1, 10.0, 0.2, agent.clock()))      # 20 ms
    agent._checkpoint_due = True
    agent.reserve_host("checkpoint")
    agent.reserve_host("exchange")
    assert agent.enforcer.host_reserve_s == pytest.approx(0.02)     # not 20 ms + the checkpoint's
    agent.reserve_host("exchange", False)
    assert agent.enforcer.host_reserve_s == agent.checkpoint_cpu_s   # the due checkpoint's alone
    agent.reserve_host("checkpoint", False)
    assert agent.enforcer.host_reserve_s == 0.0


def test_a_gpu_site_reserves_nothing_for_host_work(tmp_path):
    agent = _agent(tmp_path)
    agent.device = replace(agent.device, kind="cuda")
    agent.reserve_host("checkpoint")
    assert agent.enforcer.host_reserve_s == 0.0


def test_a_checkpoint_s_learned_cpu_follows_a_peak():
    agent = SiteAgent.__new__(SiteAgent)
    agent.checkpoint_cpu_s = 0.01
    agent.learn_checkpoint(0.03)
    assert agent.checkpoint_cpu_s == 0.03           # a larger one at once
    agent.learn_checkpoint(0.0)
    assert 0.0 < agent.checkpoint_cpu_s < 0.03      # then forgotten slowly


def test_an_exchange_begins_at_a_window_s_start_before_its_work(tmp_path):
    from agent.crosssite.agent import CrossSiteAgent
    cfg = tiny_cpu()
    cfg = replace(cfg, modes=replace(cfg.modes, mode="gpu"), checkpoint_dir=str(tmp_path / "ckpt"))
    agent = CrossSiteAgent(cfg, device=cpu_facts(1))
    assert agent._exchange_fits()                                   # no lease: nothing to hold it in
    agent.enforcer.on_lease(LeaseTerms("L", 1, 0.1, 10.0, 0.2, agent.clock()))   # 20 ms a period
    agent.enforcer.decide(agent.clock())
    assert agent._exchange_fits()                                   # the window's work has not started
    agent.enforcer.window.busy_s = 0.018                            # its work is done: 2 ms left
    assert not agent._exchange_fits()
    agent.enforcer.window.busy_s = 0.01                             # half spent: the reserve is no longer whole
    assert not agent._exchange_fits()


def test_a_phase_staggers_the_window_s_work_but_keeps_room_for_its_budget():
    from agent.enforcer import Launch
    enf = BudgetEnforcer(EnforcerConfig(phase_fraction=0.5))
    enf.on_lease(LeaseTerms("L", 1, 0.1, 10.0, 0.2, 0.0))          # 20 ms of each 100 ms period
    d = enf.decide(0.0, 0, 1)
    assert isinstance(d, Idle) and d.reason == "phase" and d.until == pytest.approx(0.05)
    assert isinstance(enf.decide(0.05, 0, 1), Launch)
    late = BudgetEnforcer(EnforcerConfig(phase_fraction=0.9))
    late.on_lease(LeaseTerms("L", 1, 0.1, 10.0, 0.6, 0.0))         # 60 ms: starts by 25 ms, not 90
    assert late.decide(0.0, 0, 1).until == pytest.approx(0.025)
