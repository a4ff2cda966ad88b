"""A real Weaver run for the dashboard tests: `weaver sim` (E2 nodes + mini-RIC) and `weaver-xapp` as
separate processes sharing one Redis (R-NIB and the xApp's SDL), optionally one `weaver-agent` per
listed site. Children run in their own process groups under `testbed.procs.Supervisor`, so `close()`
leaves nothing behind even when a test fails half-way."""
from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from testbed.procs import Supervisor

ROOT = Path(__file__).resolve().parents[2]
XAPP_BIN = ROOT / ".venv-xapp" / "bin"
AGENT_BIN = ROOT / ".venv-agent" / "bin"
# The testbed's default slices (testbed.model.config PROTECTED / BEST_EFFORT) and GPU size.
PROTECTED = {"sst": 2, "sd": 1}
BEST_EFFORT = {"sst": 1, "sd": 2}
GPU_SMS = 132


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(method: str, url: str, body: dict | None = None, timeout: float = 5.0) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw else None


@dataclass(frozen=True)
class RunEndpoints:
    dashboard: str       # the xApp's REST root; the dashboard is at <dashboard>/
    sim_api: str         # <sim>/sim/v1
    broker: str          # host:port of the lease broker
    meids: tuple[str, ...]


def xapp_controls(meids: list[str], *, submgr_url: str, route_table: str, rmr_port: int, broker_port: int,
                  period_ms: int = 100, absent_sites: int = 0) -> dict:
    """The `controls` section for a run against `weaver sim`: one site per node (site-<i>), plus
    `absent_sites` configured sites whose nodes never connect (site-a<i>: a region's dark sites)."""
    pairs = [(f"site-{i}", m) for i, m in enumerate(meids)] + [(f"site-a{i:04d}", f"gnb-absent-{i}")
                                                                for i in range(absent_sites)]
    sites = [{"site_id": sid, "nodes": [m], "gpu_sms": GPU_SMS, "granularity": 8,
              "protected_slices": [PROTECTED], "best_effort_slices": [BEST_EFFORT]} for sid, m in pairs]
    return {
        "period_ms": period_ms, "lease_valid_periods": 3, "stale_periods": 3,
        "policy": {"name": "weaver", "guard_sms": 8, "hold_periods": 5},
        "estimate": {"window_periods": 50},
        "actuation": {"mode": "quota", "control_timeout_ms": 1000},
        "sites": sites,
        "e2": {"discovery": "rnib"},
        "submgr": {"url": submgr_url.removesuffix("/subscriptions"), "client_host": "127.0.0.1",
                   "attempts": 10, "backoff_s": 0.2},
        "rmr": {"backend": "python", "port": rmr_port, "route_table": route_table},
        "broker": {"listen": f"127.0.0.1:{broker_port}", "heartbeat_ms": 1000},
        "rest": {"port": 0},
        "sdl": {"namespace": "weaver-dashboard"},
    }


class LiveRun:
    """Start with `LiveRun.start(...)`, always `close()` (it stops every process group it started)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.sup = Supervisor(log_dir=run_dir / "logs")
        self.endpoints: RunEndpoints | None = None

    @classmethod
    def start(cls, run_dir: Path, redis: dict, *, sites: int = 2, cells: int = 2,
              agent_sites: tuple[int, ...] = (), timeout: float = 60.0, absent_sites: int = 0) -> LiveRun:
        run = cls(run_dir)
        try:
            run._start(redis, sites, cells, agent_sites, timeout, absent_sites)
        except BaseException:
            run.close()
            raise
        return run

    def _start(self, redis: dict, sites: int, cells: int, agent_sites: tuple[int, ...], timeout: float,
               absent_sites: int = 0) -> None:
        rmr_port, broker_port = free_port(), free_port()
        redis_env = {"DBAAS_SERVICE_HOST": redis["host"], "DBAAS_SERVICE_PORT": str(redis["port"]),
                     "PYTHONPATH": str(ROOT)}
        sim = self.sup.start("sim", [str(XAPP_BIN / "weaver"), "sim", "--sites", str(sites), "--cells", str(cells),
                                     "--e2term-port", "0", "--submgr-port", "0", "--api-port", "0",
                                     "--xapp", f"127.0.0.1:{rmr_port}", "--route-dir", str(self.run_dir),
                                     "--redis", f"{redis['host']}:{redis['port']}",
                                     # the model's slices, not weaver sim's default (eMBB SST 1 / SD 1)
                                     "--slices", "2:1,1:2"], env=redis_env)
        sim.wait_for_line(r"^weaver-sim: ready", timeout)
        info = dict(line.split(" ", 2)[1:] for line in sim.lines if line.startswith("weaver-sim: ")
                    and line.count(" ") >= 2)
        meids = info["nodes"].split(",")
        controls = xapp_controls(meids, submgr_url=info["submgr"], route_table=info["route-table"],
                                 rmr_port=rmr_port, broker_port=broker_port, absent_sites=absent_sites)
        cfg = self.run_dir / "config-file.json"
        cfg.write_text(json.dumps({"name": "weaver", "version": "0.1.0", "controls": controls}))
        env = dict(redis_env, CONFIG_FILE=str(cfg))
        xapp = self.sup.start("xapp", [str(XAPP_BIN / "weaver-xapp")], env=env)
        rest_port = xapp.wait_for_line(r"^weaver-xapp: rest (\d+)", timeout).group(1)
        xapp.wait_for_line(r"^weaver-xapp: ready", timeout)
        self.endpoints = RunEndpoints(dashboard=f"http://127.0.0.1:{rest_port}", sim_api=info["sim-api"],
                                      broker=f"127.0.0.1:{broker_port}", meids=tuple(meids))
        for i in agent_sites:
            self.sup.start(f"agent:{i}", [str(AGENT_BIN / "weaver-agent"), "run", "--preset", "tiny",
                                          "--broker", self.endpoints.broker, "--site-id", f"site-{i}",
                                          "--agent-id", f"agent-{i}",
                                          "--checkpoint-dir", str(self.run_dir / f"ckpt-{i}")],
                           env={"PYTHONPATH": str(ROOT)})

    def tails(self, n: int = 15) -> str:
        return "\n".join(f"--- {c.name} (alive={c.alive})\n" + "\n".join(list(c.lines)[-n:])
                         for c in self.sup.children)

    def close(self) -> None:
        # xApp first (it revokes leases), then agents, then the testbed: the order `weaver up` uses.
        self.sup.stop_all(order=["xapp", "agent", "sim"], timeout=10.0)


async def until(fn, timeout: float, what: str, run: LiveRun, every: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await fn()
        if last:
            return last
        await asyncio.sleep(every)
    raise AssertionError(f"dashboard: timed out after {timeout:.0f}s waiting for {what}; last: {last}\n{run.tails()}")
