"""Shutdown lifts the shaping: after the broker revoked every lease, the stopping xApp sends each
envelope-mode node its whole GPU back (a node left shaped would throttle the RAN for a training that is
gone) and waits briefly for the ACKs. Testbed (E2 nodes + mini-RIC) in this process, the xApp in this
process, a minimal lease client as the agent, a real Redis."""
from __future__ import annotations

import asyncio
import math

import pytest
from xapp_harness import LeaseClient, SimBed, free_port, until, xapp_config

import xapp.loop
from xapp.app import XappApp
from xapp.config import load_config

pytestmark = [pytest.mark.slow,
              pytest.mark.xfail(not hasattr(xapp.loop, "lift_shaping"), strict=True,
                                reason="needs xapp.loop.lift_shaping")]


def test_stop_gives_every_node_its_whole_gpu_back(tmp_path, redis_env):
    asyncio.run(_lift(tmp_path))


async def _lift(tmp):
    rmr_port = free_port()
    tb = await SimBed.start(tmp, rmr_port)
    x = agent = None
    try:
        path = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0, mode="auto")
        x = XappApp(load_config(path))
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        agent = LeaseClient(x.broker.port, "site-0").start()
        gpu = tb.sim.nodes[0].node.config.gpu_sms
        await until(lambda: [lease for _, lease in agent.leases() if lease.sm_count > 0], 20, "a lease")
        await until(lambda: float(tb.sim.model.envelope[0]) < gpu, 5, "site-0's node to apply a tighter envelope")
        assert x.nodes[tb.meids[0]] and x.node_controls[tb.meids[0]].mode == "envelope"
        sent = x.counters.controls_sent
        await x.stop()
        stopped = x
        x = None
        env = float(tb.sim.model.envelope[0])
        assert env == gpu or math.isinf(env), env           # the whole GPU (or no envelope at all)
        assert stopped.counters.controls_sent > sent         # the lift went out over RMR
        assert agent.revokes(), "the lease was revoked before the lift"
        assert stopped.store.control_cursor() is not None    # the lift's control ids were remembered
    finally:
        if agent is not None:
            await agent.close()
        if x is not None:
            await x.stop()
        await tb.close()
