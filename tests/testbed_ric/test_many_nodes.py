"""A region's nodes on one mini-RIC (issue 27 item 3): 400 E2 nodes set up at once, their health checks
answered, none declared lost. At a fixed bound of 256 peers with sends queued, the E2 termination dropped
the setup responses and health checks of the nodes beyond it and declared them lost."""
from __future__ import annotations

import asyncio

from testbed.sim import SimConfig, Simulation

NODES = 400


async def _many(keepalive_s: float) -> tuple[int, int, int]:
    sim = await asyncio.wait_for(Simulation.start(SimConfig(n_sites=NODES, n_cells=1, keepalive_s=keepalive_s,
                                                            speed=0, e2term_port=0, submgr_http_port=0)), 120)
    try:
        await asyncio.sleep(4 * keepalive_s)      # past the 3 silent intervals that declare a node lost
        e2t = sim.ric.e2term
        return len(e2t.nodes), e2t.stats.nodes_lost, e2t.outbox.dropped
    finally:
        await sim.close()


def test_four_hundred_nodes_set_up_and_stay_connected():
    connected, lost, dropped = asyncio.run(_many(1.0))
    assert (connected, lost, dropped) == (NODES, 0, 0)
