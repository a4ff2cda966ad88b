"""The mini-RIC's SubMgr answers as OSC's does (ric-plt-submgr pkg/control/control.go, registry.go;
ric-plt-xapp-frame pkg/xapp/subscription.go), one difference of issue 15 per test, over its real REST API
with real E2 nodes behind it; and the xApp's SubMgr client copes with each answer.

A node that drops the first request of a kind (`_drop_first`) keeps a procedure in progress for one
E2 timeout (1 s): the window in which SubMgr answers a DELETE with 400, or in which a background delete
is still running."""
from __future__ import annotations

import asyncio
import dataclasses
import time

import aiohttp
import pytest
from aiohttp import web

from e2sm import kpm
from testbed.sim import SimConfig, Simulation
from xapp.config import SubmgrConfig
from xapp.state import SubscriptionRecord
from xapp.subaudit import missing
from xapp.submgr import SubmgrClient

from .tiny_xapp import TinyXapp, kpm_action

SUB_REQ, SUB_DEL_REQ = 12010, 12020
V3 = kpm.KpmVersion.V3_00


def _drop_first(shell, mtype: int) -> list[int]:
    """The node ignores the first message of `mtype` (as a node busy or losing it would); returns a
    list that counts what it was sent of that type."""
    seen: list[int] = []
    receive = shell.node.receive

    def dropping(t, payload):
        if t == mtype:
            seen.append(t)
            if len(seen) == 1:
                return []
        return receive(t, payload)
    shell.node.receive = dropping
    return seen


async def _bed(**cfg):
    sim = await Simulation.start(SimConfig(n_sites=1, n_cells=1, speed=0, keepalive_s=None, **cfg))
    x = await TinyXapp.start(sim.ric.xapp_route_table)
    node = sim.nodes[0]
    fn, _ = x.functions(sim.ric.sdl, node.meid)[kpm.KPM_OID_V3]
    body = x.subscription_body(node.meid, fn, kpm.encode_event_trigger(kpm.KpmEventTrigger(100), V3),
                               kpm_action(V3, None, node.node.config.slices))
    body["E2SubscriptionDirectives"]["E2TimeoutTimerValue"] = 1
    return sim, x, node, body


async def _eventually(check, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.02)


def test_201_carries_null_instances_and_the_list_is_submgrs():
    """201 is `{SubscriptionId, SubscriptionInstances: null}`; GET lists each E2 subscription as SubMgr's
    QueryHandler does (E2 instance ID, Meid, RMR endpoints, null instances, no REST id), and the xApp's
    audit matches its records against exactly that."""
    async def body():
        sim, x, node, req = await _bed()
        try:
            url = sim.ric.submgr_url + "/subscriptions"
            status, created = await x.post(url, req)
            assert status == 201 and created["SubscriptionInstances"] is None and created["SubscriptionId"]
            [inst] = (await x.notification())["SubscriptionInstances"]
            status, listed = await x.get(url)
            assert status == 200 and listed == [{"SubscriptionId": inst["E2EventInstanceId"], "Meid": node.meid,
                                                 "ClientEndpoint": [f"127.0.0.1:{x.ep.port}"],
                                                 "SubscriptionInstances": None}]
            rec = SubscriptionRecord(subscription_id=created["SubscriptionId"], meid=node.meid, ran_function_id=2,
                                     xapp_event_instance_id=1, e2_event_instance_id=inst["E2EventInstanceId"],
                                     kpm_version="V3_00", period_ms=100, created_unix=0.0)
            other = dataclasses.replace(rec, e2_event_instance_id=inst["E2EventInstanceId"] + 1)
            assert missing([rec, other], listed) == [other]
        finally:
            await x.close()
            await sim.close()
    asyncio.run(body())


def test_delete_while_in_progress_is_400_and_deletes_nothing_then_204_and_in_the_background():
    async def body():
        sim, x, node, req = await _bed()
        sub_reqs, del_reqs = _drop_first(node, SUB_REQ), _drop_first(node, SUB_DEL_REQ)
        try:
            url = sim.ric.submgr_url + "/subscriptions"
            status, created = await x.post(url, req)
            rest_id = created["SubscriptionId"]
            # The node has not answered yet (its first request is lost, the retry is a second away).
            status, err = await x.delete(f"{url}/{rest_id}")
            assert status == 400 and "still being set up" in err, (status, err)
            [inst] = (await x.notification(timeout=5))["SubscriptionInstances"]     # the retry made it
            assert inst["E2EventInstanceId"] > 0 and len(sub_reqs) == 2 and len(node.node.subscriptions) == 1
            # Now 204 at once, while the node has not confirmed the delete: SubMgr still lists it.
            t0 = time.monotonic()
            status, _ = await x.delete(f"{url}/{rest_id}")
            assert status == 204 and time.monotonic() - t0 < 0.5
            assert [d["SubscriptionId"] for d in (await x.get(url))[1]] == [inst["E2EventInstanceId"]]
            # A DELETE of an id being deleted, and of an id SubMgr never had: 204, nothing else happens.
            assert (await x.delete(f"{url}/{rest_id}"))[0] == 204
            assert (await x.delete(f"{url}/no-such-id"))[0] == 204

            async def gone():
                return (await x.get(url))[1] == [] and node.node.subscriptions == {}
            assert await _eventually(gone), "the background delete never finished"
            assert len(del_reqs) == 2                                # its retry reached the node
        finally:
            await x.close()
            await sim.close()
    asyncio.run(body())


def test_post_naming_an_unknown_subscription_id_is_404():
    async def body():
        sim, x, node, req = await _bed()
        try:
            url = sim.ric.submgr_url + "/subscriptions"
            status, err = await x.post(url, {**req, "SubscriptionId": "made-up"})
            assert status == 404 and "made-up" in err["error"]
            assert (await x.get(url))[1] == [] and node.node.subscriptions == {}
            # A held one takes new details under its id.
            status, created = await x.post(url, req)
            await x.notification()
            again = {**req, "SubscriptionId": created["SubscriptionId"]}
            again["SubscriptionDetails"] = [{**req["SubscriptionDetails"][0], "XappEventInstanceId": 2}]
            status, more = await x.post(url, again)
            assert status == 201 and more["SubscriptionId"] == created["SubscriptionId"]
            note = await x.notification()
            assert note["SubscriptionId"] == created["SubscriptionId"]
            assert note["SubscriptionInstances"][0]["XappEventInstanceId"] == 2
        finally:
            await x.close()
            await sim.close()
    asyncio.run(body())


@pytest.mark.parametrize("answers,tries", [([204, 201, 200], 3), ([500] * 12, 10)])
def test_notification_is_tried_ten_times_and_only_200_counts(answers, tries):
    """Up to 10 POSTs `notify_interval_s` apart (SubMgr: 5 s; shortened here), until one gets a 200."""
    async def body():
        sim, x, node, req = await _bed(notify_interval_s=0.05)
        got: list[float] = []

        async def handler(request):
            await request.read()
            got.append(time.monotonic())
            return web.Response(status=answers[min(len(got), len(answers)) - 1])
        app = web.Application()
        app.router.add_post("/ric/v1/subscriptions/response", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            req["ClientEndpoint"]["HTTPPort"] = port
            status, _ = await x.post(sim.ric.submgr_url + "/subscriptions", req)
            assert status == 201

            async def settled():
                n = len(got)
                await asyncio.sleep(0.3)
                return n and len(got) == n
            await _eventually(settled, 5)
            assert len(got) == tries, got
            gaps = [b - a for a, b in zip(got, got[1:], strict=False)]
            assert all(g >= 0.045 for g in gaps), gaps
        finally:
            await runner.cleanup()
            await x.close()
            await sim.close()
    asyncio.run(body())


def test_xapp_client_retries_a_delete_answered_400_until_submgr_deletes_it():
    """The client's DELETE of a subscription SubMgr is still setting up: 400 -> retried -> 204, and the
    node's E2 subscription is gone (the client before issue 15 took the 400 as 'already gone': leaked)."""
    async def body():
        sim, x, node, req = await _bed()
        _drop_first(node, SUB_REQ)
        try:
            url = sim.ric.submgr_url + "/subscriptions"
            _, created = await x.post(url, req)
            cfg = SubmgrConfig(url=sim.ric.submgr_url, e2_timeout_s=1, e2_retries=1, backoff_s=0.2, attempts=1)
            async with aiohttp.ClientSession() as session:
                assert await SubmgrClient(cfg, session).unsubscribe(created["SubscriptionId"]) is True

            async def gone():
                return (await x.get(url))[1] == [] and node.node.subscriptions == {}
            assert await _eventually(gone), f"leaked: {node.node.subscriptions}"
        finally:
            await x.close()
            await sim.close()
    asyncio.run(body())
