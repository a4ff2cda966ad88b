"""The enforcer's idle accounting (the held -> used leg of the utilisation waterfall), in virtual time.

Every closed window splits the part of its grant no recorded work used into named causes, and
granted = busy + host + the causes, exactly. A device with an affine step time "takes" the time the
enforcer plans around; the clock moves only by what it takes and by the waits the test sets.
"""
from __future__ import annotations

import random

import pytest

from agent.enforcer import (
    BEYOND,
    CPU_TIME,
    HOST_RESERVE,
    LOOP,
    NOTHING_FITS,
    OTHER,
    ROUND_WAIT,
    STARVED,
    WALL,
    BudgetEnforcer,
    Idle,
    Launch,
    LeaseTerms,
    StepNow,
    window_waterfall,
)


def lease(now, seq, period=0.1, duty=0.6, valid=0.3):
    return LeaseTerms(f"L{seq}", 4, period, valid, duty, now, 1, seq)


def run(enf, until, *, a=0.002, b=0.0015, host_per_s=0.0, blocked=(), period=0.1, duty=0.6, loop_gap=0.0,
        seed=0, preempted=0.0):
    """The site agent's loop skeleton: renew each period, decide, run, record, report. `blocked`: (start,
    end) stretches in which the caller asks for no decision (the cross-site tier's phases after a round
    deadline); `loop_gap`: the caller's bookkeeping after each piece of work; `host_per_s`: host CPU;
    `preempted`: the share of a launch's wall time other processes take (it uses only the rest as CPU)."""
    rng = random.Random(seed)
    now, pending, seq, next_renew, work_cpu, reports = 0.0, 0, 0, 0.0, 0.0, []
    blocked = sorted(blocked)
    while now < until:
        if blocked and blocked[0][0] <= now:
            now = max(now, blocked.pop(0)[1])          # no decision asked meanwhile; windows close later
        if now >= next_renew:
            seq += 1
            enf.on_lease(lease(now, seq, period, duty))
            next_renew = now + period
        enf.note_process_cpu(now, work_cpu + host_per_s * now)
        d = enf.decide(now, pending, 8)
        if isinstance(d, Launch):
            t = (a + b * d.size * d.fraction) * (1 + rng.uniform(-0.05, 0.05))
            wall = t / (1 - preempted)
            work_cpu += t
            enf.record_micro_batch(d.size, now, now + wall, t, d.fraction)
            now, pending = now + wall + loop_gap, pending + d.size
        elif isinstance(d, StepNow):
            t = 0.003
            wall = t / (1 - preempted)
            work_cpu += t
            enf.record_step(now, now + wall, t)
            now, pending = now + wall + loop_gap, 0
        else:
            assert isinstance(d, Idle)
            now = min(d.until if d.until is not None else until, now + 0.05, next_renew, until) + 1e-6
        enf.note_process_cpu(now, work_cpu + host_per_s * now)
        reports += enf.close_windows(now)
    return reports


def check_identity(reports):
    assert reports
    for r in reports:
        causes = dict(r.idle_s)
        assert set(causes) == {NOTHING_FITS, ROUND_WAIT, HOST_RESERVE, LOOP, STARVED, OTHER, BEYOND}
        assert r.granted_s == pytest.approx(r.busy_s + r.host_s + sum(causes.values()), abs=1e-9)
        assert all(v >= 0 for c, v in causes.items() if c != BEYOND) and causes[BEYOND] <= 0
        assert causes[OTHER] * causes[BEYOND] == 0          # idle left unexplained, or beyond the grant


@pytest.mark.parametrize("host_per_s,loop_gap", [(0.0, 0.0), (0.05, 0.0), (0.1, 0.0005)])
def test_causes_add_up_to_the_idle_grant_in_every_window(host_per_s, loop_gap):
    reports = run(BudgetEnforcer(), 4.0, host_per_s=host_per_s, loop_gap=loop_gap)
    check_identity(reports)
    full = [r for r in reports if r.end == "period"][5:]
    idle = sum(r.granted_s - r.busy_s - r.host_s for r in full)
    other = sum(r.idle(OTHER) for r in full)
    assert abs(other) <= 0.2 * max(idle, 1e-3) + 1e-3   # the closing term stays small: the causes are measured
    if loop_gap:
        assert sum(r.idle(LOOP) for r in full) > 0.3 * loop_gap * sum(r.micro_batches for r in full)


def test_a_round_deadline_and_the_tier_phase_after_it_are_round_waits():
    """The deadline at 1.05 s, then 0.4 s in which the caller asks nothing (the tier's quorum and
    all-reduce): that grant is idle as a round wait, not as the loop's or the enforcer's choice."""
    enf = BudgetEnforcer()
    enf.deadline = 1.05
    first = run(enf, 1.05)
    enf.deadline = None
    rest = run_after(enf, 1.05, 2.0, blocked_until=1.45)
    reports = first + rest
    check_identity(reports)
    waits = sum(r.idle(ROUND_WAIT) for r in reports)
    # 0.4 s blocked with a lease of duty 0.6 from 1.05: the windows it spans had budget left for ~0.6 x 0.4
    assert 0.6 * 0.4 * 0.7 <= waits <= 0.6 * 0.4 + 0.06
    assert sum(r.idle(ROUND_WAIT) for r in first if r.start + r.length_s <= 1.0) == 0.0


def run_after(enf, start, until, blocked_until):
    """As `run`, from `start`, asking no decision before `blocked_until` (the lease, renewed at `start`,
    is still held meanwhile: the tier's phase runs under it)."""
    enf.on_lease(lease(start, 1000, valid=1.0))
    now, reports, seq = blocked_until, [], 1000
    reports += enf.close_windows(now)
    next_renew = now
    pending = 0
    while now < until:
        if now >= next_renew:
            seq += 1
            enf.on_lease(lease(now, seq))
            next_renew = now + 0.1
        d = enf.decide(now, pending, 8)
        if isinstance(d, Launch):
            t = 0.002 + 0.0015 * d.size * d.fraction
            enf.record_micro_batch(d.size, now, now + t, t, d.fraction)
            now, pending = now + t, pending + d.size
        elif isinstance(d, StepNow):
            enf.record_step(now, now + 0.003, 0.003)
            now, pending = now + 0.003, 0
        else:
            now = min(d.until if d.until is not None else until, next_renew, until) + 1e-6
        reports += enf.close_windows(now)
    return reports


def test_budget_no_launch_fits_is_the_enforcers_idle_choice():
    """A fixed cost of 35 ms per launch and a 60 ms budget: after one launch ~25 ms are left and nothing
    fits them. That is `nothing-fits`; on a device whose launches fill the budget it is near zero."""
    coarse = [r for r in run(BudgetEnforcer(), 3.0, a=0.035, b=0.0001) if r.end == "period"][8:]
    check_identity(coarse)
    fits = sum(r.idle(NOTHING_FITS) for r in coarse) / len(coarse)
    assert fits >= 0.01
    fine = [r for r in run(BudgetEnforcer(), 3.0) if r.end == "period"][8:]
    assert sum(r.idle(NOTHING_FITS) for r in fine) / len(fine) < fits / 3


def test_host_cpu_reserve_is_named():
    """Host CPU that the busy budget reserved (the expected host work of a period) but that did not come
    is held back, not used: `host-reserve`."""
    enf = BudgetEnforcer()
    reports = run(enf, 1.0, host_per_s=0.15)          # the tracker learns ~15 ms of host CPU a period
    reports += run_quiet(enf, 1.0, 1.3)               # then the host goes quiet for a few periods
    check_identity(reports)
    quiet = [r for r in reports if r.start >= 1.0 and r.end == "period"]
    assert quiet and sum(r.idle(HOST_RESERVE) for r in quiet) > 0.005


def run_quiet(enf, start, until):
    now, reports, seq, pending, work = start, [], 2000, 0, 0.0
    base = 0.15 * start                                  # the CPU clock as `run` left it (host part)
    next_renew = now
    while now < until:
        if now >= next_renew:
            seq += 1
            enf.on_lease(lease(now, seq))
            next_renew = now + 0.1
        enf.note_process_cpu(now, 1e3 + base + work)   # offset: a fresh reading base, no host CPU since
        d = enf.decide(now, pending, 8)
        if isinstance(d, Launch):
            t = 0.002 + 0.0015 * d.size * d.fraction
            work += t
            enf.record_micro_batch(d.size, now, now + t, t, d.fraction)
            now, pending = now + t, pending + d.size
        elif isinstance(d, StepNow):
            work += 0.003
            enf.record_step(now, now + 0.003, 0.003)
            now, pending = now + 0.003, 0
        else:
            now = min(d.until if d.until is not None else until, next_renew, until) + 1e-6
        enf.note_process_cpu(now, 1e3 + base + work)
        reports += enf.close_windows(now)
    return reports


def test_after_the_deadline_the_callers_silence_is_a_round_wait():
    """Work ends 10 ms before the round's deadline and the caller asks nothing for 60 ms (its loop,
    then the tier's blocking phase): 10 ms are the loop's, the rest up to the idle grant a round wait."""
    enf = BudgetEnforcer()
    enf.on_lease(lease(0.0, 1, period=0.1, duty=0.6, valid=0.3))
    enf.deadline = 0.03
    assert isinstance(enf.decide(0.0, 0, 8), Launch)       # a young fit: plans without a measurement
    enf.record_micro_batch(1, 0.0, 0.02, 0.02)
    enf.deadline = None                                     # the round's local work returned
    (r,) = [w for w in enf.close_windows(0.1 + 1e-9) if w.end == "period"]
    check_identity([r])
    assert r.idle(LOOP) == pytest.approx(0.01)
    assert r.idle(ROUND_WAIT) == pytest.approx(0.06 - 0.02 - 0.01)   # granted 60 ms: 20 busy, 10 loop


@pytest.mark.parametrize("units", [1, 4])
def test_the_usage_report_fields_add_up_to_the_grant(units):
    """What the agent sends (window_waterfall -> UsageReport, lease.proto fields 13-22): sm_ms_granted =
    sm_ms_used + host + starved + idle causes - beyond_grant, with a CPU clock that gets only ~90 % of the
    wall time (host starvation) and host CPU on other threads."""
    enf = BudgetEnforcer()
    reports = run(enf, 2.0, host_per_s=0.08, loop_gap=0.0003)
    log = [(r.start, r.start + 0.001, "eval") for r in reports[:3]]
    for r in reports:
        used_ms = 0.9 * r.busy_s * 1e3 * units            # the CPU clock the work got
        f = window_waterfall(r, units, used_ms, log)
        granted = r.granted_s * 1e3 * units
        total = used_ms + f["host_sm_ms"] + f["starved_sm_ms"] - f["beyond_grant_sm_ms"] + sum(
            v for k, v in f.items() if k.startswith("idle_"))
        assert total == pytest.approx(granted, abs=1e-6)
        assert f["starved_sm_ms"] == pytest.approx(0.1 * r.busy_s * 1e3 * units)
        assert 0 <= f["eval_sm_ms"] <= used_ms and f["beyond_grant_sm_ms"] >= 0
    assert sum(window_waterfall(r, units, 0.9 * r.busy_s * 1e3 * units, log)["eval_sm_ms"] for r in reports) > 0


def cpu_used(r):
    return r.cpu_s + r.host_s


@pytest.mark.parametrize("meter", [WALL, CPU_TIME])
def test_a_preempted_launch_is_charged_the_cpu_it_used_on_the_cpu_meter(meter):
    """Other processes take 20 % of every launch's wall time. On the CPU meter (a CPU stand-in, metered
    by its CPU time) the window is charged what the work used, so the CPU the work got fills the grant;
    charged by wall time, the CPU it did not get is idle grant (~20 %), named host starvation."""
    reports = [r for r in run(BudgetEnforcer(meter=meter), 3.0, preempted=0.2, host_per_s=0.02)
               if r.end == "period"][8:]
    check_identity(reports)
    granted = sum(r.granted_s for r in reports)
    used = sum(cpu_used(r) for r in reports) / granted
    assert max(cpu_used(r) - r.granted_s for r in reports) <= 0.003     # within the grant: one launch's excess
    if meter == CPU_TIME:
        assert used >= 0.93
    else:
        assert used <= 0.85


def test_on_the_cpu_meter_wall_time_still_bounds_the_work():
    """Half of every launch's wall time goes to other processes: a 60 ms CPU budget needs 120 ms of a 100 ms
    period. Predictions are CPU time, but no launch is planned to end past the window (each is stretched
    by the measured wall / CPU), and the budget the wall time could not hold is host starvation."""
    reports = [r for r in run(BudgetEnforcer(meter=CPU_TIME), 3.0, preempted=0.5) if r.end == "period"][8:]
    check_identity(reports)
    assert max(r.overrun_s for r in reports) <= 0.004       # at most a launch's jitter past the window's end
    starved = sum(r.idle(STARVED) for r in reports)
    assert starved >= 0.5 * sum(r.granted_s - r.busy_s for r in reports)
    assert sum(r.idle(NOTHING_FITS) for r in reports) < starved
