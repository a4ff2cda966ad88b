"""agent.confine against the real kernel: the CFS quota holds a whole process tree (threads and children)
to its cores, the freezer stops it, the meter counts exited tasks, and the agent's cgroups go away with
it. Each bound is checked against a control without it, so the test can fail."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agent.confine import (
    ConfinementError,
    WorkerCgroup,
    detect,
    format_cpu_list,
    parse_cpu_list,
    period_for,
    sweep_stale,
)

try:
    HOST = detect()
except ConfinementError:
    HOST = None
needs_cgroup = pytest.mark.skipif(HOST is None, reason="no writable cgroup on this host")

# three busy threads and a busy child process: more than the quota by any count
BURNER = """
import os, threading, time
def spin():
    while True: pass
for _ in range(2): threading.Thread(target=spin, daemon=True).start()
if os.fork() == 0:
    spin()
spin()
"""


def test_period_for_keeps_the_quota_at_or_below_the_lease():
    bw = period_for(0.3)
    assert (bw.quota_us, bw.period_us) == (1500, 5000) and bw.cores == pytest.approx(0.3)
    small = period_for(0.03)          # the kernel's 1 ms floor lengthens the period, never raises the quota
    assert small.quota_us == 1000 and small.cores <= 0.03 + 1e-9 and small.period_us == 33334
    assert period_for(2.5).quota_us == 12500
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            period_for(bad)


def test_cpu_lists_round_trip_and_bad_ones_are_refused():
    assert parse_cpu_list("0-2,5") == {0, 1, 2, 5} and format_cpu_list({5, 0, 1}) == "0,1,5"
    assert parse_cpu_list("") == set()
    with pytest.raises(ValueError):
        parse_cpu_list("0-x")


def _start(cg: WorkerCgroup | None) -> subprocess.Popen:
    files = [str(f) for f in cg.procs_files()] if cg else []

    def enter():
        for f in files:
            with open(f, "w") as fh:
                fh.write(str(os.getpid()))
    return subprocess.Popen([sys.executable, "-c", BURNER], preexec_fn=enter if files else None,
                            start_new_session=True)


def _tree_cpu_s(pid: int) -> float:
    from testbed.groundtruth import ProcCpuSampler
    s = ProcCpuSampler(pid, rescan_s=0.0)
    s.sample()
    time.sleep(1.0)
    return s.sample() or 0.0


@needs_cgroup
def test_the_quota_holds_threads_and_children_and_the_freezer_stops_them():
    cg = WorkerCgroup(HOST, name="test-quota").create()
    free = _start(None)            # the control: the same tree with no bound
    bound = _start(cg)
    try:
        cg.set_cores(0.25)
        time.sleep(0.3)
        assert _tree_cpu_s(free.pid) > 0.8, "the control should take more than its quota"
        used = _tree_cpu_s(bound.pid)
        assert 0.15 < used < 0.25 + 0.02, used      # 0.25 core for 1 s, plus the kernel's tick
        assert len(cg.pids()) == 2                  # the forked child is in it too
        took = cg.freeze()
        assert took < 0.1
        before = cg.usage_ns()
        time.sleep(0.5)
        assert cg.usage_ns() - before == 0, "a frozen tree executed"
        cg.thaw()
        time.sleep(0.2)
        assert cg.usage_ns() > before
        nr, _ = cg.throttled()
        assert nr > 0
    finally:
        os.killpg(free.pid, signal.SIGKILL)
        cg.remove()
        bound.wait(5)
        free.wait(5)
    assert not cg.dirs["cpu"].parent.exists() and not cg.dirs["freezer"].parent.exists()


@needs_cgroup
def test_cpuset_and_memory_limit_apply_to_the_tree():
    cpus = sorted(os.sched_getaffinity(0))
    cg = WorkerCgroup(HOST, name="test-set").create(cpus={cpus[-1]}, memory_limit_bytes=256 << 20)
    try:
        files = [str(f) for f in cg.procs_files()]

        def enter():
            for f in files:
                with open(f, "w") as fh:
                    fh.write(str(os.getpid()))
        out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                             preexec_fn=enter, capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == str([cpus[-1]])
        hog = subprocess.run([sys.executable, "-c", "b = bytearray(600 << 20); b[::4096] = b'x' * len(b[::4096])"],
                             preexec_fn=enter, capture_output=True, timeout=60)
        assert hog.returncode == -signal.SIGKILL, "the memory limit did not stop a 600 MB allocation"
    finally:
        cg.remove()


@needs_cgroup
def test_a_killed_agents_subtree_is_swept_and_no_other_cgroup_is_touched(tmp_path):
    # a subtree of a pid that is gone (an agent killed with SIGKILL before it could clean up)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = WorkerCgroup(HOST, name="worker", owner_pid=dead.pid).create()
    foreign = HOST.dirs["cpu"] / "not-weaver-test"
    foreign.mkdir(exist_ok=True)
    live = WorkerCgroup(HOST, name="worker").create()     # ours, alive: must stay
    try:
        removed = sweep_stale(HOST)
        assert [p.name for p in removed] == [f"weaver-agent-{dead.pid}"]
        assert not any(d.parent.exists() for d in stale.dirs.values())
        assert foreign.exists() and live.dirs["cpu"].exists()
    finally:
        foreign.rmdir()
        live.remove()
        stale.remove()


@needs_cgroup
def test_a_frozen_orphan_of_a_killed_supervisor_is_killed_by_the_next_sweep():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cg = WorkerCgroup(HOST, name="worker", owner_pid=dead.pid).create()
    orphan = _start(cg)
    try:
        time.sleep(0.2)
        cg.freeze()
        assert sweep_stale(HOST) and orphan.wait(5) == -signal.SIGKILL
        assert not cg.dirs["cpu"].parent.exists() and not cg.dirs["freezer"].parent.exists()
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)
        cg.remove()


@needs_cgroup
def test_the_platform_meter_of_a_worker_cgroup_counts_every_member_as_the_kernel_does():
    """testbed.groundtruth.CgroupCpuSampler reads the cgroup's members (a forked child included) by their
    CPU clocks; over a run it agrees with the cgroup's own counter, its cross-check."""
    from testbed.groundtruth import CgroupCpuSampler
    cg = WorkerCgroup(HOST, name="test-meter").create()
    bound = _start(cg)
    try:
        cg.set_cores(0.3)
        s = CgroupCpuSampler(cg.meter_path(), bound.pid)
        s.sample()
        total = 0.0
        for _ in range(10):
            time.sleep(0.1)
            total += s.sample() or 0.0
        assert 0.2 < total < 0.4                                     # 0.3 core for ~1 s, both processes
        assert abs(s.clock_cpu_s - s.stat_cpu_s) < 0.02 * s.stat_cpu_s + 0.005
    finally:
        cg.remove()
        bound.wait(5)
