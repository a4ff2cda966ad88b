"""A connected node that stops sending KPM for long (as after a node restart, when the E2 side forgot the
subscription) is resubscribed: the old SubMgr subscription is deleted, a new one made, KPM flows again."""
from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from xapp_harness import SimBed, free_port, until, xapp_config

from xapp.app import XappApp
from xapp.config import load_config
from xapp.submgr import SubmgrError

pytestmark = pytest.mark.slow


def test_silent_connected_node_is_resubscribed(tmp_path, redis_env):
    asyncio.run(_resub(tmp_path))


async def _resub(tmp):
    rmr_port = free_port()
    tb = await SimBed.start(tmp, rmr_port)
    path = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0)
    x = XappApp(load_config(path))
    x.resubscribe_after_s = 1.5
    try:
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        await until(lambda: x.ready() and x.readiness()["subscriptions"], 20, "ready and subscribed")
        meid = tb.meids[0]
        old_rec = x.subscriptions[meid]
        old = old_rec.subscription_id
        tb.muted.add(meid)
        await until(lambda: meid in x.subscriptions and x.subscriptions[meid].subscription_id != old, 10,
                    "a new subscription")
        tb.muted.clear()
        n = x.counters.indications
        await until(lambda: x.counters.indications > n + 4, 5, "KPM again")
        # SubMgr lists E2 subscriptions by E2 instance ID (sub_id) and Meid, and deletes in the background
        ids = await _live_ids(tb, lambda ids: len(ids) == 2)
        new = x.subscriptions[meid]
        assert (old_rec.e2_event_instance_id, meid) not in ids and (new.e2_event_instance_id, meid) in ids
        assert {(r.e2_event_instance_id, r.meid) for r in x.store.subscriptions()} == ids
    finally:
        await x.stop()
        await tb.close()


def test_remembered_subscription_is_deleted_when_the_node_cannot_be_subscribed_any_more(tmp_path, redis_env, caplog):
    """A previous run's subscription for a node the new run cannot subscribe to (here: no KPM to ask for)
    is deleted from SubMgr and SDL, not leaked; the permanent failure is logged once, not per retry."""
    caplog.set_level(logging.WARNING, logger="weaver.xapp")
    asyncio.run(_unsubscribable(tmp_path))
    refusals = [r for r in caplog.records if "cannot subscribe" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]


async def _live_ids(tb, done=lambda ids: True) -> set[tuple[int, str]]:
    """(E2 instance ID, Meid) of SubMgr's list, once `done` holds of it (deletes finish in the background)."""
    for _ in range(100):
        async with aiohttp.ClientSession() as s, s.get(tb.sim.ric.submgr_url + "/subscriptions") as r:
            ids = {(d["SubscriptionId"], d["Meid"]) for d in await r.json()}
        if done(ids):
            break
        await asyncio.sleep(0.02)
    return ids


async def _unsubscribable(tmp):
    rmr_port = free_port()
    tb = await SimBed.start(tmp, rmr_port)
    path = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0)
    first = XappApp(load_config(path), keep_subscriptions=True)
    x = None
    try:
        await first.start(rest_port=0, broker_listen="127.0.0.1:0")
        await until(lambda: first.ready() and first.readiness()["subscriptions"], 20, "ready and subscribed")
        meid, other = tb.meids[0], tb.meids[1]
        old = {m: r.subscription_id for m, r in first.subscriptions.items()}
        old_e2 = {m: (r.e2_event_instance_id, m) for m, r in first.subscriptions.items()}
        await first.stop()
        first = None
        assert await _live_ids(tb) == set(old_e2.values())           # kept for the next run

        x = XappApp(load_config(path))
        spec = x._spec

        def refuse(node, xid):
            if node.meid == meid:
                raise SubmgrError(f"{meid} supports none of the configured KPM measurements")
            return spec(node, xid)
        x._spec = refuse
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        await until(lambda: other in x.subscriptions and meid in x.subscribe_errors
                    and [r.meid for r in x.store.subscriptions()] == [other], 10, "the unusable subscription deleted")
        assert x.subscriptions[other].subscription_id == old[other]          # the usable one is reused
        assert await _live_ids(tb, lambda ids: ids == {old_e2[other]}) == {old_e2[other]}
        await asyncio.sleep(3.5)                                              # a few more tries for meid
        assert meid not in x.subscriptions and "none of the configured" in x.subscribe_errors[meid]
    finally:
        for app in (first, x):
            if app is not None:
                await app.stop()
        await tb.close()
