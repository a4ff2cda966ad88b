"""A connected node that stops sending KPM for long (as after a node restart, when the E2 side forgot the
subscription) is resubscribed: the old SubMgr subscription is deleted, a new one made, KPM flows again."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from xapp_harness import SimBed, free_port, until, xapp_config

from xapp.app import XappApp
from xapp.config import load_config

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
        await until(lambda: all(x.readiness().values()), 20, "ready")
        meid = tb.meids[0]
        old = x.subscriptions[meid].subscription_id
        tb.muted.add(meid)
        await until(lambda: meid in x.subscriptions and x.subscriptions[meid].subscription_id != old, 10,
                    "a new subscription")
        tb.muted.clear()
        n = x.counters.indications
        await until(lambda: x.counters.indications > n + 4, 5, "KPM again")
        async with aiohttp.ClientSession() as s, s.get(tb.sim.ric.submgr_url + "/subscriptions") as r:
            live = await r.json()
        ids = {d.get("RestSubscriptionId", d["SubscriptionId"]) for d in live}
        assert len(live) == 2 and old not in ids and x.subscriptions[meid].subscription_id in ids
        assert x.store.subscriptions()[0].subscription_id in ids and len(x.store.subscriptions()) == 2
    finally:
        await x.stop()
        await tb.close()
