"""The enforcer on a CPU stand-in (meter=CPU_TIME), in virtual time: what keeps a window's CPU inside
what the platform meters, over period-long intervals on the platform's own clock.

Each rule is checked against the same enforcer on the wall meter or without the rule's input, so that a
test fails when the rule is gone.
"""
from __future__ import annotations

import pytest

from agent.config import tiny_cpu
from agent.enforcer import (
    CPU_TIME,
    HOST_RESERVE,
    NOTHING_FITS,
    WALL,
    BudgetEnforcer,
    EnforcerConfig,
    Idle,
    Launch,
    LeaseTerms,
    StepNow,
)
from agent.monitors import cpu_facts

pytestmark = [pytest.mark.agent]

PERIOD, DUTY = 0.1, 0.3           # 30 ms of CPU in each 100 ms period


def lease(now, seq, duty=DUTY):
    return LeaseTerms(f"L{seq}", 4, PERIOD, 0.3, duty, now, 1, seq)


def drive(enf, until, *, blocked=(), a=0.002, b=0.0015, slow_at=None):
    """The loop skeleton: renew each period, decide, run. Work of size B takes a + b*B of CPU (and as
    much wall). `blocked`: (start, end[, host CPU]) in which the caller asks nothing (an exchange in
    flight; its host CPU runs just before `end`); `slow_at`: from then on, one launch 2.2 x slower.
    Returns the (start, end, cpu) of every piece of work and host CPU, and the closed windows."""
    now, seq, renew, pending, cpu, pieces, reports = 0.0, 0, 0.0, 0, 0.0, [], []
    blocked = list(blocked)
    while now < until:
        while blocked and blocked[0][0] <= now:
            start, end, *burst = blocked.pop(0)
            if burst:       # announced host CPU on another thread (reserved while it runs), at the block's end
                enf.note_process_cpu(max(now, end - burst[0]), cpu)
                enf.host_reserve_s = PERIOD * DUTY
                cpu += burst[0]
                pieces.append((end - burst[0], end, burst[0]))
                enf.note_process_cpu(end, cpu)
                enf.host_reserve_s = 0.0
            now = end
        if now >= renew:
            seq += 1
            enf.on_lease(lease(now, seq))
            renew = now + PERIOD
        enf.note_process_cpu(now, cpu)
        d = enf.decide(now, pending, 8)
        if isinstance(d, Launch):
            t = a + b * d.size * d.fraction
            if slow_at is not None and now >= slow_at:
                t, slow_at = 2.2 * t, None
            pieces.append((now, now + t, t))
            cpu += t
            enf.record_micro_batch(d.size, now, now + t, t, d.fraction)
            now, pending = now + t, pending + d.size
        elif isinstance(d, StepNow):
            pieces.append((now, now + 0.003, 0.003))
            cpu += 0.003
            enf.record_step(now, now + 0.003, 0.003)
            now, pending = now + 0.003, 0
        else:
            now = min(d.until if d.until is not None else until, renew, until,
                      blocked[0][0] if blocked else until) + 1e-6
        enf.note_process_cpu(now, cpu)
        reports += enf.close_windows(now)
    return pieces, reports


def heaviest_period(pieces, start=0.3):
    """The most CPU any period-long interval [t, t + PERIOD) holds (pieces split pro rata)."""
    def inside(t0):
        t1 = t0 + PERIOD
        return sum(c * max(0.0, min(e, t1) - max(s, t0)) / (e - s) for s, e, c in pieces if e > s)
    edges = sorted({x for s, e, _ in pieces for x in (s, e) if x >= start})
    return max(max(inside(x), inside(x - PERIOD)) for x in edges)


@pytest.mark.parametrize("meter", [CPU_TIME, WALL])
def test_a_window_s_late_work_and_the_next_one_s_early_work_never_share_a_metered_period(meter):
    """The caller asks nothing for the first 60 ms of the window at 0.6 s (an exchange in flight). Its
    budget left over, spent from 60 ms on, and the next window's work from its start would put 2 x the
    budget into one metered period; on the CPU meter the window's work stays in its slot (1.1 x the
    budget x the median stretch from its start), so no period-long interval holds more than 1.1 budgets."""
    pieces, _ = drive(BudgetEnforcer(meter=meter), 1.2, blocked=[(0.6, 0.66)])
    budget = PERIOD * DUTY
    heaviest = heaviest_period(pieces)
    if meter == CPU_TIME:
        assert heaviest <= 1.1 * budget + 1e-6
    else:
        assert heaviest > 1.5 * budget


@pytest.mark.parametrize("phase", [0.0, 0.5])
def test_past_its_slot_a_window_launches_nothing_on_the_cpu_meter(phase):
    cfg = EnforcerConfig(phase_fraction=phase)
    enf, wall = BudgetEnforcer(cfg, meter=CPU_TIME), BudgetEnforcer(cfg)
    for e in (enf, wall):
        e.on_lease(lease(0.0, 1))
    slot_end = enf.work_start() + 1.1 * PERIOD * DUTY
    assert enf.work_start() == pytest.approx(min(phase, 1 - 1.25 * DUTY) * PERIOD)
    d = enf.decide(slot_end + 0.001, 0, 8)
    assert isinstance(d, Idle) and d.until == pytest.approx(PERIOD)
    assert isinstance(wall.decide(slot_end + 0.001, 0, 8), Launch)


@pytest.mark.parametrize("late", [True, False])
def test_host_cpu_past_the_slot_is_taken_from_the_next_window(late):
    """An exchange in flight from 0.6 s completes at 0.69 s with 10 ms of host CPU, past the window's slot:
    that CPU and the next window's early work would share a metered period (40 ms of a 30 ms budget).
    It is the next window's debt, so no period-long interval holds more than 1.1 budgets. The same CPU
    inside the slot leaves the next window's budget whole."""
    end = 0.69 if late else 0.625
    pieces, reports = drive(BudgetEnforcer(meter=CPU_TIME), 1.2,
                            blocked=[(0.6, end - 0.01), (end - 0.01, end, 0.01)])
    budget = PERIOD * DUTY
    assert heaviest_period(pieces) <= 1.1 * budget + 1e-6
    after = next(r for r in reports if r.start == pytest.approx(0.7))
    if late:
        assert after.busy_s + after.host_s <= budget - 0.009
    else:
        assert after.busy_s + after.host_s >= budget - 0.003


def test_routine_host_cpu_past_the_slot_is_no_debt():
    """Host CPU spread over the whole period (threads, the loop's wake-ups) also runs past the slot; it is
    the host tracker's to expect, not the next window's debt, so the windows keep their budget."""
    routine = BudgetEnforcer(meter=CPU_TIME)
    routine.on_lease(lease(0.0, 1))
    routine.note_process_cpu(0.0, 0.0)
    routine.decide(0.0, 0, 8)
    routine.note_process_cpu(0.09, 0.004)          # 4 ms of unannounced host CPU, most of it past the slot
    routine.close_windows(0.1 + 1e-6)
    assert routine.window.debt_s == 0.0
    announced = BudgetEnforcer(meter=CPU_TIME)
    announced.on_lease(lease(0.0, 1))
    announced.note_process_cpu(0.0, 0.0)
    announced.decide(0.0, 0, 8)
    announced.host_reserve_s = PERIOD * DUTY        # an exchange in flight
    announced.note_process_cpu(0.09, 0.004)
    announced.close_windows(0.1 + 1e-6)
    assert announced.window.debt_s == pytest.approx(0.004 * (0.09 - 1.1 * PERIOD * DUTY) / 0.09)   # its share past the slot


def test_announced_host_work_is_not_learned_as_every_period_s_host_cpu():
    """An exchange's 20 ms of host CPU, reserved for (host_reserve_s) while it ran, leaves the expected
    host CPU of a period as it was; the same CPU unannounced sets it at once (a burst to plan for)."""
    def learned(reserve):
        enf = BudgetEnforcer(meter=CPU_TIME)
        enf.on_lease(lease(0.0, 1, duty=0.6))
        enf.note_process_cpu(0.0, 0.0)
        enf.host_reserve_s = reserve
        enf.decide(0.001, 0, 8)
        enf.note_process_cpu(0.05, 0.02)
        enf.host_reserve_s = 0.0
        enf.close_windows(PERIOD + 1e-6)
        return enf.host_expected_s
    assert learned(0.0) == pytest.approx(0.02)
    assert learned(0.06) == pytest.approx(0.0)


def test_held_back_budget_is_a_host_reserve_not_the_enforcer_s_choice():
    """The tracker expects 15 ms of host CPU a period after a burst; the quiet periods after it leave
    that budget idle. The idle stretch after the budget is spent is the held-back reserve, and nothing
    fits names only the busy budget the enforcer left unplanned."""
    enf = BudgetEnforcer(meter=CPU_TIME)
    enf.on_lease(lease(0.0, 1, duty=0.6))
    enf.note_process_cpu(0.0, 0.0)
    enf.decide(0.0, 0, 8)
    enf.note_process_cpu(0.05, 0.015)                    # an unannounced burst: 15 ms of host CPU
    _, reports = drive(enf, 1.0)
    quiet = [r for r in reports if r.end == "period" and 0.1 <= r.start < 0.4]
    assert quiet
    held = sum(r.idle(HOST_RESERVE) for r in quiet)
    assert held > 0.01
    assert sum(r.idle(NOTHING_FITS) for r in quiet) < 0.5 * held


def test_a_launch_slower_than_the_edge_quantile_scales_the_next_plan():
    """Interference that slows one launch 2.2 x slows the next too (two in a row in `weaver up`, the second
    past the grant): the plan made right after it is scaled by the measured slowdown. Forgotten, the
    same decision plans a launch that, as slow, would run past what is left of the budget."""
    def plan(remember):
        enf = BudgetEnforcer(meter=CPU_TIME)
        enf.on_lease(LeaseTerms("L", 4, 1.0, 3.0, 0.2, 0.0))     # 200 ms of a 1 s period
        now = 0.0
        for i in range(12):                                    # warm: t = 2 ms + 1.5 ms per sample
            size = 4 + i % 5
            t = 0.002 + 0.0015 * size
            enf.record_micro_batch(size, now, now + t, t)
            now += t
        t = 2.2 * (0.002 + 0.0015 * 8)
        enf.record_micro_batch(8, now, now + t, t)
        now += t
        if not remember:
            enf._slowdown = None
        left = enf.busy_budget() - enf.window.busy_s
        d = enf.decide(now + 0.0001, 0, 1000)
        assert isinstance(d, Launch)
        return d.predicted_s, left
    scaled, left = plan(True)
    unscaled, _ = plan(False)
    assert 2.2 * scaled <= left + 1e-9                        # as slow, it still ends inside the grant
    assert unscaled > 1.5 * scaled


def test_an_exchange_waits_for_the_window_s_phase(tmp_path):
    from dataclasses import replace

    from agent.crosssite.agent import CrossSiteAgent
    cfg = tiny_cpu()
    cfg = replace(cfg, modes=replace(cfg.modes, mode="gpu"), checkpoint_dir=str(tmp_path / "ckpt"),
                  enforcer=replace(cfg.enforcer, phase_fraction=0.5))
    agent = CrossSiteAgent(cfg, device=cpu_facts(1))
    now = agent.clock()
    agent.enforcer.on_lease(LeaseTerms("L", 1, 1.0, 10.0, 0.2, now))   # a 1 s period: its phase at 0.5 s
    agent.enforcer.decide(now)
    assert agent.enforcer.work_start() == pytest.approx(now + 0.5)
    assert not agent._exchange_fits()                    # before the phase: next to the last window's work
    agent.clock = lambda: now + 0.5
    assert agent._exchange_fits()


def test_while_an_exchange_is_in_flight_the_loop_reads_the_process_cpu_often(tmp_path):
    """An exchange's CPU runs on another thread and is charged where the loop's readings fall: between
    readings 50 ms apart it was split by wall time across a period boundary. In flight, the loop wakes
    every 5 ms; otherwise the idle tick is 50 ms, and a GPU site (host CPU is no SM) keeps it too."""
    from dataclasses import replace

    from agent.site_agent import HOST_WORK_TICK_S, IDLE_TICK_S, SiteAgent
    cfg = tiny_cpu()
    cfg = replace(cfg, modes=replace(cfg.modes, mode="gpu"), checkpoint_dir=str(tmp_path / "ckpt"))
    agent = SiteAgent(cfg, device=cpu_facts(1))
    idle = Idle(agent.clock() + 1.0, "budget-spent")
    assert agent._idle_timeout(idle) == IDLE_TICK_S
    agent.reserve_host("exchange")
    assert agent._idle_timeout(idle) == HOST_WORK_TICK_S < IDLE_TICK_S
    agent.device = replace(agent.device, kind="cuda")
    assert agent._idle_timeout(idle) == IDLE_TICK_S
