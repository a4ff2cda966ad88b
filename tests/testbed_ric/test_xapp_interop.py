"""The project's xApp-side clients against the mini-RIC: `xapp.submgr.SubmgrClient` subscribes and
unsubscribes through our SubMgr, and `xapp.rnib.read_rnib` reads what our E2T wrote."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from e2sm import kpm
from testbed.sim import SimConfig, Simulation

from .tiny_xapp import kpm_action

submgr_mod = pytest.importorskip("xapp.submgr")
rnib_mod = pytest.importorskip("xapp.rnib")
config_mod = pytest.importorskip("xapp.config")


async def _interop() -> None:
    sim = await Simulation.start(SimConfig(n_sites=2, n_cells=2, speed=0))
    session = aiohttp.ClientSession()
    runner = None
    try:
        nodes, problems = rnib_mod.read_rnib(sim.ric.sdl)
        assert problems == [] and sorted(n.meid for n in nodes) == [n.meid for n in sim.nodes]
        node = nodes[0]
        assert node.connected and node.kpm.oid == kpm.KPM_OID_V3 and node.rc is not None

        holder = []

        async def on_note(request):
            holder[0].on_notification(await request.json())
            return web.Response()

        app = web.Application()
        app.router.add_post("/ric/v1/subscriptions/response", on_note)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        cfg = config_mod.SubmgrConfig(url=sim.ric.submgr_url, client_host="127.0.0.1", http_port=port,
                                      rmr_port=4999, e2_timeout_s=1, e2_retries=0, attempts=1)
        client = submgr_mod.SubmgrClient(cfg, session)
        holder.append(client)
        v3 = kpm.KpmVersion.V3_00
        spec = submgr_mod.SubscriptionSpec(
            meid=node.meid, ran_function_id=node.kpm.ran_function_id, xapp_event_instance_id=9,
            event_trigger=kpm.encode_event_trigger(kpm.KpmEventTrigger(100), v3),
            actions=(submgr_mod.ActionSpec(action_id=1, definition=kpm_action(v3, None, sim.nodes[0].node.config.slices)),))
        outcome = await client.subscribe(spec)
        assert outcome.e2_event_instance_id > 0
        assert sim.ric.e2term.routes.subscriptions == {outcome.e2_event_instance_id: "127.0.0.1:4999"}
        listed = await client.list()
        assert [e["SubscriptionId"] for e in listed] == [outcome.e2_event_instance_id]
        assert await client.unsubscribe(outcome.subscription_id) is True
        # SubMgr answers 204 for an id being deleted or gone: gone, either way
        assert await client.unsubscribe(outcome.subscription_id) is True
        for _ in range(200):             # the E2 delete runs in the background, as SubMgr's
            if not sim.ric.e2term.routes.subscriptions:
                break
            await asyncio.sleep(0.02)
        assert sim.ric.e2term.routes.subscriptions == {}
        # A failing subscription: the client deletes it itself, and a retry reaches the node again.
        bad = submgr_mod.SubscriptionSpec(meid=node.meid, ran_function_id=node.kpm.ran_function_id,
                                          xapp_event_instance_id=10, event_trigger=b"\x00\x63",
                                          actions=(submgr_mod.ActionSpec(action_id=1, definition=b"\x01"),))
        for _ in range(2):
            with pytest.raises(submgr_mod.SubmgrError, match="E2Node"):
                await client.subscribe(bad)
        assert await client.list() == []
    finally:
        await session.close()
        if runner is not None:
            await runner.cleanup()
        await sim.close()


@pytest.mark.timeout(60)
def test_xapp_clients_against_mini_ric():
    asyncio.run(_interop())


async def _sim_api() -> None:
    from testbed.sim import build_sim_api

    sim = await Simulation.start(SimConfig(n_sites=2, n_cells=1, speed=0))
    runner = web.AppRunner(build_sim_api(sim), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/sim/v1"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.put(f"{base}/sites/1/training", json={"sms": 64}) as r:
                assert r.status == 204
            for url, body, code in ((f"{base}/sites/1/training", {"sms": 1e9}, 400),
                                    (f"{base}/sites/9/training", {"sms": 1}, 404),
                                    (f"{base}/sites/x/training", {"sms": 1}, 400),
                                    (f"{base}/sites/0/training", {"sms": "lots"}, 400),
                                    (f"{base}/sites/0/training", [1], 400)):
                async with s.put(url, json=body) as r:
                    assert r.status == code and (await r.json())["error"]
            async with s.put(f"{base}/sites/0/training", data=b"{not json") as r:
                assert r.status == 400
            await sim.step()
            async with s.get(f"{base}/state") as r:
                st = await r.json()
        assert st["periods"] == 1 and st["slot"] == 200
        assert [x["training_sms"] for x in st["sites"]] == [0.0, 64.0]
        assert st["sites"][0]["envelope_sms"] is None and st["sites"][0]["quota_percent"][0][1] == [0, 100, 0]
    finally:
        await runner.cleanup()
        await sim.close()


def test_sim_api_sets_training_and_reports_state():
    asyncio.run(_sim_api())
