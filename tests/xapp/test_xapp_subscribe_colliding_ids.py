"""Subscriptions in flight together each carry their own XappEventInstanceId, also for nodes whose
default instance id (derived from the meid) is the same: SubMgr matches its notifications to a request by
that id, so two requests sharing one could have a node's KPM routed as another's.

gNB ids 0x3 and 0x12 give the RAN names gnb_001_001_000003 and gnb_001_001_000012, whose octets add up to
the same sum, the xApp's first choice of instance id."""
from __future__ import annotations

import asyncio

import pytest
from xapp_harness import SimBed, free_port, until, xapp_config

from xapp.app import XappApp
from xapp.config import load_config

pytestmark = pytest.mark.slow


def test_colliding_instance_ids_are_made_unique(tmp_path, redis_env):
    asyncio.run(_colliding(tmp_path))


async def _colliding(tmp):
    rmr_port = free_port()
    tb = await SimBed.start(tmp, rmr_port, overrides={0: {"gnb_id": 0x3}, 1: {"gnb_id": 0x12}})
    meids = tb.meids
    assert len({sum(m.encode()) for m in meids}) == 1, meids        # the premise: the same first choice
    x = XappApp(load_config(xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0)))
    try:
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        await until(lambda: x.ready() and set(x.subscriptions) == set(meids), 20, "both nodes subscribed")
        ids = {m: x.subscriptions[m].xapp_event_instance_id for m in meids}
        assert len(set(ids.values())) == 2, ids
        assert not x._xids_in_use                               # released once each subscription is made
        # each node's KPM arrives under its own subscription, attributed to that node
        subs = {s.meid: s for s in x.ingest.subs.values()}
        assert set(subs) == set(meids)
        assert len({s.sub_id for s in subs.values()}) == 2
        n = x.counters.indications
        await until(lambda: x.counters.indications >= n + 4, 10, "KPM from the nodes")
        await until(lambda: all(set(x.state.sites[f"site-{i}"].last) == {meids[i]} for i in range(2)), 10,
                    "each site's KPM from its own node")
    finally:
        await x.stop()
        await tb.close()
