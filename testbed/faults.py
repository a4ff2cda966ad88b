"""A fault schedule for `weaver sim` and `weaver up`, injected into the real processes and the real wire.

    --fault KIND[:param=value,...]    (repeatable)      --fault-at SECONDS (default start of every fault
                                                          that names no `at=`)

| kind | what happens | params (default) |
|---|---|---|
| ack-delay | every RIC control ACK the node sends goes out `ms` later | site (all), ms (300), for (5) |
| ack-loss | every RIC control ACK the node sends is dropped | site (all), for (5) |
| ack-dup | every RIC control ACK is sent twice | site (all), for (5) |
| ack-reorder | one ACK is held and sent right after the next one | site (all), for (5) |
| node-restart | the node loses its RC state (no envelope, default quotas: the DU runs unshaped), goes off the air for `down` s and redoes E2 setup | site (0), down (0.5) |
| node-lost | the node goes off the air (RC state kept: a lost transport) and comes back after `down` s with a new E2 setup | site (0), down (5) |
| slow-reader | broker -> agent bytes trickle at `rate` bytes/s (0: stall) in the agent's TCP proxy | site (0), for (5), rate (256) |
| partition | both directions of the agent's TCP proxy stall (the connection stays open) | site (0), for (5) |
| xapp-stall | SIGSTOP of the xApp process for `ms`, then SIGCONT | ms (2000) |
| xapp-kill | SIGKILL of the xApp, restarted `down` s later with the same config (and SDL) | down (0) |
| replica-kill | `weaver up --xapp-replicas N`: SIGKILL of the replica that controls the most sites, not restarted; the others take its shards once its claims end (`xapp.shards`) | - |
| revoke-mid-period | repeatedly, while the site's agent is busy inside its lease (its 2 ms CPU trace), its node's last KPM report is timed so that the xApp's stale-KPM revoke (last KPM + `stale` ms) lands `~0.4` into the agent's busy stretch of a period, then KPM stays off for `down` s and resumes (the xApp re-grants); needs the CPU trace (`weaver bench safety`) | site (0), for (10), down (0.4), stale (200: the xApp's stale_periods x period) |
| green-context-fail | agents start with WEAVER_FAULT_GREEN_CONTEXT_FAIL=1 (their green context fails to create); on a CPU agent there is none, and the timeline says "not applicable on CPU" | - |

The ACK faults act in the E2 node's control reply path (`testbed.e2node.shell.AckShaper`), the proxy
faults in `testbed.tcpproxy`, the process faults through `testbed.procs.Supervisor`. Every fault logs
its start and end and keeps a timeline entry (`FaultInjector.timeline`, in `--json` summaries).
`weaver sim` runs the node-side faults only (ack-*, node-restart, node-lost).
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import time
from dataclasses import asdict, dataclass, field, fields

log = logging.getLogger("weaver.faults")

DEFAULT_AT_S = 5.0
GREEN_CONTEXT_ENV = "WEAVER_FAULT_GREEN_CONTEXT_FAIL"


@dataclass(frozen=True)
class Fault:
    kind = ""
    at_s: float | None = None  # seconds after the run's start (None: --fault-at)

    def describe(self) -> str:
        ps = ",".join(f"{_PARAM_NAMES.get(f.name, f.name)}={getattr(self, f.name)}" for f in fields(self)
                      if f.name != "at_s" and getattr(self, f.name) is not None)
        return self.kind + (f":{ps}" if ps else "")

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float | int) and not isinstance(v, bool) and v < 0:
                raise ValueError(f"{self.kind}: {_PARAM_NAMES.get(f.name, f.name)} must be >= 0, got {v}")


@dataclass(frozen=True)
class AckFault(Fault):
    site: int | None = None  # None: every site
    for_s: float = 5.0


@dataclass(frozen=True)
class AckDelay(AckFault):
    kind = "ack-delay"
    ms: float = 300.0


@dataclass(frozen=True)
class AckLoss(AckFault):
    kind = "ack-loss"


@dataclass(frozen=True)
class AckDuplicate(AckFault):
    kind = "ack-dup"


@dataclass(frozen=True)
class AckReorder(AckFault):
    kind = "ack-reorder"


@dataclass(frozen=True)
class NodeRestart(Fault):
    kind = "node-restart"
    site: int = 0
    down_s: float = 0.5


@dataclass(frozen=True)
class NodeLost(Fault):
    kind = "node-lost"
    site: int = 0
    down_s: float = 5.0


@dataclass(frozen=True)
class SlowReader(Fault):
    kind = "slow-reader"
    site: int = 0
    for_s: float = 5.0
    rate: float = 256.0


@dataclass(frozen=True)
class Partition(Fault):
    kind = "partition"
    site: int = 0
    for_s: float = 5.0


@dataclass(frozen=True)
class XappStall(Fault):
    kind = "xapp-stall"
    ms: float = 2000.0


@dataclass(frozen=True)
class XappKill(Fault):
    kind = "xapp-kill"
    down_s: float = 0.0


@dataclass(frozen=True)
class ReplicaKill(Fault):
    kind = "replica-kill"


@dataclass(frozen=True)
class RevokeMidPeriod(Fault):
    kind = "revoke-mid-period"
    site: int = 0
    for_s: float = 10.0
    down_s: float = 0.4
    stale: float = 200.0   # ms after the last KPM the xApp revokes (its stale_periods x period_ms)


@dataclass(frozen=True)
class GreenContextFail(Fault):
    kind = "green-context-fail"


KINDS: dict[str, type[Fault]] = {c.kind: c for c in (AckDelay, AckLoss, AckDuplicate, AckReorder, NodeRestart,
                                                     NodeLost, SlowReader, Partition, XappStall, XappKill,
                                                     ReplicaKill, RevokeMidPeriod, GreenContextFail)}
SIM_KINDS = ("ack-delay", "ack-loss", "ack-dup", "ack-reorder", "node-restart", "node-lost")
_PARAM_NAMES = {"for_s": "for", "down_s": "down", "at_s": "at"}
_FIELD_OF = {v: k for k, v in _PARAM_NAMES.items()}
_ACK_MODE = {"ack-delay": "delay", "ack-loss": "loss", "ack-dup": "duplicate", "ack-reorder": "reorder"}


def parse_fault(spec: str, default_at_s: float | None = None) -> Fault:
    """`"ack-delay:ms=500,for=3,at=8"` -> AckDelay(ms=500.0, for_s=3.0, at_s=8.0); ValueError if malformed."""
    kind, _, rest = spec.strip().partition(":")
    cls = KINDS.get(kind)
    if cls is None:
        raise ValueError(f"--fault {spec!r}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    known = {f.name: f for f in fields(cls)}
    kw: dict = {}
    for item in filter(None, rest.split(",")):
        k, eq, v = item.partition("=")
        name = _FIELD_OF.get(k.strip(), k.strip())
        if not eq or name not in known:
            names = ", ".join(_PARAM_NAMES.get(n, n) for n in known)
            raise ValueError(f"--fault {spec!r}: unknown parameter {k!r} (one of {names})")
        try:
            kw[name] = int(v) if name == "site" else float(v)
        except ValueError:
            raise ValueError(f"--fault {spec!r}: {k}={v!r} is not a number") from None
    if "at_s" not in kw and default_at_s is not None:
        kw["at_s"] = float(default_at_s)
    return cls(**kw)


def parse_faults(specs: list[str] | tuple[str, ...], default_at_s: float | None = None) -> tuple[Fault, ...]:
    return tuple(parse_fault(s, default_at_s) for s in specs)


def check_sites(faults: tuple[Fault, ...], n_sites: int, allowed: tuple[str, ...] | None = None) -> None:
    for f in faults:
        if allowed is not None and f.kind not in allowed:
            raise ValueError(f"--fault {f.kind}: not available here (only {', '.join(allowed)})")
        site = getattr(f, "site", None)
        if site is not None and not 0 <= site < n_sites:
            raise ValueError(f"--fault {f.describe()}: no site {site} (0..{n_sites - 1})")


def agent_env(faults: tuple[Fault, ...]) -> dict[str, str]:
    """Environment the agents start with for this schedule."""
    return {GREEN_CONTEXT_ENV: "1"} if any(isinstance(f, GreenContextFail) for f in faults) else {}


@dataclass
class Targets:
    """What faults act on; any may be missing (`weaver sim` has no xApp, agents or proxies)."""

    sim: object | None = None                      # testbed.sim.Simulation
    proxies: dict = field(default_factory=dict)    # site -> testbed.tcpproxy.TcpProxy
    supervisor: object | None = None               # testbed.procs.Supervisor
    xapp_ready: object | None = None               # async callable: wait until a restarted xApp is ready
    before_xapp_kill: object | None = None         # async callable: read what the xApp knows before it is lost
    agent_devices: object | None = None            # callable -> {site: device string} (AgentInspect)
    cpu_trace: object | None = None                # testbed.groundtruth.CpuTrace, keyed by site
    replica_sites: object | None = None            # async callable -> {xApp process name: [sites it controls]}


@dataclass
class FaultInjector:
    faults: tuple[Fault, ...]
    targets: Targets
    default_at_s: float = DEFAULT_AT_S
    notify: object | None = None   # callable(entry, "start" | "end"): e.g. a status line as it happens
    timeline: list = field(default_factory=list)
    _tasks: list = field(default_factory=list)
    _t0: float = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        for f in self.faults:
            self._tasks.append(asyncio.ensure_future(self._run(f)))

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for e in self.timeline:
            if e["end_s"] is None:
                e["end_s"] = round(self.now(), 3)
                e["note"] = (e["note"] + "; " if e["note"] else "") + "cut short by the end of the run"

    async def _run(self, f: Fault) -> None:
        at = f.at_s if f.at_s is not None else self.default_at_s
        await asyncio.sleep(max(at - self.now(), 0.0))
        entry = {"kind": f.kind, "spec": f.describe(), "params": {k: v for k, v in asdict(f).items()},
                 "start_s": round(self.now(), 3), "end_s": None, "applicable": True, "note": ""}
        entry["start_unix"] = time.time()
        self.timeline.append(entry)
        log.warning("fault %s: start at %.3f s", f.describe(), entry["start_s"])
        self._notify(entry, "start")
        try:
            await getattr(self, "_" + f.kind.replace("-", "_"))(f, entry)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a fault that cannot be injected is reported, never crashes the run
            log.exception("fault %s failed", f.describe())
            entry["applicable"] = False
            entry["note"] = f"could not inject: {exc}"
        entry["end_s"] = round(self.now(), 3)
        entry["end_unix"] = time.time()
        log.warning("fault %s: end at %.3f s (%s)", f.describe(), entry["end_s"], entry["note"] or "ok")
        self._notify(entry, "end")

    def _notify(self, entry: dict, what: str) -> None:
        if self.notify is not None:
            try:
                self.notify(entry, what)
            except Exception:  # a report must never stop a fault
                log.exception("fault notify failed")

    # -- ACKs on the E2 node's wire ----------------------------------------------------------------

    async def _ack(self, f: AckFault, entry: dict) -> None:
        from testbed.e2node.shell import AckShaper

        sim = self._need("sim")
        sites = range(len(sim.nodes)) if f.site is None else (f.site,)
        shapers = {}
        for s in sites:
            shapers[s] = AckShaper(_ACK_MODE[f.kind], getattr(f, "ms", 0.0))
            sim.nodes[s].ack_shaper = shapers[s]
        try:
            await asyncio.sleep(f.for_s)
        finally:
            for s, sh in shapers.items():
                shell = sim.nodes[s]
                if shell.ack_shaper is sh:
                    shell.ack_shaper = None
                    await sh.release(shell)
            counts: dict = {}
            for sh in shapers.values():
                for k, v in sh.counts.items():
                    counts[k] = counts.get(k, 0) + v
            entry["counts"] = counts
            entry["note"] = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
            if not counts.get("acks"):  # nothing to act on: say so rather than claim the fault happened
                entry["applicable"] = False
                entry["note"] = "no RC control was acknowledged while it was on"

    _ack_delay = _ack_loss = _ack_dup = _ack_reorder = _ack

    # -- E2 nodes ----------------------------------------------------------------------------------

    async def _node_restart(self, f: NodeRestart, entry: dict) -> None:
        await self._need("sim").restart_site(f.site, f.down_s)
        entry["note"] = "RC state lost (envelope none, quotas default); E2 setup redone"

    async def _node_lost(self, f: NodeLost, entry: dict) -> None:
        sim = self._need("sim")
        await sim.stop_site(f.site)
        await asyncio.sleep(f.down_s)
        await sim.start_site(f.site)
        entry["note"] = "E2 setup redone (RC state kept)"

    # -- the agent's TCP path ----------------------------------------------------------------------

    def _proxy(self, site: int):
        p = self.targets.proxies.get(site)
        if p is None:
            raise RuntimeError(f"no TCP proxy for site {site}")
        return p

    async def _shaped(self, site: int, for_s: float, shape) -> None:
        """`shape(proxy)` for `for_s`, then the proxy healed."""
        p = self._proxy(site)
        shape(p)
        try:
            await asyncio.sleep(for_s)
        finally:
            p.heal()

    async def _slow_reader(self, f: SlowReader, entry: dict) -> None:
        await self._shaped(f.site, f.for_s, lambda p: p.trickle("down", f.rate, f.for_s) if f.rate > 0
                           else p.stall("down", f.for_s))
        entry["note"] = f"broker->agent at {f.rate:g} B/s" if f.rate > 0 else "broker->agent stalled"

    async def _partition(self, f: Partition, entry: dict) -> None:
        await self._shaped(f.site, f.for_s, lambda p: p.stall("both", f.for_s))
        entry["note"] = "both directions stalled, connection kept open"

    # -- the xApp process --------------------------------------------------------------------------

    async def _xapp_stall(self, f: XappStall, entry: dict) -> None:
        child = self._need("supervisor").get("xapp")
        os.killpg(child.proc.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(f.ms / 1000.0)
        finally:
            os.killpg(child.proc.pid, signal.SIGCONT)
        entry["note"] = f"SIGSTOP pid {child.proc.pid} for {f.ms:g} ms"

    async def _xapp_kill(self, f: XappKill, entry: dict) -> None:
        sup = self._need("supervisor")
        old = sup.get("xapp").proc.pid
        if self.targets.before_xapp_kill is not None:
            await self.targets.before_xapp_kill()
        await asyncio.to_thread(sup.kill, "xapp")
        if f.down_s > 0:
            await asyncio.sleep(f.down_s)
        child = sup.restart("xapp")
        if self.targets.xapp_ready is not None:
            await self.targets.xapp_ready(child)
        entry["note"] = f"SIGKILL pid {old}, restarted as pid {child.proc.pid}"

    async def _replica_kill(self, f: ReplicaKill, entry: dict) -> None:
        sup, views = self._need("supervisor"), self._need("replica_sites")
        owned = await views()
        if len(owned) < 2:
            entry["applicable"] = False
            entry["note"] = "needs two or more xApp replicas answering (weaver up --xapp-replicas N)"
            return
        name = max(sorted(owned), key=lambda n: len(owned[n]))
        pid = sup.get(name).proc.pid
        await asyncio.to_thread(sup.kill, name)
        entry["replica"], entry["sites"] = name, sorted(owned[name])
        entry["note"] = f"SIGKILL {name} (pid {pid}), which controlled {', '.join(sorted(owned[name])) or 'no site'}"

    # -- a revoke that lands while the agent works -------------------------------------------------

    async def _revoke_mid_period(self, f: RevokeMidPeriod, entry: dict) -> None:
        """The xApp's decisions (and so its tick revokes) come when the agent has spent its period's duty
        budget already (at the front of its period): a revoke on that grid finds it idle. A stale-KPM
        revoke comes at the node's last KPM + `stale`, off that grid: the node's report before the planned
        instant is held back (less than a period) so that it arrives `stale` ms before a chosen point inside
        the agent's busy stretch, then the node stays silent for `down` s."""
        sim = self._need("sim")
        trace = self._need("cpu_trace")
        if f.site not in getattr(trace, "pids", {}):
            raise RuntimeError(f"site {f.site}'s agent is not traced")
        period, stale = sim.period_s, f.stale / 1000.0
        end = self.now() + f.for_s
        planned: list = []
        entry["events"] = planned
        try:
            while self.now() + stale + period + f.down_s < end:
                phase = busy_phase(*trace.recent(f.site, 3.5 * period), period)
                if phase is None:
                    await asyncio.sleep(0.05)
                    continue
                t_on, into = phase
                lead = stale + period + 0.03       # a cut a period away: some step before it sees it
                k = math.ceil((time.time() + lead - t_on - into) / period)
                target = t_on + into + k * period
                sim.kpm_last_at[f.site] = target - stale - 0.002   # the xApp's receipt is ~1-2 ms later
                await asyncio.sleep(max(target - time.time(), 0.0) + f.down_s)
                sim.kpm_last_at.pop(f.site, None)
                sim.muted.discard(f.site)
                planned.append({"target_unix": round(target, 4), "into_busy_ms": round(into * 1000, 1),
                                "kpm_last_sent_unix": sim.kpm_last_sent.get(f.site)})
                await asyncio.sleep(3 * period)    # re-granted; its new lease chain sets the agent's grid
        finally:
            sim.kpm_last_at.pop(f.site, None)
            sim.muted.discard(f.site)
        entry["note"] = f"{len(planned)} stale-KPM revokes timed into the agent's work"
        if not planned:
            entry["applicable"] = False
            entry["note"] = "the agent was never seen working in a steady period grid"

    # -- agents ------------------------------------------------------------------------------------

    async def _green_context_fail(self, f: GreenContextFail, entry: dict) -> None:
        devices = self.targets.agent_devices() if self.targets.agent_devices is not None else {}
        cpu = [s for s, d in devices.items() if not str(d).startswith("cuda")]
        if devices and len(cpu) == len(devices):
            entry["applicable"] = False
            entry["note"] = "not applicable on CPU: the agents have no green context to fail"
        else:
            entry["note"] = f"agents started with {GREEN_CONTEXT_ENV}=1" + (f"; CPU sites {cpu}" if cpu else "")

    def _need(self, what: str):
        t = getattr(self.targets, what)
        if t is None:
            raise RuntimeError(f"this run has no {what} to inject into")
        return t


def busy_phase(t: list[float], cpu_s: list[float], period_s: float, working_cores: float = 0.5,
               merge_s: float = 0.004) -> tuple[float, float] | None:
    """From a recent stretch of an agent's CPU trace: (the start of its latest busy stretch, how far into a
    busy stretch to aim), where the agent works at the front of each period of a steady grid (two busy
    stretches starting a period apart, +-15 ms); an agent busy throughout gives (its last sample, 0).
    Sample intervals above `working_cores` are busy; quiet gaps shorter than `merge_s` inside a stretch (an
    optimizer step's hand-off) do not split it. The aim is 40 % into the shorter of the two stretches,
    3..20 ms. None: no such grid (idle, or not steady yet)."""
    if len(t) < 3:
        return None
    spans: list[list[float]] = []     # [start, end] of busy stretches
    for k in range(len(t) - 1):
        dt = t[k + 1] - t[k]
        if dt <= 0 or (cpu_s[k + 1] - cpu_s[k]) / dt <= working_cores:
            continue
        if spans and t[k] - spans[-1][1] < merge_s:
            spans[-1][1] = t[k + 1]
        else:
            spans.append([t[k], t[k + 1]])
    busy = sum(b - a for a, b in spans)
    if spans and busy >= 0.95 * (t[-1] - t[0]):
        return t[-1], 0.0
    for j in range(len(spans) - 1, 0, -1):
        a, b = spans[j - 1], spans[j]
        if abs(b[0] - a[0] - period_s) <= 0.015:
            ongoing = b[1] >= t[-1] - merge_s   # the latest stretch may not have ended yet
            length = a[1] - a[0] if ongoing else min(a[1] - a[0], b[1] - b[0])
            if length < 0.006:
                return None
            return b[0], min(max(0.4 * length, 0.003), 0.020)
    return None
