"""Harness for the xApp's process-level tests: the testbed (E2 nodes over the RAN model + mini-RIC) runs
in the test's event loop, sharing a real Redis R-NIB with the xApp, which runs as a separate process
(`python -m xapp`). A minimal lease client stands in for the site agent."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import grpc

from schemas.proto.weaver.v1 import lease_pb2
from testbed.e2node.measure import from_period_report
from testbed.sim import SimConfig, Simulation, ntp64

ROOT = Path(__file__).resolve().parents[2]
METHOD = "/weaver.v1.LeaseBroker/Session"


def standalone_controls(namespace: str) -> dict:
    """The shipped descriptor's controls for an xApp started alone in a test: one static node, a SubMgr
    nobody answers (fast failure), its own SDL namespace."""
    c = json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"]
    c["submgr"].update(url=f"http://127.0.0.1:{free_port()}/ric/v1", attempts=1, backoff_s=0.01)
    c["e2"].update(discovery="static", static_nodes=[{"meid": "gnb-a", "kpm_function_id": 2}])
    c["sdl"] = {"namespace": namespace}
    return c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimBed:
    """The simulation, stepped in real time by the test; nodes in `muted` stop reporting KPM."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.muted: set[str] = set()
        self.last_report: dict[str, float] = {}
        self._task: asyncio.Task | None = None

    @classmethod
    async def start(cls, tmp: Path, xapp_rmr: int, n_sites: int = 2, n_cells: int = 2,
                    overrides: dict[int, dict] | None = None) -> SimBed:
        from ricxappframe.xapp_sdl import SDLWrapper

        # the standard text's dialect: the xApp's quota mode caps slices, which is what these tests check it does
        # (srsRAN's own DU would limit one UE's grants: testbed.e2node.dialects, tests/emulator/test_dialect_effects.py)
        sim = await Simulation.start(SimConfig(n_sites=n_sites, n_cells=n_cells, xapps=(f"127.0.0.1:{xapp_rmr}",),
                                               route_dir=str(tmp), speed=1.0,
                                               node_overrides={i: {"dialect": "o-ran", **(overrides or {}).get(i, {})}
                                                               for i in range(n_sites)}),
                                     sdl=SDLWrapper())
        tb = cls(sim)
        tb._task = asyncio.ensure_future(tb._run())
        return tb

    async def _run(self) -> None:
        sim = self.sim
        period = sim.period_s
        t0 = time.monotonic()
        n = 0
        while True:
            start_s = sim.now_s
            report = sim.model.step_period()
            stamp = ntp64(sim.epoch_unix + start_s)
            for node in sim.nodes:
                if node.meid in self.muted:
                    continue
                m = from_period_report(report, node.node.config.site, node.node.config.gpu_sms)
                await node.report(m, sim.now_s * 1000.0, stamp)
                self.last_report[node.meid] = time.monotonic()
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * period - time.monotonic()))

    @property
    def meids(self) -> list[str]:
        return [n.meid for n in self.sim.nodes]

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.sim.close()


def xapp_config(tb: SimBed, tmp: Path, *, rmr_port: int, broker_port: int, mode: str = "quota",
                stale_periods: float = 2) -> Path:
    sim = tb.sim
    sites = []
    for i, node in enumerate(sim.nodes):
        slices = node.node.config.slices
        site = sim.model.scenario.sites[i]
        prot = [{"sst": s.sst, "sd": s.sd} for s, c in zip(slices, site.slices, strict=True) if c.protected]
        be = [{"sst": s.sst, "sd": s.sd} for s, c in zip(slices, site.slices, strict=True) if not c.protected]
        sites.append({"site_id": f"site-{i}", "nodes": [node.meid], "gpu_sms": node.node.config.gpu_sms,
                      "granularity": 8, "protected_slices": prot, "best_effort_slices": be})
    controls = {
        "period_ms": int(round(sim.period_s * 1000)), "lease_valid_periods": 3, "stale_periods": stale_periods,
        "policy": {"name": "weaver", "guard_sms": 8, "hold_periods": 5},
        "estimate": {"window_periods": 50},
        "actuation": {"mode": mode, "control_timeout_ms": 1000},
        "sites": sites,
        "e2": {"discovery": "rnib"},
        "submgr": {"url": sim.ric.submgr_url, "client_host": "127.0.0.1", "attempts": 10, "backoff_s": 0.2},
        "rmr": {"backend": "python", "port": rmr_port, "route_table": str(sim.ric.route_file)},
        "broker": {"listen": f"127.0.0.1:{broker_port}", "heartbeat_ms": 1000},
        "rest": {"port": 0},
        "sdl": {"namespace": "weaver-e2e"},
    }
    p = tmp / "config-file.json"
    p.write_text(json.dumps({"name": "weaver", "version": "0.1.0", "controls": controls}))
    return p


class XappProcess:
    def __init__(self, proc, log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.info: dict[str, str] = {}

    @classmethod
    async def start(cls, python: Path, config: Path, redis: dict, log_path: Path, extra=()) -> XappProcess:
        env = dict(os.environ, CONFIG_FILE=str(config), DBAAS_SERVICE_HOST=redis["host"],
                   DBAAS_SERVICE_PORT=str(redis["port"]), PYTHONPATH=str(ROOT))
        env.pop("HOSTNAME", None)
        log = open(log_path, "ab")
        proc = await asyncio.create_subprocess_exec(str(python), "-m", "xapp", *extra, cwd=ROOT, env=env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=log)
        x = cls(proc, log_path)
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            if not line:
                raise AssertionError(f"xApp exited early:\n{log_path.read_text()[-3000:]}")
            text = line.decode().strip()
            if text == "weaver-xapp: ready":
                break
            _, key, value = text.split(" ", 2)
            x.info[key] = value
        return x

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.info['rest']}"

    async def get(self, path: str):
        async with aiohttp.ClientSession() as s, s.get(self.rest + path) as r:
            return r.status, await r.json(content_type=None)

    async def wait_ready(self, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, doc = await self.get("/ric/v1/health/ready")
            # ready is RMR + SDL (READY_GATES); these tests also need KPM flowing, so the subscriptions too
            if status == 200 and doc.get("subscriptions"):
                return doc
            await asyncio.sleep(0.2)
        raise AssertionError(f"xApp not ready: {doc}\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return self.proc.returncode


class LeaseClient:
    """A minimal agent: register, then record every message the broker sends (with its arrival time)."""

    def __init__(self, port: int, site: str) -> None:
        self.port, self.site = port, site
        self.messages: list[tuple[float, lease_pb2.BrokerMessage]] = []
        self.outbox: asyncio.Queue = asyncio.Queue()          # extra AgentMessages to send (usage, plans)
        self._task: asyncio.Task | None = None
        self.done = asyncio.Event()

    def start(self) -> LeaseClient:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _run(self) -> None:
        reg = lease_pb2.AgentMessage(register=lease_pb2.Register(
            site_id=self.site, agent_id="test-agent", mode="gpu",
            device=lease_pb2.DeviceFacts(kind="cuda", name="H200", sm_count=132, granularity=8)))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as ch:
                call = ch.stream_stream(METHOD, request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=lease_pb2.BrokerMessage.FromString)

                async def up():
                    yield reg
                    seq = 0
                    while True:
                        try:
                            yield await asyncio.wait_for(self.outbox.get(), 0.3)
                        except TimeoutError:
                            seq += 1
                            yield lease_pb2.AgentMessage(heartbeat=lease_pb2.Heartbeat(seq=seq))

                async for msg in call(up()):
                    self.messages.append((time.monotonic(), msg))
        except grpc.aio.AioRpcError as exc:
            self.messages.append((time.monotonic(), exc))
        finally:
            self.done.set()

    def leases(self) -> list[tuple[float, lease_pb2.Lease]]:
        return [(t, m.lease) for t, m in self.messages if isinstance(m, lease_pb2.BrokerMessage)
                and m.WhichOneof("body") == "lease"]

    def revokes(self, after: float = 0.0) -> list[tuple[float, lease_pb2.Revoke]]:
        return [(t, m.revoke) for t, m in self.messages if isinstance(m, lease_pb2.BrokerMessage)
                and m.WhichOneof("body") == "revoke" and t >= after]

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def until(pred, timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        await asyncio.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def python_exe() -> Path:
    return Path(sys.executable)
