"""Partitions on CUDA (a green context no bigger than the lease, or the lease is refused) and the duty
conversion that keeps granted unit-time equal in space or time. Fake context factories, no GPU."""
from __future__ import annotations

from dataclasses import replace

import pytest

from agent.config import tiny_cpu
from agent.enforcer import LeaseTerms
from agent.monitors import DeviceFacts, cpu_facts, detect_device
from agent.partition import (
    FAULT_ENV,
    GreenContextPool,
    PartitionUnavailable,
    create_green_context,
    green_supported,
)
from agent.site_agent import SiteAgent
from tests.agent.broker import record_releases


class FakeGreenContext:
    """torch 2.10/2.11's shape (no Stream()): green_scope sets and pops it around the work."""

    def __init__(self, num_sms: int, log: list | None = None):
        self.num_sms, self.calls = num_sms, log if log is not None else []

    def set_context(self):
        self.calls.append(("set", self.num_sms))

    def pop_context(self):
        self.calls.append(("pop", self.num_sms))


def factory(fail=lambda n: False, log=None):
    made = []

    def create(num_sms, device_id):
        made.append(num_sms)
        if fail(num_sms):
            raise RuntimeError(f"cannot make {num_sms} SMs")
        return FakeGreenContext(num_sms, log)
    return create, made


def test_green_context_sizes_round_down_to_the_granularity():
    pool = GreenContextPool(132, 8, enabled=False)
    assert [pool.size_for(n) for n in (0, 7, 8, 63, 64, 131, 132, 500)] == [0, 0, 8, 56, 64, 128, 132, 132]
    # disabled: a lease covering the device may use it all, a smaller one has no partition at all
    assert pool.acquire(132) == 132 and pool.acquire(64) == 0
    with pytest.raises(PartitionUnavailable):
        with pool.scope(64):
            pytest.fail("leased work ran outside a partition")
    with pool.scope(200) as sms:
        assert sms == 132


def test_a_failed_size_falls_back_to_the_next_smaller_one_and_is_not_retried():
    calls = []
    create, made = factory(fail=lambda n: n == 40, log=calls)
    pool = GreenContextPool(132, 8, enabled=True, create=create)
    assert pool.acquire(45) == 32 and made == [40, 32]
    assert pool.size_for(45) == 32 and set(pool.failed) == {40} and "cannot make 40" in pool.failed[40]
    with pool.scope(45) as sms:
        calls.append(("work", sms))
    assert calls == [("set", 32), ("work", 32), ("pop", 32)] and made == [40, 32]   # cached: no new creation


def test_no_size_that_fits_means_no_partition():
    create, made = factory(fail=lambda n: True)
    pool = GreenContextPool(132, 8, enabled=True, create=create)
    assert pool.acquire(20) == 0 and made == [16, 8]
    assert pool.size_for(20) == 0 and pool.acquire(20) == 0 and made == [16, 8]
    with pytest.raises(PartitionUnavailable):
        with pool.scope(20):
            pytest.fail("leased work ran on the whole device")
    assert pool.acquire(7) == 0 and pool.acquire(132) == 132


def test_the_fault_hook_fails_every_creation(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1")
    with pytest.raises(RuntimeError, match=FAULT_ENV):
        create_green_context(8)
    pool = GreenContextPool(132, 8, enabled=True)           # the production factory
    assert pool.acquire(64) == 0 and set(pool.failed) == {8 * k for k in range(1, 9)}


def cuda_agent(tmp_path, pool):
    """A SiteAgent that believes it runs on a 132-SM GPU (its trainer stays on the CPU here)."""
    from agent.trainer import Trainer
    cfg = replace(tiny_cpu(), checkpoint_dir=str(tmp_path))
    agent = SiteAgent(cfg, device=DeviceFacts("cuda", "fake GPU", 132, 8, True), trainer=Trainer(cfg.train))
    agent.partitions = pool
    return agent, record_releases(agent)


def test_a_cuda_lease_without_a_partition_is_refused_counted_and_released(tmp_path):
    from agent.lease_client import LeaseGranted
    from agent.metrics import render
    create, _ = factory(fail=lambda n: True)
    agent, sent = cuda_agent(tmp_path, GreenContextPool(132, 8, enabled=True, create=create))
    now = agent.clock()
    agent._handle([LeaseGranted(LeaseTerms("small", 40, 0.1, 10.0, 40 / 132, now, 1, 1))])
    assert agent.enforcer.lease is None and agent.refused == {"refused": 1}
    assert sent == [("small", "refused", 0.0, 0)]
    assert 'weaver_agent_leases_refused_total{reason="refused",site="site-0"} 1.0' in render(agent)
    agent._handle([LeaseGranted(LeaseTerms("whole", 132, 0.1, 10.0, 1.0, now, 1, 2))])
    assert agent.enforcer.lease.lease_id == "whole" and agent.partition_units(132) == 132


def test_a_cuda_lease_runs_in_a_partition_no_bigger_than_itself(tmp_path):
    from agent.lease_client import LeaseGranted
    create, made = factory(fail=lambda n: n == 40)
    agent, sent = cuda_agent(tmp_path, GreenContextPool(132, 8, enabled=True, create=create))
    t = LeaseTerms("L", 40, 0.1, 10.0, 0.5 * 40 / 132, agent.clock(), 1, 1)   # 40 SMs half of each period
    agent._handle([LeaseGranted(t)])
    assert agent.enforcer.lease is not None and sent == [] and made == [40, 32]
    assert agent.partition_units(40) == 32
    # the same SM-time in the smaller partition: busy longer, never on more SMs than leased
    assert agent.enforcer.lease.duty == pytest.approx(0.5 * 40 / 32)


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

    ctx = FakeGreenContext(8)                        # torch 2.10/2.11 shape: no Stream()
    with pytest.raises(KeyError), green_scope(ctx):
        ctx.calls.append("work")
        raise KeyError("work failed")                # the context is popped even then
    assert ctx.calls == [("set", 8), "work", ("pop", 8)]
