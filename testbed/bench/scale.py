"""`weaver bench scale`: what one xApp replica costs per site, from 10 to 1,000 sites, and what a replica's
death costs a live run (issue 27, item 5).

Per site count (`--sites`, one DU node of `--cells-per-node` cells a site, node-level E2SM-KPM v3.00 every
100 ms, values from a seeded generator, encoded once with e2sm's writers), one process pinned to one core
runs the deployed replica's path period by period, as `weaver-xapp` does:
- ingest: every node's RICindication bytes through `xapp.ingest.Ingest` (E2AP + KPM decode), as RMR
  delivers them between ticks;
- tick: one `xapp.loop.step` over every site with the period's samples and the previous period's control
  ACKs (estimate, policy, invariant, RC control encode), then each lease decision as the broker performs
  it: `xapp.broker.LeaseBroker.grant`/`revoke` with every site's session open (the AgentBook, the
  BrokerMessage serialized as the session writer does), and the tick's SDL ledger entries
  (`xapp.state.LeaseLedger`, one write at the tick's end) into the real Redis when one answers (`--redis`),
  the embedded store otherwise (said in the table and the JSON).
Measured by this thread's CPU clock: CPU per indication (everything above over indications), the tick's
p50/p99 (step + lease decisions: the time the loop holds the event loop), lease decisions a CPU second,
and memory per site (tracemalloc over a separate short pass: the loop state, the ingest tables, the book
and ledger of N sites, less the recording). Capacity: the sites a replica serves with half a core, the
smaller of the largest offline row's figure and the live broker stage's (below) at its largest row that
kept up, and how many replicas a 1,000-site region needs.

The baseline, in the same command: the smallest row (10 sites): the per-site costs at N sites are stated
as ratios to it (1.0 = linear scaling, > 1 = a cost that grows faster than the sites).

Hand-over (`--handover`, on by default; `--no-handover` skips it): a live `weaver up --xapp-replicas 3
--fault replica-kill` run (real processes, real Redis, real agents, the deployed code): seconds from the kill
to the first lease of another epoch on each of the killed replica's sites (the SDL ledger,
`testbed.up.ledger_check`), leases of two epochs that could be acted on at once, and training-caused deadline
misses by ground truth.

Tier (`--tier-sites`, default 300,1000; `none` skips): a region's sites in the cross-site tier's quorums,
`python -m agent.tierregion` in the agent venv: the deployed gated Lighthouse (its gate sized for the sites as
`weaver up` sizes it) and N model sites in one process, each through its own egress with a pass of the epoch,
for two rounds of the region's length: sites in every quorum, failed requests and heartbeats, the quorum
wait, and the gate process's threads and CPU (a relay thread for all its connections, not two threads each).

Prints a table, writes `--json FILE` with self-describing keys and `--plot FILE` (PNG).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from e2sm.e2ap import decode_e2ap
from xapp.agents import AgentBook, Registration
from xapp.bench import PERIOD_MS, loop_setup, make_config, record
from xapp.config import XappConfig
from xapp.loop import ControlOutcome, GrantLease, Inputs, RevokeLease, SendControl, step
from xapp.state import LeaseLedger, XappStore

WARMUP_PERIODS = 3          # codec compiles, first envelopes and their ACKs, the first grants: not timed
HEADROOM = 0.5              # a replica is sized to use half its core on the loop (REST, SubMgr, GC, bursts)
REGION_SITES = 1000
ROOT = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sites", default="10,100,1000", help="comma-separated site counts (one node a site)")
    parser.add_argument("--cells-per-node", type=int, default=4)
    parser.add_argument("--periods", type=int, default=20, help="timed KPM periods per row (after 3 warm-up ones)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--redis", default="127.0.0.1:6379",
                        help="the SDL ledger's Redis (host:port); 'none' or no answer: the embedded store")
    parser.add_argument("--handover", action=argparse.BooleanOptionalAction, default=True,
                        help="also run weaver up --xapp-replicas 3 --fault replica-kill (about a minute)")
    parser.add_argument("--handover-duration", type=int, default=30)
    parser.add_argument("--sessions", default="10,100,300",
                        help="site counts for the live broker stage: a real LeaseBroker (gRPC) granting at the KPM "
                             "period to that many agents of agent.loadmodel (the agent's real lease client and "
                             "enforcer, a work model for torch) in the agent venv; 'none' skips it")
    parser.add_argument("--sessions-seconds", type=float, default=5.0, help="live seconds a sessions row")
    parser.add_argument("--tier-sites", default="300,1000",
                        help="comma-separated site counts for the cross-site tier rows (agent.tierregion), or 'none'")
    parser.add_argument("--quick", action="store_true",
                        help="sites 10,100, 5 periods, no hand-over, sessions or tier rows (CI smoke)")
    parser.add_argument("--json", default=None, help="write results as JSON to this file")
    parser.add_argument("--plot", default=None, help="write a PNG of the scaling curves to this file")


def parse_sites(text: str) -> list[int]:
    try:
        sites = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"weaver bench scale: --sites {text!r}: comma-separated whole numbers, e.g. 10,100,1000") \
            from None
    if not sites or sites[0] < 1 or sites[-1] > 20000:
        raise SystemExit(f"weaver bench scale: --sites {text!r}: each between 1 and 20000")
    return sites


@dataclass(frozen=True)
class ScaleRow:
    sites: int
    indications: int
    periods: int
    cpu_us_per_indication: float        # ingest + tick, over the row's indications
    ingest_us_per_indication: float
    tick_us_per_site: float             # step + lease decisions, per site per tick
    tick_p50_ms: float
    tick_p99_ms: float
    tick_max_ms: float
    lease_decisions: int                # grants + revokes performed (LeaseBroker, stream message, ledger write)
    lease_decisions_per_s: float        # per CPU second of the lease-decision path alone
    ledger_us_per_decision: float
    controls_encoded: int
    memory_kib_per_site: float
    sites_per_core: float               # sites one core serves at the KPM period, all of the core


WALL0 = 1_800_000_000.0     # the offline rows' wall clock at loop time 0


class BrokerSide:
    """The deployed broker without a socket: `xapp.broker.LeaseBroker` with every site's session opened as an
    admitted Register opens it, grants and revokes performed as `XappApp._perform` does, the ledger hook and
    end-of-tick write as `XappApp._ledger`/`tick` do them, and the queued stream messages serialized as the
    session writer serializes them."""

    def __init__(self, cfg: XappConfig, store: XappStore, clock: dict[str, float]) -> None:
        from xapp.broker import LeaseBroker

        book = AgentBook(epoch=1, period_ms=cfg.period_ms, valid_periods=cfg.lease_valid_periods,
                         heartbeat_ms=cfg.broker.heartbeat_ms, timeout_heartbeats=cfg.broker.agent_timeout_heartbeats)
        self.ledger = LeaseLedger(store)
        self.ledger_s = 0.0
        self.wire_bytes = 0
        self.broker = LeaseBroker(cfg, book, now=lambda: clock["now"], wall=lambda: WALL0 + clock["now"],
                                  on_lease=self._ledger)
        for s in cfg.sites:
            sid, _ = book.connect(Registration(site_id=s.site_id, agent_id=f"agent-{s.site_id}", kind="gpu",
                                               sm_count=s.gpu_sms, granularity=s.granularity, capabilities=(),
                                               mode="gpu"), now=0.0)
            self.broker.open_session(s.site_id, sid)

    def _ledger(self, issued, what: str) -> None:
        t0 = time.thread_time()
        self.ledger.add(issued.ledger_record("" if what == "granted" else "revoked"), granted=what == "granted")
        self.ledger_s += time.thread_time() - t0

    def perform(self, a: GrantLease | RevokeLease) -> None:
        if isinstance(a, GrantLease):
            self.broker.grant(a.site_id, a.sm_count, a.reason, seq=a.seq, decided_at=a.decided_at, basis=a.basis)
        else:
            self.broker.revoke(a.site_id, a.reason)

    def end_of_tick(self) -> None:
        t0 = time.thread_time()
        self.ledger.flush()
        self.ledger_s += time.thread_time() - t0
        for sess in self.broker.sessions.values():
            while not sess.out.empty():
                self.wire_bytes += len(sess.out.get_nowait().SerializeToString())


def open_ledger_store(redis: str) -> tuple[XappStore, str, callable]:
    """(store, backend named for the table, cleanup). A private namespace, removed at the end."""
    from ricxappframe.xapp_sdl import SDLWrapper

    ns = f"weaver-bench-scale-{os.getpid()}"
    if redis != "none":
        host, _, port = redis.rpartition(":")
        try:
            import redis as redis_py

            redis_py.Redis(host or "127.0.0.1", int(port or 6379), socket_timeout=1).ping()
        except Exception as exc:  # noqa: BLE001 - any failure to answer: the embedded store, said so
            print(f"weaver bench scale: no Redis at {redis} ({type(exc).__name__}); the ledger is the embedded "
                  f"in-process store", file=sys.stderr)
        else:
            saved = {k: os.environ.get(k) for k in ("DBAAS_SERVICE_HOST", "DBAAS_SERVICE_PORT")}
            os.environ["DBAAS_SERVICE_HOST"], os.environ["DBAAS_SERVICE_PORT"] = host or "127.0.0.1", port or "6379"
            try:                           # ricsdl reads DBAAS_* as the platform sets them, once, here
                store = XappStore(SDLWrapper(use_fake_sdl=False), ns, backend=f"redis {redis}")
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

            def cleanup() -> None:
                r = redis_py.Redis(host or "127.0.0.1", int(port or 6379), socket_timeout=5)
                keys = list(r.scan_iter(match=f"{{{ns}}},*", count=1000))     # ricsdl's key: "{ns},key"
                for i in range(0, len(keys), 1000):
                    r.delete(*keys[i:i + 1000])
            return store, f"redis {redis}", cleanup
    return XappStore(SDLWrapper(use_fake_sdl=True), ns, backend="embedded"), "embedded", lambda: None


def run_row(n_sites: int, cells_per_node: int, periods: int, seed: int, store: XappStore) -> ScaleRow:
    cfg = make_config(n_sites)
    recorded = record(cfg, periods + WARMUP_PERIODS, cells_per_node, seed)
    memory = memory_per_site(cfg, recorded[:WARMUP_PERIODS], cells_per_node, seed)
    state, ingest = loop_setup(cfg, decode_e2ap, {meid: sid for sid, meid, _ in recorded[0]})
    loop_clock = {"now": 0.0}
    sink = BrokerSide(cfg, store, loop_clock)
    agents = frozenset(s.site_id for s in cfg.sites)
    clock = time.thread_time
    ticks, ingest_s, lease_s, n_ind, decisions, controls = [], 0.0, 0.0, 0, 0, 0
    results: tuple[ControlOutcome, ...] = ()
    gc.collect()
    gc.freeze()
    for p, period in enumerate(recorded):
        timed = p >= WARMUP_PERIODS
        now = loop_clock["now"] = (p + 1) * PERIOD_MS / 1000.0
        t0 = clock()
        samples = tuple(ingest.indication(sub_id, meid, payload, now) for sub_id, meid, payload in period)
        t1 = clock()
        _, actions = step(state, now, Inputs(samples=samples, results=results, agents=agents))
        t2 = clock()
        leases = [a for a in actions if isinstance(a, GrantLease | RevokeLease)]
        for a in leases:
            sink.perform(a)
        sink.end_of_tick()
        t3 = clock()
        sent = [a for a in actions if isinstance(a, SendControl)]
        results = tuple(ControlOutcome(control_id=a.control_id, ok=True) for a in sent)   # ACKed by the next tick
        if timed:
            ingest_s += t1 - t0
            lease_s += t3 - t2
            ticks.append(t3 - t1)
            n_ind += len(period)
            decisions += len(leases)
            controls += len(sent)
    gc.unfreeze()
    tick = np.array(ticks) * 1000.0
    cpu_s = ingest_s + float(np.sum(ticks))
    per_site_period_s = cpu_s / (n_sites * periods)
    return ScaleRow(
        sites=n_sites, indications=n_ind, periods=periods,
        cpu_us_per_indication=cpu_s / n_ind * 1e6, ingest_us_per_indication=ingest_s / n_ind * 1e6,
        tick_us_per_site=float(np.sum(ticks)) / (n_sites * periods) * 1e6,
        tick_p50_ms=float(np.percentile(tick, 50)), tick_p99_ms=float(np.percentile(tick, 99)),
        tick_max_ms=float(tick.max()), lease_decisions=decisions,
        lease_decisions_per_s=decisions / lease_s if lease_s else 0.0,
        ledger_us_per_decision=sink.ledger_s / max(1, decisions + WARMUP_PERIODS * n_sites) * 1e6,
        controls_encoded=controls, memory_kib_per_site=memory,
        sites_per_core=PERIOD_MS / 1000.0 / per_site_period_s)


def memory_per_site(cfg: XappConfig, warmup, cells_per_node: int, seed: int) -> float:
    """KiB each site adds to a replica: the loop state, ingest tables, book and ledger bookkeeping after the
    warm-up periods (estimator windows, pending controls, leases), as the growth from a 1-site replica to an
    N-site one over N - 1 (what is held once - codec tables, caches - is not a site's)."""
    one_cfg = make_config(1)
    one_rec = record(one_cfg, len(warmup), cells_per_node, seed)
    _held_bytes(one_cfg, one_rec)            # the first pass fills the process-wide caches
    one = _held_bytes(one_cfg, one_rec)
    if len(cfg.sites) == 1:
        return one / 1024.0
    return max(0.0, _held_bytes(cfg, warmup) - one) / (len(cfg.sites) - 1) / 1024.0


def _held_bytes(cfg: XappConfig, warmup) -> int:
    from ricxappframe.xapp_sdl import SDLWrapper

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    state, ingest = loop_setup(cfg, decode_e2ap, {meid: sid for sid, meid, _ in warmup[0]})
    loop_clock = {"now": 0.0}
    sink = BrokerSide(cfg, XappStore(SDLWrapper(use_fake_sdl=True), "weaver-bench-scale-mem"), loop_clock)
    agents = frozenset(s.site_id for s in cfg.sites)
    results: tuple[ControlOutcome, ...] = ()
    for p, period in enumerate(warmup):
        now = loop_clock["now"] = (p + 1) * PERIOD_MS / 1000.0
        samples = tuple(ingest.indication(sid, meid, payload, now) for sid, meid, payload in period)
        _, actions = step(state, now, Inputs(samples=samples, results=results, agents=agents))
        for a in actions:
            if isinstance(a, GrantLease | RevokeLease):
                sink.perform(a)
        sink.end_of_tick()
        results = tuple(ControlOutcome(control_id=a.control_id, ok=True) for a in actions if isinstance(a, SendControl))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return held


SECRET_ENV = "WEAVER_BENCH_SCALE_SECRET"


def run_sessions(n_sites: int, seconds: float, cells_per_node: int, seed: int, store: XappStore) -> dict:
    """The live broker stage at `n_sites`: returns the broker's side and the agents' side, or why it did not run."""
    agent_py = ROOT / ".venv-agent" / "bin" / "python"
    if not agent_py.exists():
        return {"sites": n_sites, "ran": False, "error": f"agent venv not found at {agent_py} (scripts/bootstrap)"}
    os.environ[SECRET_ENV] = os.urandom(16).hex()       # the broker reads it; the agents make their credentials
    try:
        return asyncio.run(_sessions(n_sites, seconds, cells_per_node, seed, store, agent_py))
    finally:
        os.environ.pop(SECRET_ENV, None)


async def _sessions(n_sites: int, seconds: float, cells_per_node: int, seed: int, store: XappStore,
                    agent_py: Path) -> dict:
    from xapp.broker import LeaseBroker

    cfg = make_config(n_sites, broker={"listen": "127.0.0.1:0", "token_env": SECRET_ENV, "heartbeat_ms": 1000})
    periods = max(2, int(round(seconds * 1000 / PERIOD_MS)))
    recorded = record(cfg, periods + WARMUP_PERIODS, cells_per_node, seed)
    state, ingest = loop_setup(cfg, decode_e2ap, {meid: sid for sid, meid, _ in recorded[0]})
    book = AgentBook(epoch=1, period_ms=cfg.period_ms, valid_periods=cfg.lease_valid_periods,
                     heartbeat_ms=cfg.broker.heartbeat_ms, timeout_heartbeats=cfg.broker.agent_timeout_heartbeats)
    ledger = LeaseLedger(store)
    broker = LeaseBroker(cfg, book, on_lease=lambda issued, what: ledger.add(
        issued.ledger_record("" if what == "granted" else "revoked"), granted=what == "granted"))
    port = await broker.start("127.0.0.1:0")
    connect_budget = 10.0 + n_sites / 50.0
    with tempfile.TemporaryDirectory(prefix="weaver-scale-load-") as tmp:
        out = Path(tmp) / "load.json"
        sites = ",".join(s.site_id for s in cfg.sites)
        load = await asyncio.create_subprocess_exec(
            str(agent_py), "-m", "agent.loadmodel", "--broker", f"127.0.0.1:{port}", "--sites", sites,
            "--duration", str(connect_budget + seconds + WARMUP_PERIODS * PERIOD_MS / 1000 + 1.0),
            "--secret-env", SECRET_ENV, "--json", str(out), cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            t0 = time.monotonic()
            while len(broker.sessions) < n_sites and time.monotonic() - t0 < connect_budget:
                await asyncio.sleep(0.05)
            connected_s = time.monotonic() - t0
            connected = len(broker.sessions)
            decisions, tick_cpu, cpu0, wall0 = 0, [], time.process_time(), time.monotonic()
            grants = 0
            results: tuple[ControlOutcome, ...] = ()
            next_t = time.monotonic()
            for p, period in enumerate(recorded):
                now = time.monotonic()
                c0 = time.process_time()
                samples = tuple(ingest.indication(sid, meid, payload, now) for sid, meid, payload in period)
                _, actions = step(state, now, Inputs(samples=samples, results=results,
                                                     agents=frozenset(broker.sessions)))
                for a in actions:
                    if isinstance(a, GrantLease):
                        broker.grant(a.site_id, a.sm_count, a.reason, seq=a.seq, decided_at=a.decided_at, basis=a.basis)
                    elif isinstance(a, RevokeLease):
                        broker.revoke(a.site_id, a.reason)
                with contextlib.suppress(Exception):
                    ledger.flush()
                results = tuple(ControlOutcome(control_id=a.control_id, ok=True) for a in actions
                                if isinstance(a, SendControl))
                grants += sum(isinstance(a, GrantLease) for a in actions)      # every period: what the agents got
                if p == WARMUP_PERIODS - 1:
                    decisions, tick_cpu, cpu0, wall0 = 0, [], time.process_time(), time.monotonic()
                else:
                    decisions += sum(isinstance(a, GrantLease | RevokeLease) for a in actions)
                    tick_cpu.append(time.process_time() - c0)
                next_t += PERIOD_MS / 1000.0
                await asyncio.sleep(max(0.0, next_t - time.monotonic()))    # the gRPC writes run meanwhile
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            reporting = sum(t.sm_ms_granted > 0 for t in book.usage_totals.values())
            refused = dict(broker.refused_usage)
            try:
                _, err = await asyncio.wait_for(load.communicate(), timeout=connect_budget + seconds + 60)
            except TimeoutError:
                err = b"agent.loadmodel did not end in time"
        finally:
            if load.returncode is None:
                load.kill()
                await load.wait()
            await broker.stop(grace=0.5)
        agents = json.loads(out.read_text()) if out.exists() else None
    if agents is None:
        return {"sites": n_sites, "ran": False, "error": (err or b"").decode(errors="replace")[-600:]}
    return {"sites": n_sites, "ran": True, "sessions_connected": connected, "all_connected_s": connected_s,
            "live_s": wall, "lease_decisions": decisions, "leases_granted_whole_run": grants,
            "broker_process_cpu_fraction_of_a_core": cpu / wall if wall else None,
            "broker_cpu_us_per_lease_decision": cpu / decisions * 1e6 if decisions else None,
            "tick_cpu_p99_ms": float(np.percentile(np.array(tick_cpu) * 1e3, 99)) if tick_cpu else None,
            "sites_with_usage_accepted": reporting, "usage_reports_refused": refused,
            "releases_received": broker.released,
            "agents": agents}


def run_handover(duration: int) -> dict:
    """A live `weaver up --xapp-replicas 3 --fault replica-kill`: its replicas section and ground truth."""
    with tempfile.TemporaryDirectory(prefix="weaver-scale-") as tmp:
        out = Path(tmp) / "up.json"
        cmd = [sys.executable, "-m", "testbed.cli", "up", "--guard", "56", "--duration", str(duration),
               "--xapp-replicas", "3", "--fault", "replica-kill", "--fault-at", str(max(8, duration * 2 // 5)),
               "--json", str(out), "--run-dir", str(Path(tmp) / "run")]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=duration + 400)
        if proc.returncode != 0 or not out.exists():
            return {"ran": False, "command": " ".join(cmd[2:]), "rc": proc.returncode,
                    "error": (proc.stderr or proc.stdout)[-800:]}
        s = json.loads(out.read_text())
    rep, fault = s.get("replicas", {}), (s.get("faults") or [{}])[0]
    served = {site: rep.get("served_again_s", {}).get(site) for site in fault.get("sites", [])}
    known = [v for v in served.values() if v is not None]
    return {"ran": True, "command": "weaver " + " ".join(cmd[3:-4]), "wall_s": time.perf_counter() - t0,
            "killed_replica_sites": fault.get("sites", []), "served_again_s_by_site": served,
            "served_again_s_max": max(known) if known else None,
            "sites_never_served_again": [k for k, v in served.items() if v is None],
            "lease_epoch_overlaps": len(rep.get("lease_epoch_overlaps", [])),
            "ledger_leases": rep.get("ledger_leases"),
            "training_caused_misses": s.get("totals", {}).get("deadline_misses_attributable_to_training")}


def run_tier(sites: int, rounds: int = 2) -> dict:
    """`python -m agent.tierregion` (agent venv): a region's sites in one gated Lighthouse's quorums."""
    from testbed.cli import agent_python

    cmd = [str(agent_python()), "-m", "agent.tierregion", "--sites", str(sites), "--rounds", str(rounds)]
    budget = 120 + rounds * 40 + sites // 5
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return {"ran": False, "sites": sites, "error": f"no answer within {budget} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"ran": False, "sites": sites, "rc": proc.returncode, "error": (proc.stderr or proc.stdout)[-800:]}
    return {"ran": True, **json.loads(lines[-1])}


def capacity(rows: list[ScaleRow], sessions: list[dict] = ()) -> dict:
    """Sites a replica serves with HEADROOM of a core: from the loop alone (the largest offline row), and,
    where the live broker stage ran, from the broker process's measured CPU (loop + gRPC streams) at its
    largest row that kept up; the smaller of the two is the replica's capacity."""
    big = rows[-1]
    loop_only = math.floor(big.sites_per_core * HEADROOM)
    # a row counts only if it kept up: every lease reached its agent before its hard end (an overloaded host
    # - the broker and the load model share it - inflates the CPU a decision costs)
    live = [r for r in sessions if r.get("ran") and r.get("broker_process_cpu_fraction_of_a_core")
            and r["agents"]["leases_received_past_hard_end"] == 0]
    with_broker = None
    if live:
        r = max(live, key=lambda r: r["sites"])
        with_broker = math.floor(HEADROOM / (r["broker_process_cpu_fraction_of_a_core"] / r["sites"]))
    per_replica = min(x for x in (loop_only, with_broker) if x is not None)
    return {"from_row_sites": big.sites, "sites_per_core_at_full_load": big.sites_per_core,
            "headroom_fraction_of_core_for_the_loop": HEADROOM, "sites_per_replica_loop_only": loop_only,
            "sites_per_replica_with_broker": with_broker,
            "with_broker_from_sessions_row": max(r["sites"] for r in live) if live else None,
            "sites_per_replica": per_replica, "region_sites": REGION_SITES,
            "replicas_for_region": math.ceil(REGION_SITES / per_replica) if per_replica else None,
            "indications_per_s_per_replica": per_replica * 1000.0 / PERIOD_MS}


def write_plot(rows: list[ScaleRow], base: ScaleRow, path: str, handover: dict | None, sessions: list[dict] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r.sites for r in rows]
    live = [r for r in sessions if r.get("ran")]
    fig, ax = plt.subplots(2, 3 if live else 2, figsize=(15 if live else 10, 7))
    ax[0, 0].plot(n, [r.cpu_us_per_indication for r in rows], "o-", label="total")
    ax[0, 0].plot(n, [r.ingest_us_per_indication for r in rows], "s--", label="ingest")
    ax[0, 0].plot(n, [r.tick_us_per_site for r in rows], "^--", label="tick per site")
    ax[0, 0].set(title="CPU per indication (one core)", ylabel="µs")
    ax[0, 0].legend()
    ax[0, 1].plot(n, [r.tick_p99_ms for r in rows], "o-", label="tick p99")
    ax[0, 1].plot(n, [r.tick_p50_ms for r in rows], "s--", label="tick p50")
    ax[0, 1].axhline(PERIOD_MS, color="red", lw=0.8, label=f"KPM period {PERIOD_MS} ms")
    ax[0, 1].set(title="loop tick (step + lease decisions)", ylabel="ms", yscale="log")
    ax[0, 1].legend()
    ax[1, 0].plot(n, [r.memory_kib_per_site for r in rows], "o-")
    ax[1, 0].set(title="memory per site", ylabel="KiB")
    ax[1, 1].plot(n, [r.lease_decisions_per_s for r in rows], "o-")
    ax[1, 1].set(title="lease decisions / CPU s (book + stream + ledger)", ylabel="/s")
    if live:
        m = [r["sites"] for r in live]
        ax[0, 2].plot(m, [r["agents"]["lease_delivery_ms_p99"] for r in live], "o-", label="p99")
        ax[0, 2].plot(m, [r["agents"]["lease_delivery_ms_p50"] for r in live], "s--", label="p50")
        ax[0, 2].axhline(PERIOD_MS * 3, color="red", lw=0.8, label="lease validity (3 periods)")
        ax[0, 2].set(title="live broker: lease decision -> agent receipt", ylabel="ms", yscale="log")
        ax[0, 2].legend()
        ax[1, 2].plot(m, [r["broker_process_cpu_fraction_of_a_core"] for r in live], "o-", label="broker process")
        ax[1, 2].plot(n, [r.cpu_us_per_indication * r.sites * 1000 / PERIOD_MS / 1e6 for r in rows], "s--",
                      label="loop alone (offline)")
        ax[1, 2].axhline(HEADROOM, color="red", lw=0.8, label=f"{HEADROOM:.0%} of a core")
        ax[1, 2].set(title="CPU of one replica (cores)", ylabel="cores", yscale="log")
        ax[1, 2].legend()
    for a in ax.flat:
        a.set(xscale="log", xlabel="sites on one replica")
        a.grid(alpha=0.3)
    title = f"weaver bench scale (baseline: {base.sites} sites)"
    if handover and handover.get("ran"):
        title += (f"; replica kill: served again in {handover['served_again_s_max']:.1f} s, "
                  f"{handover['training_caused_misses']} training-caused misses")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> int:
    sites = [10, 100] if args.quick else parse_sites(args.sites)
    periods = 5 if args.quick else args.periods
    tier_sites = [] if args.quick or args.tier_sites == "none" else parse_sites(args.tier_sites)
    if tier_sites and tier_sites[-1] > 2000:
        raise SystemExit(f"weaver bench scale: --tier-sites {args.tier_sites!r}: at most 2000 (one process holds "
                         f"every site's tier member)")
    if periods < 1:
        raise SystemExit(f"weaver bench scale: --periods {periods}: at least 1")
    if args.cells_per_node < 1:
        raise SystemExit(f"weaver bench scale: --cells-per-node {args.cells_per_node}: at least 1")
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {min(cores)})    # "per core": one core, honestly
    store, backend, cleanup = open_ledger_store(args.redis)
    rows = []
    try:
        for n in sites:
            t0 = time.perf_counter()
            rows.append(run_row(n, args.cells_per_node, periods, args.seed, store))
            print(f"  {n} sites: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    finally:
        cleanup()
        with contextlib.suppress(AttributeError, OSError, TypeError):
            os.sched_setaffinity(0, cores)       # the live hand-over run gets the host's cores
    session_sites = [] if args.quick or args.sessions == "none" else parse_sites(args.sessions)
    store2, _, cleanup2 = open_ledger_store(args.redis) if session_sites else (None, None, lambda: None)
    sessions = []
    try:
        for n in session_sites:
            t0 = time.perf_counter()
            sessions.append(run_sessions(n, args.sessions_seconds, args.cells_per_node, args.seed, store2))
            print(f"  sessions {n}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    finally:
        cleanup2()
    tier = []
    for n in tier_sites:
        t0 = time.perf_counter()
        tier.append(run_tier(n))
        print(f"  tier {n}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    handover = run_handover(args.handover_duration) if args.handover and not args.quick else None
    cap = capacity(rows, sessions)
    base = rows[0]

    print(f"\nweaver bench scale: one replica on one core, {args.cells_per_node} cells a node, KPM every {PERIOD_MS} ms, "
          f"{periods} periods a row; ledger: {backend}\n")
    print(f"{'sites':>6} {'µs/ind':>7} {'x base':>6} {'ingest':>7} {'tick/site':>9} {'tick p50':>9} {'tick p99':>9}"
          f" {'KiB/site':>8} {'x base':>6} {'leases/s':>9} {'ledger µs':>9} {'sites/core':>10}")
    for r in rows:
        print(f"{r.sites:6d} {r.cpu_us_per_indication:7.1f} {r.cpu_us_per_indication / base.cpu_us_per_indication:6.2f}"
              f" {r.ingest_us_per_indication:7.1f} {r.tick_us_per_site:9.1f} {r.tick_p50_ms:8.2f}m {r.tick_p99_ms:8.2f}m"
              f" {r.memory_kib_per_site:8.1f} {r.memory_kib_per_site / base.memory_kib_per_site:6.2f}"
              f" {r.lease_decisions_per_s:9.0f} {r.ledger_us_per_decision:9.1f} {r.sites_per_core:10.0f}")
    live = (f"; with the broker's gRPC streams (live {cap['with_broker_from_sessions_row']}-site row) "
            f"{cap['sites_per_replica_with_broker']}" if cap["sites_per_replica_with_broker"] is not None else "")
    print(f"\ncapacity ({HEADROOM:.0%} of a core): loop alone ({cap['from_row_sites']}-site row) "
          f"{cap['sites_per_replica_loop_only']} sites{live}; a replica serves {cap['sites_per_replica']} sites "
          f"({cap['indications_per_s_per_replica']:.0f} indications/s), a {REGION_SITES}-site region needs "
          f"{cap['replicas_for_region']} replicas")
    if sessions:
        print(f"\nlive broker (real gRPC LeaseBroker granting every {PERIOD_MS} ms; agent.loadmodel: the agent's lease "
              f"client + enforcer a site, one process):")
        print(f"{'sites':>6} {'connected':>9} {'in s':>6} {'decisions':>9} {'broker core':>11} {'µs/decision':>11}"
              f" {'received':>9} {'late':>5} {'delivery p50':>12} {'p99':>8} {'max':>8} {'usage sites':>11}"
              f" {'disconn':>7}")
        for r in sessions:
            if not r["ran"]:
                print(f"{r['sites']:6d} FAILED: {r['error']}")
                continue
            a = r["agents"]
            print(f"{r['sites']:6d} {r['sessions_connected']:9d} {r['all_connected_s']:6.1f} {r['lease_decisions']:9d}"
                  f" {r['broker_process_cpu_fraction_of_a_core']:11.2f} {r['broker_cpu_us_per_lease_decision'] or 0:11.0f}"
                  f" {a['leases_received']:9d} {a['leases_received_past_hard_end']:5d}"
                  f" {a['lease_delivery_ms_p50'] or 0:10.1f}ms {a['lease_delivery_ms_p99'] or 0:6.1f}ms"
                  f" {a['lease_delivery_ms_max'] or 0:6.1f}ms {r['sites_with_usage_accepted']:11d} {a['disconnects']:7d}")
    if tier:
        print("\ncross-site tier (agent.tierregion: a gated Lighthouse, every site's own egress and pass, 2 rounds):")
        print(f"{'sites':>6} {'round':>6} {'in a quorum':>11} {'quorum min':>10} {'failed':>6} {'wait p99':>9}"
              f" {'heartbeats':>10} {'failed':>6} {'gate threads':>12} {'gate cpu':>8}")
        for r in tier:
            if not r["ran"]:
                print(f"{r['sites']:6d} FAILED: {r['error']}")
                continue
            print(f"{r['sites']:6d} {r['round_ms'] / 1000:5.0f}s {r['sites_in_a_quorum']:11d}"
                  f" {r['quorum_sites_min'] or 0:10d} {r['quorum_failures']:6d} {r['quorum_wait_ms_p99'] or 0:7.0f}ms"
                  f" {r['heartbeats']:10d} {r['heartbeat_failures']:6d} {r['gate_process_threads']:12d}"
                  f" {r['gate_process_cpu_s']:7.2f}s")
    if handover is not None:
        if handover["ran"]:
            print(f"hand-over ({handover['command']}): killed replica's sites {handover['killed_replica_sites']} "
                  f"served again after max {handover['served_again_s_max']} s; never: "
                  f"{handover['sites_never_served_again']}; leases of two epochs at once: "
                  f"{handover['lease_epoch_overlaps']}; training-caused misses: {handover['training_caused_misses']}")
        else:
            print(f"hand-over run FAILED (rc {handover['rc']}): {handover['error']}", file=sys.stderr)
    if args.json:
        doc = {"bench": "scale", "kpm_period_ms": PERIOD_MS, "cells_per_node": args.cells_per_node,
               "periods_per_row": periods, "warmup_periods": WARMUP_PERIODS, "seed": args.seed,
               "ledger_backend": backend, "time_basis": "thread CPU time of one pinned core",
               "baseline": f"the {base.sites}-site row; *_vs_baseline = per-site cost at N sites / at {base.sites}",
               "rows": [{**asdict(r),
                         "cpu_per_indication_vs_baseline": r.cpu_us_per_indication / base.cpu_us_per_indication,
                         "memory_per_site_vs_baseline": r.memory_kib_per_site / base.memory_kib_per_site}
                        for r in rows],
               "capacity": cap, "handover": handover, "sessions": sessions, "tier": tier,
               "tier_note": "agent.tierregion rows: the gate's and the sites' processes share the host's cores",
               "sessions_note": "live broker rows: both processes share the host's cores (not pinned)",
               "load_average": os.getloadavg()}
        Path(args.json).write_text(json.dumps(doc, indent=2))
    if args.plot:
        write_plot(rows, base, args.plot, handover, sessions)
    failed = (handover is not None and not handover["ran"]) or any(not r["ran"] for r in [*sessions, *tier])
    return 1 if failed else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="weaver bench scale")
    add_arguments(p)
    sys.exit(run(p.parse_args()))
