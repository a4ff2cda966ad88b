"""`weaver up`: the whole system on one machine, on the embedded defaults.

What runs, and over which interface (nothing is short-circuited):
- the testbed world, in this process: the RAN + GPU model, one E2 node per site and the mini-RIC (E2
  termination over RMR, SubMgr REST, R-NIB), paced at real time (`testbed.sim.Simulation`);
- the xApp, as its own process (`python -m xapp`, the xApp venv): subscribes over SubMgr REST, takes KPM
  over RMR, sends RC control, grants leases over gRPC, serves the REST API and the dashboard;
- one agent per site, as its own process (`weaver-agent run`, the agent venv): trains the shipped model
  on CPU (GPU when present) strictly inside its leases;
- a torchft Lighthouse (`python -m agent.crosssite.lighthouse`, the agent venv) for the cross-site tier:
  its address and the round length go into the xApp's `broker` config, the xApp publishes them in the
  lease stream, and the agents train in time-boxed rounds combined across sites (`--no-cross-site`:
  each site trains alone). Their transfer windows and round reports show in the xApp's REST API.

What the RAN must live with is what each agent process really executes, measured by the platform
(`testbed.groundtruth`: the process's CPU time from /proc, per world period, at the broker's CPU-agent
scale gpu_sms / cores): that is what the model charges against the RAN's demand and what training-caused
misses are counted from. The first period waits until every agent is connected (its start-up, e.g. the
warm-up before it connects, is reported as ground_truth.startup_cpu_s). The lease each agent reports
holding (its AgentInspect service) is kept beside it (`sm_seconds_held_by_agent`), and the difference is
reported (`sm_ms_beyond_lease`). The run makes a fresh broker secret (only the xApp's environment holds
it) and hands each agent its own site's credential (`xapp.agents.site_credential`, in WEAVER_AGENT_TOKEN),
so an agent can register only as its site. Each agent dials the lease broker through its own TCP proxy
(`testbed.tcpproxy`), where the network faults act; `--fault` (`testbed.faults`) injects faults into the
real processes and the real wire. Ctrl-C (or `--duration`) stops the xApp first (it revokes every lease),
then the agents, all at once (each finishes its round and writes a checkpoint), then the Lighthouse, then
the world, and leaves no process behind. `--json FILE` writes the run summary (measures named as in
architecture.md), with the fault timeline. `--agents-model` runs the control plane with model agents instead
(up to 1,000 sites; `testbed.upmodel`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from agent.crosssite.lighthouse import gate_connections_for
from testbed import scenarios as named
from testbed.cli import agent_python
from testbed.e2node.config import node_configs
from testbed.e2node.functions import kpm_oid
from testbed.e2node.measure import measurements_for
from testbed.faults import (
    DEFAULT_AT_S,
    Fault,
    FaultInjector,
    RevokeMidPeriod,
    Targets,
    agent_env,
    check_sites,
)
from testbed.groundtruth import AgentTruth, CpuTrace, rate_before
from testbed.model import CellConfig, Scenario, SiteConfig
from testbed.procs import ChildFailed, Supervisor
from xapp import waterfall
from xapp.inputs import POLICY_INPUTS

ROOT = Path(__file__).resolve().parent.parent
ARCHETYPES = ("residential", "business", "transport", "entertainment", "mixed")
PHASES_H = (0.0, -9.0, -2.0, -5.0, -12.0)


REDIS = ("127.0.0.1", 6379)   # the host's Redis, as `make test` provides it: the testbed's stand-in for DBaaS


def run_sdl() -> tuple[dict[str, str], str]:
    """The xApp's SDL for this run: (env, namespace). When a Redis answers on the host it is the RIC's DBaaS
    here, with a namespace of this run's own, so the xApp's epoch, leases and ledger survive its restart (an
    `xapp-kill` fault) as on a RIC; otherwise ({}, "") and the embedded in-process store (a restarted xApp
    starts from epoch 1 with an empty ledger, and the start-up line says so)."""
    import redis
    try:
        redis.Redis(*REDIS, socket_timeout=0.5, socket_connect_timeout=0.5).ping()
    except (redis.RedisError, OSError):
        return {}, ""
    return {"DBAAS_SERVICE_HOST": REDIS[0], "DBAAS_SERVICE_PORT": str(REDIS[1])}, f"weaver-up-{secrets.token_hex(4)}"


def drop_sdl_namespace(namespace: str) -> int:
    """Remove this run's keys (ricsdl keeps them as `{namespace},key`); the run touches no other key."""
    import redis
    r = redis.Redis(*REDIS, socket_timeout=2)
    keys = list(r.scan_iter(match="{" + namespace + "},*", count=1000))
    if keys:
        r.delete(*keys)
    return len(keys)


SHARDS_PER_REPLICA = 4     # --xapp-replicas N: 4N shards of sites (xapp.shards)
PROXY_FAULTS = ("slow-reader", "partition", "xapp-kill")


def check_replicas(cfg: UpConfig, out) -> UpConfig:
    """--xapp-replicas N > 1: the cross-site tier is off (its passes are per broker epoch, and each replica
    has its own). The faults it cannot take are refused by UpConfig itself."""
    if cfg.cross_site:
        out("weaver up: replicas: the cross-site tier is off (each replica's broker has its own epoch, and one "
            "Lighthouse takes one epoch's passes)")
        cfg = replace(cfg, cross_site=False)
    return cfg


def xapp_names(sup) -> list[str]:
    return [c.name for c in sup.children if c.name == "xapp" or c.name.startswith("xapp:")]


async def _replica_sites_docs(rests: list[str], timeout: float = 2.0) -> list:
    """GET /api/v1/sites of each replica, in order: its site views, or the exception of one that does not answer."""
    out: list = []
    for rest in rests:
        try:
            out.append((await rest_get(f"{rest}/api/v1/sites", timeout))["sites"])
        except Exception as exc:  # noqa: BLE001 - a dead replica
            out.append(exc)
    return out


async def xapp_sites(rests: list[str], strict: bool = False, timeout: float = 2.0) -> dict:
    """site id -> the xApp's view of it, from the replica that controls it (`controlled`), else the first
    replica that answered; a replica that does not answer (killed) is skipped unless it is the only one."""
    views: dict = {}
    docs = await _replica_sites_docs(rests, timeout)
    for doc in docs:
        for s in doc if isinstance(doc, list) else ():
            if s["site_id"] not in views or (s.get("controlled", True) and not views[s["site_id"]].get("controlled", True)):
                views[s["site_id"]] = s
    errors = [d for d in docs if isinstance(d, Exception)]
    if strict and not views and errors:
        raise errors[0]
    return views


async def replica_sites(sup, rests: list[str]) -> dict[str, list[str]]:
    """Each answering replica's process name -> the sites it controls now (the replica-kill fault)."""
    docs = await _replica_sites_docs(rests)
    return {name: [s["site_id"] for s in doc if s.get("controlled")]
            for name, doc in zip(xapp_names(sup), docs, strict=False) if isinstance(doc, list)}


def ledger_check(namespace: str, kills: list[dict] = ()) -> dict:
    """The SDL lease ledger of a replicated run, read before the namespace is removed: every lease each replica
    issued (epoch, issue, hard end) and `lease_epoch_overlaps` (testbed.groundtruth); for each replica-kill,
    how long its sites went without a new lease (`served_again_s`: kill -> the first lease of another epoch than
    the killed owner's, which the ledger keeps as the first of its owner's takeover; the dead replica's own last
    grant may be stamped just after the kill, when SIGKILL lands mid-write)."""
    import msgpack
    import redis

    from testbed.groundtruth import lease_epoch_overlaps
    r = redis.Redis(*REDIS, socket_timeout=2)
    leases = []
    for key in r.scan_iter(match="{" + namespace + "},lease/*", count=1000):
        raw = r.get(key)
        if raw is not None:
            leases.append(msgpack.unpackb(raw, raw=False))
    overlaps = lease_epoch_overlaps(leases)
    epochs: dict = {}
    for rec in leases:
        epochs.setdefault(rec["site_id"], set()).add(rec["epoch"])
    served = {}
    for k in kills:
        for site in k.get("sites", ()):
            mine = [rec for rec in leases if rec["site_id"] == site]
            before = [rec for rec in mine if rec["issued_unix"] <= k["start_unix"]]
            dead = max(before, key=lambda rec: rec["issued_unix"])["epoch"] if before else None     # the owner killed
            after = [rec["issued_unix"] for rec in mine if rec["issued_unix"] > k["start_unix"]
                     and rec["epoch"] != dead]
            served[site] = round(min(after) - k["start_unix"], 3) if after else None
    return {"ledger_leases": len(leases), "epochs_by_site": {s: sorted(e) for s, e in sorted(epochs.items())},
            "lease_epoch_overlaps": overlaps, "served_again_s": served}


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, below the kernel's ephemeral range: the run's E2 nodes (1,000 with --agents-model)
    and clients bind port 0 after these are chosen and before the xApp binds them, and would take one."""
    import random
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low) if low > 2048 else 0
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    with socket.socket() as s:     # a crowded range: any free one
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class UpConfig:
    sites: int = 3
    cells: int = 4
    duration_s: float | None = None  # None: until Ctrl-C
    policy: str = "weaver"
    seed: int = 0
    period_ms: float = 100.0
    host: str = "127.0.0.1"
    rest_port: int = 0
    agent_preset: str = "tiny"
    agent_job: str = ""                       # every agent's --job ("" = the shipped char-GPT)
    agent_job_args: tuple[str, ...] = ()      # and its --job-arg k=v values
    run_dir: Path | None = None
    # The guard covers what an agent may run beyond its lease (the RAN-first sum). 0: derived from the kernel's
    # granularity (`kernel_guard_sms`), what the bound cannot hold; > 0: this many SMs (--guard).
    guard_sms: int = 0
    cross_site: bool = True
    xapp_replicas: int = 1        # > 1: that many xApp replicas sharing the sites by shard (xapp.shards; needs Redis)
    # Coarse rounds: the transfer window (15 %) and the quorum are idle compute, and 3 agents + the
    # Lighthouse share a few cores here. The Lighthouse's timeouts derive from it (heartbeat R/2, join 1.5 R).
    round_ms: int = 5000
    # the interface of the cross-site tier's gates (the Lighthouse's and each agent's); their services stay on
    # loopback. "" = `host`. Another loopback address (127.0.0.2) stands for a tier network in tests
    tier_host: str = ""
    faults: tuple[Fault, ...] = ()
    fault_at_s: float = DEFAULT_AT_S
    record_series: bool = False   # keep per-period ground truth and the xApp's lease view (weaver bench safety)
    # The cores each CPU stand-in agent's whole site GPU stands for; 0 = what this host can serve each agent
    # (`agent_cores_for`). 1 core each on a host with a core per agent and half one to spare; on the 2-core CI
    # machine 3 agents get 0.5 each, so the run measures Weaver and not three agents queueing for 2 cores.
    agent_cores: float = 0.0
    # > 0: for this long the E2 nodes send no KPM (the model runs, controls are answered), so the xApp,
    # without fresh measurements, grants nothing and the agents' idle baseline (connected, no lease) is
    # measured; then KPM flows, the xApp starts granting as at any start, and the faults' clock starts
    idle_probe_s: float = 0.0
    record: Path | None = None    # weaver-xapp --record: every loop step, for testbed.bench.replay
    # The load regime (`known_scenarios`): "demo", `sites` archetype sites of `cells` cells, or a regime that
    # `weaver bench` claims, built as the bench builds it (GPU size, cells, loads, slices) at this run's
    # period; `sites`/`cells` are then the scenario's own (`for_scenario` fills them in; others are refused)
    scenario: str = "demo"
    # a `weaver sim --scenario-file`'s settings (`--scenario-file`): site or "*" -> slices spec, in place of
    # the scenario's slices, and site -> NodeConfig fields (KPM version, RC table, KPM profile, UEs per cell)
    slices: dict = field(default_factory=dict, hash=False, compare=False)
    node_overrides: dict = field(default_factory=dict, hash=False, compare=False)
    scenario_file: Path | None = None   # where those came from (named in the summary)
    # --agents-model: every site's agent is the lease protocol with a work model (agent.loadmodel, many sites
    # a process) in place of a training process, so that the control plane meets a region's sessions
    # (testbed.upmodel); up to MAX_MODEL_SITES sites, and every named scenario
    agents_model: bool = False

    @classmethod
    def for_scenario(cls, scenario: str = "demo", **kw) -> UpConfig:
        """A config on `scenario`; a named one's sites and cells unless `kw` gives them (demo: the defaults)."""
        if scenario != "demo" and scenario in named.SCENARIOS:
            own = named.get(scenario)
            kw.setdefault("sites", own.n_sites)
            kw.setdefault("cells", own.n_cells)
        return cls(scenario=scenario, **kw)

    def __post_init__(self) -> None:
        check_scenario(self.scenario, self.agents_model)
        if self.scenario != "demo":
            own = named.get(self.scenario)
            if (self.sites, self.cells) != (own.n_sites, own.n_cells):
                raise ValueError(f"--sites/--cells apply to --scenario demo only: {self.scenario} is "
                                 f"{own.n_sites} sites x {own.n_cells} cells")
        most = MAX_MODEL_SITES if self.agents_model else MAX_SITES
        if not 1 <= self.sites <= most:
            more = "" if self.agents_model else f" (an agent process a site; --agents-model: up to {MAX_MODEL_SITES})"
            raise ValueError(f"--sites must be 1..{most}{more}, got {self.sites}")
        bad = [f.kind for f in self.faults if f.kind not in MODEL_FAULTS] if self.agents_model else []
        if bad:
            raise ValueError(f"--fault {bad[0]}: not available with --agents-model (the model agents have no "
                             f"process or proxy of their own); these are: {', '.join(MODEL_FAULTS)}")
        if not 1 <= self.cells <= 16:
            raise ValueError(f"--cells must be 1..16, got {self.cells}")
        if not 1 <= self.xapp_replicas <= 16:
            raise ValueError(f"--xapp-replicas {self.xapp_replicas}: 1..16 on one host")
        # the agents dial every replica's broker directly (a redirect names one of them, and an agent follows
        # it only to an address it was given): the proxy faults have no proxy to act on
        bad = [f.kind for f in self.faults if f.kind in PROXY_FAULTS] if self.xapp_replicas > 1 else []
        if bad:
            raise ValueError(f"--fault {bad[0]}: not available with --xapp-replicas (use replica-kill)")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("--duration must be positive")
        if self.tier_host:
            import ipaddress
            try:
                ipaddress.ip_address(self.tier_host)
            except ValueError:
                raise ValueError(f"--tier-host must be an IP address, got {self.tier_host!r}") from None
        if not 200 <= self.round_ms <= 600_000:
            raise ValueError(f"--round-ms must be 200..600000, got {self.round_ms}")
        check_sites(self.faults, self.sites)
        if not (self.agent_cores == 0 or 0.05 <= self.agent_cores <= 64):
            raise ValueError(f"--agent-cores must be 0 (auto) or 0.05..64, got {self.agent_cores}")
        # the period, the file's slices and node settings, checked now rather than once the world starts
        sc = scenario_for(self)
        unknown = sorted(k for k in self.node_overrides if not (isinstance(k, int) and 0 <= k < sc.n_sites))
        if unknown:
            raise ValueError(f"node settings for sites {unknown}: the scenario has sites 0..{sc.n_sites - 1}")
        node_configs(sc, overrides=self.node_overrides)

    @property
    def cores_per_agent(self) -> float:
        return self.agent_cores or agent_cores_for(self.sites)


# The world (RAN model, E2 nodes, mini-RIC), the xApp and the Lighthouse: measured ~0.27 of a core together
# in a 3-site run. A stand-in of 0.5 core holds a cross-site exchange's CPU (7-20 ms) inside one period's
# budget of a typical lease (30 ms at 80 of 132 SMs); at 0.3 core (18 ms) it ran past it.
HOST_RESERVE_CORES = 0.5


def _host_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def agent_cores_for(sites: int, host_cores: int | None = None) -> float:
    """The cores a CPU stand-in can really be served on this host: what is left after the platform's own
    processes, shared by the agents, at most one each, in steps of 0.05 (at least 0.1). A GPU site has no
    such stand-in; a host with a core per agent and one to spare gives each a whole core."""
    share = ((host_cores or _host_cores()) - HOST_RESERVE_CORES) / max(1, sites)
    return 1.0 if share >= 1.0 else max(0.1, math.floor(share * 20 + 1e-9) / 20)


MAX_SITES = len(ARCHETYPES) * 4   # one agent process per site, on this one host
MAX_MODEL_SITES = 1000            # --agents-model: a region's sites, many model agents a process
MODEL_FAULTS = ("ack-delay", "ack-loss", "ack-dup", "ack-reorder", "node-restart", "node-lost", "xapp-stall",
                "replica-kill")


def known_scenarios(agents_model: bool = False) -> tuple[str, ...]:
    """What `--scenario` takes: demo and every named scenario with at most MAX_SITES sites (`scale`'s 128
    would be 128 agent processes on one host; `weaver bench policies` runs it without agents); with
    --agents-model every named scenario."""
    most = MAX_MODEL_SITES if agents_model else MAX_SITES
    return ("demo", *(n for n in named.SCENARIOS if n != "demo" and named.get(n).n_sites <= most))


def check_scenario(name: str, agents_model: bool = False) -> None:
    if name in named.SCENARIOS and name not in known_scenarios(agents_model):
        raise ValueError(f"scenario {name!r} has {named.get(name).n_sites} sites: weaver up runs one agent "
                         f"process per site, at most {MAX_SITES} (--agents-model: model agents, any named "
                         f"scenario); known: {', '.join(known_scenarios())}")
    named.check(name, known_scenarios(agents_model))


# The kernel's granularity on a confined worker (agent.confine): CFS checks a tree's quota at the scheduler
# tick on each CPU it runs on, so a metered period can hold up to one tick per CPU beyond the lease's cores
# (measured here, HZ 250: 1-6 ms beyond a 20-30 ms quota per 100 ms on 2 CPUs; pinning each stand-in to one
# CPU halved that but not the 8-20 ms single-period overshoots seen under host contention, which it made more
# frequent, and was dropped). On a GPU the partition is the
# green context's SMs exactly and one step covers rounding; a CPU stand-in's excess maps to site SMs.
KERNEL_TICK_S = 0.004


COOPERATIVE_GUARD_SMS = 32   # issue 16's guard for agents bounded by their own accounting only


def agent_confinement() -> tuple[bool, str]:
    """Whether the agents' workers can be confined on this host (agent.confine, asked in the agent venv: this
    one cannot import it), and why not. Without it `weaver up` still runs, as a demo: the agents get
    --cooperative and the guard issue 16 needed for them, and the start-up lines say so."""
    r = subprocess.run([str(agent_python()), "-c", "from agent.confine import detect; print(detect().version)"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode == 0:
        return True, f"cgroup v{r.stdout.strip()}"
    return False, (r.stderr.strip().splitlines() or ["no cgroup"])[-1].split("ConfinementError: ")[-1]


def sweep_agent_cgroups() -> str:
    """Remove the cgroup subtrees of agents that are gone without removing their own (one SIGKILLed when it
    did not stop in time): agent.confine.sweep_stale, which touches only `weaver-agent-<pid>` of dead pids.
    Returns what it removed, one path a line."""
    r = subprocess.run([str(agent_python()), "-c", "from agent.confine import detect, sweep_stale; "
                        "print('\\n'.join(map(str, sweep_stale(detect()))))"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return r.stdout.strip()


def kernel_guard_sms(gpu_sms: int, granularity: int, cores: float, period_s: float, cpus: int | None = None) -> int:
    """The guard a CPU stand-in's confined worker needs: at least one partition step, and the kernel's
    slack (a tick per CPU of its cpuset per metered period) in site SMs, rounded up to steps."""
    cpus = cpus or _host_cores()
    slack_sms = KERNEL_TICK_S * cpus / period_s * gpu_sms / cores
    return granularity * max(1, math.ceil(slack_sms / granularity - 1e-9))


def derived_guard(cfg: UpConfig, scenario: Scenario) -> int:
    """One guard for the xApp (`UpConfig.guard_sms` 0): the largest any site's confined stand-in needs."""
    return max(kernel_guard_sms(s.gpu_sms, s.granularity, cfg.cores_per_agent, scenario.period_s)
               for s in scenario.sites)


def scenario_for(cfg: UpConfig) -> Scenario:
    """demo: sites of different archetypes (and phases), so their spare capacity is complementary (at 3 x 4,
    testbed.scenarios' demo); otherwise the named scenario as `weaver bench` builds it, at the live period.
    A scenario file's slices replace the sites' own."""
    period_slots = int(round(cfg.period_ms / 0.5))
    if cfg.scenario == "demo":
        sites = tuple(SiteConfig(site_id=i, archetype=ARCHETYPES[i % len(ARCHETYPES)],
                                 cells=(CellConfig(load=0.3),) * cfg.cells, phase_h=PHASES_H[i % len(PHASES_H)])
                      for i in range(cfg.sites))
        sc = Scenario(name="demo", description=f"weaver up: {cfg.sites} sites x {cfg.cells} cells", sites=sites,
                      period_slots=period_slots, start_hour=20.0)
    else:
        sc = named.get(cfg.scenario, period_slots=period_slots)
    return named.with_slices(sc, cfg.slices)


def scenario_line(cfg: UpConfig, sc: Scenario) -> str:
    """The start-up line naming the regime the run is in."""
    gpus = sorted({s.gpu_sms for s in sc.sites})
    steps = sorted({s.granularity for s in sc.sites})
    slices = sorted({",".join(f"{s.sst}:{s.sd}" for s in site.slices) for site in sc.sites})
    return (f"weaver up: scenario   {cfg.scenario}: {sc.n_sites} sites x {sc.n_cells} cells, "
            f"{'/'.join(map(str, gpus))}-SM GPUs (step {'/'.join(map(str, steps))}), period {sc.period_s * 1000:g} ms, "
            f"{partition_note(sc)}, slices {' '.join(slices)}"
            + (f" (scenario file {cfg.scenario_file})" if cfg.scenario_file else ""))


def partition_note(sc: Scenario) -> str:
    if sc.reconfig_s == 0:
        return f"{sc.partition} (reconfiguration in microseconds)"
    return f"{sc.partition} (reconfiguration {sc.reconfig_s:g} s)"


def static_reserve_for(cfg: UpConfig, calibration_periods: int = 600) -> int:
    """The static baseline's reservation as `weaver bench policies` tunes it: the smallest multiple of the
    granularity whose per-slot exceedance on a calibration run of this scenario (another seed than the live
    run's) meets the miss target."""
    from testbed.bench.policies import TARGET, simulate
    from xapp.policy import StaticPolicy
    sc = scenario_for(cfg)
    cal = simulate(sc, cfg.seed + 1000, calibration_periods, None)
    g = sc.sites[0].granularity
    # a quiet calibration can give 0 (refused by the config floors): at least one step, at most the GPU
    return max(g, min(StaticPolicy.reservation_for(cal.demand, g, TARGET), min(s.gpu_sms for s in sc.sites)))


def agent_pythonpath(cwd: str | None = None, pythonpath: str | None = None) -> str:
    """Where an agent finds a user's --job as Python would from the caller's shell: the caller's working
    directory and PYTHONPATH, after the checkout (a user's module cannot shadow the agent's own)."""
    cwd = os.getcwd() if cwd is None else cwd
    pythonpath = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    parts = [str(ROOT), cwd, *(p for p in pythonpath.split(os.pathsep) if p)]
    return os.pathsep.join(dict.fromkeys(parts))


# The broker echoes every heartbeat (xapp.broker): two messages a session an interval, in pure-Python protobuf
# (the xApp venv's protobuf 3.20 has no upb). 1,000 sessions at the descriptor's 1 s took most of a core of
# the xApp before any lease was decided; the interval grows so that a replica sees 200 a second at most. It
# bounds only how fast a dead agent is noticed: its lease ends at its hard end whatever the heartbeat.
HEARTBEATS_PER_S = 200


def heartbeat_ms_for(sessions: int) -> int:
    return max(1000, math.ceil(sessions * 1000 / HEARTBEATS_PER_S))


def site_name(i: int) -> str:
    return f"site-{i}"


def xapp_controls(cfg: UpConfig, sim, ports: dict[str, int], lighthouse_addr: str = "",
                  round_epoch_ms: int = 0) -> dict:
    """The xApp's `controls`: the descriptor's defaults, pointed at this run's platform (and Lighthouse)."""
    base = json.loads((ROOT / "descriptors" / "config-file.json").read_text())
    c = base["controls"]
    c["period_ms"] = int(cfg.period_ms)
    c["policy"]["name"] = cfg.policy
    c["policy"]["guard_sms"] = cfg.guard_sms or derived_guard(cfg, sim.model.scenario)
    if cfg.policy == "static":   # the descriptor's reserve of 0 is refused as unsafe: tune it as the bench does
        c["policy"]["static_reserve_sms"] = static_reserve_for(cfg)
    c["sites"] = []
    statics = []
    for i, node in enumerate(sim.nodes):
        site = sim.model.scenario.sites[i]
        slices = site.slices
        c["sites"].append({
            "site_id": site_name(i), "gpu_sms": site.gpu_sms, "granularity": site.granularity, "nodes": [node.meid],
            "protected_slices": [{"sst": s.sst, "sd": s.sd} for s in slices if s.protected],
            "best_effort_slices": [{"sst": s.sst, "sd": s.sd} for s in slices if not s.protected],
        })
        nc = node.node.config
        statics.append({"meid": node.meid, "kpm_function_id": nc.kpm_function_id, "kpm_oid": kpm_oid(nc),
                        "rc_function_id": nc.rc_function_id, "envelope": True})
    if os.environ.get("DBAAS_SERVICE_HOST"):
        c["e2"]["discovery"] = "rnib"
    else:
        c["e2"]["discovery"] = "static"
        c["e2"]["static_nodes"] = statics  # the embedded store is per process: the xApp cannot read our R-NIB
        # ... nor their KPM definitions, so it cannot see the policy inputs they offer (issue 14): name the
        # ones every node's profile offers, as an operator would for nodes configured by hand
        offered = set.intersection(*(set(measurements_for(n.node.config.kpm_profile)) for n in sim.nodes))
        c["e2"]["kpm_measurements"] = [*c["e2"]["kpm_measurements"],
                                       *(m for m in POLICY_INPUTS if m in offered and m not in c["e2"]["kpm_measurements"])]
    c["submgr"].update(url=sim.ric.submgr_url, client_host=cfg.host, http_port=ports["rest"], rmr_port=ports["rmr"])
    c["rmr"].update(port=ports["rmr"], route_table=str(sim.ric.route_file))
    c["broker"]["listen"] = f"{cfg.host}:{ports['broker']}"
    c["rest"]["host"] = cfg.host     # every listener of the run on its interface (127.0.0.1 by default)
    # the job every site trains: an agent that registers another one is refused (without --job, any: the
    # agents train the agent venv's default, which this venv cannot name without a copy of it)
    c["broker"]["job"] = cfg.agent_job
    if cfg.agents_model:   # a region's sessions on one host: what an operator of that many sets (heartbeat_ms_for)
        c["broker"]["heartbeat_ms"] = max(int(c["broker"]["heartbeat_ms"]), heartbeat_ms_for(cfg.sites))
    if lighthouse_addr:   # the coordinator role: the xApp hands these to every agent in the lease stream
        c["broker"].update(lighthouse_addr=lighthouse_addr, round_ms=cfg.round_ms, round_epoch_ms=round_epoch_ms)
    c["rest"]["port"] = ports["rest"]
    base["controls"] = c
    return base


@dataclass
class SiteTally:
    """The world's own accounting for one site (ground truth from the model, per period)."""

    periods: int = 0
    ran_sm_s: float = 0.0
    spare_sm_s: float = 0.0
    usable_spare_sm_s: float = 0.0
    training_sm_s: float = 0.0
    # the waterfall's platform terms (xapp.waterfall.combine): SMs above each period's RAN peak, the guard's
    # share of them, and what the agent executed inside the lease it held (ground truth, never its report)
    spare_above_peak_sm_s: float = 0.0
    guard_sm_s: float = 0.0
    used_in_lease_sm_s: float = 0.0
    misses: int = 0
    misses_training: int = 0          # against what the agent executed (ground truth)
    misses_training_reported: int = 0  # against the lease the agent reported holding (for comparison)
    slots: int = 0
    series: list = field(default_factory=list)


class World:
    """The testbed side of `weaver up`: paces the model, feeds it the agents' real leases, keeps the tally."""

    def __init__(self, sim, cfg: UpConfig) -> None:
        self.sim = sim
        self.cfg = cfg
        n = sim.model.scenario.n_sites
        self.tally = [SiteTally() for _ in range(n)]
        self.gpu = np.array([s.gpu_sms for s in sim.model.scenario.sites], dtype=float)
        self.gran = np.array([s.granularity for s in sim.model.scenario.sites], dtype=float)
        self.truths: list[AgentTruth] = []
        self.series: list = []  # (t_unix, site, executed SMs, reported lease SMs, lease id, hard end, dt, valid for)
        self.xapp_views: XappViews | None = None
        self.cpu_trace: CpuTrace | None = None
        self.injector: FaultInjector | None = None
        self.probe_end_unix: float | None = None
        self.log_dir: Path | None = None      # the run's logs (the xApp's, for its revoke instants)
        self.end_revoke: dict | None = None   # the xApp's SIGTERM at the end of a traced run (`end_revoke`)
        self.ended_by = ""                     # the component whose death ended the run ("" = none)
        # seconds from the start of run_up to each start-up milestone; "agents_not_connected" names the
        # agents the world stopped waiting for (a slow start shows here, not as a silent two-minute wait)
        self.startup: dict = {}
        self.last_misses_training = np.zeros(n, dtype=int)
        self.xapp_waterfall: list = [None, None]   # GET /api/v1/waterfall at the first period and at the end

    def account(self, report, reported_lease_sms=None) -> None:
        """One period's tally. `report.training_sms` is what the model was charged (the measured executed
        SMs); `reported_lease_sms` (S,) the leases the agents reported holding, tallied beside it."""
        period_s = self.sim.period_s
        demand = np.asarray(report.demand, dtype=float)          # (T, S) SMs per slot
        training = np.asarray(report.training_sms, dtype=float)  # (S,)
        reported = training if reported_lease_sms is None else np.asarray(reported_lease_sms, dtype=float)
        slot_s = period_s / demand.shape[0]
        peak = demand.max(axis=0)
        # usable spare over this lease span: SMs above the period's RAN peak plus the guard band, in
        # partition steps (green contexts: reconfiguration in microseconds, so no latency deduction here)
        above = np.maximum(self.gpu - peak, 0)
        usable = np.floor(np.maximum(above - self.cfg.guard_sms, 0) / self.gran) * self.gran
        inside = np.minimum(training, reported)   # executed within the lease it held (the model's charge)
        over = demand > (self.gpu - training)
        attributable = over & (demand <= self.gpu)  # would not have missed without the training
        attributable_reported = (demand > (self.gpu - reported)) & (demand <= self.gpu)
        self.last_misses_training = attributable.sum(axis=0)
        for i, t in enumerate(self.tally):
            t.periods += 1
            t.slots += demand.shape[0]
            t.ran_sm_s += float(demand[:, i].sum() * slot_s)
            t.spare_sm_s += float(np.maximum(self.gpu[i] - demand[:, i], 0).sum() * slot_s)
            t.usable_spare_sm_s += float(usable[i] * period_s)
            t.spare_above_peak_sm_s += float(above[i] * period_s)
            t.guard_sm_s += float(min(above[i], self.cfg.guard_sms) * period_s)
            t.used_in_lease_sm_s += float(inside[i] * period_s)
            t.training_sm_s += float(reported[i] * period_s)
            t.misses += int(over[:, i].sum())
            t.misses_training += int(attributable[:, i].sum())
            t.misses_training_reported += int(attributable_reported[:, i].sum())


@dataclass
class AgentView:
    site: int
    addr: str
    first_val_loss: float = math.nan
    last: dict = field(default_factory=dict)
    seen_at: float = 0.0
    failed: bool = False       # its last Status call failed: the probe dials it anew


def _status_dict(st) -> dict:
    lease = st.lease
    return {"mode": st.mode, "device": st.device, "step": st.step, "tokens": st.tokens, "loss": st.loss,
            "val_loss": st.val_loss, "connected": st.connected, "tokens_per_s": st.tokens_per_s,
            "lease_sms": lease.sm_count if st.lease_remaining_ms > 0 else 0, "lease_id": lease.lease_id,
            "lease_seq": lease.seq, "lease_epoch": lease.epoch, "lease_remaining_ms": st.lease_remaining_ms,
            "lease_hard_end_unix_ms": (lease.sent_unix_ms + lease.valid_for_ms) if lease.sent_unix_ms else 0,
            "lease_valid_for_ms": lease.valid_for_ms,
            "last_checkpoint": st.last_checkpoint}


PROBE_WAIT_PERIODS = 0.5  # the most of a world period spent waiting for the agents' Status answers


class AgentProbe:
    """Reads each agent's AgentInspect status (gRPC) - what the agent really holds and has trained.

    The world never waits on an agent's inspection (issue 13): each agent has at most one Status call
    outstanding, with a short deadline, on gRPC's own threads; `poll` waits for the answers at most
    `wait_s` and an answer that comes later is used by the next poll. A stalled or flooded agent then
    costs the world loop `wait_s` per period at most, never the call's deadline per agent.
    """

    def __init__(self, views: list[AgentView], deadline_s: float = 0.5) -> None:
        import grpc

        from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc

        self._pb, self._pb_grpc, self._grpc = lease_pb2, lease_pb2_grpc, grpc
        self.views = views
        self.deadline_s = deadline_s
        self._channels = [grpc.insecure_channel(v.addr) for v in views]
        self._stubs = [lease_pb2_grpc.AgentInspectStub(ch) for ch in self._channels]
        self._calls: list = [None] * len(views)
        self.late = 0   # polls that went on without some agent's answer

    def _answered(self, v: AgentView, call) -> None:
        """On a gRPC thread: one reference assignment, so the world loop reads the old view or the new."""
        try:
            st = call.result()
        except Exception:  # an agent that went away holds nothing we can see; the lease will expire
            v.last = {**v.last, "lease_sms": 0, "connected": False, "reachable": False}
            v.failed = True   # the next poll dials it anew (a channel in reconnect backoff fails every call)
            return
        d = _status_dict(st)
        d["reachable"] = True
        if math.isnan(v.first_val_loss) and not math.isnan(d["val_loss"]):
            v.first_val_loss = d["val_loss"]
        v.last, v.seen_at = d, time.monotonic()

    async def poll(self, wait_s: float) -> None:
        """Ask every agent without a call outstanding; wait at most `wait_s` for the answers."""
        loop = asyncio.get_running_loop()
        all_in = asyncio.Event()
        left = 0

        def done(v: AgentView, call) -> None:
            nonlocal left
            self._answered(v, call)
            with lock:  # callbacks run on gRPC's threads, concurrently
                left -= 1
                last = left == 0
            if last:
                try:
                    loop.call_soon_threadsafe(all_in.set)
                except RuntimeError:  # the loop is gone (the run ended while a call was out)
                    pass

        outstanding = []
        lock = threading.Lock()
        for i, v in enumerate(self.views):
            call = self._calls[i]
            if call is None or call.done():
                if v.failed:
                    v.failed = False
                    self._channels[i].close()
                    self._channels[i] = self._grpc.insecure_channel(v.addr)
                    self._stubs[i] = self._pb_grpc.AgentInspectStub(self._channels[i])
                call = self._calls[i] = self._stubs[i].Status.future(self._pb.StatusRequest(), timeout=self.deadline_s)
                outstanding.append((v, call))
        left = len(outstanding)
        if not outstanding:
            self.late += 1
            return
        for v, call in outstanding:  # a call already done runs its callback here, at once
            call.add_done_callback(lambda c, v=v: done(v, c))
        try:
            await asyncio.wait_for(all_in.wait(), wait_s)
        except TimeoutError:
            self.late += 1

    def close(self) -> None:
        for call in self._calls:
            if call is not None:
                call.cancel()
        for ch in self._channels:
            ch.close()


@dataclass
class RoundsSeen:
    """The cross-site tier as the xApp sees it (`/api/v1/transfers`, `/api/v1/rounds`), merged across
    polls by (site, round): the xApp keeps only each agent's latest 64, a long run has more."""

    windows: dict = field(default_factory=dict)   # (site_id, round) -> planned transfer window
    reports: dict = field(default_factory=dict)   # (site_id, round) -> round report

    def merge(self, transfers: list[dict], rounds: list[dict]) -> None:
        for t in transfers:
            self.windows[(t["site_id"], t["round"])] = t
        for r in rounds:
            self.reports[(r["site_id"], r["round"])] = r

    def committed_rounds(self) -> int:
        """Rounds committed anywhere (a round index is a wall-clock slot, the same on every site)."""
        return len({k for (_, k), r in self.reports.items() if r["committed"]})

    def site(self, site_id: str) -> dict:
        reps = [r for (s, _), r in self.reports.items() if s == site_id]
        done = [r for r in reps if r["committed"]]
        return {"transfer_windows": sum(1 for s, _ in self.windows if s == site_id),
                "transfer_bytes_planned": sum(t["bytes"] for (s, _), t in self.windows.items() if s == site_id),
                "rounds_reported": len(reps), "rounds_committed": len(done),
                "committed_tokens": sum(r["tokens"] for r in done),
                "bytes_sent": sum(r["bytes_sent"] for r in reps),
                # wait = quorum + end-of-round barrier; a joiner's first quorum waits for the next boundary
                "mean_wait_ms": float(np.mean([r["wait_ms"] for r in reps])) if reps else math.nan,
                "median_wait_ms": float(np.median([r["wait_ms"] for r in reps])) if reps else math.nan,
                "mean_round_wall_ms": float(np.mean([r["wall_ms"] for r in reps])) if reps else math.nan,
                "max_participants": max((r["participants"] for r in reps), default=0)}


async def rest_get(url: str, timeout: float = 2.0, *, text: bool = False):
    """One GET of the xApp's REST API: the JSON body, or with `text` the body as text (/metrics)."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s, s.get(url) as r:
        r.raise_for_status()
        return await (r.text() if text else r.json())


async def _read_rounds(rest: str, seen: RoundsSeen) -> None:
    transfers = (await rest_get(f"{rest}/api/v1/transfers"))["transfers"]
    seen.merge(transfers, (await rest_get(f"{rest}/api/v1/rounds"))["rounds"])


def _fmt_line(elapsed: float, duration: float | None, world: World, agents: list[AgentView], xsites: dict,
              rounds: RoundsSeen | None = None) -> str:
    t = world.tally
    usable = sum(x.usable_spare_sm_s for x in t)
    granted = sum((xsites.get(site_name(i)) or {}).get("counters", {}).get("sm_s_granted", 0.0) for i in range(len(t)))
    used = sum((xsites.get(site_name(i)) or {}).get("counters", {}).get("sm_s_used", 0.0) for i in range(len(t)))
    tps = sum(a.last.get("tokens_per_s", 0.0) or 0.0 for a in agents)
    losses = [a.last.get("loss") for a in agents if a.last.get("loss") and not math.isnan(a.last["loss"])]
    prog = f"{elapsed:5.0f}s" + (f"/{duration:.0f}s" if duration else "")
    leases = " ".join(f"{a.last.get('lease_sms', 0):>3}" for a in agents)
    executed = sum(tr.executed_sm_s for tr in world.truths)
    held = sum(x.training_sm_s for x in t)
    inside = sum(x.used_in_lease_sm_s for x in t)
    pct = (lambda v: f"{v / usable:.0%}") if usable > 0 else (lambda v: "-")
    return (f"[{prog}] usable spare {usable:7.1f} SM·s  granted {granted:7.1f}  used {used:7.1f}  "
            f"executed {executed:7.1f}  waterfall {pct(usable)}>{pct(granted)}>{pct(held)}>{pct(inside)}  "
            f"leases [{leases}]  misses {sum(x.misses for x in t)} (training {sum(x.misses_training for x in t)})  "
            f"tokens/s {tps:7.0f}  loss {np.mean(losses) if losses else float('nan'):.3f}"
            + (f"  rounds {rounds.committed_rounds()}" if rounds is not None else ""))


async def _xapp_waterfall(rests: list[str]) -> dict | None:
    """GET /api/v1/waterfall; of several replicas, each site's ledgers summed over those that answer (each
    accounts only the periods it decided the site in: a replica killed takes its share with it)."""
    docs = []
    for rest in rests:
        try:
            docs.append(await rest_get(f"{rest}/api/v1/waterfall"))
        except Exception:  # an xApp that does not answer: the summary says the waterfall is unknown (None)
            continue
    if len(docs) <= 1:
        return docs[0] if docs else None
    sites: dict = {}
    for doc in docs:
        for sid, v in doc.get("sites", {}).items():
            sites[sid] = {**v, "xapp": waterfall.add(v["xapp"], sites[sid]["xapp"])} if sid in sites else v
    return {"sites": sites, "replicas_answering": len(docs)}


@dataclass
class XappViews:
    """The xApp's own record of its decisions (`/api/v1/sites/{site}/series`: per decision, its instant
    on the xApp's clock, to 1 ms, and the grant), read when it matters instead of polled: at the end of
    the run and just before a fault kills the xApp (one snapshot per xApp instance). A revoke is the first
    decision with no grant after one with a grant; an instance's decisions with a grant issue consecutive
    lease seqs, the last of them the lease the xApp holds out when the snapshot is read (`lease_seq`,
    read before and after the series, equal), so seq k was issued at the (k - lease_seq + n)-th of its n
    grants, stamped with that instant: its hard end is that + valid_for. (`weaver bench safety`)"""

    rest: str
    instances: list = field(default_factory=list)   # {"epoch", "sites": {site_id: {"views", "lease_seq"}}}
    failures: list = field(default_factory=list)

    async def snapshot(self, sites: list[str]) -> None:
        try:
            epoch = int((await rest_get(f"{self.rest}/api/v1/agents"))["epoch"])
            out = {}
            for sid in sites:
                for _ in range(3):   # a grant between the reads: read again
                    before = (await rest_get(f"{self.rest}/api/v1/sites/{sid}")).get("lease")
                    pts = (await rest_get(f"{self.rest}/api/v1/sites/{sid}/series?minutes=60"))["points"]
                    after = (await rest_get(f"{self.rest}/api/v1/sites/{sid}")).get("lease")
                    if before == after:
                        break
                out[sid] = {"views": [[p["t"], p["grant_sms"]] for p in pts],
                            "lease_seq": after["seq"] if after and before == after else None}
            self.instances.append({"epoch": epoch, "sites": out})
        except Exception as exc:  # an xApp that does not answer: its decisions stay unknown, and say so
            self.failures.append(str(exc))



async def start_lighthouse(cfg: UpConfig, sup: Supervisor, secret: str) -> tuple[str, str]:
    """The run's Lighthouse, gated (agent.crosssite.gate) when the broker has a `secret`: then it answers only
    the sites the broker admitted. Returns (its address for the sites, the inner address or "")."""
    gated = ["--secret-env", "WEAVER_TIER_SECRET", "--bind-host", cfg.tier_host or cfg.host,
             "--max-connections", str(gate_connections_for(cfg.sites)),
             "--live-epochs", str(max(1, cfg.xapp_replicas))] if secret else []
    lh = sup.start("lighthouse", [str(agent_python()), "-m", "agent.crosssite.lighthouse",
                                  "--port", str(free_port()), "--round-ms", str(cfg.round_ms), *gated],
                   env={"PYTHONPATH": str(ROOT), **({"WEAVER_TIER_SECRET": secret} if secret else {})})
    m = await asyncio.to_thread(lh.wait_for_line, r"lighthouse (\w+://\S+)(?: inner (\S+))?", 60)
    return m.group(1), m.group(2) or ""


async def start_xapps(cfg: UpConfig, sim, sup: Supervisor, run_dir: Path, replicas: list[dict[str, int]],
                      sdl_env: dict[str, str], sdl_namespace: str, lighthouse: str = "", broker_secret: str = "",
                      ready_s: float = 90.0) -> None:
    """The xApp (and its replicas, `replicas[1:]`'s ports) as processes of `sup`, on this run's config file,
    each waited for until it says it is ready. `broker_secret` goes into the xApp's environment only."""
    config_path = run_dir / "config-file.json"
    controls = xapp_controls(cfg, sim, replicas[0], lighthouse, int(time.time() * 1000))
    token_env = controls["controls"]["broker"].get("token_env")
    if sdl_namespace:
        controls["controls"]["sdl"]["namespace"] = sdl_namespace
    elif cfg.xapp_replicas > 1:
        raise ChildFailed(f"--xapp-replicas {cfg.xapp_replicas} needs the RIC's SDL: no Redis answered on "
                          f"{REDIS[0]}:{REDIS[1]} (the replicas keep their shards' claims there)")
    if cfg.xapp_replicas > 1:
        controls["controls"]["replicas"] = {"shards": SHARDS_PER_REPLICA * cfg.xapp_replicas}
    config_path.write_text(json.dumps(controls, indent=2))
    xenv = {"CONFIG_FILE": str(config_path), "RMR_SEED_RT": str(sim.ric.route_file), "RMR_RTG_SVC": "-1",
            "RMR_SRC_ID": cfg.host, "RMR_BIND_IF": cfg.host, "PYTHONPATH": str(ROOT), **sdl_env,
            "WEAVER_LOG_FORMAT": "plain"}    # RMR_* would pick the RIC's JSON lines; xapp_revokes reads plain ones
    if token_env and broker_secret:
        xenv[token_env] = broker_secret
    sup.start("xapp", [sys.executable, "-m", "xapp", "--config", str(config_path),
                        *(["--record", str(cfg.record)] if cfg.record else [])], env=xenv)
    for r, rp in enumerate(replicas[1:], start=1):   # the same config; its own ports (xapp.app.env_overrides)
        sup.start(f"xapp:{r}", [sys.executable, "-m", "xapp", "--config", str(config_path)],
                  env={**xenv, "WEAVER_REST_PORT": str(rp["rest"]), "WEAVER_RMR_PORT": str(rp["rmr"]),
                       "WEAVER_BROKER_LISTEN": f"{cfg.host}:{rp['broker']}"})
    for name in xapp_names(sup):
        await asyncio.to_thread(sup.get(name).wait_for_line, r"weaver-xapp: ready", ready_s)

async def run_up(cfg: UpConfig, out=print) -> dict:
    from testbed.sim import SimConfig, Simulation
    from testbed.tcpproxy import TcpProxy

    run_dir = cfg.run_dir or Path(tempfile.mkdtemp(prefix="weaver-up-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    handler = logging.FileHandler(run_dir / "logs" / "world.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    ports = {"rmr": free_port(), "rest": cfg.rest_port or free_port(), "broker": free_port()}
    replicas = [dict(ports)] + [{"rmr": free_port(), "rest": free_port(), "broker": free_port()}
                                for _ in range(cfg.xapp_replicas - 1)]
    if cfg.xapp_replicas > 1:
        cfg = check_replicas(cfg, out)
    scenario = scenario_for(cfg)
    bound, why = await asyncio.to_thread(agent_confinement)
    if not bound and not cfg.guard_sms:
        cfg = replace(cfg, guard_sms=COOPERATIVE_GUARD_SMS)
    if not cfg.guard_sms:
        cfg = replace(cfg, guard_sms=derived_guard(cfg, scenario))
    sim_cfg = SimConfig(n_sites=cfg.sites, n_cells=cfg.cells, seed=cfg.seed, host=cfg.host, e2term_port=0,
                        submgr_http_port=0, xapps=tuple(f"{cfg.host}:{r['rmr']}" for r in replicas),
                        route_dir=str(run_dir), speed=1.0,
                        node_overrides=cfg.node_overrides)   # the scenario file's node settings
    t_start = time.monotonic()
    sim = await Simulation.start(sim_cfg, scenario=scenario)
    sup = Supervisor(log_dir=run_dir / "logs")
    world = World(sim, cfg)
    world.startup["world_s"] = round(time.monotonic() - t_start, 2)
    world.log_dir = run_dir / "logs"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    summary: dict = {}
    keeper: asyncio.Future | None = None
    keep = asyncio.Event()
    rounds = RoundsSeen() if cfg.cross_site else None
    proxies: dict[int, TcpProxy] = {}
    injector: FaultInjector | None = None
    probe: AgentProbe | None = None
    sdl_namespace = ""
    try:
        lighthouse = lighthouse_inner = ""
        broker_secret = secrets.token_hex(32)   # this run's; in no file, only in the xApp's (and Lighthouse's) env
        token_env = xapp_controls(cfg, sim, ports)["controls"]["broker"].get("token_env")
        if cfg.cross_site:
            lighthouse, lighthouse_inner = await start_lighthouse(cfg, sup, broker_secret if token_env else "")
        sdl_env, sdl_namespace = await asyncio.to_thread(run_sdl)
        await start_xapps(cfg, sim, sup, run_dir, replicas, sdl_env, sdl_namespace,
                          lighthouse=lighthouse, broker_secret=broker_secret)
        from xapp.agents import site_credential
        world.startup["xapp_ready_s"] = round(time.monotonic() - t_start, 2)
        agents: list[AgentView] = []
        aenv = {"PYTHONPATH": agent_pythonpath(), **agent_env(cfg.faults)}
        for i in range(cfg.sites):  # each agent dials the broker through its own proxy (where network faults act)
            if cfg.xapp_replicas > 1:   # every replica's broker, tried in turn; a redirect names one of them
                brokers = ",".join(f"{cfg.host}:{r['broker']}" for r in replicas)
            else:
                proxies[i] = await TcpProxy(cfg.host, ports["broker"], cfg.host, 0, name=f"proxy:{site_name(i)}").start()
                brokers = proxies[i].address
            argv = [str(agent_python()), "-m", "agent.cli", "run", "--broker", brokers,
                    "--site-id", site_name(i), "--agent-id", f"agent-{i}", "--preset", cfg.agent_preset,
                    "--checkpoint-dir", str(run_dir / f"agent-{i}"), "--inspect-addr", f"{cfg.host}:0",
                    "--metrics-addr", f"{cfg.host}:0", "--mode", "gpu",  # train only under leases, never unleased
                    "--cores", f"{cfg.cores_per_agent:g}", "--tier-host", cfg.tier_host or cfg.host,
                    *([] if bound else ["--cooperative"])]
            # No --phase: the kernel holds each worker to its lease's cores over 5 ms CFS periods, so stand-ins
            # sharing the host's cores run side by side at their quotas; a phase slot (their turn-taking when
            # nothing but their manners bounded them) cannot hold a window's budget at that rate.
            if cfg.agent_job:
                argv += ["--job", cfg.agent_job, *(a for kv in cfg.agent_job_args for a in ("--job-arg", kv))]
            cred = ({"WEAVER_AGENT_TOKEN": site_credential(broker_secret, site_name(i), int(time.time()) + 86400)}
                    if token_env else {})   # a day's credential: the agent registers with proofs of it
            sup.start(f"agent:{i}", argv, env={**aenv, **cred})   # env, not argv: ps shows every argv
        truths = []
        for i in range(cfg.sites):
            m = await asyncio.to_thread(sup.get(f"agent:{i}").wait_for_line, r"inspect on (\S+)", 120)
            agents.append(AgentView(i, m.group(1)))
            # a confined agent names its worker and the worker cgroup's meter: that is the stand-in GPU
            w = re.search(r"worker pid (\d+) bound by \S+(?: meter ([^\s,]+))?", m.string)
            truths.append(AgentTruth(i, sup.get(f"agent:{i}").proc.pid, float(world.gpu[i]), cfg.cores_per_agent,
                                     meter_path=(w.group(2) or "") if w else "",
                                     worker_pid=int(w.group(1)) if w else 0))
        world.startup["agents_up_s"] = round(time.monotonic() - t_start, 2)
        probe = AgentProbe(agents)
        world.truths = truths
        # The world's first period waits until every agent is connected to the broker: an agent builds its
        # model and warms up (timed steps, outside any lease) before it connects. That work is measured and
        # reported (ground_truth.startup_cpu_s) but charged to no RAN slot: none is simulated yet.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            await probe.poll(1.0)
            if all(a.last.get("connected") for a in agents):
                break
            await asyncio.sleep(0.1)
        world.startup["agents_connected_s"] = round(time.monotonic() - t_start, 2)
        late = [site_name(a.site) for a in agents if not a.last.get("connected")]
        world.startup["agents_not_connected"] = late
        if late:
            out(f"weaver up: {', '.join(late)} not connected to the broker after 120 s; the world starts without "
                f"waiting longer (see {run_dir / 'logs'})")
        for tr in truths:
            tr.startup_cpu_s = tr.sampler.sample() or 0.0
        rest = f"http://{cfg.host}:{ports['rest']}"
        rests = [f"http://{cfg.host}:{r['rest']}" for r in replicas]
        out(scenario_line(cfg, scenario))
        out(f"weaver up: dashboard  {rest}/")
        out(f"weaver up: rest       {rest}/api/v1  (openapi {rest}/openapi.json, metrics {rest}/metrics)")
        out(f"weaver up: rmr        xapp {cfg.host}:{ports['rmr']}  e2term {sim.ric.e2term_address}")
        if cfg.xapp_replicas > 1:
            out(f"weaver up: replicas   {cfg.xapp_replicas} xApps, {SHARDS_PER_REPLICA * cfg.xapp_replicas} shards of "
                "sites (xapp.shards); REST " + " ".join(rests) + "  brokers "
                + " ".join(f"{cfg.host}:{r['broker']}" for r in replicas))
        out(f"weaver up: grpc       lease broker {cfg.host}:{ports['broker']}  agents "
            + " ".join(f"{site_name(a.site)}={a.addr}" for a in agents))
        out(f"weaver up: submgr     {sim.ric.submgr_url}/subscriptions")
        if lighthouse:
            out(f"weaver up: lighthouse {lighthouse}"
                + (f" (its gate; the Lighthouse itself on {lighthouse_inner})" if lighthouse_inner else "")
                + f"  (cross-site rounds of {cfg.round_ms} ms; transfer windows "
                f"{rest}/api/v1/transfers, rounds {rest}/api/v1/rounds)")
        else:
            out("weaver up: lighthouse none (--no-cross-site: each site trains alone)")
        out(f"weaver up: run dir    {run_dir} (logs, config, checkpoints)")
        out("weaver up: sdl        " + (f"redis {REDIS[0]}:{REDIS[1]} namespace {sdl_namespace} (the xApp's epoch, "
                                         "leases and ledger survive its restart; removed at the end)" if sdl_namespace
                                         else "embedded in the xApp (no Redis answered on "
                                              f"{REDIS[0]}:{REDIS[1]}: a restarted xApp starts from epoch 1)"))
        if not bound:
            out(f"weaver up: confinement none ({why}): the agents run --cooperative, bounded by their own "
                f"accounting only; guard {cfg.guard_sms} SMs")
        where = ("the worker cgroups' kernel accounting" if truths[0].meter_path else "/proc")
        out(f"weaver up: truth      agent CPU from {where} ({truths[0].sampler.source}; supervisors metered apart), "
            f"site SMs = cpu_s / period_s * gpu_sms / {cfg.cores_per_agent:g} core(s) (each agent's CPU stand-in "
            f"for its site GPU: {'--agent-cores' if cfg.agent_cores else f'what this {_host_cores()}-core host can serve each'})")

        async def xapp_ready(child) -> None:
            await asyncio.to_thread(child.wait_for_line, r"weaver-xapp: ready", 90)

        if cfg.record_series:
            world.xapp_views = XappViews(rest)
        if cfg.record_series or any(isinstance(f, RevokeMidPeriod) for f in cfg.faults):
            world.cpu_trace = CpuTrace({i: tr.meter_path or tr.pid for i, tr in enumerate(truths)})
            world.cpu_trace.start()
        world.xapp_waterfall[0] = await _xapp_waterfall(rests)   # the run's share starts here
        t0 = loop.time()
        probing = cfg.idle_probe_s > 0
        if probing:
            sim.muted.update(range(cfg.sites))
            out(f"weaver up: idle probe {cfg.idle_probe_s:g} s without KPM, so nothing is granted (the agents' "
                "idle baseline)")
        if cfg.faults:
            injector = FaultInjector(cfg.faults, Targets(
                sim=sim, proxies=proxies, supervisor=sup, xapp_ready=xapp_ready,
                before_xapp_kill=(lambda: world.xapp_views.snapshot([site_name(i) for i in range(cfg.sites)]))
                if world.xapp_views is not None else None,
                agent_devices=lambda: {a.site: a.last.get("device", "") for a in agents},
                replica_sites=lambda: replica_sites(sup, rests),
                cpu_trace=world.cpu_trace), cfg.fault_at_s,
                notify=lambda e, what: out(f"weaver up: fault {e['spec']} {what}s at {e[what + '_s']:.1f} s"
                                           + (f" ({e['note']})" if what == "end" and e["note"] else "")))
            world.injector = injector
            if not probing:
                injector.start()
            out("weaver up: faults     " + "  ".join(
                f"{f.describe()}@{f.at_s if f.at_s is not None else cfg.fault_at_s:g}s" for f in cfg.faults))
        next_print = t0 + 1.0
        n = 0
        xsites: dict = {}
        last_sample = time.monotonic()
        sites_task: asyncio.Task | None = None
        while not stop.is_set():
            if cfg.duration_s is not None and loop.time() - t0 >= cfg.duration_s:
                break
            # the CPU sample first, right after the pacing wait, so that its windows are as even as the pacing
            now = time.monotonic()
            dt = now - last_sample
            # a period run back to back to catch up (the loop fell behind) is too short to measure on its own:
            # it is charged with the last measurement and the next sample covers it
            fresh = dt >= 0.5 * sim.period_s
            before = [tr.sampler.read_at for tr in truths]
            cpu = [tr.sampler.sample() for tr in truths] if fresh else []
            # each site's period runs between its own two clock reads (groundtruth.ProcCpuSampler.read_at):
            # the loop's clock and a read a few ms later (the GIL handed to another thread between them) would
            # charge one period with another's CPU
            dts = [(tr.sampler.read_at - b if tr.sampler.read_at - b > 0.05 * dt else dt)
                   for tr, b in zip(truths, before, strict=True)] if fresh else []
            if fresh:
                last_sample = now
            await probe.poll(PROBE_WAIT_PERIODS * sim.period_s)   # never the agents' pace, at most this
            reported = np.zeros(cfg.sites)
            for a in agents:  # what each agent process really executed is what the RAN must live with
                reported[a.site] = float(a.last.get("lease_sms", 0) or 0)
                truth = truths[a.site]
                sms = (truth.period(dts[a.site], reported[a.site], bool(a.last.get("connected")), cpu=cpu[a.site],
                                    said={"lease_id": a.last.get("lease_id", ""),
                                          "lease_remaining_ms": a.last.get("lease_remaining_ms", 0),
                                          "status_age_s": round(time.monotonic() - a.seen_at, 3)})
                       if fresh else truth.last_sms)
                # the model takes at most the site's GPU (a multi-threaded agent can exceed one core's worth);
                # the unclamped figure is what sm_seconds_executed and sm_ms_beyond_lease count
                sim.model.set_training_sms(a.site, min(sms, float(world.gpu[a.site])))
                if cfg.record_series and fresh:
                    world.series.append([time.time(), a.site, sms, reported[a.site], a.last.get("lease_id", ""),
                                         a.last.get("lease_hard_end_unix_ms", 0), dts[a.site],
                                         a.last.get("lease_valid_for_ms", 0), 0])
            report = await sim.step()
            world.account(report, reported)
            if fresh:   # the misses charged to each agent's period: an overrun the kernel repays is told apart
                for a in agents:
                    truths[a.site].settle(int(world.last_misses_training[a.site]))
            if cfg.record_series and fresh:
                for row in world.series[-len(agents):]:
                    row[8] = int(world.last_misses_training[row[1]])
            n += 1
            if probing and loop.time() - t0 >= cfg.idle_probe_s:
                probing = False
                sim.muted.clear()
                world.probe_end_unix = time.time()
                if injector is not None:
                    injector.start()
            if loop.time() >= next_print:
                next_print += 1.0
                # in the background: a stalled or restarting xApp must not stall the world's pacing
                if sites_task is not None and sites_task.done():
                    try:
                        xsites = sites_task.result()
                    except Exception:
                        xsites = {}
                    sites_task = None
                if sites_task is None:
                    sites_task = asyncio.ensure_future(xapp_sites(rests))
                if rounds is not None:
                    try:
                        await _read_rounds(rest, rounds)
                    except Exception:  # the next poll merges what this one missed
                        pass
                out(_fmt_line(loop.time() - t0, cfg.duration_s, world, agents, xsites, rounds))
                failed = sup.failed()   # a child a fault stopped on purpose is not a failure
                if failed:   # the run ends, and its figures up to now are the summary (with the cause)
                    world.ended_by = "; ".join(f"{c.name} exited ({c.proc.returncode})" for c in failed)
                    out(f"weaver up: {world.ended_by}: the run ends here (see {run_dir / 'logs'}); its figures follow")
                    break
            wait = t0 + n * sim.period_s - loop.time()
            if wait > 0:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                except TimeoutError:
                    pass
        # final figures, before anything is stopped. A traced run ends with the xApp's SIGTERM timed into
        # the agents' work (`end_revoke`); until then the RAN and its KPM go on (not tallied), so that the
        # xApp revokes because it stops, not because KPM went stale while the figures are read
        keep = asyncio.Event()
        keeper = asyncio.ensure_future(sim.run(keep)) if world.cpu_trace is not None and cfg.record_series else None
        if sites_task is not None:
            sites_task.cancel()
            await asyncio.gather(sites_task, return_exceptions=True)
        try:
            xsites = await xapp_sites(rests, strict=True)
        except Exception as exc:
            out(f"weaver up: could not read the xApp's final state: {exc}")
        world.xapp_waterfall[1] = await _xapp_waterfall(rests)
        if world.xapp_views is not None:
            await world.xapp_views.snapshot([site_name(i) for i in range(cfg.sites)])
        if rounds is not None:
            try:
                await _read_rounds(rest, rounds)
            except Exception as exc:
                out(f"weaver up: could not read the xApp's round reports: {exc}")
        await probe.poll(1.0)
        if injector is not None:
            await injector.close()
        if keeper is not None:
            world.end_revoke = await end_revoke(sup, world.cpu_trace)
        if world.cpu_trace is not None:
            world.cpu_trace.stop()
        if keeper is not None:
            keep.set()
            await asyncio.gather(keeper, return_exceptions=True)
        summary = build_summary(cfg, world, agents, xsites, loop.time() - t0, rounds, lighthouse)
        if cfg.xapp_replicas > 1:
            kills = [f for f in summary["faults"] if f["kind"] == "replica-kill" and f.get("applicable")]
            summary["replicas"] = {"replicas": cfg.xapp_replicas, "shards": SHARDS_PER_REPLICA * cfg.xapp_replicas,
                                   "rest": rests, **await asyncio.to_thread(ledger_check, sdl_namespace, kills)}
    finally:
        if keeper is not None and not keeper.done():
            keep.set()
            await asyncio.gather(keeper, return_exceptions=True)
        if injector is not None:
            await injector.close()
        if world.cpu_trace is not None:
            world.cpu_trace.stop()
        if probe is not None:
            probe.close()
        await asyncio.to_thread(shutdown, sup, 20.0)
        if bound:   # an agent killed at the end of its grace left its cgroups: nothing of the run stays
            swept = await asyncio.to_thread(sweep_agent_cgroups)
            if swept:
                out(f"weaver up: removed the cgroups of agents that did not stop in time: {swept.replace(chr(10), ', ')}")
        if sdl_namespace:
            try:
                await asyncio.to_thread(drop_sdl_namespace, sdl_namespace)
            except Exception as exc:  # noqa: BLE001 - a Redis gone by now leaves keys, not a failed run
                out(f"weaver up: could not remove SDL namespace {sdl_namespace}: {exc}")
        for p in proxies.values():
            await p.close()
        await sim.close()
    return summary


END_BUSY_WAIT_S = 0.3    # how long the end of a traced run waits for an agent at work before the SIGTERM
END_TRACE_S = 0.4        # how long the agents are traced after it (they are stopped only after that)
BUSY_CORES = 0.5         # an agent at work: its CPU rate over the last 3 ms above half a core


async def end_revoke(sup: Supervisor, trace: CpuTrace) -> dict:
    """The xApp's SIGTERM, which revokes every lease at once (RAN first), sent while an agent is at work
    (its CPU rate over the last 3 ms of the trace above half a core; waited for up to END_BUSY_WAIT_S,
    then sent anyway), then the agents traced for END_TRACE_S more. The instant is the signal's (taken
    just before it): the xApp's revoke follows within its own signal handling (ms), so a time to idle
    measured from it is an upper bound. The xApp logs no instant of these revokes."""
    t0 = time.time()
    rates: dict = {}
    while True:
        rates = {}
        for k in trace.pids:
            t, c = trace.recent(k, 0.006)
            rates[site_name(k)] = rate_before(np.asarray(t), np.asarray(c), time.time()) if len(t) > 1 else None
        if any(r is not None and r > BUSY_CORES for r in rates.values()) or time.time() - t0 >= END_BUSY_WAIT_S:
            break
        await asyncio.sleep(0.001)
    # every replica: each revokes its own sites' leases; the instant is the first signal's
    t_sig = min((t for t in map(sup.terminate, xapp_names(sup)) if t is not None), default=None)
    if t_sig is not None:
        await asyncio.sleep(max(t_sig + END_TRACE_S - time.time(), 0.0))
    return {"sigterm_unix": t_sig, "waited_for_work_s": round((t_sig or time.time()) - t0, 4),
            "rate_before_cores": rates, "traced_after_s": END_TRACE_S,
            "instant": "SIGTERM to the xApp (its revoke follows within ms: an upper bound)"}


_REVOKED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ \S+: site (\S+): lease revoked \((.*)\)\s*$")


def xapp_revokes(log_path: Path) -> list[list]:
    """The control loop's revokes as the xApp logged them ("site S: lease revoked (reason)", logged right
    after the revoke was queued to the agent's stream; every xApp instance of the run appends to the same
    log): [[t_unix, site, reason]], to the log's 1 ms. Revokes at shutdown and by the broker itself (a
    dropped stream) are not logged this way."""
    out = []
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        m = _REVOKED.match(line)
        if m:
            t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000.0
            out.append([t, m.group(3), m.group(4)])
    return out


def shutdown(sup: Supervisor, timeout: float) -> None:
    """RAN first: the xApp revokes every lease on SIGTERM. Then every agent at once: each finishes its
    cross-site round (its peers are in the same round, so nobody waits for a site already stopped) and
    writes a checkpoint. The Lighthouse last, so that no agent loses its quorum service while stopping."""
    sup.stop_all(["xapp", "agent", "lighthouse"], timeout)


def policy_inputs_summary(p: dict | None) -> dict:
    """Which policy inputs a site's decisions had and used (the xApp's GET /api/v1/sites policy_inputs,
    xapp.inputs): `available` the fields its KPM carried (measured), `estimated` those taken from standard
    counters through the cost model, `used` every field the policy was given, `periods` how many periods
    were decided on measured / estimated inputs or on none (no decision: revoked)."""
    if not p:
        return {"basis": "none", "available": [], "estimated": [], "used": [], "periods": {}}
    src = p.get("inputs") or {}
    return {"basis": p.get("basis", "none"), "demand": p.get("demand", "none"),
            "available": sorted(f for f, s in src.items() if s == "measured"),
            "estimated": sorted(f for f, s in src.items() if s == "estimated"),
            "used": sorted(f for f, s in src.items() if s != "absent"),
            "periods": dict(p.get("periods") or {})}


def site_waterfall(world: World, i: int) -> dict | None:
    """Site i's waterfall: the platform's usable and used (ground truth) with the xApp's and the agent's
    causes over this run (the xApp's ledgers at the end less those at the first period); None when the
    xApp's were not read."""
    start, end = world.xapp_waterfall
    sid = site_name(i)
    if not end or sid not in end.get("sites", {}):
        return None
    e = end["sites"][sid]["xapp"]
    s = (start or {}).get("sites", {}).get(sid, {}).get("xapp", {})
    t = world.tally[i]
    out = waterfall.combine(spare_above_peak_sm_s=t.spare_above_peak_sm_s, guard_sm_s=t.guard_sm_s,
                             usable_sm_s=t.usable_spare_sm_s, used_sm_s=t.used_in_lease_sm_s,
                             ledger=waterfall.subtract(e["ledger"], s.get("ledger", {})),
                             usage=waterfall.subtract(e["usage"], s.get("usage", {})))
    out["platform_meter"] = {"periods": t.periods, "peak_sm_s": float(world.gpu[i]) * t.periods * world.sim.period_s
                             - t.spare_above_peak_sm_s}
    truth = world.truths[i] if i < len(world.truths) else None
    if truth is not None and truth.supervisor is not None:   # the platform's meter of it, beside the report
        out["outside_lease"] = {"supervisor_cpu_s": truth.supervisor_cpu_s,
                                "supervisor_cpu_s_reported": out.get("outside_lease", {}).get("supervisor_cpu_s", 0.0)}
    return out


def build_summary(cfg: UpConfig, world: World, agents: list[AgentView], xsites: dict, elapsed: float,
                  rounds: RoundsSeen | None = None, lighthouse: str = "") -> dict:
    sites = {}
    for i, t in enumerate(world.tally):
        x = xsites.get(site_name(i)) or {}
        c = x.get("counters", {})
        a = agents[i].last if i < len(agents) else {}
        truth = world.truths[i].summary() if i < len(world.truths) else {}
        used = float(c.get("sm_s_used", 0.0))
        sites[site_name(i)] = {
            "archetype": world.sim.model.scenario.sites[i].archetype,
            "gpu_sms": int(world.gpu[i]),
            "kpm_indications": int(c.get("kpm_indications", 0)),
            "rc_controls_sent": int(c.get("rc_controls_sent", 0)),
            "rc_controls_acked": int(c.get("rc_controls_acked", 0)),
            "rc_controls_failed": int(c.get("rc_controls_failed", 0)),
            "leases_granted": int(c.get("leases_granted", 0)),
            "sm_seconds_granted": float(c.get("sm_s_granted", 0.0)),
            "sm_seconds_used": used,
            "sm_seconds_held_by_agent": t.training_sm_s,   # the lease the agent reported holding
            "sm_seconds_executed": truth.get("sm_seconds_executed", 0.0),  # measured by the platform
            "ran_sm_s": t.ran_sm_s,
            "spare_sm_s": t.spare_sm_s,
            "usable_spare_sm_s": t.usable_spare_sm_s,
            "utilization": used / t.usable_spare_sm_s if t.usable_spare_sm_s > 0 else 0.0,
            "deadline_misses": t.misses,
            "deadline_misses_attributable_to_training": t.misses_training,  # from what was executed
            "deadline_misses_attributable_to_reported_lease": t.misses_training_reported,
            "deadline_misses_in_repaid_overruns": int(truth.get("deadline_misses_in_repaid_overruns", 0)),
            "sm_ms_beyond_lease_total": truth.get("sm_ms_beyond_lease_total", 0.0),
            "sm_ms_beyond_lease_max": truth.get("sm_ms_beyond_lease_max", 0.0),
            "ground_truth": truth,
            "deadline_miss_rate": t.misses / t.slots if t.slots else 0.0,
            "slots": t.slots,
            "tokens_trained": int(a.get("tokens", 0) or 0),
            "steps": int(a.get("step", 0) or 0),
            "val_loss_start": agents[i].first_val_loss if i < len(agents) else math.nan,
            "val_loss_end": a.get("val_loss", math.nan),
            "final_envelope_sms": x.get("envelope_sms"),
            "final_grant_sms": x.get("grant_sms"),
            "policy_inputs": policy_inputs_summary(x.get("policy_inputs")),
            "sm_seconds_used_in_lease": t.used_in_lease_sm_s,   # ground truth: executed within the held lease
            # the platform's figure of merit: usable spare the worker really executed inside its lease
            "used_in_lease_over_usable": t.used_in_lease_sm_s / t.usable_spare_sm_s if t.usable_spare_sm_s > 0 else 0.0,
            "waterfall": site_waterfall(world, i),
        }
        if rounds is not None:
            sites[site_name(i)]["cross_site"] = rounds.site(site_name(i))
    keys_sum = ("kpm_indications", "rc_controls_sent", "rc_controls_acked", "rc_controls_failed", "leases_granted",
                "sm_seconds_granted", "sm_seconds_used", "sm_seconds_held_by_agent", "sm_seconds_executed",
                "ran_sm_s", "spare_sm_s", "usable_spare_sm_s", "deadline_misses",
                "deadline_misses_attributable_to_training", "deadline_misses_attributable_to_reported_lease",
                "deadline_misses_in_repaid_overruns", "sm_ms_beyond_lease_total", "slots", "tokens_trained", "steps")
    totals = {k: sum(s[k] for s in sites.values()) for k in keys_sum}
    totals["sm_ms_beyond_lease_max"] = max((s["sm_ms_beyond_lease_max"] for s in sites.values()), default=0.0)
    totals["sms_beyond_lease_max"] = max((s["ground_truth"].get("sms_beyond_lease_max", 0.0) for s in sites.values()),
                                         default=0.0)   # the worst period of any site, to set beside the guard
    totals["utilization"] = totals["sm_seconds_used"] / totals["usable_spare_sm_s"] if totals["usable_spare_sm_s"] else 0.0
    totals["deadline_miss_rate"] = totals["deadline_misses"] / totals["slots"] if totals["slots"] else 0.0
    starts = [s["val_loss_start"] for s in sites.values() if not math.isnan(s["val_loss_start"])]
    ends = [s["val_loss_end"] for s in sites.values() if s["val_loss_end"] is not None and not math.isnan(s["val_loss_end"])]
    totals["val_loss_start"] = float(np.mean(starts)) if starts else math.nan
    totals["val_loss_end"] = float(np.mean(ends)) if ends else math.nan
    totals["sm_seconds_used_in_lease"] = sum(s["sm_seconds_used_in_lease"] for s in sites.values())
    totals["used_in_lease_over_usable"] = (totals["sm_seconds_used_in_lease"] / totals["usable_spare_sm_s"]
                                           if totals["usable_spare_sm_s"] else 0.0)
    totals["used_in_lease_over_usable_worst_site"] = min((s["used_in_lease_over_usable"] for s in sites.values()),
                                                         default=0.0)
    wfs = {k: s["waterfall"] for k, s in sites.items() if s["waterfall"] is not None}
    totals["waterfall"] = waterfall.total(wfs) if len(wfs) == len(sites) else None
    totals["tokens_per_s"] = totals["tokens_trained"] / elapsed if elapsed > 0 else 0.0
    cross = {"enabled": False}
    if rounds is not None:
        per = [s["cross_site"] for s in sites.values()]
        waits = [r["wait_ms"] for r in rounds.reports.values()]
        cross = {"enabled": True, "lighthouse": lighthouse, "round_ms": cfg.round_ms,
                 "rounds_committed": rounds.committed_rounds(),
                 "committed_tokens": sum(p["committed_tokens"] for p in per),
                 "transfer_windows": sum(p["transfer_windows"] for p in per),
                 "bytes_sent": sum(p["bytes_sent"] for p in per),
                 "mean_wait_ms": float(np.mean(waits)) if waits else math.nan,
                 "median_wait_ms": float(np.median(waits)) if waits else math.nan,
                 "mean_wait_fraction_of_round": float(np.mean(waits)) / cfg.round_ms if waits else math.nan}
    out = {"scenario": cfg.scenario, "scenario_file": str(cfg.scenario_file) if cfg.scenario_file else None,
           "policy": cfg.policy, "seed": cfg.seed, "duration_s": round(elapsed, 3), "period_ms": cfg.period_ms,
           "partition": partition_note(world.sim.model.scenario), "guard_sms": cfg.guard_sms,
           "ground_truth": GROUND_TRUTH_NOTE, "sites": sites, "totals": totals, "cross_site": cross,
           "faults": list(world.injector.timeline) if world.injector is not None else [],
           "ended_by": world.ended_by,   # "" = the run's own end; else the component whose death ended it
           "startup": dict(world.startup)}
    if cfg.record_series:
        out["series"] = {"columns": ["t_unix", "site", "executed_sms", "reported_lease_sms", "lease_id",
                                     "lease_hard_end_unix_ms", "dt_s", "lease_valid_for_ms",
                                     "misses_training"], "rows": world.series}
        out["idle_probe_end_unix"] = world.probe_end_unix
        out["end_revoke"] = world.end_revoke
        out["xapp_revokes"] = {"columns": ["t_unix", "site", "reason"],
                               "rows": xapp_revokes(world.log_dir / "xapp.log") if world.log_dir else [],
                               "source": "the xApp's log line per control-loop revoke (1 ms)"}
        v = world.xapp_views
        out["xapp_views"] = {"columns": ["t_unix", "grant_sms"], "instances": v.instances if v else [],
                             "failures": v.failures if v else []}
        tr = world.cpu_trace
        if tr is not None:
            sers = {site_name(k): tr.series(k) for k in tr.pids}
            out["cpu_trace"] = {"columns": ["t_unix", "cpu_s"], "overhead": tr.overhead(),
                                "sites": {sid: [[round(float(a), 5), round(float(b), 7)] for a, b in zip(t, c, strict=True)]
                                          for sid, (t, c) in sers.items()}}
    return out


GROUND_TRUTH_NOTE = (
    "sm_seconds_executed and deadline_misses_attributable_to_training come from each agent process's CPU time "
    "(the process CPU clock, ns, every thread), at gpu_sms / cores site SMs per core; it includes the agent's host work "
    "outside leases (Python loop, gRPC threads, idle polling), reported as ground_truth.idle_baseline_*, "
    "never subtracted; its start-up (model build, warm-up) before it connects precedes the world's first period "
    "and is reported as ground_truth.startup_cpu_s. sm_seconds_held_by_agent is the lease the agent reported holding; sm_ms_beyond_lease "
    "is, per period, executed minus that lease when positive (max over periods and total). "
    "deadline_misses_in_repaid_overruns (a part of those attributable to training) are the misses in periods "
    "beyond the lease that the periods of the next second made up for (the kernel throttling the cgroup after a stretch "
    "in the kernel ran past its CFS quota); they are in every miss count too.")


def waterfall_line(wf: dict, top: int = 3) -> str:
    """The run's waterfall in one line: the stages, and each leg's largest causes."""
    st = wf["stages_sm_s"]
    parts = ["weaver up: waterfall " + " > ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in st.items()) + " SM·s"]
    for leg in wf["legs"]:
        big = sorted(leg["causes_sm_s"].items(), key=lambda kv: -abs(kv[1]))[:top]
        parts.append(f"{leg['from']}>{leg['to']} {-leg['lost_sm_s']:+.0f}: "
                     + ", ".join(f"{c} {v:.0f}" for c, v in big))
    sup = wf.get("outside_lease", {}).get("supervisor_cpu_s")
    if sup:
        parts.append(f"outside the leases: agent supervisors {sup:.1f} CPU·s")
    return "; ".join(parts)


def _json_safe(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_json_safe(v) for v in o]
    return o


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=None, help="seconds to run (default: until Ctrl-C)")
    parser.add_argument("--scenario", default="demo", metavar="NAME",
                        help="load regime: demo (default: --sites archetype sites of --cells cells, load 0.3), or "
                             "one of `weaver bench policies`' regimes, gh200-multicell, heavy-small-gpu, "
                             "slow-partition, with the bench's sites (GPU size, cells, loads, slices) at --period-ms")
    parser.add_argument("--scenario-file", default=None, metavar="FILE.json",
                        help="per-site slices and node settings as `weaver sim --scenario-file` takes them, on top "
                             'of --scenario: {"slices": {"*": "2:1,1:1", "1": "2:1,1:5"}, "nodes": {"1": "kpm=v4.00"}}')
    parser.add_argument("--sites", type=int, default=None,
                        help="sites, for --scenario demo (default 3); a named scenario has its own, and another "
                             "count is refused")
    parser.add_argument("--cells", type=int, default=None,
                        help="cells per site, for --scenario demo (default 4); refused like --sites otherwise")
    parser.add_argument("--policy", default="weaver", choices=["static", "reactive", "weaver", "oracle"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--period-ms", type=float, default=100.0)
    parser.add_argument("--port", type=int, default=0, help="xApp REST/dashboard port (default: any free)")
    parser.add_argument("--preset", default="tiny", help="agent model preset (tiny, small, medium)")
    parser.add_argument("--job", default=None, help="every agent's training job, package.module:factory")
    parser.add_argument("--job-arg", action="append", default=[], metavar="K=V", help="the job's arguments")
    parser.add_argument("--agent-cores", type=float, default=0.0, metavar="CORES",
                        help="cores each CPU stand-in agent's site GPU stands for (default: what this host can "
                             "serve each agent, (host cores - 0.5) / sites, at most 1)")
    parser.add_argument("--guard", type=int, default=0, metavar="SMS",
                        help="the xApp's guard band (default: one partition step, or what the kernel's granularity "
                             "on a confined CPU stand-in needs: kernel_guard_sms)")
    parser.add_argument("--run-dir", default=None, help="logs, config and checkpoints (default: a temp dir)")
    parser.add_argument("--json", default=None, metavar="SUMMARY", help="write the run summary as JSON")
    parser.add_argument("--record", default=None, metavar="FILE",
                        help="the xApp records every control-loop step to FILE (weaver-xapp --record); "
                             "`python -m testbed.bench.replay FILE` replays it through the bench's loop driver")
    parser.add_argument("--round-ms", type=int, default=5000, help="cross-site round length (default 5000)")
    parser.add_argument("--tier-host", default="", metavar="ADDR",
                        help="the interface of the cross-site tier's gates (default: --host's)")
    parser.add_argument("--no-cross-site", action="store_true",
                        help="start no Lighthouse: each site trains alone")
    parser.add_argument("--xapp-replicas", type=int, default=1, metavar="N",
                        help="run N xApp replicas that share the sites by shard (xapp.shards; needs Redis; the "
                             "cross-site tier is off with N > 1)")
    parser.add_argument("--fault", action="append", default=[], metavar="KIND[:param=value,...]",
                        help="inject a fault (repeatable; kinds and params: testbed/faults.py), e.g. "
                             "ack-delay:ms=500,for=3  partition:site=0,for=4  xapp-kill  node-restart:site=1")
    parser.add_argument("--agents-model", action="store_true",
                        help="model agents in place of training processes (agent.loadmodel: each site's lease "
                             f"protocol, a work model in place of torch), up to {MAX_MODEL_SITES} sites and any "
                             "named scenario: the control plane at a region's scale (testbed.upmodel)")
    parser.add_argument("--fault-at", type=float, default=DEFAULT_AT_S, metavar="SECONDS",
                        help=f"start of every fault that names no at= (default {DEFAULT_AT_S:g} s into the run)")


def run(args) -> int:
    from testbed.faults import parse_faults
    from testbed.sim import parse_node_overrides, read_scenario_file

    try:
        file_slices, file_nodes = read_scenario_file(args.scenario_file) if args.scenario_file else ({}, [])
        given = {k: v for k, v in (("sites", args.sites), ("cells", args.cells)) if v is not None}
        cfg = UpConfig.for_scenario(args.scenario, **given, slices=file_slices,
                       node_overrides=parse_node_overrides(file_nodes),
                       scenario_file=Path(args.scenario_file) if args.scenario_file else None,
                       duration_s=args.duration, policy=args.policy,
                       seed=args.seed, period_ms=args.period_ms, rest_port=args.port, agent_preset=args.preset,
                       agent_job=args.job or "", agent_job_args=tuple(args.job_arg),
                       agent_cores=args.agent_cores, guard_sms=args.guard,
                       run_dir=Path(args.run_dir) if args.run_dir else None,
                       cross_site=not args.no_cross_site, round_ms=args.round_ms, tier_host=args.tier_host,
                       faults=parse_faults(args.fault, args.fault_at), fault_at_s=args.fault_at,
                       record=Path(args.record).resolve() if args.record else None,
                       xapp_replicas=args.xapp_replicas, agents_model=args.agents_model)
    except ValueError as exc:
        print(f"weaver up: {exc}", file=sys.stderr)
        return 2
    if cfg.agents_model:
        from testbed.upmodel import run_model
        return run_model(cfg, args.json)
    try:
        summary = asyncio.run(run_up(cfg, out=lambda s: print(s, flush=True)))
    except ChildFailed as exc:
        print(f"weaver up: {exc}", file=sys.stderr)
        return 1
    if summary:
        t = summary["totals"]
        print(f"weaver up: done ({summary['scenario']}) in {summary['duration_s']:.0f}s - usable spare {t['usable_spare_sm_s']:.1f} SM·s, "
              f"used in lease {t['sm_seconds_used_in_lease']:.1f} ({t['used_in_lease_over_usable']:.0%}, worst site "
              f"{t['used_in_lease_over_usable_worst_site']:.0%}; agents reported {t['sm_seconds_used']:.1f}), "
              f"executed {t['sm_seconds_executed']:.1f} "
              f"(lease held {t['sm_seconds_held_by_agent']:.1f}, beyond it {t['sm_ms_beyond_lease_total'] / 1000:.1f}, worst "
              f"period {t['sms_beyond_lease_max']:.1f} SMs beyond, guard {summary['guard_sms']}), "
              f"misses {t['deadline_misses']} "
              f"(training {t['deadline_misses_attributable_to_training']}, {t['deadline_misses_in_repaid_overruns']} of them in "
              f"overruns the kernel repaid), tokens {t['tokens_trained']}, "
              f"val loss {t['val_loss_start']:.3f} -> {t['val_loss_end']:.3f}", flush=True)
        wf = t.get("waterfall")
        if wf:
            print(waterfall_line(wf), flush=True)
        xs = summary["cross_site"]
        if xs["enabled"]:
            print(f"weaver up: cross-site {xs['rounds_committed']} rounds committed, {xs['committed_tokens']} tokens, "
                  f"{xs['transfer_windows']} transfer windows, {xs['bytes_sent'] / 1e6:.1f} MB sent, wait mean "
                  f"{xs['mean_wait_ms']:.0f} ms ({xs['mean_wait_fraction_of_round']:.1%} of a round), median "
                  f"{xs['median_wait_ms']:.0f} ms", flush=True)
            for name, site in summary["sites"].items():
                c = site["cross_site"]
                print(f"weaver up:   {name}: {c['rounds_committed']}/{c['rounds_reported']} rounds committed, "
                      f"{c['committed_tokens']} tokens, {c['bytes_sent'] / 1e6:.1f} MB sent, "
                      f"wait mean {c['mean_wait_ms']:.0f} ms, median {c['median_wait_ms']:.0f} ms", flush=True)
        for f in summary["faults"]:
            print(f"weaver up: fault {f['spec']} {f['start_s']:.1f}s -> {f['end_s']:.1f}s"
                  + ("" if f["applicable"] else " (not applied)") + (f": {f['note']}" if f["note"] else ""), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(_json_safe(summary), indent=2))
        if summary["ended_by"]:
            print(f"weaver up: ended early: {summary['ended_by']}", file=sys.stderr)
            return 1
    return 0
