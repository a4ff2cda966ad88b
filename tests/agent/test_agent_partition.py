"""Partition sizing and the duty conversion that keeps granted unit-time equal in space or time."""
from __future__ import annotations

from dataclasses import replace

import pytest

from agent.config import tiny_cpu
from agent.enforcer import LeaseTerms
from agent.monitors import DeviceFacts, cpu_facts, detect_device
from agent.partition import GreenContextPool, green_supported
from agent.site_agent import SiteAgent


def test_green_context_sizes_round_down_to_the_granularity():
    pool = GreenContextPool(132, 8, enabled=False)
    assert [pool.size_for(n) for n in (0, 7, 8, 63, 64, 131, 132, 500)] == [0, 0, 8, 56, 64, 128, 132, 132]
    assert pool.context(64) is None                        # disabled: the duty cycle is the only limit
    with pool.scope(64) as sms:
        assert sms == 132


def test_no_green_contexts_on_this_cpu_build():
    assert not green_supported()
    assert not GreenContextPool(132, 8).enabled
    facts = detect_device("auto", cores=3)
    assert facts == DeviceFacts("cpu", facts.name, 3, 1, False)
    with pytest.raises(RuntimeError, match="cuda"):
        detect_device("cuda")
    with pytest.raises(ValueError):
        detect_device("tpu")


@pytest.mark.parametrize("cores,sm,duty,threads,effective", [
    (2, 1, 0.5, 1, 1.0),      # broker: 1 of 2 cores -> duty 0.5; the agent runs 1 thread all period
    (4, 2, 0.25, 2, 0.5),     # a busy-share below the core share stays a duty cycle on those cores
    (2, 2, 1.0, 2, 1.0),
    (2, 0, 0.0, 1, 0.0),
])
def test_cpu_lease_runs_on_the_leased_cores_with_the_same_core_time(tmp_path, cores, sm, duty, threads, effective):
    cfg = replace(tiny_cpu(), checkpoint_dir=str(tmp_path))
    agent = SiteAgent(cfg, device=cpu_facts(cores))
    t = agent._effective_terms(LeaseTerms("L", sm, 0.1, 0.3, duty, 0.0))
    assert agent.partition_units(sm) == threads
    assert t.duty == pytest.approx(effective)
    if sm:
        assert t.duty * threads == pytest.approx(min(threads, duty * cores))   # same core-time granted


def test_green_scope_uses_set_and_pop_context_where_torch_has_no_green_streams():
    from agent.partition import green_scope

    class OldTorchGreenContext:                      # torch 2.10/2.11 shape: no Stream()
        def __init__(self):
            self.calls = []

        def set_context(self):
            self.calls.append("set")

        def pop_context(self):
            self.calls.append("pop")

    ctx = OldTorchGreenContext()
    with pytest.raises(KeyError), green_scope(ctx):
        ctx.calls.append("work")
        raise KeyError("work failed")                # the context is popped even then
    assert ctx.calls == ["set", "work", "pop"]
