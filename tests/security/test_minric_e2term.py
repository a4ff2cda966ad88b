"""Issue 13 item 7: the mini-RIC's E2 termination never blocks on a peer, and a connected node's
identity cannot be taken over by a second E2 setup from another address.

Before: the E2T awaited every send in its receive loop, so one frame whose `src` named an address
that never accepts held every node and xApp up for the 2 s connect timeout (one such frame per
address, no backoff across addresses); and an E2 setup for an existing gNB identity from anywhere
replaced the node's address: its KPM and controls went to the impostor, the real node was lost.
Real mini-RIC, real E2 nodes, real RMR framing over TCP.
"""
from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest

from e2sm import e2ap, kpm
from testbed.e2node.node import E2Node
from testbed.ric.e2term import IDENTITY_IN_USE
from testbed.ric.rnib import read_nodeb
from testbed.sim import SimConfig, Simulation
from tests.testbed_ric.tiny_xapp import TinyXapp, kpm_action
from xapp.rmr import RmrEndpoint, RmrMessage
from xapp.rmr.framer import encode_frame

RIC_CONTROL_REQ, E2_SETUP_REQ, E2_SETUP_RESP, E2_SETUP_FAILURE, RIC_INDICATION = 12040, 12001, 12002, 12003, 12050


def _never_accepting(n: int) -> tuple[list[socket.socket], list[str]]:
    """`n` listening sockets whose backlog is full: a connect to them hangs until its timeout."""
    held, names = [], []
    for _ in range(n):
        lst = socket.socket()
        lst.bind(("127.0.0.1", 0))
        lst.listen(0)
        held.append(lst)
        for _ in range(3):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(lst.getsockname())
            except BlockingIOError:
                pass
            held.append(c)
        names.append(f"127.0.0.1:{lst.getsockname()[1]}")
    return held, names


async def _subscribe(sim, x, site: int) -> int:
    node = sim.nodes[site]
    version = kpm.KpmVersion.V3_00 if node.node.config.kpm_version == "v3.00" else kpm.KpmVersion.V2_03
    trigger = kpm.encode_event_trigger(kpm.KpmEventTrigger(100), version)
    body = x.subscription_body(node.meid, node.node.config.kpm_function_id, trigger,
                               kpm_action(version, None, node.node.config.slices), xapp_event_id=10 + site)
    status, _ = await x.post(sim.ric.submgr_url + "/subscriptions", body)
    assert status == 201
    return (await x.notification())["SubscriptionInstances"][0]["E2EventInstanceId"]


async def _kpm_latency(sim, x, sub_id: int) -> float:
    """One world step, and how long until its indication for `sub_id` reaches the xApp."""
    loop = asyncio.get_running_loop()
    t = loop.time()
    await sim.step()
    while True:
        msg = await x.receive(RIC_INDICATION, timeout=10)
        if msg.sub_id == sub_id:
            return loop.time() - t


async def _with_sim(body, **cfg):
    sim = await Simulation.start(SimConfig(n_sites=2, n_cells=2, speed=0, **cfg))
    x = await TinyXapp.start(sim.ric.xapp_route_table)
    try:
        await body(sim, x)
    finally:
        await x.close()
        await sim.close()


@pytest.mark.timeout(60)
def test_frames_whose_src_never_accepts_do_not_delay_other_nodes_kpm():
    async def body(sim, x):
        sub_id = await _subscribe(sim, x, 0)
        assert await _kpm_latency(sim, x, sub_id) < 0.5
        held, blackholes = _never_accepting(4)
        host, port = sim.ric.e2term_address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            stranger = E2Node(replace(sim.nodes[1].node.config, gnb_id=0xABCDE), sim.model)
            for i, bh in enumerate(blackholes):
                # a control for no node (answered by RTS to src, and src joins the xApps), garbage on
                # the control path (an error indication by RTS), and a setup whose return address is a
                # blackhole (the setup response is routed there)
                frames = [RmrMessage(RIC_CONTROL_REQ, b"\x00" * 8, meid="gnb_999_99_00000001"),
                          RmrMessage(RIC_CONTROL_REQ, b"\xff" * 40, meid=sim.nodes[0].meid)]
                if i == 0:
                    frames.append(RmrMessage(E2_SETUP_REQ, stranger.setup_request().payload))
                for f in frames:
                    writer.write(encode_frame(f, bh.encode(), bh.encode()))
            await writer.drain()
            # the other node's KPM flows on time, period after period, while those sends wait
            lat = [await _kpm_latency(sim, x, sub_id) for _ in range(8)]
            assert max(lat) < 0.5, lat
            assert sim.ric.e2term.stats.nodes_lost == 0 and sim.nodes[0].meid in sim.ric.e2term.nodes
        finally:
            writer.close()
            for s in held:
                s.close()

    asyncio.run(_with_sim(body, keepalive_s=0.2))


@pytest.mark.timeout(60)
def test_a_second_setup_for_a_connected_node_is_refused_and_a_restart_is_accepted():
    async def body(sim, x):
        real = sim.nodes[0]
        sub_id = await _subscribe(sim, x, 0)
        twin = await RmrEndpoint.open(0, src_id="127.0.0.1", bind_if="127.0.0.1", env={})
        try:
            claim = E2Node(real.node.config, sim.model).setup_request().payload
            await twin.wormhole_send(sim.ric.e2term_address, RmrMessage(E2_SETUP_REQ, claim))
            reply = await twin.receive(timeout=5)
            assert reply.mtype == E2_SETUP_FAILURE
            failure = e2ap.decode_e2ap(reply.payload)
            assert isinstance(failure, e2ap.E2SetupFailure) and failure.cause == IDENTITY_IN_USE
            assert sim.ric.e2term.stats.setups_refused == 1
            # the real node keeps its identity, its R-NIB entry and its KPM
            assert sim.ric.e2term._node_addr[real.meid] == real.ep.src
            assert read_nodeb(sim.ric.sdl, real.meid).port == int(real.ep.src.rsplit(":", 1)[1])
            assert await _kpm_latency(sim, x, sub_id) < 0.5

            # the real node goes away (no keepalive here: only the liveness check on the claim can
            # tell); the same identity's setup from elsewhere is now a restart, and is accepted
            await sim.stop_site(0)
            await asyncio.sleep(0.1)
            await twin.wormhole_send(sim.ric.e2term_address, RmrMessage(E2_SETUP_REQ, claim))
            reply = await twin.receive(timeout=5)
            assert reply.mtype == E2_SETUP_RESP
            assert isinstance(e2ap.decode_e2ap(reply.payload), e2ap.E2SetupResponse)
            assert sim.ric.e2term._node_addr[real.meid] == twin.src
            assert read_nodeb(sim.ric.sdl, real.meid).port == twin.port
        finally:
            await twin.close()

    asyncio.run(_with_sim(body, keepalive_s=None))
