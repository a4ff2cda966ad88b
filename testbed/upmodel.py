"""`weaver up --agents-model`: the control plane of a region, with model agents (issue 27 item 3).

The world, the mini-RIC (E2 termination, SubMgr, R-NIB) and the xApp (or `--xapp-replicas N` of them) are
those of `weaver up` (`testbed.up`); in place of one training process a site, `agent.loadmodel` processes
hold every site's agent: each the agent's real lease protocol (`LeaseClient`: its own gRPC stream, Register
with its site's credential, heartbeats, clock-offset bound, redirects between replicas; `BudgetEnforcer`:
the window and micro-batch plan) with a work model in place of torch. So a run with 1,000 sites puts 1,000
E2 nodes through SubMgr and the E2 termination, 1,000 sites through the xApp's loop and 1,000 lease sessions
through the broker, and the dashboard shows them all. Unless `--no-cross-site`, every site also joins the
cross-site tier's quorums (`agent.tiermodel`: torchft's Lighthouse client, through the gated Lighthouse's gate
with the pass the site's lease stream hands it; heartbeats and one quorum a round, no weights exchanged).

What it does not measure: training. The work model executes nothing, so the RAN model is charged no
training and every deadline miss in the summary is the RAN's own (its demand over its GPU); the figures
are the control plane's - E2 setup and subscription of every node, sessions connected and how long that
took, KPM and leases per second, lease delivery (decision -> receipt, the agents' clocks), leases that
arrived past their hard end, the xApp's loop step time (its `/metrics` histogram) and whether the world
kept its period. Each site's credential is written to a 0600 file in the run dir that only the model
agents' processes read (the broker secret stays in the xApp's environment).
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import re
import secrets
import signal
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from agent.crosssite.lighthouse import region_round_ms
from testbed.cli import agent_python
from testbed.faults import FaultInjector, Targets
from testbed.procs import ChildFailed, Supervisor
from testbed.up import (
    REDIS,
    ROOT,
    SHARDS_PER_REPLICA,
    SiteTally,
    UpConfig,
    World,
    drop_sdl_namespace,
    free_port,
    ledger_check,
    replica_sites,
    rest_get,
    run_sdl,
    scenario_for,
    scenario_line,
    site_name,
    start_lighthouse,
    start_xapps,
    xapp_sites,
)

# The E2 termination's health check of every node (testbed.ric.e2term): one probe and one answer a node an
# interval, both through this process's event loop. At 1 s, 1,000 nodes' probes alone took the loop past 3
# intervals and every node was declared lost; a real E2T leaves this to SCTP heartbeats in the kernel (30 s
# by default), so the interval grows with the nodes: 100 probes a second at most.
PROBES_PER_S = 100


def keepalive_for(nodes: int) -> float:
    return max(1.0, nodes / PROBES_PER_S)


SITES_PER_PROCESS = 250     # model agents a process: each has its client thread and gRPC channel
IO_SHARE = 0.05             # at least this much of a period the world leaves to its event loop's I/O
WARMUP_S_PER_SITE = 0.3     # the warm-up's deadline: 60 s + this a site (subscriptions are one at a time)


class Pacer:
    """The world's periods at real time (the one loop of this mode, for the warm-up and the run): each period
    the model and every node's KPM; once a second the xApp's site views (in the background: a busy xApp must
    not stall the pacing), `on_second`, `until` and the children's health."""

    def __init__(self, sim, world: World, stop: asyncio.Event, read_views, on_second=None, failed=None) -> None:
        self.sim, self.world, self.stop, self.read_views = sim, world, stop, read_views
        self.on_second, self.failed = on_second, failed
        self.periods = self.late = 0
        self.lag_max = 0.0
        self.views: dict = {}
        self.failed_children: list = []

    async def run(self, seconds: float | None, until=None) -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        n = 0
        next_second = t0 + 1.0
        task: asyncio.Task | None = None
        try:
            while not self.stop.is_set() and (seconds is None or loop.time() - t0 < seconds):
                lag = loop.time() - (t0 + n * self.sim.period_s)
                self.lag_max = max(self.lag_max, lag)
                self.late += lag > self.sim.period_s      # started more than a period after its instant
                self.world.account(await self.sim.step())
                n += 1
                self.periods += 1
                if loop.time() >= next_second:
                    next_second = loop.time() + 1.0
                    if task is not None and task.done():
                        self.views = task.result() if not task.exception() else self.views
                        task = None
                        if self.on_second is not None:
                            self.on_second(loop.time() - t0, self.views)
                        if until is not None and until(self.views):
                            break
                    if task is None:
                        task = asyncio.ensure_future(self.read_views())
                    self.failed_children = self.failed() if self.failed is not None else []
                    if self.failed_children:
                        break
                # behind or not, the loop gets a share of every period for its I/O: periods run back to
                # back left the E2 termination's health checks unanswered and it declared nodes lost
                wait = max(t0 + n * self.sim.period_s - loop.time(), IO_SHARE * self.sim.period_s)
                if wait > 0:
                    try:
                        await asyncio.wait_for(self.stop.wait(), wait)
                    except TimeoutError:
                        pass
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return loop.time() - t0


@dataclass(frozen=True)
class ModelGroup:
    """One `agent.loadmodel` process: these sites, all on one GPU size and partition step."""

    name: str
    sites: tuple[int, ...]
    gpu_sms: int
    granularity: int


def model_groups(scenario, per_process: int = SITES_PER_PROCESS) -> list[ModelGroup]:
    """The sites split into processes of at most `per_process`, each of one (GPU, step) kind."""
    kinds: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(scenario.sites):
        kinds.setdefault((s.gpu_sms, s.granularity), []).append(i)
    out = []
    for (gpu, gran), sites in sorted(kinds.items()):
        for k in range(0, len(sites), per_process):
            out.append(ModelGroup(f"agents:{len(out)}", tuple(sites[k:k + per_process]), gpu, gran))
    return out


def step_quantiles(metrics_text: str, qs=(0.5, 0.99)) -> dict:
    """The xApp's `weaver_loop_step_seconds` histogram: its count and, for each quantile, the upper bound
    of the bucket it falls in (ms; None past the last finite bucket)."""
    buckets = sorted((float(le), float(v)) for le, v in re.findall(
        r'^weaver_loop_step_seconds_bucket\{le="([^"]+)"\} (\S+)$', metrics_text, re.M))
    total = buckets[-1][1] if buckets else 0.0
    out: dict = {"steps": int(total)}
    for q in qs:
        bound = next((le for le, c in buckets if c >= q * total), None) if total else None
        out[f"p{round(q * 100)}_ms_at_most"] = (bound * 1e3 if bound is not None and math.isfinite(bound) else None)
    return out


def combine_agents(docs: list[dict]) -> dict:
    """The model agents' processes' figures as one: counts added, delivery quantiles as the worst process's."""
    keys = ("agents", "sites_connected", "disconnects", "redirects", "leases_received", "revokes_received",
            "usage_reports_sent", "leases_received_past_hard_end", "dropped_reports", "process_cpu_s")
    out = {k: sum(d.get(k, 0) or 0 for d in docs) for k in keys}
    for k in ("lease_delivery_ms_p50", "lease_delivery_ms_p99", "lease_delivery_ms_max"):
        vals = [d[k] for d in docs if d.get(k) is not None]
        out[k + "_worst_process"] = max(vals) if vals else None
    out["tier"] = combine_tiers([d["tier"] for d in docs if d.get("tier")])
    return out


def combine_tiers(tiers: list[dict]) -> dict:
    """The processes' tier figures (agent.tiermodel.Tiers.figures) as one: counts added, the quorums' sizes
    over every process, the wait quantiles as the worst process's."""
    keys = ("sites_joined", "sites_refused", "sites_in_a_quorum", "quorum_requests", "quorums", "quorum_failures",
            "heartbeats", "heartbeat_failures")
    out = {k: sum(t.get(k, 0) or 0 for t in tiers) for k in keys}

    def over(key: str, pick):
        vals = [t[key] for t in tiers if t.get(key) is not None]
        return pick(vals) if vals else None
    out["quorum_sites_min"], out["quorum_sites_max"] = over("quorum_sites_min", min), over("quorum_sites_max", max)
    out["quorum_wait_ms_p50_worst_process"] = over("quorum_wait_ms_p50", max)
    out["quorum_wait_ms_p99_worst_process"] = over("quorum_wait_ms_p99", max)
    out["an_error"] = next((t["an_error"] for t in tiers if t.get("an_error")), "")
    return out


def write_credentials(path: Path, secret: str, sites: list[str], valid_s: int = 86400) -> None:
    """Each site's credential (`xapp.agents.site_credential`, valid a day), readable by this user only."""
    from xapp.agents import site_credential
    exp = int(time.time()) + valid_s
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({s: site_credential(secret, s, exp) for s in sites}, f)


def _status_line(elapsed: float, duration: float | None, world: World, views: dict, n_sites: int,
                 last: dict, late: int) -> str:
    connected = sum(1 for v in views.values() if v.get("agent"))
    kpm = sum(v.get("counters", {}).get("kpm_indications", 0) for v in views.values())
    leases = sum(v.get("counters", {}).get("leases_granted", 0) for v in views.values())
    dt = max(1e-9, elapsed - last.get("t", 0.0))
    rate_k, rate_l = (kpm - last.get("kpm", 0)) / dt, (leases - last.get("leases", 0)) / dt
    last.update(t=elapsed, kpm=kpm, leases=leases)
    misses = sum(t.misses for t in world.tally)
    of = f"/{duration:.0f}" if duration is not None else ""
    return (f"weaver up: {elapsed:5.1f}{of} s  sites {n_sites}, agents connected {connected}  "
            f"KPM {rate_k:,.0f}/s  leases {rate_l:,.0f}/s  RAN misses {misses}  world periods late {late}")


async def run_up_model(cfg: UpConfig, out=print) -> dict:
    from testbed.sim import SimConfig, Simulation

    run_dir = cfg.run_dir or Path(tempfile.mkdtemp(prefix="weaver-up-"))
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    ports = {"rmr": free_port(), "rest": cfg.rest_port or free_port(), "broker": free_port()}
    replicas = [dict(ports)] + [{"rmr": free_port(), "rest": free_port(), "broker": free_port()}
                                for _ in range(cfg.xapp_replicas - 1)]
    scenario = scenario_for(cfg)
    # nothing runs beyond a lease (the work model executes nothing): one partition step of guard
    cfg = replace(cfg, guard_sms=cfg.guard_sms or max(s.granularity for s in scenario.sites),
                  round_ms=region_round_ms(cfg.sites, cfg.round_ms))
    t_start = time.monotonic()
    sim = await Simulation.start(SimConfig(n_sites=cfg.sites, n_cells=cfg.cells, seed=cfg.seed, host=cfg.host,
                                           e2term_port=0, submgr_http_port=0,
                                           xapps=tuple(f"{cfg.host}:{r['rmr']}" for r in replicas),
                                           route_dir=str(run_dir), speed=1.0, node_overrides=cfg.node_overrides,
                                           keepalive_s=keepalive_for(cfg.sites)),
                                 scenario=scenario)
    sup = Supervisor(log_dir=run_dir / "logs")
    world = World(sim, cfg)
    world.startup["world_s"] = round(time.monotonic() - t_start, 2)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sdl_namespace = ""
    injector: FaultInjector | None = None
    rests = [f"http://{cfg.host}:{r['rest']}" for r in replicas]
    names = [site_name(i) for i in range(cfg.sites)]
    summary: dict = {}
    try:
        secret = secrets.token_hex(32)
        # the model agents join the cross-site tier's quorums (agent.tiermodel), through its gate as sites do
        lighthouse = (await start_lighthouse(cfg, sup, secret))[0] if cfg.cross_site else ""
        sdl_env, sdl_namespace = await asyncio.to_thread(run_sdl)
        await start_xapps(cfg, sim, sup, run_dir, replicas, sdl_env, sdl_namespace, lighthouse=lighthouse,
                          broker_secret=secret, ready_s=90.0 + 0.2 * cfg.sites)
        world.startup["xapp_ready_s"] = round(time.monotonic() - t_start, 2)
        creds = run_dir / "site-credentials.json"
        write_credentials(creds, secret, names)
        brokers = ",".join(f"{cfg.host}:{r['broker']}" for r in replicas)
        groups = model_groups(scenario)
        for g in groups:
            sup.start(g.name, [str(agent_python()), "-m", "agent.loadmodel", "--broker", brokers,
                               "--sites", ",".join(names[i] for i in g.sites), "--duration", "0",
                               "--gpu-sms", str(g.gpu_sms), "--granularity", str(g.granularity),
                               "--credentials", str(creds), "--json", str(run_dir / f"{g.name.replace(':', '-')}.json"),
                               *(["--cross-site"] if lighthouse else [])],
                      env={"PYTHONPATH": str(ROOT)})
        for g in groups:
            await asyncio.to_thread(sup.get(g.name).wait_for_line, r"weaver-load: started", 60)
        # Warm-up: the world runs (a node reports KPM only in periods) until every site's session is up and
        # its KPM reaches the xApp, or the deadline; the run's figures start after it
        pacer = Pacer(sim, world, stop, lambda: xapp_sites(rests, timeout=10.0))

        def warm(views: dict) -> bool:
            return all((views.get(s) or {}).get("agent") and (views.get(s) or {}).get("counters", {})
                       .get("kpm_indications") for s in names)
        await pacer.run(60 + WARMUP_S_PER_SITE * cfg.sites, until=warm)
        views = await xapp_sites(rests, timeout=10.0)
        waiting = [s for s in names if not (views.get(s) or {}).get("agent")]
        silent = [s for s in names if not (views.get(s) or {}).get("counters", {}).get("kpm_indications")]
        world.startup["all_reporting_s"] = round(time.monotonic() - t_start, 2)
        world.startup["agents_not_connected"] = len(waiting)
        world.startup["sites_without_kpm"] = len(silent)
        world.startup["warmup_periods_late"] = pacer.late
        baseline = {sid: dict(v.get("counters", {})) for sid, v in views.items()}
        # a warm-up that fell behind real time would stamp every later KPM report that much in the past, and
        # the xApp rightly grants nothing on stale KPM: the world's clock starts the run on the wall clock's
        sim.epoch_unix = time.time() - sim.now_s
        world.tally = [SiteTally() for _ in world.tally]
        out(scenario_line(cfg, scenario))
        out(f"weaver up: agents     model agents (agent.loadmodel: the lease protocol, a work model in place "
            f"of torch) for {cfg.sites} sites in {len(groups)} process{'es' if len(groups) > 1 else ''}; "
            + (f"after the warm-up {len(waiting)} not connected, {len(silent)} without KPM at the xApp "
               f"(first: {', '.join((waiting + silent)[:5])})" if waiting or silent
               else f"every session up and every site's KPM at the xApp "
                    f"{world.startup['all_reporting_s'] - world.startup['xapp_ready_s']:.1f} s after the xApp was ready"))
        out("weaver up: lighthouse " + (f"{lighthouse} (gated; every site asks it for a quorum each {cfg.round_ms} ms "
                                         f"round, agent.tiermodel)" if lighthouse else "none (--no-cross-site)"))
        out(f"weaver up: dashboard  {rests[0]}/")
        out(f"weaver up: rest       {rests[0]}/api/v1  (metrics {rests[0]}/metrics)")
        out(f"weaver up: submgr     {sim.ric.submgr_url}/subscriptions")
        out(f"weaver up: grpc       lease broker{'s' if len(replicas) > 1 else ''} {brokers.replace(',', ' ')}")
        out(f"weaver up: run dir    {run_dir} (logs, config, the model agents' figures)")
        out("weaver up: sdl        " + (f"redis {REDIS[0]}:{REDIS[1]} namespace {sdl_namespace}" if sdl_namespace
                                         else "embedded in the xApp (no Redis answered)"))
        out("weaver up: truth      the work model executes nothing: no training is charged to the RAN, every "
            "miss is the RAN's own")
        if cfg.faults:
            injector = FaultInjector(cfg.faults, Targets(sim=sim, supervisor=sup,
                                                         replica_sites=lambda: replica_sites(sup, rests)),
                                     cfg.fault_at_s, notify=lambda e, what: out(
                                         f"weaver up: fault {e['spec']} {what}s at {e[what + '_s']:.1f} s"
                                         + (f" ({e['note']})" if what == "end" and e["note"] else "")))
            injector.start()
        pacer = Pacer(sim, world, stop, lambda: xapp_sites(rests, timeout=10.0),
                      on_second=lambda el, v: out(_status_line(el, cfg.duration_s, world, v, cfg.sites, last,
                                                               pacer.late)),
                      failed=sup.failed)
        last: dict = {}
        elapsed = await pacer.run(cfg.duration_s)
        if pacer.failed_children:
            world.ended_by = "; ".join(f"{c.name} exited ({c.proc.returncode})" for c in pacer.failed_children)
            out(f"weaver up: {world.ended_by}: the run ends here (see {run_dir / 'logs'})")
        n, late, lag_max = pacer.periods, pacer.late, pacer.lag_max
        views = await xapp_sites(rests, timeout=10.0)
        steps = [step_quantiles(await _metrics(r)) for r in rests]
        if injector is not None:
            await injector.close()
        replicas_doc = None
        if cfg.xapp_replicas > 1 and sdl_namespace:
            kills = [f for f in injector.timeline if f["kind"] == "replica-kill" and f.get("applicable")] \
                if injector is not None else []
            replicas_doc = {"replicas": cfg.xapp_replicas, "shards": SHARDS_PER_REPLICA * cfg.xapp_replicas,
                            **await asyncio.to_thread(ledger_check, sdl_namespace, kills)}
        # the xApp first (it revokes every lease), then the model agents, which write their figures, then the
        # Lighthouse (no site loses its quorum service while it stops)
        await asyncio.to_thread(sup.stop_all, ["xapp", "agents", "lighthouse"], 30.0)
        docs = []
        for g in groups:
            try:
                docs.append(json.loads((run_dir / f"{g.name.replace(':', '-')}.json").read_text()))
            except (OSError, ValueError) as exc:
                out(f"weaver up: {g.name} left no figures: {exc}")
        summary = model_summary(cfg, world, views, baseline, docs, steps, elapsed, n, late, lag_max, replicas_doc,
                                list(injector.timeline) if injector is not None else [])
    finally:
        if injector is not None:
            await injector.close()
        await asyncio.to_thread(sup.stop_all, ["xapp", "agents", "lighthouse"], 30.0)
        if sdl_namespace:
            try:
                await asyncio.to_thread(drop_sdl_namespace, sdl_namespace)
            except Exception as exc:  # noqa: BLE001 - a Redis gone by now leaves keys, not a failed run
                out(f"weaver up: could not remove SDL namespace {sdl_namespace}: {exc}")
        await sim.close()
    return summary


async def _metrics(rest: str) -> str:
    try:
        return await rest_get(f"{rest}/metrics", 10, text=True)
    except Exception:  # noqa: BLE001 - a replica killed by a fault has no metrics
        return ""


def model_summary(cfg: UpConfig, world: World, views: dict, baseline: dict, docs: list[dict], steps: list[dict],
                  elapsed: float, periods: int, late: int, lag_max_s: float, replicas: dict | None,
                  faults: list) -> dict:
    """The run after the warm-up: each site's xApp counters less those at its end (`baseline`)."""
    counters = [{k: (c or 0) - (baseline.get(sid, {}).get(k) or 0) for k, c in v.get("counters", {}).items()
                 if isinstance(c, int | float)} for sid, v in views.items()]
    keys = ("kpm_indications", "rc_controls_sent", "rc_controls_acked", "rc_controls_failed", "leases_granted",
            "sm_s_granted")
    totals = {k: sum(c.get(k, 0) or 0 for c in counters) for k in keys}
    totals["sites_seen_by_xapp"] = len(views)
    totals["sites_with_kpm"] = sum(1 for c in counters if c.get("kpm_indications"))
    totals["sites_with_leases"] = sum(1 for c in counters if c.get("leases_granted"))
    totals["kpm_indications_per_s"] = totals["kpm_indications"] / elapsed if elapsed > 0 else 0.0
    totals["leases_granted_per_s"] = totals["leases_granted"] / elapsed if elapsed > 0 else 0.0
    totals["ran_deadline_misses"] = sum(t.misses for t in world.tally)
    totals["slots"] = sum(t.slots for t in world.tally)
    return {"mode": "agents-model", "scenario": cfg.scenario, "sites": cfg.sites, "cells": cfg.cells,
            "policy": cfg.policy, "seed": cfg.seed, "period_ms": cfg.period_ms, "guard_sms": cfg.guard_sms,
            "xapp_replicas": cfg.xapp_replicas, "duration_s": round(elapsed, 3),
            "training": "none charged: the work model executes nothing; every miss is the RAN's own",
            "startup": dict(world.startup), "totals": totals,
            "agents": combine_agents(docs), "agents_by_process": docs,
            "xapp_loop_steps": steps,
            "world": {"periods": periods, "periods_started_late": late, "lag_max_ms": round(lag_max_s * 1e3, 1)},
            "replicas": replicas, "faults": faults, "ended_by": world.ended_by}


def print_summary(s: dict, out=print) -> None:
    t, a, w = s["totals"], s["agents"], s["world"]
    st = next((x for x in s["xapp_loop_steps"] if x["steps"]), {})     # a killed replica has no metrics
    out(f"weaver up: done (agents model, {s['sites']} sites, {s['xapp_replicas']} xApp replica"
        f"{'s' if s['xapp_replicas'] > 1 else ''}) in {s['duration_s']:.0f}s - sessions connected "
        f"{a['sites_connected']}/{s['sites']} (all reporting {s['startup'].get('all_reporting_s', 0):.1f} s after start), "
        f"KPM {t['kpm_indications_per_s']:,.0f}/s from {t['sites_with_kpm']} sites, leases "
        f"{t['leases_granted_per_s']:,.0f}/s to {t['sites_with_leases']} sites, delivery p99 "
        f"{_ms(a['lease_delivery_ms_p99_worst_process'])} (worst process), past their hard end "
        f"{a['leases_received_past_hard_end']} of {a['leases_received']}, loop step p99 <= "
        f"{_ms(st.get('p99_ms_at_most'))}, world periods late {w['periods_started_late']} of {w['periods']}, "
        f"RAN misses {t['ran_deadline_misses']}")
    x = a.get("tier") or {}
    if x.get("sites_joined") or x.get("sites_refused"):
        out(f"weaver up: cross-site {x['sites_in_a_quorum']}/{s['sites']} sites in a Lighthouse quorum, {x['quorums']} "
            f"quorums of {x['quorum_requests']} requests ({x['quorum_failures']} failed), sites a quorum "
            f"{x['quorum_sites_min']}..{x['quorum_sites_max']}, quorum wait p99 "
            f"{_ms(x['quorum_wait_ms_p99_worst_process'])} (worst process), heartbeats {x['heartbeats']:,} "
            f"({x['heartbeat_failures']} failed)" + (f"; e.g. {x['an_error']}" if x["an_error"] else ""))


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f} ms" if v < 10 else f"{v:.0f} ms"


def run_model(cfg: UpConfig, json_path: str | None) -> int:
    try:
        summary = asyncio.run(run_up_model(cfg, out=lambda s: print(s, flush=True)))
    except ChildFailed as exc:
        print(f"weaver up: {exc}", flush=True)
        return 1
    if not summary:
        return 1
    print_summary(summary, out=lambda s: print(s, flush=True))
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=2))
    return 1 if summary["ended_by"] else 0
