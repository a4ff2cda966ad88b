"""The enforcer under the kernel bound (EnforcerConfig.kernel_bound, a confined worker), in virtual time:
it plans by CPU budget and fit, but no longer keeps work inside a wall-clock slot of its window; a
launch may run past the window (its charge is the next window's debt) and only the lease's hard end
bounds it. A CPU quota makes every launch take ~1/share of its CPU in wall time: the device here is
such a throttled stand-in (CPU = wall x share)."""
from __future__ import annotations

import pytest

from agent.config import EnforcerConfig
from agent.enforcer import CPU_TIME, BudgetEnforcer, Idle, Launch, LeaseTerms, StepNow

SHARE = 0.3          # the quota's cores: a launch of c CPU seconds takes c / SHARE wall seconds
PER_SAMPLE = 0.0008  # CPU seconds a sample costs, plus a fixed 1 ms


def run(kernel_bound: bool, seconds: float = 3.0, phase: float = 0.0):
    cfg = EnforcerConfig(kernel_bound=kernel_bound, phase_fraction=phase, max_micro_batch=64)
    enf = BudgetEnforcer(cfg, meter=CPU_TIME)
    now, seq, pending, cpu_used, reports = 0.0, 0, 0, 0.0, []
    next_lease = 0.0
    while now < seconds:
        if now >= next_lease:
            seq += 1
            enf.on_lease(LeaseTerms(f"L{seq}", 40, 0.1, 0.3, SHARE, now, 1, seq))
            next_lease += 0.1
        d = enf.decide(now, pending, 16)
        if isinstance(d, Launch):
            cpu = 0.001 + PER_SAMPLE * d.size * d.fraction
            enf.record_micro_batch(d.size, now, now + cpu / SHARE, cpu, d.fraction)
            now += cpu / SHARE
            pending += d.size
            cpu_used += cpu
        elif isinstance(d, StepNow):
            cpu = 0.002
            enf.record_step(now, now + cpu / SHARE, cpu)
            now += cpu / SHARE
            pending = 0
            cpu_used += cpu
        else:
            assert isinstance(d, Idle)
            now = min(d.until if d.until is not None else now + 0.01, next_lease, now + 0.01)
            now = max(now, 1e-6 + now)
        reports += enf.close_windows(now)
    return cpu_used / (SHARE * seconds), reports


def test_kernel_bound_spends_the_whole_budget_of_a_throttled_stand_in():
    coop, _ = run(False)
    bound, reports = run(True)
    # the budget takes the whole window at the quota's rate: spent to the last launch (the debt keeps the
    # long-run rate at the budget), never above it
    assert 0.99 <= bound <= 1.0 + 0.02, bound
    assert bound >= coop, (bound, coop)
    assert max(r.overrun_s for r in reports) == 0.0          # work past a window is no overrun here


def test_kernel_bound_ignores_the_phase_and_never_works_past_the_lease():
    frac, reports = run(True, phase=0.5)
    assert frac > 0.9
    cfg = EnforcerConfig(kernel_bound=True)
    enf = BudgetEnforcer(cfg, meter=CPU_TIME)
    enf.on_lease(LeaseTerms("L1", 40, 0.1, 0.3, SHARE, 0.0, 1, 1))
    d = enf.decide(0.29, 0, 16)                               # 10 ms before the hard end
    assert isinstance(d, Launch)
    cpu = 0.001 + PER_SAMPLE * d.size
    assert 0.29 + cpu / max(enf.wall_stretch(0.5), 1.0) <= 0.3 + 1e-9
    assert isinstance(enf.decide(0.31, 0, 16), Idle)          # past it: nothing


@pytest.mark.parametrize("kernel_bound", [False, True])
def test_a_revoked_lease_launches_nothing(kernel_bound):
    enf = BudgetEnforcer(EnforcerConfig(kernel_bound=kernel_bound), meter=CPU_TIME)
    enf.on_lease(LeaseTerms("L1", 40, 0.1, 0.3, SHARE, 0.0, 1, 1))
    assert enf.on_revoke(0.01, "L1")
    assert isinstance(enf.decide(0.02, 0, 16), Idle)
