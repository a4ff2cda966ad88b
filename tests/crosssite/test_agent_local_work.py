"""CrossSiteAgent._local_work, in-process and fast: a real Trainer of the tiny preset, the enforcer's
decisions scripted, no broker, no Lighthouse."""
from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from agent.config import tiny_cpu
from agent.crosssite.agent import CrossSiteAgent
from agent.enforcer import Idle, Launch, LeaseTerms, StepNow
from agent.monitors import cpu_facts
from tests.agent.broker import record_releases

pytestmark = [pytest.mark.agent]


def _agent(tmp_path) -> CrossSiteAgent:
    cfg = tiny_cpu()
    cfg = replace(cfg, modes=replace(cfg.modes, mode="gpu"), checkpoint_dir=str(tmp_path / "ckpt"),
                  train=replace(cfg.train, eval_every=0, checkpoint_every=0))
    agent = CrossSiteAgent(cfg, device=cpu_facts(1))
    agent.enforcer.on_lease(LeaseTerms("L1", 1, 0.1, 60.0, 1.0, agent.clock()))
    agent._leased_iteration()       # the lease's first launch is the warm-up: the tests script what follows
    assert [kind for _, _, kind in agent.work_log] == ["warm-up"]
    return agent


def test_round_tokens_count_only_the_trained_prefix_of_cut_samples(tmp_path):
    agent = _agent(tmp_path)
    t = agent.trainer
    block = t.config.model.block_size
    script = [Launch(4, 0.0), Launch(3, 0.0, fraction=0.5), StepNow(0.0),     # stepped: 4 + 3 cut samples
              Launch(2, 0.0, fraction=0.25)]                                     # pending at the deadline
    agent.enforcer.decide = lambda *a, **k: script.pop(0) if script else Idle(None, "scripted")
    tokens0 = t.tokens_seen
    work = agent._local_work(time.time() + 0.3)
    assert not script and work.steps == 1 and math.isfinite(work.loss)
    assert work.tokens == 4 * block + 3 * math.floor(0.5 * block)     # not (4 + 3) x block
    # the pending cut launch was trained (the data position moved) but is not counted, and is dropped
    assert t.tokens_seen - tokens0 == work.tokens + 2 * math.floor(0.25 * block)
    assert t.pending_samples == 0 and t.pending_tokens == 0


def test_the_round_s_deadline_is_the_enforcer_s_for_the_work_phase_only(tmp_path):
    agent = _agent(tmp_path)
    enf, decide, seen = agent.enforcer, agent.enforcer.decide, []

    def recording(now, *a):
        d = decide(now, *a)
        seen.append((now, enf.deadline, d))
        return d
    enf.decide = recording
    start = agent.clock()
    work = agent._local_work(time.time() + 0.4)
    assert seen and enf.deadline is None                          # cleared once the work phase is over
    deadlines = {dl for _, dl, _ in seen}
    assert len(deadlines) == 1 and start + 0.35 < deadlines.pop() < start + 0.45
    end = seen[0][1]
    # every launch and step was planned to end by the deadline (a young fit predicts 0: not checked)
    assert all(now + d.predicted_s <= end + 1e-9 for now, _, d in seen if isinstance(d, Launch | StepNow))
    assert all(d.until == end for _, _, d in seen if isinstance(d, Idle) and d.reason == "round-deadline")
    assert work.steps >= 1 and work.tokens > 0


def _scripted_events(agent, *batches):
    """The lease client's poll() hands out these event batches, one per call, then nothing."""
    pending = list(batches)
    agent.client.poll = lambda timeout=0.0: pending.pop(0) if pending else []
    return record_releases(agent)


def test_a_revocation_in_the_work_phase_is_released_before_the_round_s_collectives(tmp_path):
    from agent.lease_client import LeaseGranted, LeaseRevoked
    agent = _agent(tmp_path)
    now = agent.clock()
    sent = _scripted_events(agent, [LeaseGranted(LeaseTerms("L2", 1, 0.1, 60.0, 1.0, now, 0, 1))],
                            [], [LeaseRevoked(now, "", "stale-kpm")])
    agent._local_work(time.time() + 0.2)
    assert [(lid, reason) for lid, reason, *_ in sent] == [("L2", "revoked")]
    assert agent.enforcer.lease is None


def test_lease_events_are_handled_and_released_while_the_tier_waits_for_the_boundary(tmp_path):
    from agent.lease_client import LeaseGranted
    agent = _agent(tmp_path)
    now = agent.clock()
    sent = _scripted_events(agent, [LeaseGranted(LeaseTerms("A", 1, 0.1, 60.0, 1.0, now, 0, 1))],
                            [LeaseGranted(LeaseTerms("B", 1, 0.1, 0.05, 1.0, now, 0, 2))])
    agent._sleep(0.15)       # what the tier calls before the next round's boundary
    assert [(lid, reason) for lid, reason, *_ in sent] == [("A", "replaced"), ("B", "expired")]
