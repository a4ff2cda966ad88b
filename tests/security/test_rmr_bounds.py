"""Issue 13 item 4 (RMR): what hostile peers on the RMR port can make the xApp hold is bounded.

Before: each connection could hold one partial frame of up to 64 MiB and nothing bounded their sum or
their number (8 connections announcing 64 MiB frames grew a running xApp's RSS by ~200 MB). Now a frame
announcing more than `max_frame` closes its connection before anything is buffered, the partial frames of
all connections together stay under `max_buffered` (the biggest holder is closed), accepted connections
stay under `max_connections` (the one with the fewest frames goes, so a live peer keeps its socket), and a
closed connection drops its bytes at once. Real sockets against a real endpoint, and a real xApp process
whose VmRSS is read from /proc."""
from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from xapp.rmr import RmrEndpoint, RmrMessage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "xapp"))
from xapp_harness import XappProcess, free_port, standalone_controls  # noqa: E402

MiB = 1 << 20


def announce(length: int) -> bytes:
    """The first bytes of a frame claiming `length` bytes: LE length word, BE copy, '$'."""
    return struct.pack("<I", length) + struct.pack(">I", length) + b"$"


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _send(writer: asyncio.StreamWriter, data: bytes) -> bool:
    """Write; False once the peer has closed (reset or EPIPE)."""
    try:
        writer.write(data)
        await asyncio.wait_for(writer.drain(), 5)
        return True
    except (ConnectionError, TimeoutError):
        return False


async def _closed_by_peer(reader: asyncio.StreamReader, timeout: float = 5.0) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), timeout) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def test_endpoint_bounds_frames_buffered_bytes_and_connections():
    asyncio.run(asyncio.wait_for(_endpoint_bounds(), 30))


async def _endpoint_bounds():
    ep = await RmrEndpoint.open(0, env={}, max_frame=1 * MiB, max_buffered=4 * MiB, max_connections=16)
    try:
        # 1. A frame announcing more than max_frame: refused, the connection closed, nothing buffered.
        conns = [await _open(ep.port) for _ in range(16)]
        for _, w in conns:
            await _send(w, announce(64 * MiB) + bytes(1000))
        assert all([await _closed_by_peer(r) for r, _ in conns])
        assert ep.stats.frame_errors == 16 and ep.buffered == 0
        for _, w in conns:
            w.close()

        # 2. Twelve connections each sending 900 KiB of a (1 MiB - 1)-byte frame: 10.8 MB wanted, the
        # endpoint never holds more than max_buffered plus one socket read (256 KiB), and the biggest
        # holders are closed.
        conns = [await _open(ep.port) for _ in range(12)]
        peak = 0
        for _, w in conns:
            await _send(w, announce(MiB - 1))
        for _ in range(9):
            for _, w in conns:
                await _send(w, bytes(100 << 10))
                await asyncio.sleep(0.002)
                peak = max(peak, ep.buffered)
        await asyncio.sleep(0.2)
        peak = max(peak, ep.buffered)
        assert peak <= 4 * MiB + (256 << 10), peak
        assert ep.stats.overflow_closes >= 7, ep.stats
        closed = [await _closed_by_peer(r, 0.5) for r, _ in conns]
        assert sum(closed) == ep.stats.overflow_closes
        for _, w in conns:
            w.close()
        await asyncio.sleep(0.2)
        assert ep.buffered == 0                  # closed connections gave their bytes back

        # 3. A live peer (an RMR endpoint sending a frame every 20 ms) and 40 idle sockets: at most 16
        # accepted connections stay open, the idle ones go, the live peer keeps delivering.
        peer = await RmrEndpoint.open(0, src_id="127.0.0.1", env={})
        target = f"127.0.0.1:{ep.port}"
        got = 0

        async def live(n: int):
            for i in range(n):
                await peer.wormhole_send(target, RmrMessage(mtype=4000, payload=b"live %d" % i))
                await asyncio.sleep(0.02)
        sender = asyncio.ensure_future(live(10_000))
        for _ in range(5):
            await ep.receive(5)
            got += 1
        idle = []
        for _ in range(40):
            idle.append(await _open(ep.port))
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)
        assert ep._accepted <= 16 and ep.stats.connections_evicted >= 40 + 1 - 16, ep.stats
        start = time.monotonic()
        while time.monotonic() - start < 1.0:            # still arriving, on the same connection
            m = await ep.receive(5)
            assert m.payload.startswith(b"live")
            got += 1
        assert peer.stats.dials == 1, "the live peer's connection was evicted"
        sender.cancel()
        for _, w in idle:
            w.close()
        await peer.close()
    finally:
        await ep.close()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_xapp_rss_stays_bounded_under_huge_frame_announcements(tmp_path, redis_env, xapp_python):
    asyncio.run(asyncio.wait_for(_xapp_rss(tmp_path, redis_env, xapp_python), 90))


async def _xapp_rss(tmp: Path, redis: dict, python: Path):
    controls = standalone_controls("weaver-sec-rmr")
    controls["rmr"].update(port=free_port(), backend="python")
    controls["broker"]["listen"] = "127.0.0.1:0"
    controls["rest"] = {"port": 0}
    cfg = tmp / "config-file.json"
    cfg.write_text(json.dumps({"name": "weaver", "version": "0.1.0", "controls": controls}))
    x = await XappProcess.start(python, cfg, redis, tmp / "xapp.log")
    try:
        port = int(x.info["rmr"])
        pid = x.proc.pid
        await asyncio.sleep(1.0)
        base = _rss_kib(pid)
        peak = base

        # 8 connections, each announcing a 64 MiB frame and sending 24 MiB of it (192 MiB wanted).
        conns = [await _open(port) for _ in range(8)]
        alive = [await _send(w, announce(64 * MiB)) for _, w in conns]
        for _ in range(24):
            for i, (_, w) in enumerate(conns):
                if alive[i]:
                    alive[i] = await _send(w, bytes(MiB))
            peak = max(peak, _rss_kib(pid))
        # 16 connections, each sending 3.5 MiB of a frame just under the xApp's 4 MiB frame limit.
        more = [await _open(port) for _ in range(16)]
        alive2 = [await _send(w, announce(4 * MiB - 1)) for _, w in more]
        for _ in range(7):
            for i, (_, w) in enumerate(more):
                if alive2[i]:
                    alive2[i] = await _send(w, bytes(512 << 10))
            peak = max(peak, _rss_kib(pid))
        await asyncio.sleep(0.5)
        peak = max(peak, _rss_kib(pid))
        for _, w in conns + more:
            w.close()
        await asyncio.sleep(1.0)
        after = _rss_kib(pid)
        growth, kept = (peak - base) / 1024, (after - base) / 1024
        print(f"xApp VmRSS {base / 1024:.0f} MiB, peak +{growth:.0f} MiB, after close +{kept:.0f} MiB")
        # The xApp's bound is 32 MiB of partial frames; allow the socket reads in flight and the allocator.
        assert growth < 64, f"RSS grew {growth:.0f} MiB under huge frame announcements"
        assert kept < 40, f"{kept:.0f} MiB kept after the connections closed"
        async with aiohttp.ClientSession() as s, s.get(x.rest + "/metrics") as r:
            text = await r.text()
        dropped = {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("weaver_rmr_dropped_total{")}
        assert dropped["bad_frame_connection"] >= 8 and dropped["overflow_connection"] >= 1, dropped
        status, _ = await x.get("/ric/v1/health/alive")
        assert status == 200
    finally:
        assert await x.stop() == 0, (tmp / "xapp.log").read_text()[-3000:]


def test_favoured_frames_jump_a_flood_and_a_held_connection_is_not_read():
    asyncio.run(asyncio.wait_for(_favour_and_hold(), 30))


async def _favour_and_hold():
    """The queue order the xApp relies on under a flood: frames of a connection it vouched for (the E2
    termination's, which delivered valid KPM) come out before a flood queued from another connection,
    and a connection put on hold is not read (its bytes wait in the kernel) until the hold ends."""
    from xapp.rmr import encode_frame

    ep = await RmrEndpoint.open(0, env={}, queue_size=4096)
    good = await RmrEndpoint.open(0, src_id="127.0.0.1", env={})
    try:
        target = f"127.0.0.1:{ep.port}"
        await good.wormhole_send(target, RmrMessage(mtype=12050, payload=b"kpm-0"))
        first = await ep.receive(5)
        ep.favour(first.via)
        _, flood = await _open(ep.port)
        junk = b"".join(encode_frame(RmrMessage(mtype=4242, payload=b"x" * 64), b"127.0.0.1:9", b"127.0.0.1:9") for _ in range(2000))
        assert await _send(flood, junk)
        await asyncio.sleep(0.2)                      # the flood is read and queued first...
        await good.wormhole_send(target, RmrMessage(mtype=12050, payload=b"kpm-1"))
        await asyncio.sleep(0.1)
        assert ep.pending() > 1000
        nxt = await ep.receive(5)                     # ...and the vouched-for frame still comes out first
        assert nxt.payload == b"kpm-1", (nxt.mtype, ep.pending())
        while ep.pending():
            await ep.receive(1)

        # hold the flood's connection: what it sends for the next 0.5 s is not read, then it is
        assert await _send(flood, junk[:len(junk) // 20])
        msg = await ep.receive(5)
        assert ep.hold(msg.via, 0.5)
        while ep.pending():
            await ep.receive(1)
        t0 = time.monotonic()
        assert await _send(flood, junk[:len(junk) // 20])
        got = await ep.receive(5)
        assert time.monotonic() - t0 >= 0.4 and got.mtype == 4242
        flood.close()
    finally:
        await good.close()
        await ep.close()
