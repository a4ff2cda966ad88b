"""Many sites' agents in one process, for load (issue 27 item 3): each site runs the agent's real lease
protocol - `agent.lease_client.LeaseClient` (its own gRPC stream, Register with the site's credential proof,
heartbeats, clock-offset bound, reconnects and redirects) and `agent.enforcer.BudgetEnforcer` (the window and
micro-batch plan) - with a work model in place of torch: a planned micro-batch of B samples "takes"
`step_a_s + step_b_s * B` of the clock and uses nothing. The usage reports, releases and waterfall terms go
back to the broker as a real agent's do, built from the enforcer's own window reports.

What it measures, on this host's wall clock (the broker stamps each lease with its decision instant): for
every lease, decision -> receipt by the site's client (`lease_delivery_ms`), and how many leases, revokes,
sessions and redirects each site saw. It never touches a GPU and imports no job code.

    python -m agent.loadmodel --broker HOST:PORT[,HOST:PORT...] --sites site-0,site-1 --duration 10 --json F

Each site's credential comes from `--credentials FILE` (a JSON object site id -> token, as `weaver up
--agents-model` writes it, mode 0600), or is made from the broker secret in the environment variable
`--secret-env` names (as `weaver-xapp site-token` would); neither: the broker's dev mode, no credential.
`--duration 0` runs until SIGTERM or SIGINT; either ends a run early, and the figures so far are printed.
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from agent.config import EnforcerConfig, LeaseClientConfig
from agent.enforcer import WALL, BudgetEnforcer, Idle, Launch, StepNow
from agent.lease_client import (
    Connected,
    CrossSiteChanged,
    Disconnected,
    LeaseClient,
    LeaseGranted,
    LeaseRevoked,
)
from agent.monitors import DeviceFacts
from agent.tiermodel import Tiers, preload_tier
from schemas.credential import site_credential
from schemas.proto.weaver.v1 import lease_pb2

EVENTS_EVERY_S = 0.02    # how often every client's events are looked at (a lease's wait to be acted on)
IDLE_LOOK_S = 0.5        # an agent with no lease looks again this late (or at its next event)


@dataclass(frozen=True)
class LoadConfig:
    brokers: str
    sites: tuple[str, ...]
    duration_s: float = 10.0
    gpu_sms: int = 132
    granularity: int = 8
    step_a_s: float = 0.002          # the work model: a micro-batch of B samples takes a + b*B seconds
    step_b_s: float = 0.0002
    step_samples: int = 16           # samples between optimizer steps
    secret: str | None = None
    credentials: dict[str, str] = field(default_factory=dict, hash=False, compare=False)  # site -> token
    start_spread_s: float = 2.0      # registrations spread over this long (a region's agents do not start at once)
    cross_site: bool = False         # the sites will be told to join a tier: its modules load before they connect


@dataclass
class ModelAgent:
    site_id: str
    client: LeaseClient
    enforcer: BudgetEnforcer
    busy_until: float = 0.0          # the work model's current micro-batch or step ends then
    running: tuple | None = None     # (kind, size, started)
    pending_samples: int = 0
    delivery_ms: list[float] = field(default_factory=list)
    leases: int = 0
    revokes: int = 0
    reports: int = 0
    connects: int = 0
    disconnects: int = 0
    late: int = 0                    # leases received after their hard end (the agent runs nothing on them)


def make_agent(cfg: LoadConfig, site_id: str) -> ModelAgent:
    token = cfg.credentials.get(site_id) or (site_credential(cfg.secret, site_id) if cfg.secret else "")
    client = LeaseClient(LeaseClientConfig(broker=cfg.brokers, site_id=site_id, agent_id=f"load-{site_id}",
                                           token=token, heartbeat_ms=1000),
                         DeviceFacts(kind="cuda", name="work model", sm_count=cfg.gpu_sms,
                                     granularity=cfg.granularity, green_contexts=True),
                         mode="gpu", capabilities=())
    client.job = "agent.loadmodel (work model, no torch)"
    return ModelAgent(site_id, client, BudgetEnforcer(EnforcerConfig(), meter=WALL))


def _report(a: ModelAgent, now: float) -> None:
    for r in a.enforcer.close_windows(now):
        if not r.lease_id or r.granted_s <= 0:
            continue
        units = r.sm_count
        used, granted = r.busy_s * 1e3 * units, r.granted_s * 1e3 * units
        ok = a.client.send_usage(lease_pb2.UsageReport(
            lease_id=r.lease_id, sm_ms_used=min(used, granted), sm_ms_granted=granted, overrun_ms=r.overrun_s * 1e3,
            steps=r.steps, tokens=r.samples * 64, mode="gpu", device="cuda", window_ms=r.length_s * 1e3,
            idle_other_sm_ms=max(0.0, granted - used), beyond_grant_sm_ms=max(0.0, used - granted)))
        a.reports += ok


def _events(a: ModelAgent, now: float, tiers: Tiers) -> bool:
    """The client's events since the last look; True if there were any (the agent is woken for them)."""
    events = a.client.poll()
    for ev in events:
        if isinstance(ev, Connected):
            a.connects += 1
            if ev.cross_site is not None:
                tiers.configure(a.site_id, ev.cross_site)
        elif isinstance(ev, CrossSiteChanged):
            tiers.configure(a.site_id, ev.config)
        elif isinstance(ev, Disconnected):
            a.disconnects += 1
            a.enforcer.on_revoke(now, reason="disconnected", in_flight_until=a.busy_until)
        elif isinstance(ev, LeaseGranted):
            a.leases += 1
            a.enforcer.on_lease(ev.terms)      # reports follow the enforcer's windows (`_report`)
            if ev.transit_ms is not None:
                a.delivery_ms.append(ev.transit_ms)
                a.late += ev.transit_ms >= ev.terms.valid_for_s * 1e3     # arrived past its hard end: useless
        elif isinstance(ev, LeaseRevoked):
            a.revokes += 1
            held = a.enforcer.lease
            if held is not None and a.enforcer.on_revoke(now, ev.lease_id, in_flight_until=a.busy_until):
                # as SiteAgent._release: the lease it held (and every earlier one) runs no more
                a.client.send_release(held.lease_id, ev.reason, max(0.0, a.busy_until - now) * 1e3, held.sm_count)
    return bool(events)


def _advance(cfg: LoadConfig, a: ModelAgent, now: float) -> float:
    """Finish the modelled work that ended by `now`, plan the next; returns when to look again."""
    e = a.enforcer
    if a.running is not None and now >= a.busy_until:
        kind, size, started = a.running
        if kind == "batch":
            e.record_micro_batch(size, started, a.busy_until, a.busy_until - started)
            a.pending_samples += size
        else:
            e.record_step(started, a.busy_until, a.busy_until - started)
            a.pending_samples = 0
        a.running = None
    if a.running is not None:
        return a.busy_until
    d = e.decide(now, a.pending_samples, cfg.step_samples)
    if isinstance(d, Launch):
        a.running, a.busy_until = ("batch", d.size, now), now + cfg.step_a_s + cfg.step_b_s * d.size
        return a.busy_until
    if isinstance(d, StepNow):
        a.running, a.busy_until = ("step", 0, now), now + cfg.step_a_s
        return a.busy_until
    assert isinstance(d, Idle)
    # nothing to do until a lease comes (an event wakes the agent then) or the window the enforcer names
    return now + IDLE_LOOK_S if d.until is None else max(now + 0.001, min(d.until, now + 0.05))


def run(cfg: LoadConfig, out=print, stop: threading.Event | None = None) -> dict:
    """Every site's agent for `cfg.duration_s` (0: until `stop` is set), then the figures."""
    stop = stop or threading.Event()
    if cfg.cross_site:    # as a real agent does (CrossSiteAgent): torch and torchft at start, not on the loop
        preload_tier()
    agents = [make_agent(cfg, s) for s in cfg.sites]
    tiers = Tiers()
    clock = time.monotonic
    t0 = clock()
    gap = cfg.start_spread_s / max(1, len(agents))
    for a in agents:                          # spread the registrations (a stop cuts the spreading short)
        a.client.start()
        if gap > 0 and not stop.is_set():
            stop.wait(gap)
    out(f"weaver-load: started {len(agents)} agents in {clock() - t0:.1f} s", flush=True)
    wake_at = [clock()] * len(agents)          # each agent's next look; older heap entries are stale
    wake = [(t, i) for i, t in enumerate(wake_at)]
    heapq.heapify(wake)
    end = clock() + cfg.duration_s if cfg.duration_s > 0 else math.inf
    last_events = 0.0
    cpu0 = time.process_time()
    while clock() < end and not stop.is_set():
        now = clock()
        if now - last_events >= EVENTS_EVERY_S:   # every client's events
            for i, a in enumerate(agents):
                if _events(a, now, tiers) and wake_at[i] > now:
                    wake_at[i] = now
                    heapq.heappush(wake, (now, i))
            last_events = now
        while wake and wake[0][0] <= now:
            t, i = heapq.heappop(wake)
            if t != wake_at[i]:
                continue
            a = agents[i]
            wake_at[i] = _advance(cfg, a, now)
            heapq.heappush(wake, (wake_at[i], i))
            _report(a, now)
        time.sleep(max(0.0, min(0.005, (wake[0][0] if wake else now + 0.005) - clock())))
    cpu = time.process_time() - cpu0
    tiers.stop()
    with ThreadPoolExecutor(max_workers=64) as pool:      # each stop drains its stream: not one after another
        list(pool.map(lambda a: a.client.stop(timeout=2.0, drain_s=0.2), agents))
    delivery = sorted(x for a in agents for x in a.delivery_ms)

    def pct(q: float) -> float | None:
        return delivery[min(len(delivery) - 1, int(q * len(delivery)))] if delivery else None

    return {"agents": len(agents), "duration_s": round(clock() - t0, 3), "process_cpu_s": cpu,
            "sites_connected": sum(a.connects > 0 for a in agents),
            "disconnects": sum(a.disconnects for a in agents), "redirects": sum(a.client.redirects for a in agents),
            "leases_received": sum(a.leases for a in agents), "revokes_received": sum(a.revokes for a in agents),
            "usage_reports_sent": sum(a.reports for a in agents),
            "lease_delivery_ms_p50": pct(0.50), "lease_delivery_ms_p99": pct(0.99),
            "lease_delivery_ms_max": delivery[-1] if delivery else None,
            "leases_received_past_hard_end": sum(a.late for a in agents),
            "dropped_reports": sum(a.client.dropped_reports for a in agents), "tier": tiers.figures()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.loadmodel", description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", required=True, help="host:port, or the replicas' brokers comma-separated")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--sites", help="comma-separated site ids")
    g.add_argument("--count", type=int, help="site-0 .. site-(N-1)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds; 0 = until SIGTERM/SIGINT")
    p.add_argument("--secret-env", default="", help="env var holding the broker secret (site credentials)")
    p.add_argument("--credentials", default="", metavar="FILE", help="JSON object: site id -> credential")
    p.add_argument("--gpu-sms", type=int, default=132, help="every site's GPU, as its agent registers it")
    p.add_argument("--granularity", type=int, default=8, help="every site's partition step, in SMs")
    p.add_argument("--cross-site", action="store_true",
                   help="the coordinator names a Lighthouse: load the tier's modules before connecting")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sites = tuple(s for s in (args.sites or "").split(",") if s) or tuple(f"site-{i}" for i in range(args.count or 0))
    if not sites or len(sites) > 5000 or args.duration < 0:
        print("weaver-load: need 1..5000 sites and a duration >= 0", file=sys.stderr)
        return 2
    if not (1 <= args.granularity <= args.gpu_sms <= 1024):
        print("weaver-load: need 1 <= --granularity <= --gpu-sms <= 1024", file=sys.stderr)
        return 2
    secret = os.environ.get(args.secret_env) if args.secret_env else None
    creds: dict[str, str] = {}
    if args.credentials:
        try:
            with open(args.credentials) as f:
                creds = json.load(f)
        except (OSError, ValueError) as exc:
            print(f"weaver-load: --credentials {args.credentials}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(creds, dict) or not all(isinstance(v, str) for v in creds.values()):
            print(f"weaver-load: --credentials {args.credentials}: not an object of site id -> token", file=sys.stderr)
            return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    doc = run(LoadConfig(brokers=args.broker, sites=sites, duration_s=args.duration, secret=secret,
                         credentials=creds, gpu_sms=args.gpu_sms, granularity=args.granularity,
                         cross_site=args.cross_site), stop=stop)
    print(json.dumps(doc), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
