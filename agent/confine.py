"""Kernel confinement of the training worker's process tree to its lease (cgroups).

The supervisor (agent.supervisor) puts the worker into a cgroup of its own before the worker runs a line
of job code; every thread, DataLoader worker and child the job starts is born into it. The kernel then
holds the whole tree to the lease, whatever the job's code does:

- CPU: a CFS bandwidth quota equal to the lease's cores (`cpu.max` on cgroup v2; `cpu.cfs_quota_us` /
  `cpu.cfs_period_us` on v1). The CFS period is short (`period_for`): a metered window of length W can
  hold the quota of every CFS period it overlaps, W / P + 1 of them, so a 100 ms period would let one
  metered period see two periods' quota; at 5 ms it sees at most 21 / 20 of it. The kernel's 1 ms floor
  on a quota lengthens the period for small leases: the excess is then at most 1 ms of CPU per window.
- No lease: frozen (`freezer.state` FROZEN on v1, `cgroup.freeze` on v2). A frozen tree executes nothing;
  `freeze` returns once the kernel says the whole tree is frozen.
- A cpuset off the cores the RAN is configured to own, and a memory limit.
- What the tree executed: `cpuacct.usage` (v1) / `cpu.stat` usage_usec (v2), exited tasks included.

Ownership: the agent makes one subtree, `weaver-agent-<pid>`, beneath the cgroup it was started in (per
controller, so a memory limit the host set on us still applies), removes it when it exits, and touches no
cgroup it did not make. `sweep_stale` removes subtrees of agents that died without cleaning up (SIGKILL).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

CFS_PERIOD_S = 0.005       # the short CFS period (see the module doc)
MIN_QUOTA_US = 1000        # the kernel's floor on a CFS quota
MAX_PERIOD_US = 1_000_000  # and its ceiling on a CFS period
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "freezer", "memory")
PREFIX = "weaver-agent-"


class ConfinementError(RuntimeError):
    """This host offers no cgroup the agent can confine its worker with (the message says why)."""


@dataclass(frozen=True)
class CpuBandwidth:
    quota_us: int     # -1: unlimited
    period_us: int

    @property
    def cores(self) -> float:
        return math.inf if self.quota_us < 0 else self.quota_us / self.period_us


def period_for(cores: float, target_s: float = CFS_PERIOD_S) -> CpuBandwidth:
    """The CFS quota and period that hold a tree to `cores` (> 0) with the shortest period the kernel's
    1 ms quota floor allows: the period is lengthened, never the quota raised above the lease."""
    if not cores > 0 or math.isinf(cores):
        raise ValueError(f"cores must be positive and finite, got {cores}")
    period = max(1000, round(target_s * 1e6))
    if cores * period < MIN_QUOTA_US:
        period = min(MAX_PERIOD_US, math.ceil(MIN_QUOTA_US / cores))
    quota = max(MIN_QUOTA_US, math.floor(cores * period))
    return CpuBandwidth(quota, period)


def parse_cpu_list(text: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5} (the kernel's cpu list format)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"bad cpu list {text!r}")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def format_cpu_list(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


@dataclass(frozen=True)
class CgroupHost:
    """Where this process's cgroups are: v2 (one unified directory) or v1 (a directory per controller)."""
    version: int
    dirs: dict[str, Path]    # controller -> this process's cgroup directory for it (v2: every key the same)

    def base(self, controller: str) -> Path:
        return self.dirs[controller]


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(fstype, mount point, super options) of every cgroup mount, from /proc/self/mountinfo."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(rparts) >= 3 and rparts[0] in ("cgroup", "cgroup2"):
            out.append((rparts[0], parts[4], set(rparts[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """controller (or '' for v2) -> this process's path in that hierarchy, from /proc/self/cgroup."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in (ctrls.split(",") if ctrls else [""]):
            out[c] = path
    return out


def _writable(d: Path) -> bool:
    return d.is_dir() and os.access(d, os.W_OK)


def detect() -> CgroupHost:
    """The cgroups this process may confine a child with, or ConfinementError saying why not.
    v2 where its cpu and freeze interfaces are there and writable for us, else the v1 controllers.
    WEAVER_NO_CGROUP=1 says there is none (an operator's choice, and the tests' way to turn the bound off)."""
    if os.environ.get("WEAVER_NO_CGROUP", "") not in ("", "0"):
        raise ConfinementError("WEAVER_NO_CGROUP is set")
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as exc:
        raise ConfinementError(f"cannot read this process's cgroups: {exc}") from None
    why = []
    for fstype, mnt, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        d = Path(mnt) / own[""].lstrip("/")
        ctrls = (d / "cgroup.controllers").read_text().split() if (d / "cgroup.controllers").exists() else []
        if "cpu" in ctrls and _writable(d):
            return CgroupHost(2, {c: d for c in V1_CONTROLLERS})
        why.append(f"cgroup v2 at {d}: {'not writable' if 'cpu' in ctrls else 'no cpu controller delegated'}")
    dirs: dict[str, Path] = {}
    for fstype, mnt, opts in mounts:
        if fstype != "cgroup":
            continue
        for c in V1_CONTROLLERS:
            if c in opts and c in own and c not in dirs:
                dirs[c] = Path(mnt) / own[c].lstrip("/")
    missing = [c for c in V1_CONTROLLERS if c not in dirs or not _writable(dirs[c])]
    if not missing:
        return CgroupHost(1, dirs)
    why.append(f"cgroup v1: {', '.join(missing)} not mounted or not writable")
    raise ConfinementError("; ".join(why) or "no cgroup filesystem mounted")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rmtree_cgroup(d: Path) -> None:
    """Remove a cgroup directory and its children, deepest first (cgroupfs: rmdir only, no unlink)."""
    if not d.is_dir():
        return
    for child in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        d.rmdir()


def sweep_stale(host: CgroupHost) -> list[Path]:
    """Remove the subtrees of agents that are gone (killed before they could clean up). Only ours:
    directories named weaver-agent-<pid> whose pid is dead. A worker orphaned there (its supervisor was
    SIGKILLed while it was frozen, so it never saw its link close) is killed first: nothing holds a lease
    for it any more."""
    removed = []
    for d in set(host.dirs.values()):
        for sub in d.glob(PREFIX + "*"):
            m = re.fullmatch(PREFIX + r"(\d+)", sub.name)
            if not m or _pid_alive(int(m.group(1))):
                continue
            for leaf in (p for p in sub.iterdir() if p.is_dir()):
                cg = WorkerCgroup(host, name=leaf.name, owner_pid=int(m.group(1)))
                cg.remove()
            _rmtree_cgroup(sub)
            removed.append(sub)
    return removed


@dataclass
class WorkerCgroup:
    """The worker's cgroup (one directory per hierarchy), inside this agent's own subtree."""
    host: CgroupHost
    name: str = "worker"
    owner_pid: int = field(default_factory=os.getpid)
    dirs: dict[str, Path] = field(init=False)
    cpu: CpuBandwidth | None = field(init=False, default=None)
    frozen: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.dirs = {c: self.host.base(c) / f"{PREFIX}{self.owner_pid}" / self.name for c in V1_CONTROLLERS}

    # --- life cycle -------------------------------------------------------------------------------
    def create(self, *, cpus: set[int] | None = None, memory_limit_bytes: int = 0) -> WorkerCgroup:
        """Make the directories, start frozen-ready with the minimum quota, set cpuset and memory."""
        if self.host.version == 2:
            self._create_v2()
        else:
            for c, d in self.dirs.items():
                d.parent.mkdir(exist_ok=True)
                d.mkdir(exist_ok=True)
                if c == "cpuset":   # a v1 cpuset accepts tasks only once its cpus and mems are set
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        for level in (d.parent, d):
                            (level / f).write_text((level.parent / f).read_text().strip() or "0")
        if cpus is not None:
            self.set_cpus(cpus)
        if memory_limit_bytes:
            self.set_memory_limit(memory_limit_bytes)
        return self

    def _create_v2(self) -> None:
        d = self.dirs["cpu"]
        top = d.parent
        top.mkdir(exist_ok=True)
        # controllers reach our leaf only through the subtree's own subtree_control (ours holds no task)
        want = [c for c in ("cpu", "cpuset", "memory") if c in (top / "cgroup.controllers").read_text().split()]
        with contextlib.suppress(OSError):
            (top / "cgroup.subtree_control").write_text(" ".join("+" + c for c in want))
        d.mkdir(exist_ok=True)

    def remove(self) -> None:
        """Kill whatever is left in it, then remove this agent's whole subtree."""
        self.kill_all()
        with contextlib.suppress(OSError):
            self.thaw()   # a SIGKILL is delivered only once the task runs
        deadline = time.monotonic() + 2.0
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        for d in set(self.dirs.values()):
            _rmtree_cgroup(d.parent)

    def procs_files(self) -> list[Path]:
        """Where a task's pid is written to enter the cgroup in every hierarchy (the supervisor writes the
        worker's own pid there before it execs the worker: agent.supervisor)."""
        return [d / "cgroup.procs" for d in dict.fromkeys(self.dirs.values())]

    def add(self, pid: int) -> None:
        for f in self.procs_files():
            f.write_text(str(pid))

    def pids(self) -> list[int]:
        try:
            text = (self.dirs["cpu"] / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(x) for x in text.split()]

    def kill_all(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # --- the bound --------------------------------------------------------------------------------
    def set_cores(self, cores: float) -> CpuBandwidth:
        """Hold the tree to `cores` of CPU (> 0); math.inf lifts the quota."""
        bw = CpuBandwidth(-1, round(CFS_PERIOD_S * 1e6)) if math.isinf(cores) else period_for(cores)
        if bw != self.cpu:
            d = self.dirs["cpu"]
            if self.host.version == 2:
                (d / "cpu.max").write_text(f"{'max' if bw.quota_us < 0 else bw.quota_us} {bw.period_us}")
            else:
                # v1 takes quota and period in two writes: go through the kernel's minimum quota, so no
                # moment between them allows more than either the old or the new lease (lifting the quota
                # first let a supervisor descheduled between the writes leave the tree unbounded)
                if self.cpu is None or bw.period_us != self.cpu.period_us:
                    (d / "cpu.cfs_quota_us").write_text(str(MIN_QUOTA_US))
                    (d / "cpu.cfs_period_us").write_text(str(bw.period_us))
                (d / "cpu.cfs_quota_us").write_text(str(bw.quota_us))
            self.cpu = bw
        return bw

    def freeze(self, timeout_s: float = 1.0) -> float:
        """Freeze the tree; returns once the kernel reports it frozen (seconds it took). A tree that does
        not freeze in `timeout_s` is killed: it must not run on."""
        t0 = time.monotonic()
        if self.host.version == 2:
            d = self.dirs["freezer"]
            (d / "cgroup.freeze").write_text("1")
            done = lambda: "frozen 1" in (d / "cgroup.events").read_text()  # noqa: E731
        else:
            d = self.dirs["freezer"]
            (d / "freezer.state").write_text("FROZEN")
            done = lambda: (d / "freezer.state").read_text().strip() == "FROZEN"  # noqa: E731
        self.frozen = True
        while not done():
            if time.monotonic() - t0 > timeout_s:
                self.kill_all()
                break
            time.sleep(0.0002)
        return time.monotonic() - t0

    def thaw(self) -> None:
        d = self.dirs["freezer"]
        if self.host.version == 2:
            (d / "cgroup.freeze").write_text("0")
        else:
            (d / "freezer.state").write_text("THAWED")
        self.frozen = False

    def set_cpus(self, cpus: set[int]) -> None:
        if not cpus:
            raise ConfinementError("the worker's cpuset would be empty (every core is the RAN's)")
        (self.dirs["cpuset"] / "cpuset.cpus").write_text(format_cpu_list(cpus))   # the same file on v1 and v2

    def set_memory_limit(self, limit_bytes: int) -> None:
        d = self.dirs["memory"]
        if self.host.version == 2:
            (d / "memory.max").write_text(str(limit_bytes))
        else:
            (d / "memory.limit_in_bytes").write_text(str(limit_bytes))

    # --- the meter --------------------------------------------------------------------------------
    def usage_ns(self) -> int:
        """CPU time every task of the tree has executed since the cgroup was made, exited ones included."""
        if self.host.version == 2:
            for line in (self.dirs["cpu"] / "cpu.stat").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "usage_usec":
                    return int(v) * 1000
            return 0
        return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text())

    def meter_path(self) -> str:
        """The file `usage_ns` reads, for a platform meter outside this process (testbed.groundtruth)."""
        return str(self.dirs["cpu"] / "cpu.stat" if self.host.version == 2 else self.dirs["cpuacct"] / "cpuacct.usage")

    def throttled(self) -> tuple[int, int]:
        """(periods throttled, nanoseconds throttled) from cpu.stat."""
        stat = dict(line.split(" ", 1) for line in (self.dirs["cpu"] / "cpu.stat").read_text().splitlines() if " " in line)
        if self.host.version == 2:
            return int(stat.get("nr_throttled", 0)), int(stat.get("throttled_usec", 0)) * 1000
        return int(stat.get("nr_throttled", 0)), int(stat.get("throttled_time", 0))


def online_cpus() -> set[int]:
    return set(os.sched_getaffinity(0))
