"""`weaver sim`: N simulated sites (E2 nodes over the RAN model) plus the mini-RIC, standalone.

Any xApp can use it: the command prints where the SubMgr REST API, the E2 termination's RMR port,
the xApp route table (for RMR_SEED_RT) and the R-NIB (SDL namespace e2Manager) are, one
`weaver-sim: <key> <value>` line each, then `weaver-sim: ready`, and runs until SIGINT/SIGTERM.

`Simulation` is the library behind it (tests and `weaver up` use it directly):

    sim = await Simulation.start(SimConfig(n_sites=2))
    report = await sim.step()      # one reporting period: model step + KPM indications
    await sim.run(stop_event)      # paced: real time (`speed` 1.0), faster, or as fast as possible (0)
    await sim.close()

Time: the RAN model's slot is the virtual time. `step()` advances it by one period; `run()` paces
steps against the wall clock only when `speed` > 0.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from aiohttp import web
from ricxappframe.xapp_sdl import SDLWrapper

from schemas.announce import announce
from testbed.e2node.config import KPM_VERSIONS, RC_TABLES, node_configs
from testbed.e2node.measure import from_period_report
from testbed.e2node.shell import NodeShell
from testbed.faults import DEFAULT_AT_S, SIM_KINDS, FaultInjector, Targets, check_sites, parse_faults
from testbed.model import SLOT_S, CellConfig, RanModel, RealTimeClock, Scenario, SiteConfig, compile_kernels
from testbed.model.config import parse_slices
from testbed.ric.mini import MiniRic

log = logging.getLogger("weaver.sim")

NTP_UNIX_OFFSET = 2208988800  # seconds from 1900-01-01 (NTP era 0) to 1970-01-01


def ntp64(unix_s: float) -> int:
    """64-bit NTP timestamp (KPM v3 TimeStamp): seconds since 1900 in the high word, fraction low."""
    sec = int(unix_s)
    return ((sec + NTP_UNIX_OFFSET) << 32) | int((unix_s - sec) * (1 << 32))


SETUPS_AT_ONCE = 32   # E2 setups in flight while a simulation starts its nodes


@dataclass(frozen=True)
class SimConfig:
    n_sites: int = 2
    n_cells: int = 4
    scenario: str | None = None  # a named testbed.scenarios scenario instead of n_sites x n_cells
    period_ms: float | None = None  # reporting/control period (default: the scenario's, 100 ms)
    seed: int = 0
    host: str = "127.0.0.1"
    e2term_port: int = 0
    submgr_rmr_port: int = 0
    submgr_http_port: int = 0
    xapps: tuple[str, ...] = ()
    kpm_version: str = "v3.00"
    rc_table: str = "srsran"
    node_overrides: dict = field(default_factory=dict, hash=False, compare=False)  # site -> NodeConfig fields
    route_dir: str | None = None
    speed: float = 1.0  # x real time; 0 = as fast as possible
    epoch_unix: float | None = None  # wall time of slot 0 (indication timestamps); default: start time
    keepalive_s: float | None = 1.0  # E2T health-check interval towards nodes (None: never declare a node lost)
    notify_interval_s: float = 5.0  # SubMgr's pause between notification tries (xapp-frame's retryDelay)
    # site (or "*" for every site) -> "PROTECTED_SST:SD,BEST_EFFORT_SST:SD" (testbed.model.parse_slices);
    # empty: the scenario's own slices
    slices: dict = field(default_factory=dict, hash=False, compare=False)


def build_scenario(cfg: SimConfig) -> Scenario:
    """The named scenario (testbed.scenarios) or `n_sites` default sites of `n_cells` cells, with the
    slices of `cfg.slices` per site."""
    from testbed import scenarios

    overrides = {} if cfg.period_ms is None else {"period_slots": int(round(cfg.period_ms / 1000 / SLOT_S))}
    if cfg.scenario:
        sc = scenarios.get(cfg.scenario, **overrides)
    else:
        sc = Scenario("sim", f"{cfg.n_sites} sites x {cfg.n_cells} cells (weaver sim default)",
                      sites=tuple(SiteConfig(i, cells=(CellConfig(),) * cfg.n_cells) for i in range(cfg.n_sites)),
                      **overrides)
    return scenarios.with_slices(sc, cfg.slices)


class Simulation:
    def __init__(self, cfg: SimConfig, model: RanModel, ric: MiniRic, nodes: list[NodeShell]) -> None:
        self.cfg = cfg
        self.model = model
        self.ric = ric
        self.nodes = nodes
        self.epoch_unix = cfg.epoch_unix if cfg.epoch_unix is not None else time.time()
        self.periods = 0
        self.stopped: set[int] = set()  # sites taken off the air (`stop_site`)
        self.muted: set[int] = set()    # sites whose node sends no KPM for now (it still answers controls)
        # site -> unix instant: the site's last KPM report before a silence goes out at that instant (the
        # period's report held back, less than a period), then the site is muted (`revoke-mid-period`)
        self.kpm_last_at: dict[int, float] = {}
        self.kpm_last_sent: dict[int, float] = {}   # site -> unix instant that held report went out
        self._held: set[asyncio.Task] = set()

    @classmethod
    async def start(cls, cfg: SimConfig, sdl: SDLWrapper | None = None, scenario: Scenario | None = None) -> Simulation:
        scenario = scenario or build_scenario(cfg)  # `weaver up` hands in its own (archetypes, period)
        # The E2 nodes report per-slice delay from the queues (KPM DRB.RlcSduDelayDl); nothing
        # here reads the bytes-weighted histograms, which would cost a quarter of every period's time.
        model = RanModel(scenario, seed=cfg.seed, track_delay=False)
        await asyncio.to_thread(compile_kernels, scenario)  # before any E2 node has a deadline
        ric = await MiniRic.start(cfg.host, cfg.e2term_port, cfg.submgr_rmr_port, cfg.submgr_http_port,
                                  cfg.xapps, sdl, cfg.route_dir, cfg.keepalive_s, cfg.notify_interval_s)
        nodes: list[NodeShell] = []
        try:
            for nc in node_configs(scenario, cfg.kpm_version, cfg.rc_table, cfg.node_overrides):
                nodes.append(await NodeShell.open(nc, model, ric.e2term_address, cfg.host))
            # a bounded number at a time: 1,000 nodes sending E2 setup (and resending it every 0.5 s) at once
            # kept the E2 termination decoding resends, and nodes at the back of the queue timed out
            gate = asyncio.Semaphore(SETUPS_AT_ONCE)

            async def setup(n: NodeShell) -> None:
                async with gate:
                    await n.setup()
            await asyncio.gather(*(setup(n) for n in nodes))
        except BaseException:
            for n in nodes:
                await n.close()
            await ric.close()
            raise
        return cls(cfg, model, ric, nodes)

    @property
    def period_s(self) -> float:
        return self.model.scenario.period_s

    @property
    def now_s(self) -> float:
        """Virtual time: seconds of simulated RAN since slot 0."""
        return self.model.slot * SLOT_S

    def endpoints(self) -> dict[str, str]:
        return {
            "submgr": self.ric.submgr_url + "/subscriptions",
            "e2term-rmr": self.ric.e2term_address,
            "route-table": str(self.ric.route_file) if self.ric.route_file else "",
            "rnib": f"sdl namespace {self.ric.rnib_namespace}",
            "nodes": ",".join(n.meid for n in self.nodes),
        }

    async def step(self):
        """One period: the RAN model runs it, then every node reports what its subscriptions ask for."""
        start_s = self.now_s
        report = self.model.step_period()
        now_ms = self.now_s * 1000.0
        stamp = ntp64(self.epoch_unix + start_s)
        for i, node in enumerate(self.nodes):
            if i in self.stopped or i in self.muted:
                continue
            m = from_period_report(report, node.node.config.site, node.node.config.gpu_sms)
            cut = self.kpm_last_at.get(i)
            if cut is not None and time.time() + self.period_s > cut:   # the last report before the cut
                del self.kpm_last_at[i]
                self.muted.add(i)
                task = asyncio.ensure_future(self._report_at(i, node, m, now_ms, stamp, cut))
                self._held.add(task)
                task.add_done_callback(self._held.discard)
                continue
            await node.report(m, now_ms, stamp)
        self.periods += 1
        await asyncio.sleep(0)  # let controls and subscriptions in before the next period
        return report

    async def run(self, stop: asyncio.Event, max_periods: int | None = None, clock: RealTimeClock | None = None) -> None:
        """Step until `stop` is set. With `speed` > 0 each period starts when `clock` (default a
        `RealTimeClock(speed)` started now) reaches it; with speed 0 periods run back to back."""
        if clock is None and self.cfg.speed > 0:
            clock = RealTimeClock(speed=self.cfg.speed)
        first = self.model.slot
        n = 0
        while not stop.is_set() and (max_periods is None or n < max_periods):
            await self.step()
            n += 1
            if clock is not None:
                wait = clock.seconds_until_slot(self.model.slot - first)
                if wait > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), wait)
                    except TimeoutError:
                        pass

    async def stop_site(self, site: int) -> bool:
        """Take a site's E2 node off the air: its RMR endpoint closes, so its KPM stops and the E2T's
        keepalive declares it lost (R-NIB DISCONNECTED). The RAN model keeps running. False if already off."""
        if site in self.stopped:
            return False
        self.stopped.add(site)
        await self.nodes[site].close()
        return True

    async def start_site(self, site: int) -> bool:
        """Bring a stopped site's E2 node back: a new RMR endpoint and E2 setup again (its subscriptions
        are gone, as after a real reconnect). Its RC state in the RAN model is untouched. False if on air."""
        if site not in self.stopped:
            return False
        old = self.nodes[site]
        shell = await NodeShell.open(old.node.config, self.model, self.ric.e2term_address, self.cfg.host)
        self.nodes[site] = shell
        try:
            await shell.setup()
        finally:
            self.stopped.discard(site)
        return True

    async def restart_site(self, site: int, down_s: float = 0.0) -> None:
        """A node restart that loses its RC state: the node goes off the air, the RAN model forgets the
        site's envelope and quotas (the DU keeps running, unshaped), and after `down_s` the node comes
        back and does E2 setup again."""
        await self.stop_site(site)
        self.model.reset_controls(site)
        if down_s > 0:
            await asyncio.sleep(down_s)
        await self.start_site(site)

    async def _report_at(self, site: int, node: NodeShell, m, now_ms: float, stamp: int, at: float) -> None:
        await asyncio.sleep(max(at - time.time(), 0.0))
        if site not in self.stopped and self.nodes[site] is node:
            self.kpm_last_sent[site] = time.time()
            await node.report(m, now_ms, stamp)

    async def close(self) -> None:
        for t in list(self._held):
            t.cancel()
        await asyncio.gather(*self._held, return_exceptions=True)
        for i, n in enumerate(self.nodes):
            if i not in self.stopped:
                await n.close()
        await self.ric.close()


# -- the simulator's own REST API (testbed control, not an O-RAN interface) -------------------------

def build_sim_api(sim: Simulation) -> web.Application:
    """`GET /sim/v1/state` (virtual time, per-site envelope, training SMs, quotas) and
    `PUT /sim/v1/sites/{site}/training {"sms": n}`: what an agent really holds, so the model counts
    deadline misses against real leases; `POST /sim/v1/sites/{site}/stop`: take that site's E2 node off
    the air (tests of lost sites). Bad requests get 4xx JSON errors and change nothing."""

    def error(status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    async def state(request: web.Request) -> web.Response:
        m = sim.model
        sites = []
        for i, site in enumerate(m.scenario.sites):
            env = float(m.envelope[i])
            sites.append({"site": i, "meid": sim.nodes[i].meid, "gpu_sms": site.gpu_sms,
                          "envelope_sms": None if env == float("inf") else env,
                          "training_sms": float(m.training_sms[i]), "stopped": i in sim.stopped,
                          "quota_percent": (m.quota[i] * 100).round(3).tolist(),
                          # srsRAN-dialect controls: the UEs whose grants are limited (testbed.e2node.dialects)
                          "ue_grant_limits": [{"cell": int(c), "slice": int(sl), "ue": int(m.limits_dl.tag[i, c, sl]),
                                               "max_percent": round(float(m.limits_dl.cap[i, c, sl]) * 100, 3)}
                                              for c, sl in zip(*np.nonzero(m.limits_dl.tag[i] >= 0), strict=True)],
                          # oai-gnb-dialect controls: the NVS downlink slicer's reserved shares (null: not configured)
                          "nvs_reserved": [None if v != v else float(v) for v in m.nvs_reserved[i]]})
        return web.json_response({"slot": int(m.slot), "now_s": sim.now_s, "periods": sim.periods,
                                  "period_s": sim.period_s, "scenario": m.scenario.name, "sites": sites})

    async def training(request: web.Request) -> web.Response:
        try:
            site = int(request.match_info["site"])
            body = await request.json()
            sms = body["sms"]
            if isinstance(sms, bool) or not isinstance(sms, int | float):
                raise TypeError("sms must be a number")
        except (ValueError, KeyError, TypeError) as exc:
            return error(400, f"expected PUT /sim/v1/sites/<int>/training with {{\"sms\": <number>}}: {exc}")
        if not 0 <= site < sim.model.scenario.n_sites:
            return error(404, f"no site {site}")
        try:
            sim.model.set_training_sms(site, float(sms))
        except ValueError as exc:
            return error(400, str(exc))
        return web.Response(status=204)

    async def stop(request: web.Request) -> web.Response:
        try:
            site = int(request.match_info["site"])
        except ValueError:
            return error(400, "expected POST /sim/v1/sites/<int>/stop")
        if not 0 <= site < sim.model.scenario.n_sites:
            return error(404, f"no site {site}")
        stopped = await sim.stop_site(site)
        return web.json_response({"site": site, "stopped": True, "already": not stopped})

    app = web.Application(client_max_size=64 << 10)
    app.router.add_get("/sim/v1/state", state)
    app.router.add_put("/sim/v1/sites/{site}/training", training)
    app.router.add_post("/sim/v1/sites/{site}/stop", stop)
    return app


# -- CLI adapter ------------------------------------------------------------------------------------

EPILOG = """\
E2 nodes (an E2 emulator third-party OSC xApps use unchanged; docs/emulator.md):
  names      each site is a gNB-DU (gNB ID site+1, 22 bits, gNB-DU ID 1, PLMN 001/01), named as OSC's E2
             termination names it (BuildRunName.h): gnbd_001_001_000001_1, gnbd_001_001_000002_1, ...
  KPM        --kpm / --node SITE:kpm=: v3.00 (OID 1.3.6.1.4.1.53148.1.3.2.2), v2.03 (...1.2.2.2) or
             v4.00 (...1.4.2.2); RAN function ID 2. Report styles (action format N for style N):
               1 E2 node measurement (cell or node; per slice with a sliceID label)   message format 1
               2 one UE (gNB-DU-UEID)                                              message format 1
               3 condition-based, UE level (ul-rSRP/dl-rSRP/cQI tests, sliceID)    message format 2
               4 common condition, every matching UE                               message format 3
               5 a list of >= 2 UE IDs                                             message format 3
             UE-level names: RRU.PrbUsedDl/Ul, DRB.UEThpDl/Ul, DRB.RlcSduDelayDl (+ .SNSSAI). Each cell has
             --ues-per-cell UEs (F1AP IDs cell*N .. cell*N+N-1) whose values sum to the cell's.
  RC         RAN function ID 3, style 2 action 6 (slice-level PRB quota), validated as the DU of the
             ID table does it (--rc-table / --node SITE:rc=): srsran (srsRAN DU: top-level IDs in the
             table, an existing UE, min+max+dedicated present), oai-gnb (OAI gNB's positional parser,
             ASCII values), oai (FlexRIC IDs, nested layout); plus Weaver's envelope style 1000.
             What an accepted quota changes is the node's dialect's (--node SITE:dialect=, default the
             table's DU): srsran limits the grants of the one UE the header names; o-ran (the standard
             text, the default of the oai table) and oai-gnb cap the slice on every cell.
  slices     --slices [SITE=]PROTECTED_SST:SD,BEST_EFFORT_SST:SD (default 2:1,1:1: URLLC SST 2/SD 1 and
             eMBB SST 1/SD 1, the slice the srsRAN and OAI example xApps control), or a --scenario-file.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = "Simulated sites (E2 nodes over the RAN model) and the mini-RIC, standalone."
    parser.epilog = EPILOG
    parser.add_argument("--sites", type=int, default=2, help="number of sites (one E2 node each)")
    parser.add_argument("--cells", type=int, default=4, help="cells per site")
    parser.add_argument("--scenario", default=None,
                        help="named scenario of testbed.scenarios, e.g. demo, gh200-multicell (overrides --sites/--cells)")
    parser.add_argument("--period-ms", type=float, default=None,
                        help="reporting period (a multiple of the TDD pattern: 2.5 ms for DDDSU); default 100")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1", help="address every endpoint binds to and advertises")
    parser.add_argument("--e2term-port", type=int, default=38000, help="E2 termination RMR port (0: any free)")
    parser.add_argument("--submgr-port", type=int, default=8088, help="SubMgr REST port (0: any free)")
    parser.add_argument("--submgr-rmr-port", type=int, default=0)
    parser.add_argument("--api-port", type=int, default=0, help="the simulator's own REST API (0: any free)")
    parser.add_argument("--xapp", action="append", default=[], metavar="HOST:PORT",
                        help="an xApp RMR endpoint to route control ACK/FAILURE and error indications to")
    parser.add_argument("--kpm", choices=KPM_VERSIONS, default="v3.00", help="KPM version of every node")
    parser.add_argument("--slices", action="append", default=[], metavar="[SITE=]SST:SD,SST:SD",
                        help="S-NSSAIs of the protected and the best-effort slice, for every site or SITE "
                             "(repeatable; default 2:1,1:1)")
    parser.add_argument("--ues-per-cell", type=int, default=4, help="UEs per cell of the per-UE view (styles 2-5)")
    parser.add_argument("--scenario-file", default=None, metavar="FILE.json",
                        help='per-site settings: {"slices": {"*": "2:1,1:1", "1": "2:1,1:5"}, '
                             '"nodes": {"1": "kpm=v4.00,rc=oai-gnb"}}')
    parser.add_argument("--rc-table", choices=RC_TABLES, default="srsran", help="RC parameter-ID table")
    parser.add_argument("--node", action="append", default=[], metavar="SITE:kpm=v2.03,rc=oai",
                        help="per-node override of the KPM version, RC table, dialect, KPM profile and/or UEs "
                             "per cell (dialect=srsran|oai-gnb|o-ran; profile=compute-aware|gpu|standard; standard: a "
                             "stock gNB's 3GPP counters; ues=N; sub_ms=, control_ms=: answer delays) (repeatable)")
    parser.add_argument("--speed", type=float, default=1.0, help="x real time; 0 = as fast as possible")
    parser.add_argument("--route-dir", default=None, help="where to write xapp.rt (default: a temp dir)")
    parser.add_argument("--redis", default=None, metavar="HOST:PORT",
                        help="R-NIB in this Redis (default: DBAAS_SERVICE_HOST/PORT if set, else embedded)")
    parser.add_argument("--json", default=None, help="also write the endpoints as JSON to this file")
    parser.add_argument("--fault", action="append", default=[], metavar="KIND[:param=value,...]",
                        help="inject a node-side fault (repeatable): ack-delay, ack-loss, ack-dup, ack-reorder, "
                             "node-restart, node-lost (params: testbed/faults.py)")
    parser.add_argument("--fault-at", type=float, default=DEFAULT_AT_S, metavar="SECONDS",
                        help=f"start of every fault that names no at=, in seconds after ready (default {DEFAULT_AT_S:g})")


def _sdl_from(args) -> SDLWrapper:
    if args.redis:
        host, _, port = args.redis.rpartition(":")
        os.environ["DBAAS_SERVICE_HOST"], os.environ["DBAAS_SERVICE_PORT"] = host, port
    if os.environ.get("DBAAS_SERVICE_HOST"):
        return SDLWrapper()
    print("weaver-sim: note R-NIB in an embedded in-process store (set --redis or DBAAS_* to share it)", flush=True)
    return SDLWrapper(use_fake_sdl=True)


def parse_node_overrides(specs: list[str]) -> dict[int, dict]:
    """`["1:kpm=v2.03,rc=oai"]` -> {1: {"kpm_version": "v2.03", "rc_table": "oai"}}; ValueError if malformed."""
    keys = {"kpm": "kpm_version", "rc": "rc_table", "dialect": "dialect", "profile": "kpm_profile",
            "ues": "ues_per_cell", "sub_ms": "subscription_delay_ms", "control_ms": "control_delay_ms"}
    numbers = {"ues": int, "sub_ms": float, "control_ms": float}
    out: dict[int, dict] = {}
    for spec in specs:
        site, sep, rest = spec.partition(":")
        if not sep or not site.isdigit():
            raise ValueError(f"--node {spec!r}: expected SITE:kpm=...,rc=...")
        fields = out.setdefault(int(site), {})
        for item in filter(None, rest.split(",")):
            k, eq, v = item.partition("=")
            if not eq or k not in keys:
                raise ValueError(f"--node {spec!r}: unknown setting {item!r} "
                                 "(kpm=..., rc=..., dialect=..., profile=..., ues=..., sub_ms=..., control_ms=...)")
            try:
                fields[keys[k]] = numbers[k](v) if k in numbers else v
            except ValueError:
                raise ValueError(f"--node {spec!r}: {k} must be a number, got {v!r}") from None
    return out


def parse_slice_specs(specs: list[str]) -> dict:
    """`["2:1,1:1", "1=2:1,1:5"]` -> {"*": "2:1,1:1", 1: "2:1,1:5"}; ValueError if malformed."""
    out: dict = {}
    for spec in specs:
        site, eq, rest = spec.partition("=")
        if eq and not site.isdigit():
            raise ValueError(f"--slices {spec!r}: expected [SITE=]SST:SD,SST:SD")
        key, value = (int(site), rest) if eq else ("*", spec)
        parse_slices(value)
        out[key] = value
    return out


def read_scenario_file(path: str) -> tuple[dict, list[str]]:
    """The slices and --node specs of a scenario file (see --scenario-file)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--scenario-file {path}: {exc}") from exc
    if not isinstance(data, dict) or set(data) - {"slices", "nodes"}:
        raise ValueError(f"--scenario-file {path}: expected an object with 'slices' and/or 'nodes'")
    slices = [v if k == "*" else f"{k}={v}" for k, v in dict(data.get("slices", {})).items()]
    nodes = [f"{k}:{v}" for k, v in dict(data.get("nodes", {})).items()]
    return parse_slice_specs(slices), nodes


async def _main(args) -> int:
    own_dir = args.route_dir is None
    route_dir = args.route_dir or tempfile.mkdtemp(prefix="weaver-sim-")
    try:
        return await _serve(args, route_dir)
    finally:
        if own_dir:
            shutil.rmtree(route_dir, ignore_errors=True)


async def _serve(args, route_dir: str) -> int:
    cfg = SimConfig(n_sites=args.sites, n_cells=args.cells, scenario=args.scenario, period_ms=args.period_ms,
                    seed=args.seed, host=args.host,
                    e2term_port=args.e2term_port, submgr_http_port=args.submgr_port,
                    submgr_rmr_port=args.submgr_rmr_port, xapps=tuple(args.xapp), kpm_version=args.kpm,
                    rc_table=args.rc_table, route_dir=route_dir, speed=args.speed)
    try:
        file_slices, file_nodes = read_scenario_file(args.scenario_file) if args.scenario_file else ({}, [])
        slices = {"*": "2:1,1:1", **file_slices, **parse_slice_specs(args.slices)}
        overrides = parse_node_overrides(file_nodes + args.node)
        for site in range(build_scenario(replace(cfg, slices=slices)).n_sites):
            overrides.setdefault(site, {}).setdefault("ues_per_cell", args.ues_per_cell)
        cfg = replace(cfg, node_overrides=overrides, slices=slices)
        faults = parse_faults(args.fault, args.fault_at)
        check_sites(faults, build_scenario(cfg).n_sites, allowed=SIM_KINDS)
        sim = await Simulation.start(cfg, _sdl_from(args))
    except (ValueError, TypeError) as exc:  # ModelConfigError / NodeConfigError: a bad scenario or node setting
        print(f"weaver sim: {exc}", file=sys.stderr)
        return 2
    api = web.AppRunner(build_sim_api(sim), access_log=None)
    await api.setup()
    api_site = web.TCPSite(api, args.host, args.api_port)
    await api_site.start()
    api_port = api_site._server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        eps = {**sim.endpoints(), "sim-api": f"http://{args.host}:{api_port}/sim/v1"}
        for key, value in eps.items():
            announce(f"weaver-sim: {key} {value}")
        if args.json:
            Path(args.json).write_text(json.dumps(eps, indent=2))
        announce("weaver-sim: ready")
        injector = FaultInjector(faults, Targets(sim=sim), args.fault_at)
        injector.start()
        try:
            await sim.run(stop)
        finally:
            await injector.close()
        for e in injector.timeline:
            announce(f"weaver-sim: fault {json.dumps(e)}")
    finally:
        await api.cleanup()
        await sim.close()
    print(f"weaver-sim: stopped after {sim.periods} periods ({sim.now_s:.1f} s simulated)", flush=True)
    return 0


def run(args) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        return asyncio.run(_main(args))
    except OSError as exc:
        print(f"weaver sim: {exc}", file=sys.stderr)
        return 2
