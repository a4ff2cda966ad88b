"""Issue 13 item 1 (usage reports): what an agent reports cannot corrupt the run's accounting.

Before: only the `site.epoch.` prefix of a UsageReport's lease id was checked, so `sm_ms_used = 1e300` on a
never-issued lease went into the per-site SM·ms total (a `weaver up` summary showed sm_seconds_used
1.32e299). Now a report counts only when it names a lease issued to the reporting session, arrives while
that lease is current or within the grace after it ended, and claims no more than the lease's partition
could do in one period x (1 + USAGE_TOLERANCE); every other report is refused (the stream stays up),
counted by reason, and never reaches the per-site totals. Non-finite or negative values still end the
stream with INVALID_ARGUMENT, and are counted too.
Real grpc.aio broker on loopback, a raw gRPC client from the proto stubs; the broker's wall clock is the
test's, so "late" needs no sleeping."""
from __future__ import annotations

import asyncio
import math

import grpc

from schemas.proto.weaver.v1 import lease_pb2
from xapp.agents import AgentBook
from xapp.broker import LeaseBroker
from xapp.config import XappConfig

METHOD = "/weaver.v1.LeaseBroker/Session"
PERIOD_MS = 100


def make_cfg():
    return XappConfig.from_controls({
        "period_ms": PERIOD_MS, "policy": {"name": "weaver"},
        "sites": [{"site_id": "s1", "nodes": ["n1"], "gpu_sms": 128}],
        "broker": {"listen": "127.0.0.1:0", "heartbeat_ms": 100}})


def register(kind="cuda", sm=128, gran=8):
    return lease_pb2.AgentMessage(register=lease_pb2.Register(
        site_id="s1", agent_id="agent-1", mode="gpu",
        device=lease_pb2.DeviceFacts(kind=kind, name="dev", sm_count=sm, granularity=gran))).SerializeToString()


def usage(lease_id, used, granted=0.0, window=PERIOD_MS):
    return lease_pb2.AgentMessage(usage=lease_pb2.UsageReport(
        lease_id=lease_id, sm_ms_used=used, sm_ms_granted=granted, window_ms=window, steps=1)).SerializeToString()


class Agent:
    def __init__(self, ch, first=None):
        self.q: asyncio.Queue = asyncio.Queue()
        self.q.put_nowait(first or register())
        self.call = ch.stream_stream(METHOD, request_serializer=lambda b: b,
                                     response_deserializer=lease_pb2.BrokerMessage.FromString)(self._requests())
        self.hb = 0

    async def _requests(self):
        while (item := await self.q.get()) is not None:
            yield item

    async def until(self, body):
        while (m := await asyncio.wait_for(self.call.read(), 3)).WhichOneof("body") != body:
            pass
        return m

    async def sync(self):
        """Everything sent before has been handled: a heartbeat's echo comes back after it."""
        self.hb += 1
        self.q.put_nowait(lease_pb2.AgentMessage(heartbeat=lease_pb2.Heartbeat(seq=self.hb)).SerializeToString())
        while (await self.until("heartbeat")).heartbeat.seq != self.hb:
            pass


def run(body):
    wall = [1_000_000.0]

    async def main():
        book = AgentBook(epoch=7, period_ms=PERIOD_MS, valid_periods=3, heartbeat_ms=100, timeout_heartbeats=3)
        broker = LeaseBroker(make_cfg(), book, wall=lambda: wall[0])
        port = await broker.start("127.0.0.1:0")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                return await body(broker, ch, wall)
        finally:
            await broker.stop(0.1)
    return asyncio.run(main())


def test_hostile_reports_are_refused_counted_and_kept_out_of_the_accounting():
    async def body(broker, ch, wall):
        a = Agent(ch)
        await a.until("revoke")
        lease = (broker.grant("s1", 64, "weaver")).lease          # s1.7.1: 64 SMs, 100 ms periods
        await a.until("lease")
        bound = 64 * PERIOD_MS * 2                                # partition x period x (1 + tolerance)
        for msg in (usage("s1.7.999", 1e300),                      # never issued (only the prefix matches)
                    usage("s1.6.1", 10.0),                          # another epoch
                    usage("s2.7.1", 10.0),                          # another site's
                    usage(lease.lease_id, 1e300),                   # more than the lease could ever do
                    usage(lease.lease_id, bound * 1.01),
                    usage(lease.lease_id, 10.0, granted=1e12),
                    usage(lease.lease_id, 10.0, window=PERIOD_MS * 50)):   # a window longer than the period
            a.q.put_nowait(msg)
        await a.sync()
        assert broker.book.used_sm_ms.get("s1", 0.0) == 0.0 and broker.book.agents["s1"].reports == 0
        a.q.put_nowait(usage(lease.lease_id, bound))              # at the bound: an honest overrun, kept
        a.q.put_nowait(usage(lease.lease_id, 3200.0, granted=6400.0))
        await a.sync()
        used = broker.book.used_sm_ms["s1"]
        # the session is still the agent's and still gets leases
        broker.grant("s1", 32, "weaver")
        assert (await a.until("lease")).lease.seq == 2
        a.q.put_nowait(None)
        return used, dict(broker.refused_usage), broker.book.agents["s1"].reports

    used, refused, reports = run(body)
    assert used == 64 * PERIOD_MS * 2 + 3200.0 and reports == 2
    assert refused == {"usage-unknown-lease": 3, "usage-exceeds-lease": 4}


def test_reports_on_a_lease_of_another_session_or_long_ended_are_refused():
    async def body(broker, ch, wall):
        old = Agent(ch)
        await old.until("revoke")
        first = broker.grant("s1", 64, "weaver").lease
        await old.until("lease")
        old.call.cancel()
        await asyncio.sleep(0.2)
        new = Agent(ch)                                           # the next session for s1
        await new.until("revoke")
        new.q.put_nowait(usage(first.lease_id, 100.0))             # issued to the previous session
        lease = broker.grant("s1", 64, "weaver").lease
        await new.until("lease")
        broker.revoke("s1", "stale-kpm")
        wall[0] += 0.5                                            # just ended: within the grace
        new.q.put_nowait(usage(lease.lease_id, 100.0))
        await new.sync()
        kept = broker.book.used_sm_ms.get("s1", 0.0)
        wall[0] += broker.book.usage_grace_s                       # long ended
        new.q.put_nowait(usage(lease.lease_id, 100.0))
        await new.sync()
        new.q.put_nowait(None)
        return kept, broker.book.used_sm_ms.get("s1", 0.0), dict(broker.refused_usage)

    kept, total, refused = run(body)
    assert kept == total == 100.0
    assert refused == {"usage-unknown-lease": 1, "usage-late": 1}


def test_a_cpu_agent_is_bounded_in_its_own_cores():
    """A 4-core CPU agent standing in for a 128-SM GPU: a lease's partition is at most its 4 cores (agent
    units), so 4 cores x 100 ms x 2 is the most it can claim; what is kept converts to site SMs."""
    async def body(broker, ch, wall):
        a = Agent(ch, register(kind="cpu", sm=4, gran=1))
        await a.until("revoke")
        lease = broker.grant("s1", 64, "weaver").lease
        await a.until("lease")
        a.q.put_nowait(usage(lease.lease_id, 4 * PERIOD_MS * 2 + 1))
        a.q.put_nowait(usage(lease.lease_id, 400.0))               # 4 cores busy for the whole period
        await a.sync()
        a.q.put_nowait(None)
        return broker.book.used_sm_ms["s1"], dict(broker.refused_usage)

    used, refused = run(body)
    assert used == 400.0 * 128 / 4 and refused == {"usage-exceeds-lease": 1}


def test_what_an_agent_declares_cannot_scale_its_usage_beyond_the_lease():
    """Issue 26 item 5: a stand-in that registers 0.01 cores scales each core·ms to 128 / 0.01 site SM·ms; before,
    200 such reports put 42 M SM·s in a site's ledger. The bound is the broker's own record of the lease, in site
    SM·ms: per report its SMs over the window, per lease its SMs over its whole life (x (1 + tolerance))."""
    async def body(broker, ch, wall):
        a = Agent(ch, lease_pb2.AgentMessage(register=lease_pb2.Register(
            site_id="s1", agent_id="agent-1", mode="gpu", device=lease_pb2.DeviceFacts(
                kind="cpu", name="dev", sm_count=1, granularity=1, cores=0.01))).SerializeToString())
        await a.until("revoke")
        lease = broker.grant("s1", 64, "weaver").lease
        await a.until("lease")
        a.q.put_nowait(usage(lease.lease_id, 2.0))                 # 2 core·ms = 25,600 SM·ms: above one period's
        for _ in range(200):
            a.q.put_nowait(usage(lease.lease_id, 1.0))             # 12,800 SM·ms each: the lease's life holds 3
        await a.sync()
        a.q.put_nowait(None)
        return broker.book.used_sm_ms.get("s1", 0.0), dict(broker.refused_usage), lease

    used, refused, lease = run(body)
    life = lease.sm_count * lease.valid_for_ms * 2
    assert used <= life and used == 3 * 12_800.0, used
    assert refused == {"usage-exceeds-lease": 1 + 197}


def test_non_finite_usage_ends_the_stream_and_is_counted():
    async def body(broker, ch, wall):
        a = Agent(ch)
        await a.until("revoke")
        lease = broker.grant("s1", 64, "weaver").lease
        await a.until("lease")
        a.q.put_nowait(usage(lease.lease_id, math.inf))
        try:
            while True:
                await asyncio.wait_for(a.call.read(), 3)
        except grpc.aio.AioRpcError as err:
            code = err.code()
        return code, dict(broker.refused_usage), broker.book.used_sm_ms.get("s1", 0.0)

    code, refused, used = run(body)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and refused == {"usage-invalid": 1} and used == 0.0
