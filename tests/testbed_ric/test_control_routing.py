"""Control replies routed as on an OSC RIC: e2term sets an ACK's / FAILURE's RMR sub_id to the request's
RIC instance ID (ric-plt-e2 sctpThread.cpp), and rtmgr routes 12041/12042 by sub_id to the xApp owning
that subscription (ric-plt-rtmgr pkg/rpe/rpe.go); a sub_id that is nobody's takes the one default route.
Two tiny xApps on one mini-RIC, each with its own KPM subscription on the same node, send controls whose
instance ID is their own subscription's: each ACK reaches its sender and only its sender."""
from __future__ import annotations

import asyncio

import pytest

from e2sm import e2ap, kpm, rc
from testbed.sim import SimConfig, Simulation

from .tiny_xapp import TinyXapp, kpm_action, prb_quota

V3 = kpm.KpmVersion.V3_00


async def _subscribe(sim, x: TinyXapp, meid: str, fn: int, slices) -> int:
    body = x.subscription_body(meid, fn, kpm.encode_event_trigger(kpm.KpmEventTrigger(100), V3),
                               kpm_action(V3, None, slices))
    status, _ = await x.post(sim.ric.submgr_url + "/subscriptions", body)
    assert status == 201
    [inst] = (await x.notification())["SubscriptionInstances"]
    assert inst["E2EventInstanceId"] > 0
    return inst["E2EventInstanceId"]


async def _replies(x: TinyXapp, window_s: float = 0.3) -> list:
    out = []
    while True:
        try:
            msg = await x.receive(timeout=window_s)
        except TimeoutError:
            return out
        if msg.mtype in (12041, 12042):
            out.append((msg.mtype, msg.sub_id, e2ap.decode_e2ap(msg.payload).request_id.instance))


async def _two_xapps() -> None:
    sim = await Simulation.start(SimConfig(n_sites=1, n_cells=1, speed=0, keepalive_s=None))
    a = await TinyXapp.start(sim.ric.xapp_route_table)
    b = await TinyXapp.start(sim.ric.xapp_route_table)
    try:
        node = sim.nodes[0]
        meid, cfg = node.meid, node.node.config
        fns = a.functions(sim.ric.sdl, meid)
        kpm_fn, _ = fns[kpm.KPM_OID_V3]
        rc_fn, rc_def = fns[rc.RC_OID]
        ids = rc.resolve_prb_quota_ids(rc.decode_ran_function_definition(rc_def), fallback="srsran")
        sub_a = await _subscribe(sim, a, meid, kpm_fn, cfg.slices)
        sub_b = await _subscribe(sim, b, meid, kpm_fn, cfg.slices)
        assert sub_a != sub_b
        be = cfg.slices[1]
        # Both xApps become known to the E2T by their controls' src; B, the last, holds the default route.
        await a.control(meid, rc_fn, *prb_quota(ids, be.sst, be.sd, 80), instance=sub_a)
        await asyncio.sleep(0.05)
        await b.control(meid, rc_fn, *prb_quota(ids, be.sst, be.sd, 90), instance=sub_b)
        got_a, got_b = await asyncio.gather(_replies(a), _replies(b))
        assert got_a == [(12041, sub_a, sub_a)], got_a
        assert got_b == [(12041, sub_b, sub_b)], got_b
        # A failure is routed the same way (an RC function the node does not have).
        await a.control(meid, rc_fn + 100, *prb_quota(ids, be.sst, be.sd, 80), instance=sub_a)
        got_a, got_b = await asyncio.gather(_replies(a), _replies(b))
        assert got_a == [(12042, sub_a, sub_a)] and got_b == [], (got_a, got_b)
        # An instance ID of nobody's subscription follows the one default route (here B): on a real RIC
        # such an ACK reaches whichever xApp rtmgr listed last, which is why the xApp does not send one.
        await a.control(meid, rc_fn, *prb_quota(ids, be.sst, be.sd, 80), instance=4000)
        got_a, got_b = await asyncio.gather(_replies(a), _replies(b))
        assert got_a == [] and got_b == [(12041, 4000, 4000)], (got_a, got_b)
    finally:
        await a.close()
        await b.close()
        await sim.close()


@pytest.mark.timeout(60)
def test_control_ack_reaches_the_xapp_owning_the_sub_id_of_its_instance_id():
    asyncio.run(_two_xapps())
