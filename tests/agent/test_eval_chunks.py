"""Validation runs as leased work in chunks sized by the measured cost of one held-out sample, so a chunk
fits the launch the enforcer planned whatever the job (a fixed 'forward is 1/3 of a training sample' rule
overran the leases of a transformers job)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from agent.config import tiny_cpu
from agent.enforcer import Launch
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent

pytestmark = [pytest.mark.agent]


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_chunks_follow_the_measured_cost_of_a_validation_sample(tmp_path):
    clock = FakeClock()
    cfg = replace(tiny_cpu(), checkpoint_dir=str(tmp_path))
    agent = SiteAgent(cfg, device=cpu_facts(1), clock=clock)
    agent._warmed = True
    agent._evaluating, agent._eval_sum = 32, 0.0
    sizes = []

    def eval_loss(start, n):            # a job whose held-out sample costs 2 ms (more than 1/3 of training)
        sizes.append(n)
        clock.t += 0.002 * n
        return 1.0
    agent.trainer.eval_loss = eval_loss
    plan = Launch(8, 0.009)             # the enforcer planned 9 ms for 8 training samples
    for _ in range(4):
        agent._launch(plan)
    assert sizes == [1, 4, 4, 4]        # one to measure, then what fits 9 ms at 2 ms a sample (not 24)
    assert all(t1 - t0 <= plan.predicted_s + 1e-9 for t0, t1, kind in agent.work_log if kind == "eval")
    young = Launch(8, 0.0)              # a young fit predicts nothing: one sample at a time
    agent._launch(young)
    assert sizes[-1] == 1
