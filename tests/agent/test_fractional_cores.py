"""An agent standing in for its site GPU with a fraction of a core: one thread, every lease's duty scaled
by the share, and the share registered with the broker (which scales usage by it)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from agent.config import tiny_cpu
from agent.enforcer import LeaseTerms
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent

pytestmark = [pytest.mark.agent]


def test_facts_of_a_share_of_a_core():
    d = cpu_facts(0.3)
    assert (d.sm_count, d.cores, d.core_share) == (1, 0.3, pytest.approx(0.3))
    assert d.to_proto().cores == pytest.approx(0.3)
    whole = cpu_facts(2)
    assert (whole.sm_count, whole.core_share, whole.to_proto().cores) == (2, 1.0, 0.0)
    with pytest.raises(ValueError):
        cpu_facts(-1)


def test_a_lease_of_the_whole_gpu_is_the_share_of_one_thread(tmp_path):
    cfg = replace(tiny_cpu(), checkpoint_dir=str(tmp_path))
    agent = SiteAgent(cfg, device=cpu_facts(0.3))
    t = agent._effective_terms(LeaseTerms("L", 132, 0.1, 1.0, 1.0, 0.0))
    assert t.duty == pytest.approx(0.3) and t.budget_s == pytest.approx(0.03)
    half = agent._effective_terms(LeaseTerms("L", 66, 0.1, 1.0, 0.5, 0.0))
    assert half.budget_s == pytest.approx(0.015)
    assert agent.partition_units(132) == 1
    whole = SiteAgent(cfg, device=cpu_facts(1))
    assert whole._effective_terms(LeaseTerms("L", 132, 0.1, 1.0, 1.0, 0.0)).duty == 1.0
