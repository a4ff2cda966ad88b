"""The srsRAN oran-sc-ric example xApps' path through the mini-RIC, end to end: the subscription body their
patched ricxappframe posts (ricxappframe's own subscriber models, serialised as the oran-sc-ric patch does:
CamelCase keys, unset fields as null, POST to `<uri>/subscriptions`), the indication at the E2EventInstanceId
over RMR, decoded with their KPM v4.00 module, and simple_rc_xapp's hand-built control to the OSC-named node,
answered by an ACK over RMR."""
from __future__ import annotations

import asyncio

import ricxappframe.xapp_subscribe as subscribe
from testbed_ric.tiny_xapp import TinyXapp  # tests/ is on sys.path (rootdir import mode)

from e2sm import e2ap, kpm, rc
from testbed.sim import SimConfig, Simulation
from xapp.rmr import RmrMessage

from . import peers


def patched_to_dict(obj):
    """ricxappframe's swagger `to_dict` with the oran-sc-ric patch: every model's keys renamed through its
    `attribute_map` (Nones kept, as the generated models keep them)."""
    if hasattr(obj, "swagger_types"):
        return {obj.attribute_map[k]: patched_to_dict(getattr(obj, k)) for k in obj.swagger_types}
    if isinstance(obj, list):
        return [patched_to_dict(v) for v in obj]
    return obj


def test_kpm_mon_and_simple_rc_xapp_through_the_mini_ric():
    async def body():
        sim = await Simulation.start(SimConfig(n_sites=1, n_cells=2, speed=0, kpm_version="v4.00",
                                               slices={"*": "2:1,1:1"}, keepalive_s=None))
        x = await TinyXapp.start(sim.ric.xapp_route_table)
        try:
            meid = sim.nodes[0].meid
            assert meid == "gnbd_001_001_000001_1"
            # e2mgr's R-NIB entry under that name holds the KPM v4.00 function (accepted in E2 setup) and RC
            assert set(x.functions(sim.ric.sdl, meid)) == {kpm.KPM_OID_V4, rc.RC_OID}
            sub = subscribe.NewSubscriber(sim.ric.submgr_url)   # xAppBase: NewSubscriber(SUB_MGR_URI)
            endpoint = sub.SubscriptionParamsClientEndpoint("127.0.0.1", x.http_port, x.ep.port)
            for style in range(1, 6):
                action = sub.ActionToBeSetup(1, "report", list(peers.action_definition(style)))
                detail = sub.SubscriptionDetail(1234, list(peers.event_trigger(1000)), [action])
                params = sub.SubscriptionParams(None, endpoint, meid, 2, None, [detail])
                status, resp = await x.post(sim.ric.submgr_url + "/subscriptions", patched_to_dict(params))
                assert status == 201, resp
                note = await x.notification()
                assert note["SubscriptionId"] == resp["SubscriptionId"]
                instance = note["SubscriptionInstances"][0]["E2EventInstanceId"]
                assert instance > 0, note
                await sim.step()
                msg = await x.receive(12050)
                assert msg.sub_id == instance and msg.meid == meid
                ind = e2ap.decode_e2ap(msg.payload)
                peers.kpm().decode("E2SM-KPM-IndicationHeader-Format1", ind.header)
                kind, _ = peers.kpm().decode("E2SM-KPM-IndicationMessage", ind.message)["indicationMessage-formats"]
                assert kind == f"indicationMessage-Format{ {1: 1, 2: 1, 3: 2, 4: 3, 5: 3}[style] }"
                status, _ = await x.delete(sim.ric.submgr_url + "/subscriptions/" + resp["SubscriptionId"])
                assert status == 204
            for n, (lo, hi, ded) in enumerate(peers.SRSRAN_CONTROLS, start=1):
                payload = peers.srsran_control_request(*peers.srsran_quota(lo, hi, ded), requestor=n)
                await x.ep.send(RmrMessage(12040, payload, meid=meid, sub_id=-1))
                reply = await x.receive()
                assert reply.mtype == 12041, reply
            # srsRAN's DU applies them to UE 0's grant sizes (testbed.e2node.dialects), the last one 100 %
            ue0 = sim.nodes[0].node.config.ues.get(0)
            assert sim.model.limits_dl.tag[0, ue0.cell, ue0.slice] == 0
            assert sim.model.limits_dl.cap[0, ue0.cell, ue0.slice] == 1.0
            assert sim.model.quota[0, :, 1].tolist() == [[0.0, 1.0, 0.0]] * 2
        finally:
            await x.close()
            await sim.close()

    asyncio.run(asyncio.wait_for(body(), 60))
