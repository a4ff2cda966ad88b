"""Issue 28 item 2: the emulated DU takes time to answer, as a real one does. SubMgr's 201 reaches the xApp
before the subscription's notification and before its first indication; a control's ACK comes its configured
time after the request; requests are answered in arrival order and their delays do not add up."""
from __future__ import annotations

import asyncio

import pytest

from e2sm import e2ap, kpm, rc
from testbed.e2node.config import NodeConfig, NodeConfigError, SliceId
from testbed.sim import SimConfig, Simulation
from tests.testbed_ric.tiny_xapp import TinyXapp, kpm_action, prb_quota

SUB_MS, CTRL_MS = 120.0, 150.0


async def _drive() -> None:
    sim = await Simulation.start(SimConfig(n_sites=1, n_cells=1, speed=0, seed=3, node_overrides={
        0: {"subscription_delay_ms": SUB_MS, "control_delay_ms": CTRL_MS}}))
    x = await TinyXapp.start(sim.ric.xapp_route_table)
    loop = asyncio.get_running_loop()
    try:
        node = sim.nodes[0]
        meid, cfg = node.meid, node.node.config
        fns = x.functions(sim.ric.sdl, meid)
        version = kpm.kpm_version_from_oid(kpm.KPM_OID_V3)
        kpm_fn, _ = fns[kpm.KPM_OID_V3]
        rc_fn, rc_def = fns[rc.RC_OID]
        body = x.subscription_body(meid, kpm_fn, kpm.encode_event_trigger(kpm.KpmEventTrigger(100), version),
                                   kpm_action(version, cfg.nr_cell_id(0), cfg.slices))
        t0 = loop.time()
        status, created = await x.post(sim.ric.submgr_url + "/subscriptions", body)
        t_201 = loop.time()
        assert status == 201 and x.notifications.empty(), "the notification came before the 201"
        note = await x.notification()
        t_note = loop.time()
        assert note["SubscriptionId"] == created["SubscriptionId"]
        assert t_201 < t_note and t_note - t0 >= SUB_MS / 1000 - 0.005, (t_201 - t0, t_note - t0)
        await sim.step()
        assert (await x.receive(12050)).sub_id == note["SubscriptionInstances"][0]["E2EventInstanceId"]

        # two controls back to back: each ACKed its delay after it was sent, in order, not one after the other
        ids = rc.resolve_prb_quota_ids(rc.decode_ran_function_definition(rc_def), fallback=cfg.rc_table)
        be = cfg.slices[1]
        t_sent = loop.time()
        await x.control(meid, rc_fn, *prb_quota(ids, be.sst, be.sd, 50), instance=1)
        await x.control(meid, rc_fn, *prb_quota(ids, be.sst, be.sd, 40), instance=2)
        acks = []
        for _ in range(2):
            msg = await x.receive(12041, timeout=5)
            acks.append((loop.time() - t_sent, e2ap.decode_e2ap(msg.payload).request_id.instance))
        assert [i for _, i in acks] == [1, 2], acks
        assert all(CTRL_MS / 1000 - 0.005 <= t < 2 * CTRL_MS / 1000 for t, _ in acks), acks
    finally:
        await x.close()
        await sim.close()


@pytest.mark.timeout(60)
def test_the_node_answers_after_its_delays_in_order_and_the_201_comes_first():
    asyncio.run(_drive())


def test_delays_are_checked():
    for bad in (-1.0, 1e6, "5"):
        with pytest.raises(NodeConfigError):
            NodeConfig(site=0, n_cells=1, slices=(SliceId(1, None), SliceId(1, 1)), control_delay_ms=bad)
