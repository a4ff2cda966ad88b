"""Restart: SIGKILL the xApp mid-run, start it again against the same real Redis. It must come back with
the same SubMgr subscriptions (no duplicates, no leaks), its sites' acknowledged envelopes and the lease
ledger, in a new broker epoch; no agent may hold a lease from before the kill beyond that lease's validity."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from xapp_harness import LeaseClient, SimBed, XappProcess, free_port, until, xapp_config

from schemas.proto.weaver.v1 import lease_pb2
from xapp.state import open_store

pytestmark = pytest.mark.slow


def test_sigkill_and_restart(tmp_path, redis_env, xapp_python):
    asyncio.run(_restart(tmp_path, redis_env, xapp_python))


async def _subs(tb) -> list[str]:
    async with aiohttp.ClientSession() as s, s.get(tb.sim.ric.submgr_url + "/subscriptions") as r:
        return sorted(str(d.get("RestSubscriptionId", d["SubscriptionId"])) for d in await r.json())


async def _restart(tmp, redis, python):
    rmr_port, broker_port = free_port(), free_port()
    tb = await SimBed.start(tmp, rmr_port)
    x = x2 = a1 = a2 = None
    try:
        cfg = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=broker_port, mode="auto")
        x = await XappProcess.start(python, cfg, redis, tmp / "xapp.log", extra=("--keep-subscriptions",))
        await x.wait_ready()
        epoch1 = int(x.info["epoch"])
        a1 = LeaseClient(broker_port, "site-0").start()
        await until(lambda: [lease for _, lease in a1.leases() if lease.sm_count > 0], 15, "a lease")

        async def acked_site():
            _, doc = await x.get("/api/v1/sites/site-0")
            return doc["acked_envelope_sms"] is not None and doc
        before = await until(acked_site, 10, "an acknowledged envelope")
        assert before["nodes"][tb.meids[0]]["mode"] == "envelope"
        # the node obeys: the RAN model's compute-aware MAC now runs inside the acknowledged envelope
        await until(lambda: float(tb.sim.model.envelope[0]) == before["acked_envelope_sms"]
                    or float(tb.sim.model.envelope[0]) < 132, 5, "the node to apply the envelope")
        subs_before = await _subs(tb)
        assert len(subs_before) == 2

        x.kill()
        await x.proc.wait()
        kill_t, kill_wall = time.monotonic(), time.time()
        store = open_store("weaver-e2e")
        sdl_site = store.sites()["site-0"]
        assert sdl_site.envelope_sms == before["acked_envelope_sms"] or sdl_site.envelope_sms > 0
        old_leases = [r for r in store.leases() if r.epoch == epoch1]
        assert old_leases, "the ledger kept the pre-kill leases"
        await until(lambda: a1.done.is_set(), 5, "the agent stream to break")
        last_old = max(t for t, _ in a1.leases())

        x2 = await XappProcess.start(python, cfg, redis, tmp / "xapp2.log", extra=("--keep-subscriptions",))
        await x2.wait_ready()
        assert int(x2.info["epoch"]) == epoch1 + 1
        log2 = (tmp / "xapp2.log").read_text()
        assert log2.count("reusing subscription") == 2, log2[-2000:]
        assert "2 subscriptions, 2 sites" in log2
        assert await _subs(tb) == subs_before                  # the same two: none duplicated, none leaked

        a2 = LeaseClient(broker_port, "site-0").start()
        await until(lambda: [lease for _, lease in a2.leases() if lease.sm_count > 0], 15, "a lease after restart")
        first = [m for _, m in a2.messages if isinstance(m, lease_pb2.BrokerMessage)]
        assert first[0].WhichOneof("body") == "welcome" and first[0].welcome.epoch == epoch1 + 1
        assert first[1].WhichOneof("body") == "revoke" and first[1].revoke.lease_id == ""
        assert all(lease.epoch == epoch1 + 1 for _, lease in a2.leases())
        # Nothing from before the kill outlives its validity: the old agent got its last old-epoch lease
        # before the kill, and every new lease comes from the new epoch, after fresh KPM.
        assert last_old <= kill_t and all(lease.epoch == epoch1 for _, lease in a1.leases())
        ledger = store.leases()
        for r in ledger:
            if r.epoch == epoch1:
                assert r.ended in ("epoch-ended", "revoked") or r.valid_until_unix <= kill_wall + 0.3 + 0.05
            else:
                assert r.issued_unix >= kill_wall
        _, s0 = await x2.get("/api/v1/sites/site-0")
        assert s0["acked_envelope_sms"] is not None
    finally:
        for a in (a1, a2):
            if a:
                await a.close()
        for p in (x, x2):
            if p:
                await p.stop()
        await tb.close()
