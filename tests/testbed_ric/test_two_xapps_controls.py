"""The Weaver xApp's RC controls on a mini-RIC shared with another xApp (issue 15 item 2): the E2T routes a
control's ACK by the sub_id it copies from the request's RIC instance ID, and rtmgr's routes send that
sub_id to its subscription's owner, anything else to the one default xApp. A tiny xApp holding its own
KPM subscription is the default holder here (the last xApp the E2T learnt). Weaver's controls carry the
sub_id of its own subscription on each node, so every ACK comes back to Weaver and none to the tiny
xApp; before, the instance ID was the control's sequence number and the ACKs went to the tiny xApp."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "xapp"))
from xapp_harness import SimBed, free_port, until, xapp_config  # noqa: E402

from e2sm import e2ap, kpm, rc  # noqa: E402
from xapp.actuate import CONTROL_REQUESTOR  # noqa: E402
from xapp.app import XappApp  # noqa: E402
from xapp.config import load_config  # noqa: E402

from .tiny_xapp import TinyXapp, kpm_action, prb_quota  # noqa: E402

pytestmark = pytest.mark.slow
V3 = kpm.KpmVersion.V3_00


async def _drain(x: TinyXapp, into: list) -> None:
    while True:
        msg = await x.ep.receive()
        if msg.mtype in (12041, 12042):
            into.append((msg.sub_id, e2ap.decode_e2ap(msg.payload).request_id))


async def _shared_ric(tmp: Path) -> None:
    rmr_port = free_port()
    tb = await SimBed.start(tmp, rmr_port, n_sites=2)
    tiny = await TinyXapp.start(tb.sim.ric.xapp_route_table)
    x = drain = None
    try:
        node = tb.sim.nodes[0]
        fns = tiny.functions(tb.sim.ric.sdl, node.meid)
        kpm_fn, _ = fns[kpm.KPM_OID_V3]
        rc_fn, rc_def = fns[rc.RC_OID]
        body = tiny.subscription_body(node.meid, kpm_fn, kpm.encode_event_trigger(kpm.KpmEventTrigger(100), V3),
                                      kpm_action(V3, None, node.node.config.slices))
        assert (await tiny.post(tb.sim.ric.submgr_url + "/subscriptions", body))[0] == 201
        [inst] = (await tiny.notification())["SubscriptionInstances"]
        tiny_sub = inst["E2EventInstanceId"]
        # One control of its own makes the tiny xApp known to the E2T, after Weaver: the default route.
        ids = rc.resolve_prb_quota_ids(rc.decode_ran_function_definition(rc_def), fallback="srsran")
        be = node.node.config.slices[1]
        await tiny.control(node.meid, rc_fn, *prb_quota(ids, be.sst, be.sd, 100), instance=tiny_sub)
        assert (await tiny.receive(12041)).sub_id == tiny_sub
        assert list(tb.sim.ric.e2term.routes.xapps)[-1] == f"127.0.0.1:{tiny.ep.port}"

        seen: list = []
        drain = asyncio.ensure_future(_drain(tiny, seen))
        x = XappApp(load_config(xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0, mode="envelope")))
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        await until(lambda: x.ready() and x.readiness()["subscriptions"], 20, "ready and subscribed")
        await until(lambda: x.counters.controls_acked >= 2 and x.counters.controls_sent >= 2, 15,
                    "Weaver's envelopes acknowledged")
        ours = {rec.e2_event_instance_id for rec in x.subscriptions.values()}
        assert tiny_sub not in ours
        await asyncio.sleep(0.3)
        # no control timed out for want of its ACK, and none of the replies went to the tiny xApp
        assert x.counters.controls_failed == 0, list(x.controls_log)[-5:]
        stray = [(s, r) for s, r in seen if r.requestor == CONTROL_REQUESTOR]
        assert stray == [], f"Weaver's control replies reached the other xApp: {stray[:5]}"
    finally:
        if drain is not None:
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)
        if x is not None:
            await x.stop()
        await tiny.close()
        await tb.close()


@pytest.mark.timeout(90)
def test_weavers_control_acks_come_back_to_weaver_not_to_the_default_xapp(tmp_path, redis_env):
    asyncio.run(_shared_ric(tmp_path))
