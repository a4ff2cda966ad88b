"""Dynamic route tables from a route manager (rmr-wire.md §9, mtypes 20/21/22), the route manager played
by raw TCP peers: pushes to our control port, and requests from us when RMR_RTG_SVC names host:port."""
from __future__ import annotations

import pytest
from rmr_helpers import RawListener, build_frame, eventually, free_port, raw_connect

from xapp.rmr import RmrEndpoint, RmrMessage

DEAD = b"127.0.0.1:1"  # route-manager src nobody listens on: acks come back on the arriving socket


async def endpoint(**kw) -> RmrEndpoint:
    return await RmrEndpoint.open(0, src_id="127.0.0.1", **kw)


def test_pushed_tables_commit_atomically_and_are_acknowledged(run):
    async def body():
        ctl = free_port()
        b = await endpoint(env={})
        ep = await endpoint(env={"RMR_RTG_SVC": str(ctl)})
        rtmgr = await raw_connect(ctl)
        # one table over two messages: nothing applies before the end marker
        await rtmgr.send(build_frame(20, f"newrt|start|t1\nrte|5|{b.src}\n".encode(), src=DEAD))
        await rtmgr.send(build_frame(100, b"", src=DEAD))  # health check is still answered here
        hc, _ = await rtmgr.frame()
        ready_mid_table = ep.ready
        await rtmgr.send(build_frame(20, b"newrt|end|1\n", src=DEAD))
        ack1, _ = await rtmgr.frame()
        await ep.send(RmrMessage(5, b"routed"))
        got = await b.receive(5)
        await rtmgr.send(build_frame(20, b"updatert|start|u2\nrte|6|x:1\nupdatert|end|4\n", src=DEAD))
        ack2, _ = await rtmgr.frame()
        await rtmgr.send(build_frame(20, f"updatert|start|u3\nrte|7|{b.src}\nupdatert|end|1\n".encode(), src=DEAD))
        ack3, _ = await rtmgr.frame()
        routes = (ep.router.table.lookup(5, -1) is not None, ep.router.table.lookup(6, -1), ep.router.table.table_id)
        await ep.close()
        await b.close()
        rtmgr.close()
        return hc, ready_mid_table, ack1, got, ack2, ack3, routes
    hc, mid, ack1, got, ack2, ack3, routes = run(body())
    assert hc.mtype == 101 and not mid
    assert (ack1.mtype, ack1.payload) == (22, b"OK t1 \n") and got.payload == b"routed"
    assert ack2.mtype == 22 and ack2.payload.startswith(b"ERR u2 ")
    assert ack3.payload == b"OK u3 \n" and routes == (True, None, "u3")


def test_table_data_on_the_data_port_is_just_a_message(run):
    async def body():
        ep = await endpoint(env={})
        conn = await raw_connect(ep.port)
        await conn.send(build_frame(20, b"newrt|start\nrte|5|x:1\nnewrt|end\n", src=DEAD))
        m = await ep.receive(5)
        ready = ep.ready
        await ep.close()
        conn.close()
        return m, ready
    m, ready = run(body())
    assert m.mtype == 20 and not ready


def test_requests_a_table_from_host_port_route_manager(run):
    async def body():
        rtmgr = await RawListener().start()
        b = await endpoint(env={})
        ep = await endpoint(env={"RMR_RTG_SVC": rtmgr.name})
        conn = await rtmgr.accepted()
        req, _ = await conn.frame()
        await conn.send(build_frame(20, f"newrt|start|r1\nrte|8|{b.src}\nnewrt|end|1\n".encode(), src=DEAD))
        ack, _ = await conn.frame()
        await eventually(lambda: ep.ready, what="table from the route manager")
        await ep.send(RmrMessage(8))
        await b.receive(5)
        src = ep.src
        await ep.close()
        await b.close()
        await rtmgr.close()
        return req, ack, src
    req, ack, src = run(body())
    assert req.mtype == 21 and req.payload.startswith(f"{src} ts=".encode()) and req.payload.endswith(b"\n")
    assert (ack.mtype, ack.payload) == (22, b"OK r1 \n")


def test_bad_route_manager_address_is_refused(run):
    async def body():
        with pytest.raises(Exception, match="host:port|bad"):
            await endpoint(env={"RMR_RTG_SVC": "nohost:"})
    run(body())
