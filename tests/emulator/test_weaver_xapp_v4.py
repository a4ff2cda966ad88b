"""The Weaver xApp on KPM v4.00 nodes: it picks the codec by the node's RAN function OID (the v4.00 arc),
subscribes, takes the indications with their 64-bit NTP timestamps and gets its quota controls acknowledged
under the srsRAN rule (its header names UE 0, which the emulated population has)."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "xapp"))
from xapp_harness import SimBed, free_port, until, xapp_config  # noqa: E402

from e2sm import kpm  # noqa: E402
from testbed.sim import SimConfig, Simulation  # noqa: E402
from xapp.app import XappApp  # noqa: E402
from xapp.config import load_config  # noqa: E402


async def _run(tmp: Path) -> None:
    from ricxappframe.xapp_sdl import SDLWrapper

    rmr_port = free_port()
    sim = await Simulation.start(SimConfig(n_sites=1, n_cells=2, kpm_version="v4.00", slices={"*": "2:1,1:1"},
                                           xapps=(f"127.0.0.1:{rmr_port}",), route_dir=str(tmp), speed=1.0),
                                 sdl=SDLWrapper())
    tb = SimBed(sim)
    tb._task = asyncio.ensure_future(tb._run())
    x = None
    try:
        (node,) = sim.nodes
        assert node.node.version is kpm.KpmVersion.V4_00
        x = XappApp(load_config(xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0, mode="quota")))
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        await until(lambda: x.ready() and x.readiness()["subscriptions"], 20, "ready and subscribed")
        await until(lambda: x.counters.indications >= 10, 15, "KPM indications")
        (rec,) = x.subscriptions.values()
        assert rec.kpm_version == kpm.KpmVersion.V4_00.name, rec
        await until(lambda: x.counters.controls_acked >= 1, 15, "a quota control acknowledged")
        assert x.counters.controls_failed == 0, list(x.controls_log)[-5:]
    finally:
        if x is not None:
            await x.stop()
        await tb.close()


def test_weaver_xapp_against_a_kpm_v4_node(tmp_path, redis_env):
    asyncio.run(_run(tmp_path))
