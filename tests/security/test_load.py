"""Issue 13 item 8: a bounded load test. While a separate process floods the xApp for 10 s - malformed
RMR frames at ~10,000 a second (pre-built bytes), a REST connection flood and a gRPC connection flood at
the lease broker - every site keeps getting leases and the load causes no stale-KPM revocation.

The testbed is the one of the xApp's process tests (tests/xapp/xapp_harness.py): two E2 nodes over the
RAN model and the mini-RIC in this process, the xApp as its own process, one minimal lease client per
site. The RMR flood mixes what costs the xApp most per frame: indications carrying a live sub_id and meid
(read from SubMgr's list, as an attacker would) with undecodable E2AP, indications for unknown
subscriptions, oversized indications, junk control replies, unknown mtypes, health checks naming a src
that never accepts, plus a few connections a second that send bad framing or announce a 64 MiB frame.

On this project's 2-core hosts the xApp, the testbed, the flooder and Redis share two cores: the full
rate is kept (100,000 frames in 10 s reach the socket), but the flooder runs at nice 10, since the
point is what the xApp does with the frames that reach it, not which process the kernel favours. On the
tree before the fix (c364296) the same flood had the xApp decode ~77,000 bad indications: sites waited
up to 314-676 ms for a lease renewal (a lease lives 300 ms) and one run had both sites revoked for stale
KPM 7 s in; now ~95,000 frames are dropped undecoded by the per-source budget, the longest wait is
116-156 ms (one period plus jitter) and no site is revoked.

Run alone: `.venv-xapp/bin/python -m pytest tests/security/test_load.py -q -p no:cacheprovider`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "xapp"))
from xapp_harness import LeaseClient, SimBed, XappProcess, free_port, until, xapp_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FLOOD_S = 10.0
RATE = 10_000                   # malformed RMR frames a second
STALE_PERIODS = 2               # KPM older than 500 ms revokes a site (see the docstring)
pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------- flooder
def _frames(sub_id: int, meid: str, n: int) -> tuple[bytes, int]:
    """One batch of `n` malformed frames as one byte string (built once, sent many times)."""
    from xapp.rmr import RmrMessage, encode_frame

    src = b"127.0.0.1:1"            # health checks answered by rts dial this: nothing listens there
    kinds = [
        RmrMessage(mtype=12050, payload=b"\x00\x05\x00" + bytes(range(256)) * 2, sub_id=sub_id, meid=meid),
        RmrMessage(mtype=12050, payload=b"\x20\x05\x00\x80" + os.urandom(200), sub_id=sub_id, meid=meid),
        RmrMessage(mtype=12050, payload=os.urandom(120), sub_id=sub_id + 1000, meid=meid),
        RmrMessage(mtype=12041, payload=b"\x01\x02\x03", meid=meid),
        RmrMessage(mtype=4242, payload=b"?", meid="gnb-intruder"),
        RmrMessage(mtype=12050, payload=bytes(70 << 10), sub_id=sub_id, meid=meid),
        RmrMessage(mtype=100, payload=b"", meid=meid),
    ]
    weights = [40, 30, 10, 8, 8, 1, 3]
    out = []
    for i in range(n):
        k = i % sum(weights)
        j = 0
        while k >= weights[j]:
            k -= weights[j]
            j += 1
        out.append(encode_frame(kinds[j], src, src))
    return b"".join(out), n


async def _flood(args) -> dict:
    loop = asyncio.get_running_loop()
    end = loop.time() + args.seconds
    sent = {"rmr_frames": 0, "rmr_bad_conns": 0, "rest_requests": 0, "rest_errors": 0, "rest_idle": 0,
            "grpc_streams": 0, "grpc_raw": 0}
    streams = 4
    batch, per_batch = _frames(args.sub_id, args.meid, args.rate // (10 * streams))

    async def rmr_stream():
        while loop.time() < end:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", args.rmr)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            t = loop.time()
            while loop.time() < end and not w.is_closing():
                try:
                    w.write(batch)
                    await asyncio.wait_for(w.drain(), 1.0)
                except (ConnectionError, TimeoutError):
                    break
                sent["rmr_frames"] += per_batch
                t += 0.1
                await asyncio.sleep(max(0.0, t - loop.time()))
            w.close()

    async def rmr_bad_framing():
        junk = [b"\x00\x00\x00\x10garbage-not-rmr" * 4, struct.pack("<I", 64 << 20) + b"\x04\x00\x00\x00$" + bytes(4096)]
        i = 0
        while loop.time() < end:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", args.rmr)
                w.write(junk[i % 2])
                await w.drain()
                w.close()
                sent["rmr_bad_conns"] += 1
            except OSError:
                pass
            i += 1
            await asyncio.sleep(0.05)

    async def rest_worker(session):
        paths = ["/api/v1/sites", "/ric/v1/health/alive", "/nope", "/api/v1/controls"]
        i = 0
        while loop.time() < end:
            i += 1
            try:
                if i % 5 == 0:
                    async with session.post(f"{args.rest}/ric/v1/subscriptions/response", data=b"[" * 5000) as r:
                        await r.read()
                else:
                    async with session.get(args.rest + paths[i % len(paths)]) as r:
                        await r.read()
                sent["rest_requests"] += 1
            except (aiohttp.ClientError, TimeoutError, OSError):
                sent["rest_errors"] += 1
                await asyncio.sleep(0.05)

    async def rest_idle():
        """Connections that send half a request line and wait (the REST side times them out or not)."""
        port = int(args.rest.rsplit(":", 1)[1])
        held = []
        while loop.time() < end:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(b"GET /api/v1/sites HTTP/1.1\r\nHost: x\r\n")
                held.append(w)
                sent["rest_idle"] += 1
            except OSError:
                pass
            if len(held) > 200:
                held.pop(0).close()
            await asyncio.sleep(0.02)
        for w in held:
            w.close()

    async def grpc_flood():
        import grpc

        from schemas.proto.weaver.v1 import lease_pb2
        method = "/weaver.v1.LeaseBroker/Session"
        while loop.time() < end:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{args.broker}") as ch:
                call = ch.stream_stream(method, request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=lease_pb2.BrokerMessage.FromString)

                async def up():
                    yield lease_pb2.AgentMessage(register=lease_pb2.Register(site_id="site-0", agent_id="intruder",
                                                                            mode="gpu"))
                    await asyncio.sleep(0.5)
                try:
                    async for _ in call(up(), timeout=1.0):
                        pass
                except grpc.aio.AioRpcError:
                    pass
                sent["grpc_streams"] += 1

    async def grpc_raw():
        while loop.time() < end:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", args.broker)
                w.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(64))
                await w.drain()
                w.close()
                sent["grpc_raw"] += 1
            except OSError:
                pass
            await asyncio.sleep(0.02)

    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=2)) as session:
        tasks = [rmr_stream() for _ in range(streams)] + [rmr_bad_framing(), rest_idle(), grpc_raw()]
        tasks += [rest_worker(session) for _ in range(8)] + [grpc_flood() for _ in range(8)]
        await asyncio.gather(*tasks, return_exceptions=True)
    return sent


def flood_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    for name in ("--rmr", "--broker", "--sub-id", "--rate"):
        p.add_argument(name, type=int, required=True)
    p.add_argument("--rest", required=True)
    p.add_argument("--meid", required=True)
    p.add_argument("--seconds", type=float, required=True)
    args = p.parse_args(argv)
    os.nice(10)
    print(json.dumps(asyncio.run(_flood(args))), flush=True)


# ---------------------------------------------------------------------------------------------- the test
async def _metrics(rest: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(rest + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _max_gap(agent: LeaseClient, t0: float, t1: float) -> float:
    times = [t for t, _ in agent.leases() if t0 <= t <= t1]
    return max((b - a for a, b in zip(times, times[1:], strict=False)), default=t1 - t0)


def _stale(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items() if k.startswith("weaver_lease_revocations_total") and
               ("stale" in k or "xapp-error" in k))


def test_flood_leaves_every_site_served(tmp_path, redis_env, xapp_python):
    asyncio.run(asyncio.wait_for(_load(tmp_path, redis_env, xapp_python), 120))


async def _load(tmp: Path, redis: dict, python: Path):
    rmr_port, broker_port = free_port(), free_port()
    tb = await SimBed.start(tmp, rmr_port)
    x = None
    agents: list[LeaseClient] = []
    try:
        cfg = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=broker_port, mode="quota",
                          stale_periods=STALE_PERIODS)
        x = await XappProcess.start(python, cfg, redis, tmp / "xapp.log")
        await x.wait_ready()
        sites = [f"site-{i}" for i in range(len(tb.meids))]
        agents = [LeaseClient(broker_port, s).start() for s in sites]

        def granted(after: float) -> bool:
            return all(any(t > after and lease.sm_count > 0 for t, lease in a.leases()) for a in agents)
        await until(lambda: granted(0.0), 20, "leases on every site")
        async with aiohttp.ClientSession() as s, s.get(tb.sim.ric.submgr_url + "/subscriptions") as r:
            subs = await r.json()
        target = next(d for d in subs if d.get("Meid") == tb.meids[0])
        before = await _metrics(x.rest)

        cpu0 = _cpu_s(x.proc.pid)
        t0 = time.monotonic()
        flooder = await asyncio.create_subprocess_exec(
            str(python), __file__, "--rmr", str(rmr_port), "--broker", str(broker_port), "--rest", x.rest,
            "--sub-id", str(target["SubscriptionId"]), "--meid", tb.meids[0], "--rate", str(RATE),
            "--seconds", str(FLOOD_S), cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # During the flood: every second, every site gets a lease with SMs in it.
        gaps = []
        mark = t0
        while flooder.returncode is None and time.monotonic() - t0 < FLOOD_S + 5:
            await asyncio.sleep(1.0)
            if not granted(mark):
                gaps.append(round(time.monotonic() - t0, 1))
            mark = time.monotonic()
            try:
                await asyncio.wait_for(flooder.wait(), 0.01)
            except TimeoutError:
                pass
        out, err = await asyncio.wait_for(flooder.communicate(), 30)
        assert flooder.returncode == 0, err.decode()[-3000:]
        sent = json.loads(out.decode().strip().splitlines()[-1])
        t1 = time.monotonic()
        cpu = _cpu_s(x.proc.pid) - cpu0
        await until(lambda: granted(t1), 5, "leases on every site after the flood")
        after = await _metrics(x.rest)
        gap = max(_max_gap(a, t0, t1) for a in agents)
        print(f"flood: {sent}; rmr dropped { {k: v for k, v in after.items() if 'rmr_dropped' in k} }; "
              f"xApp CPU {cpu:.1f} s in {t1 - t0:.1f} s; longest wait for a lease {gap * 1000:.0f} ms")
        revokes = [(round(t - t0, 2), r.reason) for a in agents for t, r in a.revokes(after=t0)]
        assert sent["rmr_frames"] >= 0.8 * RATE * FLOOD_S, sent
        assert not gaps, f"a site got no lease during these seconds of the flood: {gaps}; revokes {revokes}"
        # A lease is valid for 3 periods (300 ms) and renewed every period: a longer wait lets it lapse.
        assert gap < 0.3, f"a site waited {gap * 1000:.0f} ms for a lease during the flood; revokes {revokes}"
        assert _stale(after) == _stale(before), f"revocations during the flood: {revokes}"
        assert not [r for r in revokes if "stale" in r[1] or r[1] == "xapp-error"], revokes
        dropped = sum(v for k, v in after.items() if k.startswith("weaver_rmr_dropped_total"))
        assert dropped > 0.5 * sent["rmr_frames"] or after.get("weaver_ingest_errors_total{kind=\"e2ap\"}", 0) > 0
        assert after["weaver_indications_total"] > before["weaver_indications_total"] + 2 * FLOOD_S * 10 * 0.8
    finally:
        for a in agents:
            await a.close()
        if x:
            rc = await x.stop()
            assert rc == 0, (tmp / "xapp.log").read_text()[-3000:]
        await tb.close()


if __name__ == "__main__":
    flood_main(sys.argv[1:])
