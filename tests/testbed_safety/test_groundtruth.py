"""The /proc sampler against real child processes that burn a known CPU time (no mocks of /proc)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from testbed.groundtruth import (
    AgentTruth,
    CpuTrace,
    IdleBaseline,
    ProcCpuSampler,
    idle_from,
    rate_before,
    site_sms,
    stat_cpu_s,
    window_rates,
    work_stopped_at,
)

SPIN = """
import sys, time
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
t0 = time.process_time()
while time.process_time() - t0 < {burn}:
    pass
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""

SPIN_THREADS = """
import sys, threading, time
def burn():
    t0 = time.thread_time()
    while time.thread_time() - t0 < {burn}:
        pass
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
ts = [threading.Thread(target=burn) for _ in range(2)]
[t.start() for t in ts]
[t.join() for t in ts]
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


def _child(code: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _burn(p: subprocess.Popen) -> None:
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "done"


def _finish(p: subprocess.Popen) -> None:
    p.stdin.write("bye\n")
    p.stdin.flush()
    p.wait(10)


def test_sampler_measures_a_known_burn():
    p = _child(SPIN.format(burn=0.3))
    try:
        s = ProcCpuSampler(p.pid)
        assert s.sample() == 0.0
        idle = s.sample()  # the child blocks on stdin: next to nothing
        assert idle is not None and idle < 0.05
        _burn(p)
        cpu = s.sample()
        assert cpu is not None
        # the child spun 0.3 s of its own CPU time, plus a little bookkeeping around it
        assert 0.29 <= cpu <= 0.45, cpu
        assert s.source.startswith("process CPU clock")
        # the tick-based cross-check agrees to within a few ticks
        assert abs(s.stat_cpu_s - s.clock_cpu_s) <= 0.05, (s.stat_cpu_s, s.clock_cpu_s)
    finally:
        _finish(p)
    assert s.sample() is None  # gone


def test_sampler_counts_threads_born_and_ended_between_samples():
    p = _child(SPIN_THREADS.format(burn=0.2))
    try:
        s = ProcCpuSampler(p.pid)
        s.sample()
        before = stat_cpu_s(p.pid)
        _burn(p)
        cpu = s.sample()
        after = stat_cpu_s(p.pid)
    finally:
        _finish(p)
    # two threads of 0.2 s each, both exited before the sample: the process CPU clock keeps an exited
    # thread's time (per-thread schedstat lost it), as the tick counts do
    assert after - before >= 0.35
    assert s.stat_cpu_s >= 0.35
    assert cpu is not None and cpu >= 0.39 and abs(cpu - s.stat_cpu_s) <= 0.05, (cpu, s.stat_cpu_s)


def test_site_sms_scale_and_truth_accounting():
    assert site_sms(0.05, 0.1, 132, 1) == pytest.approx(66.0)
    assert site_sms(0.1, 0.1, 132, 2) == pytest.approx(66.0)
    with pytest.raises(ValueError):
        site_sms(0.1, 0.0, 132, 1)
    p = _child(SPIN.format(burn=0.3))
    try:
        t = AgentTruth(site=0, pid=p.pid, gpu_sms=100.0, cores=1)
        time.sleep(0.05)
        t.period(0.1, lease_sms=0.0, connected=True)
        _burn(p)
        sms = t.period(1.0, lease_sms=10.0, connected=True)  # 0.3 s over a 1 s "period": 30 SMs of 100
        assert 28 <= sms <= 45
        summ = t.summary()
        assert summ["sm_ms_beyond_lease_total"] == pytest.approx((sms - 10.0) * 1000.0, rel=0.05)
        assert summ["sm_seconds_executed"] >= sms * 1.0
        # the worst period is kept with what came before it and what the agent said about its lease
        w = summ["worst_periods"]
        assert [r["reported_lease_sms"] for r in w] == [0.0, 10.0] and w[-1]["beyond_sms"] == pytest.approx(sms - 10.0, abs=0.01)
        for lease in (10.0, 10.0, 10.0):
            t.period(0.1, lease_sms=lease, connected=True, said={"lease_id": "s.1.2"})
        w = t.summary()["worst_periods"]
        assert len(w) == 4 and [r.get("lease_id") for r in w[2:]] == ["s.1.2", "s.1.2"]
    finally:
        _finish(p)


def test_idle_baseline_waits_for_the_lease_tail():
    b = IdleBaseline(settle=2)
    for sms, lease in [(50, 40), (30, 0), (20, 0), (1, 0), (2, 0), (60, 40), (3, 0)]:
        b.observe(sms, lease, True)
    assert b.samples == [1, 2]


SPIN_THEN_SLEEP = """
import sys, time
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
t0 = time.process_time()
while time.process_time() - t0 < {burn}:
    pass
stop = time.time()
time.sleep({rest})
sys.stdout.write(repr(stop) + "\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


def test_cpu_trace_finds_the_instant_a_real_process_stops_working():
    """A child spins 0.3 s of CPU, then sleeps: the idle instant found in the 2 ms trace of its CPU clock
    is within a few ms of the instant it really stopped (it says so itself, on the same wall clock)."""
    p = _child(SPIN_THEN_SLEEP.format(burn=0.3, rest=0.4))
    trace = CpuTrace({0: p.pid}, interval_s=0.002)
    try:
        trace.start()
        time.sleep(0.1)
        started = time.time()
        p.stdin.write("go\n")
        p.stdin.flush()
        stop = float(p.stdout.readline())
    finally:
        trace.stop()
        _finish(p)
    t, cpu = trace.series(0)
    assert cpu[-1] - cpu[0] >= 0.29
    busy = idle_from(t, cpu, started + 0.05, threshold_cores=0.05)  # mid-spin: idle only once it stops
    assert busy is not None and abs(busy - stop) <= 0.006, (busy - stop)
    assert idle_from(t, cpu, stop + 0.1, threshold_cores=0.05) == stop + 0.1  # already idle: at once
    assert idle_from(t, cpu, started + 0.05, threshold_cores=0.05, until=stop - 0.05) is None
    o = trace.overhead()
    assert o["samples"] == len(t) and o["thread_cpu_s"] > 0 and o["sample_gap_ms_p50"] >= 1.0
    assert not o["truncated"]


def test_idle_needs_the_quiet_to_hold():
    # 1 ms samples: busy to 0.05, a 30 ms gap, busy again 0.08-0.12, then quiet: the gap is not idle
    t = np.arange(0.0, 0.4, 0.001)
    busy = ((t < 0.05) | ((t >= 0.08) & (t < 0.12))).astype(float)
    cpu = np.concatenate(([0.0], np.cumsum(busy[:-1] * 0.001)))
    assert idle_from(t, cpu, 0.0, threshold_cores=0.05, window_s=0.01, hold_s=0.1) == pytest.approx(0.12)
    assert idle_from(t, cpu, 0.0, threshold_cores=0.05, window_s=0.01, hold_s=0.02) == pytest.approx(0.05)
    # a 3 ms burst of host work (a reconnect) 40 ms after the stop: idle from the stop where the hold only
    # looks for work resumed (windows above half a core), not where it asks for the baseline throughout
    burst = (t < 0.05) | ((t >= 0.09) & (t < 0.093))
    cpu_b = np.concatenate(([0.0], np.cumsum(burst[:-1] * 0.001)))
    assert idle_from(t, cpu_b, 0.0, 0.05, window_s=0.01, hold_s=0.1, hold_threshold_cores=0.5) == pytest.approx(0.05)
    assert idle_from(t, cpu_b, 0.0, 0.05, window_s=0.01, hold_s=0.1) == pytest.approx(0.093)
    rates = window_rates(t, cpu, 0.01)
    assert rates[0] == pytest.approx(1.0) and rates[200] == 0.0 and np.isinf(rates[-1])


def _clock(busy, t0=0.0, t1=0.4, step=0.002):
    """A CPU clock sampled every `step` from `t0`: one core busy within each (start, end) of `busy`."""
    t = np.arange(t0, t1, step)
    fine = np.arange(t0, t1 + step, 1e-5)
    on = np.zeros(len(fine))
    for a, b in busy:
        on[(fine >= a) & (fine < b)] = 1.0
    cum = np.concatenate(([0.0], np.cumsum(on[:-1] * 1e-5)))
    return t, np.interp(t, fine, cum)


def test_work_stopped_at_a_revoke_mid_work():
    # revoked at t0 = 0.1 while working; busy until t0 + 7 ms, then idle: 7 ms, on the sample grid (samples
    # at 0.001 + 2k ms) and inside a sample interval alike (samples every 2 ms from 0: 7 ms lies in [6, 8])
    for start in (0.001, 0.0):
        t, cpu = _clock([(0.0, 0.107)], t0=start)
        stop = work_stopped_at(t, cpu, 0.1)
        assert stop is not None and (stop - 0.1) * 1000 == pytest.approx(7.0, abs=0.05)
    # busy at the instant: ~1 core over the last 3 ms; idle later
    assert rate_before(t, cpu, 0.1) == pytest.approx(1.0)
    assert rate_before(t, cpu, 0.2) == pytest.approx(0.0)
    assert rate_before(t, cpu, 0.5) is None      # past the trace's end: unknown, not idle
    # work that resumes within the hold (a 5 ms gap, then 30 ms more) is not a stop; a stop cut by a new
    # lease before the hold has passed is none either
    t, cpu = _clock([(0.0, 0.107), (0.112, 0.142)])
    assert (work_stopped_at(t, cpu, 0.1) - 0.1) * 1000 == pytest.approx(42.0, abs=0.05)
    t, cpu = _clock([(0.0, 0.107)])
    assert work_stopped_at(t, cpu, 0.1, until=0.12) == pytest.approx(0.107, abs=5e-5)  # the hold is cut at until
    assert work_stopped_at(t, cpu, 0.1, until=0.105) is None                             # re-granted first
    t, cpu = _clock([(0.0, 0.4)])
    assert work_stopped_at(t, cpu, 0.1) is None                                          # never stops


def test_a_dying_workers_teardown_beyond_the_lease_is_kept_apart_and_a_zombie_reads_as_exiting():
    from testbed.groundtruth import stat_fields

    z = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not stat_fields(z.pid)[1]:
        time.sleep(0.01)
    assert stat_fields(z.pid)[1], "an unreaped child is a zombie: exiting"
    assert stat_fields(os.getpid())[1] is False
    z.wait()
    p = _child(SPIN.format(burn=0.3))
    try:
        t = AgentTruth(site=0, pid=p.pid, gpu_sms=100.0, cores=1)
        t.period(0.1, lease_sms=10.0, connected=True)
        _burn(p)
        t.sampler.exiting = True          # as if the sample had caught the worker in do_exit
        t.sampler.sample = lambda: 0.3    # and it had executed 30 SMs' worth meanwhile
        charged = t.period(1.0, lease_sms=10.0, connected=True, cpu=0.3)
        summ = t.summary()
        assert charged == 10.0 and summ["exit_teardown_sm_ms_beyond_lease"] == pytest.approx(20_000.0)
        assert summ["sm_seconds_executed"] == pytest.approx(30.0, abs=1.0)   # what ran is still what ran
        assert summ["sm_ms_beyond_lease_max"] == 0.0
    finally:
        _finish(p)


def _periods(t: AgentTruth, cpu_lease_misses: list[tuple[float, float, int]]) -> None:
    for cpu, lease, misses in cpu_lease_misses:   # 0.1 s periods, 1 core = 100 SMs: cpu 0.05 s is 50 SMs
        t.period(0.1, lease_sms=lease, connected=True, cpu=cpu)
        t.settle(misses)


def test_an_overrun_the_kernel_repays_is_told_apart_and_training_outside_the_lease_is_not():
    # the kernel's pattern (Linux 6.18, a long syscall past the CFS quota): 2.5x the lease, then throttled
    repaid = AgentTruth(site=0, pid=os.getpid(), gpu_sms=100.0, cores=1)
    _periods(repaid, [(0.03, 30.0, 0), (0.075, 30.0, 40), (0.0, 30.0, 0), (0.01, 30.0, 0)] + [(0.03, 30.0, 0)] * 10)
    s = repaid.summary()
    assert s["repaid_overrun_periods"] == 1 and s["deadline_misses_in_repaid_overruns"] == 40, s
    # the fault: an agent running past its lease period after period repays nothing, so none is told apart
    outside = AgentTruth(site=0, pid=os.getpid(), gpu_sms=100.0, cores=1)
    _periods(outside, [(0.075, 30.0, 40)] * 20)
    s = outside.summary()
    assert s["repaid_overrun_periods"] == 0 and s["deadline_misses_in_repaid_overruns"] == 0, s
    # nor a burst that the next second does not make up for (the agent at its lease after it)
    partial = AgentTruth(site=0, pid=os.getpid(), gpu_sms=100.0, cores=1)
    _periods(partial, [(0.075, 30.0, 40)] + [(0.03, 30.0, 0)] * 15)
    assert partial.summary()["deadline_misses_in_repaid_overruns"] == 0
    # nor work with no lease at all (a frozen tree runs up no debt), however little runs under the next lease
    unleased = AgentTruth(site=0, pid=os.getpid(), gpu_sms=100.0, cores=1)
    _periods(unleased, [(0.0, 0.0, 0), (0.03, 0.0, 30)] + [(0.0, 0.0, 0)] + [(0.01, 30.0, 0)] * 12)
    assert unleased.summary()["deadline_misses_in_repaid_overruns"] == 0
