"""`POST /sim/v1/sites/{site}/stop` (the simulator's own API): a stopped site's E2 node sends no more KPM,
the E2T declares it lost (R-NIB DISCONNECTED), the other sites keep reporting, and bad requests get 4xx
JSON and change nothing. This is how the dashboard's browser test makes a site disappear mid-run."""
from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from e2sm import e2ap, kpm
from testbed.ric.mini import sdl_connected
from testbed.sim import SimConfig, Simulation, build_sim_api
from tests.testbed_ric.tiny_xapp import TinyXapp, kpm_action


async def _indications(x: TinyXapp, quiet_s: float = 0.3) -> list[str]:
    """meids of the indications that arrive until none has for `quiet_s`."""
    out = []
    while True:
        try:
            msg = await x.receive(12050, timeout=quiet_s)
        except TimeoutError:
            return out
        e2ap.decode_e2ap(msg.payload)  # a real RICindication, not just any frame
        out.append(msg.meid)


async def _stop_site():
    sim = await Simulation.start(SimConfig(n_sites=2, n_cells=1, speed=0, keepalive_s=0.5))
    x = await TinyXapp.start(sim.ric.xapp_route_table)
    runner = web.AppRunner(build_sim_api(sim), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/sim/v1"
    try:
        v3 = kpm.KpmVersion.V3_00
        for i, node in enumerate(sim.nodes):
            body = x.subscription_body(node.meid, 2, kpm.encode_event_trigger(kpm.KpmEventTrigger(100), v3),
                                       kpm_action(v3, None, node.node.config.slices), xapp_event_id=i + 1)
            status, _ = await x.post(sim.ric.submgr_url + "/subscriptions", body)
            assert status == 201
            await x.notification()
        meids = [n.meid for n in sim.nodes]
        await sim.step()
        assert sorted(await _indications(x)) == sorted(meids)

        async with aiohttp.ClientSession() as http:
            async def call(method, path):
                async with http.request(method, api + path) as r:
                    text = await r.text()
                    return r.status, json.loads(text) if r.content_type == "application/json" else text

            # bad requests: clear 4xx JSON, nothing stopped
            assert (await call("POST", "/sites/x/stop"))[0] == 400
            status, doc = await call("POST", "/sites/7/stop")
            assert status == 404 and "no site 7" in doc["error"]
            assert (await call("GET", "/sites/1/stop"))[0] == 405
            assert not sim.stopped

            status, doc = await call("POST", "/sites/1/stop")
            assert status == 200 and doc == {"site": 1, "stopped": True, "already": False}
            assert (await call("POST", "/sites/1/stop"))[1]["already"] is True

            slot = sim.model.slot
            for _ in range(3):
                await sim.step()
            assert sim.model.slot > slot                    # the RAN keeps running
            assert await _indications(x) == [meids[0]] * 3  # only the live site reports

            for _ in range(100):                            # the E2T's keepalive notices the node is gone
                if not sdl_connected(sim.ric.sdl, meids[1]):
                    break
                await asyncio.sleep(0.05)
            assert not sdl_connected(sim.ric.sdl, meids[1])
            assert sdl_connected(sim.ric.sdl, meids[0])

            status, state = await call("GET", "/state")
            assert status == 200 and [s["stopped"] for s in state["sites"]] == [False, True]
    finally:
        await runner.cleanup()
        await x.close()
        await sim.close()


def test_stop_site_silences_its_node_only():
    asyncio.run(_stop_site())
