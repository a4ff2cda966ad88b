"""Deploying on a real OSC RIC (issue 15 item 1), on a real XappApp against a private real Redis:

- readiness is RMR + SDL, as both OSC frameworks: ready while SubMgr has not notified (on a Kubernetes RIC
  the notification cannot reach a pod that is not ready), the subscription state reported in the body, at
  /api/v1/subscriptions and in /metrics; 503 while SDL is unreachable, ready again when it is back;
- appmgr registration with no APP_NAMESPACE in the environment (ricxapp, as the frameworks), posted to a
  real HTTP server standing in for appmgr as soon as RMR and SDL are up, and deregistration on stop;
- the metrics also at /ric/v1/metrics (the Go framework's path, named by the descriptor's annotations).
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import aiohttp
import redis
from aiohttp import web
from xapp_harness import until

from xapp.app import XappApp
from xapp.appmgr import deregister, register_if_configured, registration
from xapp.config import XappConfig

ROOT = Path(__file__).resolve().parents[2]


class StandIn:
    """A real aiohttp server recording what it is sent: SubMgr that accepts a subscription and never
    notifies (what a not-ready pod sees on Kubernetes), and appmgr's register / deregister."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> str:
        async def record(request):
            self.posts.append((request.path, await request.json()))
            if request.path.endswith("/subscriptions"):
                return web.json_response({"SubscriptionId": f"sub-{len(self.posts)}",
                                          "SubscriptionInstances": None}, status=201)
            return web.json_response({}, status=201)

        async def listing(request):
            return web.json_response([])

        async def gone(request):
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post("/{tail:.*}", record)
        app.router.add_get("/ric/v1/subscriptions", listing)
        app.router.add_delete("/{tail:.*}", gone)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        return [p for p, _ in self.posts]


def controls(submgr: str) -> dict:
    c = json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"]
    c["submgr"].update(url=f"{submgr}/ric/v1", attempts=1, backoff_s=0.01)
    c["e2"].update(discovery="static", static_nodes=[{"meid": "gnb-a", "kpm_function_id": 2}])
    return c


async def _get(s: aiohttp.ClientSession, base: str, path: str):
    async with s.get(base + path) as r:
        return r.status, (await r.json() if "json" in r.headers.get("Content-Type", "") else await r.text())


def test_ready_and_registered_before_any_subscription(redis_env, tmp_path, monkeypatch):
    monkeypatch.setenv("WEAVER_CONFIG_TOKEN", "s3cret")
    asyncio.run(_ready_and_registered(tmp_path))


async def _ready_and_registered(tmp_path):
    ric = StandIn()
    base_ric = await ric.start()
    x = XappApp(XappConfig.from_controls(controls(base_ric)))
    await x.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
    rest = f"http://127.0.0.1:{x.rest_port}"
    desc = tmp_path / "config-file.json"
    desc.write_text((ROOT / "descriptors" / "config-file.json").read_text())
    env = {"CONFIG_FILE": str(desc), "HOSTNAME": "weaver",            # no APP_NAMESPACE: the chart sets none
           "SERVICE_RICXAPP_WEAVER_HTTP_PORT": f"tcp://127.0.0.1:{x.rest_port}",
           "SERVICE_RICXAPP_WEAVER_RMR_PORT": f"tcp://127.0.0.1:{x.rmr.port}"}
    reg = None
    try:
        # SubMgr took the request (201) and will not notify: the subscription stays pending
        await until(lambda: "/ric/v1/subscriptions" in ric.paths(), 10, "the subscription request")
        async with aiohttp.ClientSession() as s:
            status, doc = await _get(s, rest, "/ric/v1/health/ready")
            assert status == 200, doc
            assert doc["ready"] is True and doc["rmr"] is True and doc["sdl"] is True
            assert doc["subscriptions"] is False            # reported, not gating
            _, subs = await _get(s, rest, "/api/v1/subscriptions")
            assert [(v["meid"], v["state"]) for v in subs["subscriptions"]] == [("gnb-a", "pending")]
            reg = registration(env)                         # APP_NAMESPACE defaults to ricxapp
            assert isinstance(reg, tuple), reg
            url, _ = reg
            assert url == "http://service-ricplt-appmgr-http.ricplt:8080/ric/v1/register"
            reg = asyncio.ensure_future(register_if_configured(x, env, attempts=3, appmgr_url=base_ric))
            # registered while the subscription is pending, with the frameworks' body and namespace
            assert await asyncio.wait_for(reg, 5) is True
            [(path, body)] = [(p, b) for p, b in ric.posts if p == "/ric/v1/register"]
            assert body == {"appName": "weaver", "appVersion": "0.1.0", "configPath": "",
                            "appInstanceName": "weaver", "httpEndpoint": f"127.0.0.1:{x.rest_port}",
                            "rmrEndpoint": f"127.0.0.1:{x.rmr.port}", "config": json.dumps(json.loads(
                                desc.read_text()))}
            # /ric/v1/metrics is /metrics: the same families, the subscription shown inactive
            s1, m1 = await _get(s, rest, "/metrics")
            s2, m2 = await _get(s, rest, "/ric/v1/metrics")
            assert s1 == s2 == 200
            fams = [sorted(ln for ln in m.splitlines() if ln.startswith("# TYPE")) for m in (m1, m2)]
            assert fams[0] == fams[1] and len(fams[0]) > 20
            assert 'weaver_subscription_active{meid="gnb-a"} 0' in m2
            assert "weaver_appmgr_registered 1" in m2
        assert await deregister(env, appmgr_url=base_ric) is True
        assert ric.posts[-1] == ("/ric/v1/deregister", {"appName": "weaver", "appInstanceName": "weaver"})
    finally:
        if reg is not None:
            reg.cancel()
        await x.stop()
        await ric.runner.cleanup()


def test_readiness_follows_sdl(redis_server, monkeypatch):
    monkeypatch.setenv("DBAAS_SERVICE_HOST", redis_server["host"])
    monkeypatch.setenv("DBAAS_SERVICE_PORT", str(redis_server["port"]))
    monkeypatch.setenv("WEAVER_CONFIG_TOKEN", "s3cret")
    asyncio.run(_readiness_follows_sdl(redis_server["port"]))


async def _readiness_follows_sdl(port: int):
    ric = StandIn()
    x = XappApp(XappConfig.from_controls(controls(await ric.start())))
    await x.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
    rest = f"http://127.0.0.1:{x.rest_port}"
    again = None
    try:
        async with aiohttp.ClientSession() as s:
            assert (await _get(s, rest, "/ric/v1/health/ready"))[0] == 200
            with redis.Redis(port=port) as r:
                try:
                    r.shutdown(nosave=True)
                except redis.ConnectionError:
                    pass                                  # the server closes the connection as it goes
            status, doc = await until(lambda: _unready(s, rest), 10, "503 with SDL down")
            assert doc["sdl"] is False and doc["rmr"] is True and doc["ready"] is False
            again = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await until(lambda: _ready(s, rest), 15, "ready again once SDL is back")
    finally:
        await x.stop()
        await ric.runner.cleanup()
        if again is not None:
            again.terminate()
            again.wait(5)


async def _unready(s, rest):
    status, doc = await _get(s, rest, "/ric/v1/health/ready")
    return (status, doc) if status == 503 else None


async def _ready(s, rest):
    return (await _get(s, rest, "/ric/v1/health/ready"))[0] == 200
