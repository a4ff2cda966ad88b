"""Issue 13 item 1 (lease broker): nothing a client sends can take over a site's lease stream.

Before: a second Register for a live site replaced the real agent's stream (repeated, an attacker collected
44 of one site's leases in 10 s), and with a token configured one shared token registered as any site.
Now each site's agent presents its own credential, HMAC-SHA256(broker secret, site_id), which registers that
site only; a Register for a site whose session is alive is refused with ALREADY_EXISTS, and a reconnect is
welcomed once the old stream has closed or has been silent past the heartbeat expiry (a half-open TCP
connection, here a real stalled proxy). Refusals are counted by reason in the running xApp's /metrics,
and neither the secret nor a credential shows in its REST output or logs.
Real grpc.aio broker on loopback; raw gRPC clients built from the proto stubs act as the agent and the
attacker."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import time
from pathlib import Path

import aiohttp
import grpc
import pytest

from schemas.credential import make_proof
from schemas.proto.weaver.v1 import lease_pb2
from testbed.tcpproxy import TcpProxy
from xapp.agents import AgentBook
from xapp.app import XappApp
from xapp.broker import LeaseBroker
from xapp.config import XappConfig

METHOD = "/weaver.v1.LeaseBroker/Session"
ROOT = Path(__file__).resolve().parents[2]
SECRET = "broker-secret-for-the-test-0123456789"


def site_credential(secret: str, site: str) -> str:
    """The contract (xapp.agents.site_credential), restated: a site's credential is HMAC-SHA256(secret, site)."""
    return hmac.new(secret.encode(), site.encode(), hashlib.sha256).hexdigest()


def make_cfg(token_env=None):
    return XappConfig.from_controls({
        "period_ms": 100, "policy": {"name": "weaver"},
        "sites": [{"site_id": "s1", "nodes": ["n1"], "gpu_sms": 128}, {"site_id": "s2", "nodes": ["n2"]}],
        "broker": {"listen": "127.0.0.1:0", "token_env": token_env, "heartbeat_ms": 100,
                   "agent_timeout_heartbeats": 3}})


def proof(credential: str, site: str, agent: str = "agent-1") -> str:
    """What an agent registers with (schemas.credential): a one-time proof of its credential, made now."""
    return make_proof(credential, site, agent, int(time.time() * 1000))


def register(site="s1", token="", agent="agent-1", raw=False):
    """`token`: the credential the agent holds (sent as a fresh proof of it); `raw`: sent as it is."""
    return lease_pb2.AgentMessage(register=lease_pb2.Register(
        site_id=site, agent_id=agent, token=token if raw or not token else proof(token, site, agent), mode="gpu",
        device=lease_pb2.DeviceFacts(kind="cuda", name="H200", sm_count=128, granularity=8))).SerializeToString()


def heartbeat(seq):
    return lease_pb2.AgentMessage(heartbeat=lease_pb2.Heartbeat(seq=seq)).SerializeToString()


class Peer:
    """One raw stream: what the test queues is sent, in order; `hold` keeps it open and silent."""

    def __init__(self, channel: grpc.aio.Channel, first: bytes, metadata=None) -> None:
        self.q: asyncio.Queue = asyncio.Queue()
        self.q.put_nowait(first)
        call = channel.stream_stream(METHOD, request_serializer=lambda b: b,
                                     response_deserializer=lease_pb2.BrokerMessage.FromString)
        self.call = call(self._requests(), metadata=metadata)

    async def _requests(self):
        while (item := await self.q.get()) is not None:
            yield item

    async def read(self, timeout=3.0):
        return await asyncio.wait_for(self.call.read(), timeout)

    async def welcomed(self) -> str:
        """The Welcome's site (and the session's opening revoke-all), or the gRPC error code."""
        try:
            w = await self.read()
            assert (await self.read()).WhichOneof("body") == "revoke"
            return w.welcome.site_id
        except grpc.aio.AioRpcError as err:
            return err.code()

    async def error(self):
        try:
            while (await self.read()) is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details()
        return None


async def wait_for(pred, timeout=3.0):
    for _ in range(int(timeout / 0.01)):
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def with_broker(cfg, body, **kw):
    async def main():
        book = AgentBook(epoch=7, period_ms=100, valid_periods=3, heartbeat_ms=100, timeout_heartbeats=3)
        ledger = []
        broker = LeaseBroker(cfg, book, on_lease=lambda issued, what: ledger.append((issued.lease.lease_id, what)),
                             **kw)
        port = await broker.start("127.0.0.1:0")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                return await body(broker, ch, ledger, port)
        finally:
            await broker.stop(0.1)
    return asyncio.run(main())


def test_a_site_credential_registers_only_its_own_site(monkeypatch):
    monkeypatch.setenv("TEST_BROKER_SECRET", SECRET)
    s1 = site_credential(SECRET, "s1")

    async def body(broker, ch, ledger, port):
        out = {}
        for name, first, md in (
                ("s1 credential for s2", register("s2", s1), None),
                ("s1 credential for s2, metadata", register("s2"), (("authorization", f"Bearer {proof(s1, 's2')}"),)),
                ("s1 credential itself, not a proof", register("s1", s1, raw=True), None),
                ("the secret itself", register("s1", SECRET), None),
                ("no credential", register("s1"), None),
                ("unknown site", register("nowhere", s1), None)):
            out[name] = await Peer(ch, first, md).error()
        agent = Peer(ch, register("s1", s1))
        out["s1 credential for s1"] = await agent.welcomed()
        agent.call.cancel()
        return out, dict(broker.refused_registrations)

    out, refused = with_broker(make_cfg("TEST_BROKER_SECRET"), body)
    assert out.pop("s1 credential for s1") == "s1"
    for name, (code, details) in out.items():
        assert code == grpc.StatusCode.UNAUTHENTICATED and "token" in details, name
        assert "known" not in details, name     # an unauthenticated peer is not told the site list
    assert refused == {"unauthenticated": 6}


def test_a_live_site_session_is_not_taken_over():
    """The attacker's Registers for s1 are refused while the real agent heartbeats; every lease still
    reaches the real agent and none the attacker."""
    async def body(broker, ch, ledger, port):
        agent = Peer(ch, register(agent="real-agent"))
        assert await agent.welcomed() == "s1"
        got = []
        for i in range(10):
            agent.q.put_nowait(heartbeat(i + 1))
            attacker = Peer(ch, register(agent="attacker"))
            code, details = await attacker.error()
            assert code == grpc.StatusCode.ALREADY_EXISTS, (code, details)
            assert "already has a live agent session" in details and "real-agent" in details
            broker.grant("s1", 64, "weaver")
            while (m := await agent.read()).WhichOneof("body") != "lease":
                pass
            got.append(m.lease.seq)
        return got, broker.sessions["s1"].session, dict(broker.refused_registrations)

    got, session, refused = with_broker(make_cfg(), body)
    assert got == list(range(1, 11)) and session == 1         # the first session kept every lease
    assert refused == {"already-connected": 10}


def test_a_reconnect_is_welcomed_once_the_old_stream_closed():
    async def body(broker, ch, ledger, port):
        old = Peer(ch, register())
        assert await old.welcomed() == "s1"
        broker.grant("s1", 32, "weaver")
        await old.read()
        old.call.cancel()                         # the agent's process died, its connection closed
        await wait_for(lambda: not broker.sessions and "s1" not in broker.book.leases)   # its lease went with it
        new = Peer(ch, register())
        site = await new.welcomed()
        broker.grant("s1", 16, "weaver")
        lease = (await new.read()).lease
        new.call.cancel()
        return site, lease.seq

    assert with_broker(make_cfg(), body) == ("s1", 2)


def test_a_half_open_session_is_replaced_only_after_the_heartbeat_expiry():
    """A network cut the broker cannot see (a stalled TCP proxy: the connection stays open): the agent's
    reconnect over another path is refused while the old session is within its expiry (3 x 100 ms), and
    welcomed after it; the old session's lease is revoked and its stream closed."""
    async def body(broker, ch, ledger, port):
        proxy = await TcpProxy("127.0.0.1", port, "127.0.0.1", 0, name="proxy:s1").start()
        try:
            async with grpc.aio.insecure_channel(proxy.address) as via_proxy:
                old = Peer(via_proxy, register(agent="agent-1"))
                assert await old.welcomed() == "s1"
                broker.grant("s1", 64, "weaver")
                assert (await old.read()).lease.seq == 1
                proxy.stall("both", 30.0)             # the cut: nothing passes, nothing is closed
                early = await Peer(ch, register(agent="agent-1")).error()
                await asyncio.sleep(0.45)             # past 3 heartbeats of silence
                new = Peer(ch, register(agent="agent-1"))
                site = await new.welcomed()
                broker.grant("s1", 16, "weaver")
                lease = (await new.read()).lease
                proxy.heal()
                await old.error()                     # returns: the broker ended the old stream
                new.call.cancel()
                return early, site, lease.seq, ledger
        finally:
            await proxy.close()

    early, site, seq, ledger = with_broker(make_cfg(), body)
    assert early[0] == grpc.StatusCode.ALREADY_EXISTS
    assert site == "s1" and seq == 2
    assert ledger[:3] == [("s1.7.1", "granted"), ("s1.7.1", "revoked"), ("s1.7.2", "granted")]


@pytest.fixture()
def no_dbaas(monkeypatch):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    monkeypatch.delenv("DBAAS_CLUSTER_ADDR_LIST", raising=False)
    monkeypatch.setenv("WEAVER_BROKER_SECRET", SECRET)
    monkeypatch.setenv("WEAVER_CONFIG_TOKEN", "rest-config-token")


def test_running_xapp_counts_refusals_and_shows_no_secret(no_dbaas, caplog):
    """A real XappApp (embedded SDL, SubMgr unreachable) with the shipped descriptor's broker.token_env:
    an attacker's refused registrations and usage reports show in /metrics by reason, the real agent's
    session stays, and no REST answer nor log line holds the secret or a site credential."""
    caplog.set_level("DEBUG")
    c = json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"]
    c["submgr"].update(url="http://127.0.0.1:9/ric/v1", attempts=1, backoff_s=0.01)
    c["e2"].update(discovery="static", static_nodes=[{"meid": "gnb-a", "kpm_function_id": 2}])
    assert c["broker"]["token_env"] == "WEAVER_BROKER_SECRET"
    site = c["sites"][0]["site_id"]
    cred = site_credential(SECRET, site)

    async def main():
        x = XappApp(XappConfig.from_controls(c))
        await x.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{x.broker.port}") as ch:
                agent = Peer(ch, register(site, cred, agent="real-agent"))
                assert await agent.welcomed() == site
                assert (await Peer(ch, register(site, SECRET)).error())[0] == grpc.StatusCode.UNAUTHENTICATED
                assert (await Peer(ch, register(site, cred)).error())[0] == grpc.StatusCode.ALREADY_EXISTS
                agent.q.put_nowait(lease_pb2.AgentMessage(usage=lease_pb2.UsageReport(
                    lease_id=f"{site}.{x.epoch}.999", sm_ms_used=1e300)).SerializeToString())
                await wait_for(lambda: x.broker.refused_usage)
                assert x.broker.sessions[site] is not None
                base = f"http://127.0.0.1:{x.rest_port}"
                bodies = {}
                async with aiohttp.ClientSession() as s:
                    for path in ("/metrics", "/api/v1/config", "/api/v1/agents", "/api/v1/sites",
                                 f"/api/v1/sites/{site}", "/openapi.json"):
                        async with s.get(base + path) as r:
                            bodies[path] = (r.status, await r.text())
                agent.call.cancel()
                return bodies
        finally:
            await x.stop()

    bodies = asyncio.run(main())
    metrics = bodies["/metrics"][1]
    assert 'weaver_broker_refused_registrations_total{reason="unauthenticated"} 1' in metrics
    assert 'weaver_broker_refused_registrations_total{reason="already-connected"} 1' in metrics
    assert 'weaver_broker_refused_usage_reports_total{reason="usage-unknown-lease"} 1' in metrics
    for path, (status, text) in bodies.items():
        assert status == 200, path
        assert SECRET not in text and cred not in text, path
    assert SECRET not in caplog.text and cred not in caplog.text


def test_site_token_prints_a_sites_credential_from_the_secret_in_the_environment(monkeypatch):
    import subprocess
    import sys

    cfg = str(ROOT / "descriptors" / "config-file.json")
    site = json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"]["sites"][0]["site_id"]

    def run_cli(*args, secret=SECRET):
        env = {k: v for k, v in os.environ.items() if k != "WEAVER_BROKER_SECRET"}
        if secret:
            env["WEAVER_BROKER_SECRET"] = secret
        return subprocess.run([sys.executable, "-m", "xapp", "site-token", *args], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=60)

    ok = run_cli(site, "--config", cfg)
    expiry, _, mac = ok.stdout.strip().partition(".")
    assert ok.returncode == 0 and 29 * 86400 < int(expiry) - time.time() <= 30 * 86400   # 30 days by default
    assert mac == hmac.new(SECRET.encode(), f"{site}|{expiry}".encode(), hashlib.sha256).hexdigest()
    forever = run_cli(site, "--config", cfg, "--valid-days", "0")
    assert forever.stdout.strip() == site_credential(SECRET, site)
    unknown = run_cli("no-such-site", "--config", cfg)
    assert unknown.returncode == 2 and "unknown site" in unknown.stderr
    missing = run_cli(site, "--config", cfg, secret="")
    assert missing.returncode == 2 and "WEAVER_BROKER_SECRET" in missing.stderr
