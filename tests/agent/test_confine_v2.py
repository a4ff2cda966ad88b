"""agent.confine's cgroup v2 path against a real cgroup2 hierarchy of this kernel.

Hosts here (and CI) are hybrid: the controllers are bound to v1, and the unified hierarchy
(/sys/fs/cgroup/unified) has none. What v2 offers without controllers is still real and is what the
agent's v2 path relies on for the freezer, membership, the kill and the meter: `cgroup.freeze` /
`cgroup.events`, `cgroup.procs`, `cpu.stat` usage_usec (present whether or not the cpu controller is
enabled). So these tests drive a WorkerCgroup on that hierarchy; the bound itself (`cpu.max`, cpuset,
`memory.max`) is tested here only where the hierarchy delegates those controllers, and otherwise through
v1 in test_confine.py. detect() refuses such a hierarchy (no cpu controller) and says why: tested too.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import confine
from agent.confine import V1_CONTROLLERS, CgroupHost, WorkerCgroup, sweep_stale
from testbed.groundtruth import CgroupCpuSampler

BURNER = """
import os, threading
def spin():
    while True: pass
threading.Thread(target=spin, daemon=True).start()
if os.fork() == 0:
    spin()
spin()
"""


def _unified() -> Path | None:
    """This process's directory in a writable cgroup2 hierarchy, or None."""
    try:
        own = confine._own_paths()
        mounts = confine._mounts()
    except OSError:
        return None
    for fstype, mnt, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            d = Path(mnt) / own[""].lstrip("/")
            if (d / "cgroup.procs").exists() and os.access(d, os.W_OK):
                return d
    return None


UNIFIED = _unified()
pytestmark = pytest.mark.skipif(UNIFIED is None, reason="no writable cgroup2 hierarchy on this host")


def _controllers() -> set[str]:
    return set((UNIFIED / "cgroup.controllers").read_text().split())


@pytest.fixture
def host() -> CgroupHost:
    return CgroupHost(2, {c: UNIFIED for c in V1_CONTROLLERS})


def _start(cg: WorkerCgroup) -> subprocess.Popen:
    files = [str(f) for f in cg.procs_files()]

    def enter():
        for f in files:
            with open(f, "w") as fh:
                fh.write(str(os.getpid()))
    return subprocess.Popen([sys.executable, "-c", BURNER], preexec_fn=enter, start_new_session=True)


def test_a_v2_hierarchy_without_a_cpu_controller_is_refused_with_the_reason(monkeypatch):
    if "cpu" in _controllers():
        pytest.skip("this hierarchy delegates the cpu controller")
    # only the cgroup2 mount: detect() must not take it, and must say why
    mounts = [m for m in confine._mounts() if m[0] == "cgroup2"]
    monkeypatch.setattr(confine, "_mounts", lambda: mounts)
    with pytest.raises(confine.ConfinementError, match="no cpu controller delegated"):
        confine.detect()


def test_v2_membership_freeze_meter_and_removal_on_the_real_kernel(host):
    cg = WorkerCgroup(host, name="test-v2").create()
    tree = _start(cg)
    try:
        deadline = time.monotonic() + 5
        while len(cg.pids()) < 2 and time.monotonic() < deadline:   # the forked child is born into it
            time.sleep(0.01)
        assert tree.pid in cg.pids() and len(cg.pids()) == 2
        assert cg.meter_path().endswith("cpu.stat")
        time.sleep(0.3)
        assert cg.usage_ns() > 0, "cpu.stat usage_usec did not count the tree"

        took = cg.freeze()
        assert took < 0.5 and "frozen 1" in (cg.dirs["freezer"] / "cgroup.events").read_text()
        before = cg.usage_ns()
        time.sleep(0.5)
        assert cg.usage_ns() - before == 0, "a frozen v2 tree executed"
        cg.thaw()
        time.sleep(0.3)
        assert cg.usage_ns() - before > 100_000_000, "a thawed tree did not run"   # > 0.1 s in 0.3 s

        # the platform meter reads the v2 counter as the kernel keeps it
        s = CgroupCpuSampler(cg.meter_path(), tree.pid)
        s.sample()
        total = 0.0
        for _ in range(5):
            time.sleep(0.1)
            total += s.sample() or 0.0
        assert total > 0.2                                             # busy on (up to) 2 cores, 0.5 s
        assert abs(s.clock_cpu_s - s.stat_cpu_s) < 0.05 * s.stat_cpu_s + 0.01
        cg.freeze()                                                    # removal kills a frozen tree too
    finally:
        cg.remove()
        if tree.poll() is None:
            os.killpg(tree.pid, signal.SIGKILL)
        tree.wait(5)
    assert tree.returncode == -signal.SIGKILL
    assert not cg.dirs["cpu"].parent.exists(), "the agent's v2 subtree was left behind"


def test_a_dead_agents_v2_subtree_is_swept_and_a_foreign_cgroup_stays(host):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = WorkerCgroup(host, name="worker", owner_pid=dead.pid).create()
    orphan = _start(stale)
    foreign = UNIFIED / "not-weaver-test-v2"
    foreign.mkdir(exist_ok=True)
    try:
        time.sleep(0.2)
        stale.freeze()
        removed = sweep_stale(host)
        assert UNIFIED / f"weaver-agent-{dead.pid}" in removed
        assert orphan.wait(5) == -signal.SIGKILL
        assert foreign.exists() and not stale.dirs["cpu"].parent.exists()
    finally:
        foreign.rmdir()
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)
        stale.remove()


def test_v2_cpu_max_holds_the_tree_where_the_cpu_controller_is_delegated(host):
    if "cpu" not in _controllers():
        pytest.skip("this cgroup2 hierarchy has no cpu controller (hybrid host: cpu.max is tested on v2 hosts only)")
    cg = WorkerCgroup(host, name="test-v2-quota").create()
    tree = _start(cg)
    try:
        cg.set_cores(0.25)
        assert (cg.dirs["cpu"] / "cpu.max").read_text().split() == ["1250", "5000"]
        time.sleep(0.3)
        before = cg.usage_ns()
        time.sleep(1.0)
        used = (cg.usage_ns() - before) / 1e9
        assert 0.15 < used < 0.25 + 0.02, used
        assert cg.throttled()[0] > 0
    finally:
        cg.remove()
        tree.wait(5)
