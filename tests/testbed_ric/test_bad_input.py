"""Bad input through the mini-RIC: malformed E2AP from an xApp gets an error indication or an E2AP
failure, never a crash; REST garbage gets a 4xx with a JSON error and changes nothing."""
from __future__ import annotations

import asyncio
import json

import pytest

from e2sm import e2ap, kpm, rc
from testbed.sim import SimConfig, Simulation
from xapp.rmr import RmrMessage

from .tiny_xapp import TinyXapp, kpm_action, prb_quota


async def _with_sim(body, n_sites_override: int = 1, **cfg):
    cfg.setdefault("keepalive_s", 0.1)
    sim = await Simulation.start(SimConfig(n_sites=n_sites_override, n_cells=2, speed=0, **cfg))
    x = await TinyXapp.start(sim.ric.xapp_route_table)
    try:
        await body(sim, x)
    finally:
        await x.close()
        await sim.close()


async def _still_serves(sim, x) -> None:
    """After the abuse, a normal subscription still works end to end."""
    node = sim.nodes[0]
    version = kpm.KpmVersion.V3_00 if node.node.config.kpm_version == "v3.00" else kpm.KpmVersion.V2_03
    trigger = kpm.encode_event_trigger(kpm.KpmEventTrigger(100), version)
    body = x.subscription_body(node.meid, node.node.config.kpm_function_id, trigger,
                               kpm_action(version, None, node.node.config.slices), xapp_event_id=77)
    status, _ = await x.post(sim.ric.submgr_url + "/subscriptions", body)
    assert status == 201
    inst = (await x.notification())["SubscriptionInstances"][0]
    assert inst["E2EventInstanceId"] > 0
    await sim.step()
    msg = await x.receive(12050)
    assert msg.sub_id == inst["E2EventInstanceId"]


def test_malformed_e2ap_from_xapp_gets_error_indication_or_failure():
    async def body(sim, x):
        meid = sim.nodes[0].meid
        rc_fn = sim.nodes[0].node.config.rc_function_id
        # 1. Not E2AP at all -> E2AP ErrorIndication (10030) back to the sender.
        for garbage in (b"", b"\x00", b"\xff" * 40, bytes(range(256))):
            await x.ep.send(RmrMessage(12040, garbage, meid=meid))
            reply = await x.receive()
            assert reply.mtype == 10030
            err = e2ap.decode_e2ap(reply.payload)
            assert isinstance(err, e2ap.ErrorIndication) and err.cause.group == "protocol"
        # 2. Valid E2AP, but not a control -> ErrorIndication.
        wrong = e2ap.encode_e2ap(e2ap.RicSubscriptionDeleteRequest(e2ap.RicRequestId(1, 2), 3))
        await x.ep.send(RmrMessage(12040, wrong, meid=meid))
        assert (await x.receive()).mtype == 10030
        # 3. A control whose RC payload is garbage -> RICcontrolFailure control-message-invalid.
        await x.control(meid, rc_fn, b"\x01\x02", b"\xde\xad\xbe\xef", instance=3)
        fail = await x.receive()
        assert fail.mtype == 12042
        f = e2ap.decode_e2ap(fail.payload)
        assert isinstance(f, e2ap.RicControlFailure) and f.request_id.instance == 3
        assert f.cause == e2ap.Cause("ricRequest", "control-message-invalid")
        # 4. OAI parameter IDs sent to a srsRAN-table node -> failure, nothing applied.
        before = sim.model.quota.copy()
        await x.control(meid, rc_fn, *prb_quota(rc.OAI_IDS, 1, 2, 5), instance=4)
        f = e2ap.decode_e2ap((await x.receive(12042)).payload)
        assert f.cause.value == "control-message-invalid"
        assert (sim.model.quota == before).all()
        # 5. A slice the node does not serve -> control-failed-to-execute.
        await x.control(meid, rc_fn, *prb_quota(rc.SRSRAN_IDS, 9, 9, 5), instance=5)
        f = e2ap.decode_e2ap((await x.receive(12042)).payload)
        assert f.cause.value == "control-failed-to-execute"
        # 6. Wrong RAN function (the KPM one) -> ran-function-id-invalid.
        await x.control(meid, sim.nodes[0].node.config.kpm_function_id, *prb_quota(rc.SRSRAN_IDS, 1, 2, 5), instance=6)
        f = e2ap.decode_e2ap((await x.receive(12042)).payload)
        assert f.cause.value == "ran-function-id-invalid"
        # 7. Unknown node -> RICcontrolFailure from the E2T.
        await x.control("gnb_001_01_0000ffff", rc_fn, *prb_quota(rc.SRSRAN_IDS, 1, 2, 5), instance=7)
        assert (await x.receive(12042)).mtype == 12042
        # 8. Envelope above the GPU -> failure; a valid one -> ACK and the model holds it.
        hdr = rc.encode_control_header(rc.envelope_control_header())
        await x.control(meid, rc_fn, hdr, rc.encode_control_message(rc.build_envelope_control(10_000, 5)), instance=8)
        assert (await x.receive()).mtype == 12042
        await x.control(meid, rc_fn, hdr, rc.encode_control_message(rc.build_envelope_control(96, 20)), instance=9)
        assert (await x.receive()).mtype == 12041
        assert sim.model.envelope[0] == 96
        assert sim.ric.e2term.stats.error_indications_sent == 5
        await _still_serves(sim, x)

    asyncio.run(_with_sim(body))


def test_subscription_the_node_cannot_serve_fails_like_submgr():
    async def body(sim, x):
        node = sim.nodes[0]
        url = sim.ric.submgr_url + "/subscriptions"
        trigger = kpm.encode_event_trigger(kpm.KpmEventTrigger(100), kpm.KpmVersion.V3_00)
        # Action definition garbage -> the node refuses -> notification with E2EventInstanceId 0.
        status, created = await x.post(url, x.subscription_body(node.meid, 2, trigger, b"\x99\x99"))
        assert status == 201
        inst = (await x.notification())["SubscriptionInstances"][0]
        assert inst["E2EventInstanceId"] == 0 and inst["ErrorSource"] == "E2Node" and inst["ErrorCause"]
        # RC function for a KPM subscription -> ran-function-id-invalid.
        status, _ = await x.post(url, x.subscription_body(node.meid, 3, trigger, kpm_action(
            kpm.KpmVersion.V3_00, None, node.node.config.slices), xapp_event_id=2))
        inst = (await x.notification())["SubscriptionInstances"][0]
        assert inst["E2EventInstanceId"] == 0 and "ran-function-id-invalid" in inst["ErrorCause"]
        # Unknown measurement name -> refused.
        bad = kpm.encode_action_definition(kpm.KpmActionDefinition(1, kpm.ActionDefFormat1(
            (kpm.MeasInfo("No.Such.Counter"),), 100)), kpm.KpmVersion.V3_00)
        await x.post(url, x.subscription_body(node.meid, 2, trigger, bad, xapp_event_id=3))
        assert (await x.notification())["SubscriptionInstances"][0]["E2EventInstanceId"] == 0
        status, listed = await x.get(url)
        assert listed == []
        await _still_serves(sim, x)

    asyncio.run(_with_sim(body))


def test_rest_garbage_gets_4xx_json_and_changes_nothing():
    async def body(sim, x):
        base = sim.ric.submgr_url
        url = base + "/subscriptions"
        good = x.subscription_body(sim.nodes[0].meid, 2, b"\x00\x63", b"\x00")
        cases = [b"", b"not json", b"[]", b"{}", b"\xff\xfe", json.dumps({**good, "Meid": 5}).encode(),
                 json.dumps({**good, "RANFunctionID": -1}).encode(),
                 json.dumps({**good, "SubscriptionDetails": [{"XappEventInstanceId": 1}]}).encode(),
                 b"[" * 100_000 + b"]" * 100_000]          # deeply nested: a JSON 400, not a text/plain 500
        for raw in cases:
            status, err = await x.post(url, raw)
            assert status == 400 and isinstance(err, dict) and err["error"], raw
        status, err = await x.post(url, {**good, "Meid": "gnb_001_01_0000ffff"})
        assert status == 503 and "no E2 connection" in err["error"]
        status, err = await x.delete(url + "/nope")
        assert status == 204 and err == ""          # as SubMgr: an unknown id is gone already
        status, err = await x.get(base + "/no/such/path")
        assert status == 404 and err["error"]
        async with x.session.put(url) as r:
            assert r.status == 405 and (await r.json())["error"]
        huge = b"[" + b"0," * (1 << 20) + b"0]"
        status, err = await x.post(url, huge)
        assert status == 413 and err["error"]
        status, listed = await x.get(url)
        assert status == 200 and listed == []
        await _still_serves(sim, x)

    asyncio.run(_with_sim(body))


@pytest.mark.timeout(60)
def test_kpm_v2_node_refuses_v3_encoded_trigger_cleanly():
    async def body(sim, x):
        node = sim.nodes[0]
        # A v3 action definition to a v2 node still decodes (same bytes for format 1), but the header
        # timestamp the node sends must be 4 octets: decode with v2 works, with v3 fails.
        await _still_serves(sim, x)
        await sim.step()
        ind = e2ap.decode_e2ap((await x.receive(12050)).payload)
        assert kpm.decode_indication_header(ind.header, kpm.KpmVersion.V2_03).collect_start_time > 0
        with pytest.raises(ValueError):
            kpm.decode_indication_header(ind.header, kpm.KpmVersion.V3_00)
        assert node.node.config.kpm_version == "v2.03"

    asyncio.run(_with_sim(body, kpm_version="v2.03"))


@pytest.mark.timeout(60)
def test_silent_node_gives_e2_timeout_notification_after_retries():
    async def body(sim, x):
        node = sim.nodes[0]
        await node.close()  # the node goes silent; the R-NIB still says CONNECTED (no SCTP to notice)
        b = x.subscription_body(node.meid, 2, b"\x00\x63", b"\x00")
        b["E2SubscriptionDirectives"] = {"E2TimeoutTimerValue": 1, "E2RetryCount": 1, "RMRRoutingNeeded": True}
        t0 = asyncio.get_running_loop().time()
        status, _ = await x.post(sim.ric.submgr_url + "/subscriptions", b)
        assert status == 201
        inst = (await x.notification(timeout=10))["SubscriptionInstances"][0]
        assert inst["E2EventInstanceId"] == 0 and inst["TimeoutType"] == "E2-Timeout"
        assert inst["ErrorSource"] == "SUBMGR"
        assert asyncio.get_running_loop().time() - t0 >= 1.9  # two tries of 1 s each
        assert sim.ric.e2term.routes.subscriptions == {}  # the route was withdrawn

    asyncio.run(_with_sim(body, keepalive_s=None))  # no keepalive: the RIC cannot tell the node is gone


def test_e2term_survives_random_payloads_on_every_mtype():
    import random

    async def body(sim, x):
        rnd = random.Random(4)
        meid = sim.nodes[0].meid
        e2t = sim.ric.e2term_address
        for mtype in (12001, 12010, 12011, 12012, 12020, 12021, 12040, 12041, 12042, 12050, 10030, 4242):
            for n in (0, 1, 7, 300):
                msg = RmrMessage(mtype, bytes(rnd.randrange(256) for _ in range(n)), sub_id=rnd.choice([-1, 1, 77]),
                                 meid=rnd.choice(["", meid, "gnb_x"]))
                await x.ep.wormhole_send(e2t, msg)
        # Drain whatever error indications came back, then check the RIC still works end to end.
        while True:
            try:
                reply = await x.receive(timeout=0.5)
            except TimeoutError:
                break
            assert reply.mtype in (10030, 12042)
        assert sim.ric.e2term.stats.dropped_undecodable > 0
        await _still_serves(sim, x)

    asyncio.run(_with_sim(body))


@pytest.mark.timeout(60)
def test_lost_node_goes_disconnected_then_503_and_comes_back_on_setup():
    from ricxappframe.entities.rnib import nb_identity_pb2

    from testbed.e2node.shell import NodeShell
    from testbed.ric.rnib import read_nodeb

    async def body(sim, x):
        node = sim.nodes[1]
        await node.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while read_nodeb(sim.ric.sdl, node.meid).connection_status != nb_identity_pb2.DISCONNECTED:
            assert loop.time() < deadline, "node never declared lost"
            await asyncio.sleep(0.05)
        assert sim.nodes[0].meid in sim.ric.e2term.nodes  # the other node is untouched
        status, err = await x.post(sim.ric.submgr_url + "/subscriptions",
                                   x.subscription_body(node.meid, 2, b"\x00\x63", b"\x00"))
        assert status == 503
        # The node comes back (new process, new port): E2 setup makes it CONNECTED again.
        back = await NodeShell.open(node.node.config, sim.model, sim.ric.e2term_address)
        sim.nodes[1] = back
        await back.setup()
        assert read_nodeb(sim.ric.sdl, node.meid).connection_status == nb_identity_pb2.CONNECTED
        await asyncio.sleep(0.6)  # a few keepalive rounds: answered, so it stays connected
        assert node.meid in sim.ric.e2term.nodes and sim.ric.e2term.stats.nodes_lost == 1

    asyncio.run(_with_sim(body, n_sites_override=2))


def test_unroutable_xapp_src_is_ignored_not_fatal():
    async def body(sim, x):
        e2t = sim.ric.e2term
        before = e2t.routes
        e2t.add_xapp("bad|name:1")  # what a control from a src no route table can name would cause
        e2t.add_xapp("no-port")
        assert e2t.routes == before and sim.ric.e2term_ep.ready
        await _still_serves(sim, x)

    asyncio.run(_with_sim(body))
