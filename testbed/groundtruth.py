"""Ground truth of what each agent process executes, measured by the platform from /proc.

The architecture's rule: "used" and "training-caused miss" are measured by the platform, never taken
from the agent's own report. On a CPU site the agent stands in for the site GPU, so what it executes is
its process's CPU time, mapped to site SMs with the broker's CPU-agent scale:

    site SMs = (cpu seconds in the period / period seconds) * gpu_sms / cores

(`cores` is the agent's `--cores`; `weaver up` starts every agent with `--cores 1`).

What is read, and why (`ProcCpuSampler`):
- the process's CPU-time clock (`clock_gettime` on the clock id of `clock_getcpuclockid(pid)`,
  CPUCLOCK_SCHED): nanoseconds on CPU of every thread of the process, exited ones included - the
  scheduler's sum_exec_runtime, the figure `/proc/<pid>/task/<tid>/schedstat` shows per thread - in one
  system call per process and sample, with no file to list or open. Resolution is nanoseconds, which is
  what a 100 ms world period needs: utime + stime of `/proc/<pid>/stat` counts clock ticks (SC_CLK_TCK,
  100 Hz here), 10 ms each - a tenth of a period - sampled statistically at the tick.
- `/proc/<pid>/stat` utime + stime is read at every sample too and its cumulative total is reported
  beside the clock's total as an independent cross-check (`stat_cpu_s` vs `clock_cpu_s`); where the
  clock cannot be read (not Linux) the sampler falls back to the tick counts, and says so in `source`.
- descendants of the agent process (`/proc/<pid>/task/<tid>/children`, where the kernel has it) are
  measured the same way and added: work the agent hands to a child process is still the agent's. The
  process tree is walked again at most every `rescan_s` (1 s); a child found later is charged all of its
  CPU time so far, so only what a child executed after the last walk before it exited is lost.

What the number includes: everything the agent process executes - training steps inside leases, but
also its host work outside them (the Python loop, the gRPC stream and inspect threads, idle polling,
checkpoint writes). None of it is subtracted. The idle baseline (agent connected, no lease) is measured
and reported beside it (`IdleBaseline`), so that a reader can tell "executed beyond a lease" from
"the agent's own idle host work"; the RAN model is charged with all of it, as a real GPU would be.
"""
from __future__ import annotations

import math
import os
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None


# the most periods (the overrun one first) within which a kernel-repaid overrun must net out
# (AgentTruth.settle): 1 s of 100 ms periods, the longest debt a lease's quota takes back here
REPAY_WINDOW_PERIODS = 10

PF_EXITING = 0x4   # include/linux/sched.h: the task is in do_exit (its memory being torn down)


def stat_fields(pid: int) -> tuple[float, bool] | None:
    """(utime + stime in seconds, whether the process is exiting) of the whole process; None if gone."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    # the command name (field 2) is in parentheses and may contain spaces: split after the last ')'
    rest = text[text.rfind(")") + 2:].split()
    exiting = rest[0] in ("Z", "X", "x") or bool(int(rest[6]) & PF_EXITING)   # fields 3 (state), 9 (flags)
    return (int(rest[11]) + int(rest[12])) / CLK_TCK, exiting  # fields 14, 15 (utime, stime)


def stat_cpu_s(pid: int) -> float | None:
    """utime + stime of the whole process (all threads, exited ones included), in seconds; None if gone."""
    f = stat_fields(pid)
    return None if f is None else f[0]


def _cpu_clock_id(pid: int) -> int:
    """The kernel's CPU-time clock of a whole process (what glibc's clock_getcpuclockid returns):
    MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) = (~pid << 3) | 2."""
    return ((~pid) << 3) | 2


def process_cpu_ns(pid: int) -> int | None:
    """Nanoseconds on CPU of every thread of `pid`, exited threads included; None if the process is gone
    (or the clock cannot be read here). One system call, ~0.5 us."""
    try:
        return time.clock_gettime_ns(_cpu_clock_id(pid))
    except (OSError, AttributeError, OverflowError):
        return None


def children(pid: int) -> list[int]:
    """Direct children of every thread of `pid` (empty where the kernel has no `children` file)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return out
    for tid in tids:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        if text:
            out.extend(int(c) for c in text.split())
    return out


def cpu_clock_available() -> bool:
    return process_cpu_ns(os.getpid()) is not None


@dataclass
class ProcCpuSampler:
    """CPU seconds executed by one process (and its descendants) between successive `sample()` calls.

    `sample()` returns the CPU seconds since the previous call (0.0 on the first), or None once the
    process is gone. Cumulative totals by both sources stay readable (`clock_cpu_s`, `stat_cpu_s`)."""

    pid: int
    include_children: bool = True
    rescan_s: float = 1.0
    # the processes to read, when someone else keeps the list (a cgroup's `cgroup.procs`: CgroupCpuSampler);
    # read at every sample, in place of the tree below `pid`
    members: Callable[[], list[int]] | None = field(default=None, repr=False)
    source: str = field(default="", init=False)
    clock_cpu_s: float = field(default=0.0, init=False)
    stat_cpu_s: float = field(default=0.0, init=False)
    _last_ns: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _stat_last: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _pid_list: list[int] = field(default_factory=list, init=False, repr=False)
    _scanned: float = field(default=-math.inf, init=False, repr=False)
    _started: bool = field(default=False, init=False, repr=False)
    read_at: float = field(default=0.0, init=False)   # monotonic instant of the last sample's clock reads
    exiting: bool = field(default=False, init=False)  # a process read in the last sample was being torn down

    def __post_init__(self) -> None:
        self.source = ("process CPU clock (ns, every thread, exited ones included)" if cpu_clock_available()
                       else "stat utime+stime (clock ticks)")

    def _pids(self) -> list[int]:
        if self.members is not None:
            return self.members()
        now = time.monotonic()
        if not self.include_children:
            return [self.pid]
        if now - self._scanned >= self.rescan_s:
            self._scanned = now
            pids, todo = [], [self.pid]
            while todo:
                p = todo.pop()
                pids.append(p)
                todo.extend(children(p))
            self._pid_list = pids
        return self._pid_list

    def sample(self) -> float | None:
        if not os.path.exists(f"/proc/{self.pid}"):
            return None
        use_ns = self.source.startswith("process CPU clock")
        delta_ns = 0
        delta_stat = 0.0
        seen: dict[int, int] = {}
        pids = self._pids()
        self.exiting = False
        for p in pids:
            f = stat_fields(p)
            s = None if f is None else f[0]
            # the tree's root only: a job's own short-lived children (loader workers) exit all the time, and
            # their CPU is the job's like any other
            self.exiting = self.exiting or (p == self.pid and f is not None and f[1])
            if s is not None:
                prev = self._stat_last.get(p)
                if prev is not None:
                    delta_stat += max(s - prev, 0.0)
                elif self._started:  # a new child: all its time so far is new
                    delta_stat += s
                self._stat_last[p] = s
        # the clocks last, together, and the instant beside them: a file read releases the GIL (another
        # thread of the world may run for a switch interval), a clock read does not, so `read_at` is when the
        # figure was true, and a period's length is measured between two of them, not by the caller's clock
        if use_ns:
            for p in pids:
                ns = process_cpu_ns(p)
                if ns is None:
                    continue
                seen[p] = ns
                prev_ns = self._last_ns.get(p)
                if prev_ns is not None:
                    delta_ns += max(ns - prev_ns, 0)
                elif self._started:  # a child found since the last sample: count all of it
                    delta_ns += ns
            self._last_ns = seen
        self.read_at = time.monotonic()
        if not self._started:
            self._started = True
            return 0.0
        self.stat_cpu_s += delta_stat
        self.clock_cpu_s += delta_ns / 1e9
        return delta_ns / 1e9 if use_ns else delta_stat


@dataclass
class CgroupCpuSampler:
    """What a confined worker's cgroup executed between `sample()` calls. Membership is the kernel's
    (`cgroup.procs` beside the meter: every process of the tree, however it was started); each member is
    read by its process CPU clock (ProcCpuSampler), which includes the running slice of a task on CPU (the
    kernel brings it up to date on the read). The cgroup's own counter (`cpuacct.usage` / cpu.stat
    `usage_usec`) advances only when the scheduler accounts (a tick, a switch), so a read once a period can
    lag a running worker by up to a tick per CPU. That counter, exited tasks included, is the cumulative
    cross-check (`stat_cpu_s`); `clock_cpu_s` is the precise sum (a process that exits between two samples
    loses its last interval)."""

    meter_path: str
    pid: int                       # the worker (kept for the record; membership comes from the cgroup)
    source: str = field(default="", init=False)
    stat_cpu_s: float = field(default=0.0, init=False)
    _members: ProcCpuSampler = field(init=False, repr=False)
    _meter_ns: int | None = field(default=None, init=False, repr=False)
    last_meter_s: float = field(default=0.0, init=False)   # the meter's own figure for the last sample

    def __post_init__(self) -> None:
        self.source = (f"worker cgroup: its processes (cgroup.procs) by their CPU clocks (ns, running slices "
                       f"included); {Path(self.meter_path).name} as the cross-check")
        procs = Path(self.meter_path).parent / "cgroup.procs"
        self._members = ProcCpuSampler(self.pid, members=lambda: [int(x) for x in procs.read_text().split()])

    @property
    def clock_cpu_s(self) -> float:
        return self._members.clock_cpu_s

    @property
    def read_at(self) -> float:
        return self._members.read_at

    @property
    def exiting(self) -> bool:
        return self._members.exiting

    def sample(self) -> float | None:
        meter = read_usage_ns(self.meter_path)
        if meter is None:
            return None
        try:
            cpu = self._members.sample()
        except OSError:        # the cgroup went between the two reads
            return None
        if self._meter_ns is not None:
            self.last_meter_s = max(meter - self._meter_ns, 0) / 1e9
            self.stat_cpu_s += self.last_meter_s
        self._meter_ns = meter
        return cpu


def read_usage_ns(meter_path: str) -> int | None:
    """A cgroup's CPU time from its meter file (None once the cgroup is gone): the platform's reading of the
    worker cgroup agent.confine makes (the testbed imports nothing of the agent)."""
    try:
        text = Path(meter_path).read_text()
    except OSError:
        return None
    if meter_path.endswith("cpu.stat"):
        for line in text.splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) * 1000
        return None
    return int(text.strip() or 0)


def site_sms(cpu_s: float, period_s: float, gpu_sms: float, cores: int) -> float:
    """The broker's CPU-agent scale: a duty cycle over `cores` cores is that share of the site GPU."""
    if period_s <= 0 or cores <= 0:
        raise ValueError("period_s and cores must be positive")
    return cpu_s / period_s * gpu_sms / cores


@dataclass
class IdleBaseline:
    """The agent's executed SMs while it holds no lease (connected, idle): its host work. Periods count
    only once the agent has reported no lease for `settle` periods in a row, so a lease's tail is not
    mistaken for idling."""

    settle: int = 3
    samples: list = field(default_factory=list)
    _quiet: int = 0

    def observe(self, executed_sms: float, lease_sms: float, connected: bool) -> None:
        if lease_sms > 0 or not connected:
            self._quiet = 0
            return
        self._quiet += 1
        if self._quiet > self.settle:
            self.samples.append(executed_sms)

    def median(self) -> float:
        if not self.samples:
            return math.nan
        s = sorted(self.samples)
        return s[len(s) // 2]

    def p90(self) -> float:
        if not self.samples:
            return math.nan
        s = sorted(self.samples)
        return s[min(len(s) - 1, int(0.9 * len(s)))]


@dataclass
class AgentTruth:
    """Per agent: the sampler, the per-period executed SMs, the lease it reported, and what lies beyond."""

    site: int
    pid: int
    gpu_sms: float
    cores: float = 1.0
    sampler: ProcCpuSampler = field(init=False)
    idle: IdleBaseline = field(default_factory=IdleBaseline)
    executed_sm_s: float = 0.0
    cpu_s: float = 0.0
    beyond_lease_sm_ms_total: float = 0.0
    beyond_lease_sm_ms_max: float = 0.0
    beyond_lease_sms_max: float = 0.0
    periods_beyond_lease: int = 0
    last_sms: float = 0.0
    gone: bool = False
    prev_lease_sms: float = 0.0
    startup_cpu_s: float = 0.0   # before the world's first period (model build, warm-up): charged to no slot
    # A confined agent (agent.supervisor): `pid` is its supervisor, measured apart (its host CPU: the lease
    # stream, inspection, metrics; it never touches the GPU); the stand-in GPU is the worker cgroup's meter.
    meter_path: str = ""
    worker_pid: int = 0
    supervisor: ProcCpuSampler | None = field(init=False, default=None)
    supervisor_cpu_s: float = 0.0
    # the periods around the worst one beyond the lease (2 before, it, 2 after), each with the lease the agent
    # said it held and what it said about it: a rare overrun is diagnosed from the run's own summary
    exit_teardown_sm_ms: float = 0.0   # beyond the lease while the worker was being torn down (see period)
    recent: deque = field(default_factory=lambda: deque(maxlen=3))
    worst_periods: list = field(default_factory=list)
    _worst_after: int = 0
    # Overruns the kernel repaid (see `settle`): the RAN misses in them, counted apart from the others
    repaid_overrun_periods: int = 0
    misses_in_repaid_overruns: int = 0
    _last_sm_s: tuple = (0.0, 0.0)
    _window: deque = field(default_factory=lambda: deque(maxlen=REPAY_WINDOW_PERIODS))

    def __post_init__(self) -> None:
        if self.meter_path:
            self.sampler = CgroupCpuSampler(self.meter_path, self.worker_pid)
            self.supervisor = ProcCpuSampler(self.pid, include_children=False)
            self.supervisor.sample()
        else:
            self.sampler = ProcCpuSampler(self.pid)
        self.sampler.sample()

    def period(self, period_s: float, lease_sms: float, connected: bool, cpu: float | None | bool = False,
               said: dict | None = None) -> float:
        """Sample one world period of `period_s` wall seconds (the time since the last sample); returns
        the site SMs the RAN is charged over it: what was executed (unclamped: a multi-threaded agent may
        exceed the site GPU), except a dying worker's teardown beyond the lease (`exit_teardown_sm_ms`).

        `lease_sms`: the lease the agent reports holding now, at the period's end. The lease it may have
        held during the period is the larger of that and the one it reported at the period's start (a lease
        that arrived, or ended, within the period), and "beyond the lease" is measured against that.
        `cpu`: a sample the caller already took for this period (default: sample now); `said`: what the agent
        reported with the lease (its id, validity), kept with the periods around the worst one."""
        if cpu is False:
            cpu = self.sampler.sample()
        if cpu is None:
            self.gone = True
            cpu = 0.0
        if self.supervisor is not None:
            self.supervisor_cpu_s += self.supervisor.sample() or 0.0
        sms = site_sms(cpu, period_s, self.gpu_sms, self.cores)
        self.cpu_s += cpu
        self.executed_sm_s += sms * period_s
        held = max(lease_sms, self.prev_lease_sms)
        self.prev_lease_sms = lease_sms
        if self.sampler.exiting and sms > held:
            # the worker was killed (or ends) during this period: the kernel tearing its memory down runs on its
            # CPU (47 ms for a 600 MB torch process, measured), work a GPU site's SMs never see (a dead context
            # launches nothing). What ran beyond the lease then is kept apart, and the RAN is charged the lease
            self.exit_teardown_sm_ms += (sms - held) * period_s * 1000.0
            sms = held
        beyond = max(sms - held, 0.0)
        if beyond > 0:
            self.periods_beyond_lease += 1
        self.beyond_lease_sm_ms_total += beyond * period_s * 1000.0
        self.beyond_lease_sm_ms_max = max(self.beyond_lease_sm_ms_max, beyond * period_s * 1000.0)
        row = {"t_unix": round(time.time(), 3), "dt_s": round(period_s, 4), "executed_sms": round(sms, 2),
               "reported_lease_sms": lease_sms, "held_sms": held, "beyond_sms": round(beyond, 2),
               "connected": connected, **(said or {})}
        if hasattr(self.sampler, "last_meter_s"):   # the kernel's counter beside it (lags by up to a tick per CPU)
            row["meter_sms"] = round(site_sms(self.sampler.last_meter_s, period_s, self.gpu_sms, self.cores), 2)
        if self._worst_after:
            self.worst_periods.append(row)
            self._worst_after -= 1
        if beyond > self.beyond_lease_sms_max:
            self.worst_periods, self._worst_after = [*self.recent, row], 2
        self.recent.append(row)
        self.beyond_lease_sms_max = max(self.beyond_lease_sms_max, beyond)
        self.idle.observe(sms, held, connected)
        self.last_sms = sms
        self._last_sm_s = (sms * period_s, held * period_s)
        return sms

    def settle(self, misses: int) -> None:
        """The RAN misses the model charged to this agent's last `period` (its executed SMs). An overrun
        period whose excess the kernel took back within the next second (from it up to some later period,
        executed SM·s at most leased SM·s) is a repaid overrun: CFS bandwidth throttles a task only on its
        way back to user mode (Linux 6.18's task-based throttling), so a long stretch in the kernel runs
        past the quota and the cgroup then sits throttled until the debt is paid. The misses stay in the RAN's tally; they are
        also counted here apart, because a GPU partition has no such debt (an agent running outside its
        leases never repays: its misses are never counted here)."""
        self._window.append((*self._last_sm_s, misses))
        if len(self._window) < REPAY_WINDOW_PERIODS:
            return
        first_exec, first_held, first_misses = self._window[0]
        # with no lease the tree is frozen and runs up no debt: what it executed then is never a repaid overrun
        if first_exec <= first_held or first_misses == 0 or first_held <= 0:
            return
        executed = held = 0.0
        for e, h, _ in self._window:    # netted out by some later period of the window
            executed, held = executed + e, held + h
            if executed <= held:
                self.repaid_overrun_periods += 1
                self.misses_in_repaid_overruns += first_misses
                return

    def summary(self) -> dict:
        return {
            "source": self.sampler.source,
            "gpu_sms": self.gpu_sms,
            "cores": self.cores,
            "cpu_s": self.cpu_s,
            "startup_cpu_s": self.startup_cpu_s,
            "clock_cpu_s": self.sampler.clock_cpu_s,
            "stat_cpu_s": self.sampler.stat_cpu_s,
            "worker_meter": self.meter_path,
            "supervisor_cpu_s": self.supervisor_cpu_s if self.supervisor is not None else None,
            "sm_seconds_executed": self.executed_sm_s,
            "idle_baseline_sms_median": self.idle.median(),
            "idle_baseline_sms_p90": self.idle.p90(),
            "idle_baseline_periods": len(self.idle.samples),
            # per period: measured SMs minus the SMs of the lease the agent reported holding (at the period's
            # start or end, the larger), when positive; this includes the agent's idle host work (see
            # idle_baseline_*): nothing is subtracted
            "sm_ms_beyond_lease_total": self.beyond_lease_sm_ms_total,
            "sm_ms_beyond_lease_max": self.beyond_lease_sm_ms_max,
            "sms_beyond_lease_max": self.beyond_lease_sms_max,
            "periods_beyond_lease": self.periods_beyond_lease,
            "worst_periods": self.worst_periods,
            "exit_teardown_sm_ms_beyond_lease": self.exit_teardown_sm_ms,
            "repaid_overrun_periods": self.repaid_overrun_periods,
            "deadline_misses_in_repaid_overruns": self.misses_in_repaid_overruns,
        }


class CpuTrace(threading.Thread):
    """Each process's CPU clock every `interval_s` (2 ms), beside the wall time it was read at: the
    platform's fine record of when an agent works and when it stops (`weaver bench safety`'s revoke /
    expiry -> idle), far below the world's 100 ms period.

    One `clock_gettime` per process and tick (~0.5 us) in a daemon thread of its own: no file is opened.
    Its cost is measured, not guessed (`overhead()`: the thread's own CPU time per wall second), and so is
    the resolution it really got (the gaps between samples: the thread waits for the GIL while the world's
    loop holds it, up to the interpreter's 5 ms switch interval). Descendants of a process are not traced
    (`ProcCpuSampler` adds them per period). Bounded: at most `max_samples` per process, then it stops
    recording and says so (`truncated`)."""

    def __init__(self, pids: dict, interval_s: float = 0.002, max_samples: int = 600_000) -> None:
        super().__init__(daemon=True, name="cpu-trace")
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.pids = dict(pids)                      # key (e.g. site) -> pid, or a worker cgroup's meter path
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.t = {k: array("d") for k in self.pids}   # unix seconds
        self.ns = {k: array("q") for k in self.pids}  # the process's CPU clock, ns (-1: gone)
        self.truncated = False
        self._halt = threading.Event()
        self._t0 = self._t1 = 0.0
        self._cpu_s = 0.0

    def run(self) -> None:
        clock = time.pthread_getcpuclockid(threading.get_ident())
        self._t0 = time.time()
        # a key whose value is a path is a worker cgroup's meter (the kernel's accounting of its whole tree)
        items = [(self.t[k], self.ns[k], src if isinstance(src, str) else _cpu_clock_id(src))
                 for k, src in self.pids.items()]
        nxt = time.monotonic()
        while not self._halt.is_set():
            for ts, ns, clk in items:
                if isinstance(clk, str):
                    u = read_usage_ns(clk)
                    v = -1 if u is None else u
                else:
                    try:
                        v = time.clock_gettime_ns(clk)
                    except OSError:
                        v = -1
                ts.append(time.time())
                ns.append(v)
            if len(items[0][0]) >= self.max_samples if items else True:
                self.truncated = bool(items)
                break
            nxt += self.interval_s
            wait = nxt - time.monotonic()
            if wait < 0:        # fell behind (GIL, scheduler): sample at once, keep the pace from now
                nxt, wait = time.monotonic(), 0.0
            self._halt.wait(wait)
        self._t1 = time.time()
        self._cpu_s = time.clock_gettime(clock)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(2.0)

    def series(self, key) -> tuple[np.ndarray, np.ndarray]:
        """(unix seconds, cumulative CPU seconds) of one process, the samples after it was gone dropped."""
        t = np.frombuffer(self.t[key], dtype=float).copy()
        ns = np.frombuffer(self.ns[key], dtype=np.int64).copy()
        ok = ns >= 0
        return t[ok], ns[ok] / 1e9

    def recent(self, key, span_s: float) -> tuple[list[float], list[float]]:
        """While tracing: (unix seconds, cumulative CPU seconds) of one process over about its last
        `span_s`, read by index (no buffer export: the tracing thread keeps appending)."""
        ts, ns = self.t[key], self.ns[key]
        n = min(len(ts), len(ns))   # a sample's time is appended before its CPU clock
        if n == 0:
            return [], []
        k = n - 1
        while k > 0 and ts[k - 1] >= ts[n - 1] - span_s:
            k -= 1
        pts = [(ts[i], ns[i] / 1e9) for i in range(k, n) if ns[i] >= 0]
        return [a for a, _ in pts], [b for _, b in pts]

    def overhead(self) -> dict:
        """What tracing cost and the resolution it got (self-describing keys)."""
        wall = max(self._t1 - self._t0, 1e-9)
        gaps = [np.diff(np.frombuffer(a, dtype=float)) for a in self.t.values() if len(a) > 1]
        g = np.concatenate(gaps) * 1000.0 if gaps else np.array([math.nan])
        n = sum(len(a) for a in self.t.values())
        return {"interval_ms": self.interval_s * 1000.0, "processes": len(self.pids), "samples": n,
                "wall_s": wall if self._t1 else 0.0, "thread_cpu_s": self._cpu_s,
                "thread_cpu_fraction_of_one_core": self._cpu_s / wall if self._t1 else math.nan,
                "cpu_us_per_sample": self._cpu_s / n * 1e6 if n else math.nan,
                "sample_gap_ms_p50": float(np.percentile(g, 50)), "sample_gap_ms_p99": float(np.percentile(g, 99)),
                "sample_gap_ms_max": float(np.max(g)), "truncated": self.truncated}


def window_rates(t: np.ndarray, cpu_s: np.ndarray, window_s: float) -> np.ndarray:
    """Per sample i of a `CpuTrace` series: the CPU rate (cores) over the window from it to the first
    sample at least `window_s` later; inf where the trace ends before that."""
    n = len(t)
    j = np.searchsorted(t, t + window_s, side="left")
    ok = j < n
    jj = np.minimum(j, n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (cpu_s[jj] - cpu_s) / (t[jj] - t)
    return np.where(ok, r, np.inf)


def idle_from(t: np.ndarray, cpu_s: np.ndarray, after: float, threshold_cores: float, window_s: float = 0.01,
              hold_s: float = 0.1, until: float = math.inf, rates: np.ndarray | None = None,
              hold_threshold_cores: float | None = None) -> float | None:
    """The first instant at or after `after` from which the process is idle, from a `CpuTrace` series:
    the start of the first sample window of `window_s` whose CPU rate is at most `threshold_cores` (back
    at its idle baseline), no window starting in the next `hold_s` being above `hold_threshold_cores`
    (default: the same; work resumed after a gap, e.g. a duty cycle's off time inside a period, is not
    idle, where a short burst of host work need not be), that span cut at `until` (a new lease: from then
    on it may work again). The search starts at the last sample at or before `after`, so a process
    already idle then is idle at `after` itself. None if it never is (before `until` and the trace's end).
    `rates`: `window_rates(t, cpu_s, window_s)`, when the caller has it already."""
    n = len(t)
    if n < 2:
        return None
    r = window_rates(t, cpu_s, window_s) if rates is None else rates
    hold_thr = threshold_cores if hold_threshold_cores is None else hold_threshold_cores
    loud = np.concatenate(([0], np.cumsum(r > hold_thr)))   # windows above hold_thr among the first k samples
    i = max(int(np.searchsorted(t, after, side="right")) - 1, 0)
    while i < n and t[i] <= until:
        if r[i] <= threshold_cores:
            last = max(int(np.searchsorted(t, min(t[i] + hold_s, until) - window_s, side="right")) - 1, i)
            if loud[last + 1] - loud[i] == 0:
                return max(float(t[i]), after)
        i += 1
    return None


def rate_before(t: np.ndarray, cpu_s: np.ndarray, at: float, span_s: float = 0.003,
                max_gap_s: float = 0.006) -> float | None:
    """The CPU rate (cores) of a `CpuTrace` series over its last `span_s` or more before `at`: from the
    last sample at or before (the last sample at or before `at`) - `span_s` to that sample. None where
    the trace does not reach that close to `at` (its last sample before it is over `max_gap_s` old)."""
    j = int(np.searchsorted(t, at, side="right")) - 1
    if j < 1 or at - t[j] > max_gap_s:
        return None
    i = int(np.searchsorted(t, t[j] - span_s, side="right")) - 1
    if i < 0 or i == j:
        return None
    return float((cpu_s[j] - cpu_s[i]) / (t[j] - t[i]))


def work_stopped_at(t: np.ndarray, cpu_s: np.ndarray, after: float, until: float = math.inf,
                    working_cores: float = 0.5, window_s: float = 0.01, hold_s: float = 0.1,
                    rates: np.ndarray | None = None) -> float | None:
    """For a process that is working at `after` (e.g. when its lease is revoked mid-work): the instant
    its work stopped, from a `CpuTrace` series. The first sample interval [t_k, t_k+1] at or after
    `after` that runs at most `working_cores`, and from whose start no `window_s` window in the next
    `hold_s` (cut at `until`, a new lease) runs above `working_cores` (work that resumes is not a stop);
    the instant is t_k + the CPU time spent in that interval (its tail of work, run at one core from
    the interval's start), so that a stop inside an interval is placed inside it, not at either end.
    Resolution: the trace's sample gap at most (one core's worth is an upper bound on how fast a
    single-threaded tail runs). None if it never stops before `until` or the trace's end."""
    n = len(t)
    if n < 2:
        return None
    r = window_rates(t, cpu_s, window_s) if rates is None else rates
    loud = np.concatenate(([0], np.cumsum(r > working_cores)))
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.diff(cpu_s) / np.diff(t)
    k = max(int(np.searchsorted(t, after, side="right")) - 1, 0)
    while k < n - 1 and t[k] <= until:
        if step[k] <= working_cores:
            last = max(int(np.searchsorted(t, min(t[k] + hold_s, until) - window_s, side="right")) - 1, k)
            if loud[last + 1] - loud[k] == 0:
                tail = min(float(cpu_s[k + 1] - cpu_s[k]), float(t[k + 1] - t[k]))
                return max(float(t[k]) + tail, after)
        k += 1
    return None


def lease_epoch_overlaps(leases: list[dict]) -> list[dict]:
    """Leases of a site issued while a lease of another epoch (another xApp instance or replica) could still
    be acted on: issued before that lease's hard end, whatever the ledger says became of it (a revoke is
    sent, not acknowledged: architecture.md, the RAN-first invariant). Each is one hand-over that did not
    wait out the earlier owner's leases; [] is the rule kept. `leases`: the SDL ledger's records (dicts with
    site_id, epoch, lease_id, issued_unix, valid_until_unix)."""
    out = []
    by_site: dict[str, list[dict]] = {}
    for rec in leases:
        by_site.setdefault(rec["site_id"], []).append(rec)
    for site, recs in sorted(by_site.items()):
        recs.sort(key=lambda r: (r["issued_unix"], r["epoch"]))
        ends: dict[int, tuple[float, str]] = {}   # epoch -> the latest hard end issued so far, and its lease
        for r in recs:
            for epoch, (end, lease_id) in ends.items():
                if epoch != r["epoch"] and r["issued_unix"] < end:
                    out.append({"site_id": site, "lease_id": r["lease_id"], "epoch": r["epoch"],
                                "issued_unix": r["issued_unix"], "other_lease_id": lease_id, "other_epoch": epoch,
                                "other_hard_end_unix": end, "overlap_ms": round((end - r["issued_unix"]) * 1000, 3)})
            cur = ends.get(r["epoch"])
            if cur is None or r["valid_until_unix"] > cur[0]:
                ends[r["epoch"]] = (r["valid_until_unix"], r["lease_id"])
    return out
