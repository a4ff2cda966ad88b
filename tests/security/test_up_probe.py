"""Issue 13 item 4 (testbed): `weaver up` never waits on an agent's inspection to advance the world.

Before: the world loop awaited `AgentProbe.poll`, one Status call per agent in turn with a 0.5 s
deadline each, so an agent whose AgentInspect pool was starved by watchers (or any agent that stops
answering) held up every period by 0.5 s per such agent: no KPM meanwhile, and the xApp revoked every
site for stale KPM. Here the probe runs the world's own pacing against real gRPC servers: one that
answers, one whose Status never returns (its pool is taken), and a socket that never accepts.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent import futures

import grpc

from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc
from testbed.up import PROBE_WAIT_PERIODS, AgentProbe, AgentView

PERIOD_S = 0.1


class _Inspect(lease_pb2_grpc.AgentInspectServicer):
    def __init__(self, hang: threading.Event | None = None) -> None:
        self.hang = hang

    def Status(self, request, context):
        if self.hang is not None:
            self.hang.wait(30)   # a starved or wedged agent: the call never returns in time
        return lease_pb2.AgentStatus(site_id="site-0", connected=True, step=7)


def _server(servicer, workers: int) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    lease_pb2_grpc.add_AgentInspectServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_a_stalled_agent_inspection_never_delays_the_world_loop():
    hang = threading.Event()
    good, good_addr = _server(_Inspect(), 2)
    wedged, wedged_addr = _server(_Inspect(hang), 1)
    mute = socket.socket()   # listens, never accepts: the handshake completes, nothing is ever answered
    mute.bind(("127.0.0.1", 0))
    mute.listen(1)
    views = [AgentView(0, good_addr), AgentView(1, wedged_addr), AgentView(2, f"127.0.0.1:{mute.getsockname()[1]}")]
    probe = AgentProbe(views)

    async def world(periods: int) -> list[float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        waits = []
        for n in range(1, periods + 1):   # as run_up's loop: probe, step, then sleep to the next period
            t = loop.time()
            await probe.poll(PROBE_WAIT_PERIODS * PERIOD_S)
            waits.append(loop.time() - t)
            await asyncio.sleep(max(0.0, t0 + n * PERIOD_S - loop.time()))
        return waits

    try:
        t0 = time.monotonic()
        waits = asyncio.run(world(20))
        elapsed = time.monotonic() - t0
        assert max(waits) < PROBE_WAIT_PERIODS * PERIOD_S + 0.05, waits
        assert elapsed < 20 * PERIOD_S + 0.3, elapsed            # the world kept its pace
        assert views[0].last["reachable"] and views[0].last["step"] == 7
        # the silent ones are seen as holding nothing once their call's deadline passed
        assert views[1].last.get("reachable") is False and views[1].last["lease_sms"] == 0
        assert views[2].last.get("reachable") is False
        assert probe.late > 0
    finally:
        hang.set()
        probe.close()
        good.stop(0)
        wedged.stop(0)
        mute.close()
