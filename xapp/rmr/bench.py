"""`weaver bench rmr`: one-way message rate and round-trip latency over loopback, one sender and one echo
peer in another process, for 300-byte and 30 KB payloads.

Two arms run in the same command:
- `weaver`: `RmrEndpoint` on both sides (batched writes, asyncio Protocol, routed send, rts replies);
- `baseline`: the naive way, asyncio streams with one `write` + `drain` per frame and `readexactly` per
  frame, the same frame codec. Ratios are weaver / baseline.

The peer runs as `python -m xapp.rmr.bench --peer weaver|baseline --port P`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .endpoint import RmrEndpoint
from .framer import decode_frame, encode_frame
from .message import RmrMessage

ONE_WAY, DONE, ECHO = 1, 2, 3
SRC = b"127.0.0.1:1"
ROOT = Path(__file__).resolve().parents[2]


# -- peers (run in their own process) ---------------------------------------------------------------

async def weaver_peer(port: int) -> None:
    ep = await RmrEndpoint.open(port, src_id="127.0.0.1", env={}, queue_size=100_000)
    print(json.dumps({"ready": ep.port}), flush=True)
    count, cpu0 = 0, 0.0
    while True:
        m = await ep.receive()
        if m.mtype == ONE_WAY:
            if not count:
                cpu0 = time.process_time()
            count += 1
        elif m.mtype == DONE:
            await ep.rts(m, payload=f"{count} {time.process_time() - cpu0}".encode())
            count = 0
        elif m.mtype == ECHO:
            await ep.rts(m)


async def baseline_peer(port: int) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count, cpu0 = 0, 0.0
        try:
            while True:
                head = await reader.readexactly(4)
                n = int.from_bytes(head, "little")
                m = decode_frame(head + await reader.readexactly(n - 4))
                if m.mtype == ONE_WAY:
                    if not count:
                        cpu0 = time.process_time()
                    count += 1
                elif m.mtype in (DONE, ECHO):
                    if m.mtype == DONE:
                        payload = f"{count} {time.process_time() - cpu0}".encode()
                        count = 0
                    else:
                        payload = m.payload
                    writer.write(encode_frame(m.replace(payload=payload), SRC, SRC))
                    await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    print(json.dumps({"ready": port}), flush=True)
    async with server:
        await server.serve_forever()


# -- senders ----------------------------------------------------------------------------------------

class WeaverSender:
    async def open(self, port: int) -> None:
        self.ep = await RmrEndpoint.open(0, src_id="127.0.0.1", env={}, queue_size=100_000)
        self.ep.load_route_table(f"newrt|start\nrte|{ONE_WAY}|127.0.0.1:{port}\nrte|{DONE}|127.0.0.1:{port}\n"
                                 f"rte|{ECHO}|127.0.0.1:{port}\nnewrt|end|3\n")

    async def one_way(self, n: int, payload: bytes) -> tuple[float, float, bytes]:
        send = self.ep.send
        msg = RmrMessage(ONE_WAY, payload)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            await send(msg)
        await send(RmrMessage(DONE))
        reply = await self.ep.receive(120)
        return time.perf_counter() - t0, time.process_time() - c0, reply.payload

    async def rtt(self, n: int, payload: bytes) -> list[float]:
        out = []
        msg = RmrMessage(ECHO, payload)
        for _ in range(n):
            t0 = time.perf_counter()
            await self.ep.send(msg)
            await self.ep.receive(30)
            out.append(time.perf_counter() - t0)
        return out

    async def close(self) -> None:
        await self.ep.close()


class BaselineSender:
    async def open(self, port: int) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)

    async def _read(self) -> RmrMessage:
        head = await self.reader.readexactly(4)
        return decode_frame(head + await self.reader.readexactly(int.from_bytes(head, "little") - 4))

    async def one_way(self, n: int, payload: bytes) -> tuple[float, float, bytes]:
        msg = RmrMessage(ONE_WAY, payload)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            self.writer.write(encode_frame(msg, SRC, SRC))
            await self.writer.drain()
        self.writer.write(encode_frame(RmrMessage(DONE), SRC, SRC))
        await self.writer.drain()
        reply = await self._read()
        return time.perf_counter() - t0, time.process_time() - c0, reply.payload

    async def rtt(self, n: int, payload: bytes) -> list[float]:
        out = []
        msg = RmrMessage(ECHO, payload)
        for _ in range(n):
            t0 = time.perf_counter()
            self.writer.write(encode_frame(msg, SRC, SRC))
            await self.writer.drain()
            await self._read()
            out.append(time.perf_counter() - t0)
        return out

    async def close(self) -> None:
        self.writer.close()


# -- the benchmark ----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pin(cpu: int) -> None:
    # One core per process, as the target is stated; ignored where affinity is not available.
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[cpu % len(cpus)]})
    except (AttributeError, OSError):
        pass


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _run_arm(arm: str, sizes: list[int], counts: dict[int, int], rtt_n: int, pin: bool) -> dict:
    port = _free_port()
    cmd = [sys.executable, "-m", "xapp.rmr.bench", "--peer", arm, "--port", str(port)] + (["--pin"] if pin else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    peer = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = await asyncio.to_thread(peer.stdout.readline)
        if not line:
            raise RuntimeError(f"{arm} peer did not start")
        sender = WeaverSender() if arm == "weaver" else BaselineSender()
        await sender.open(port)
        results = {}
        for size in sizes:
            payload = os.urandom(size)
            await sender.rtt(min(50, rtt_n), payload)  # warm up: connections, allocator, caches
            elapsed, cpu, done = await sender.one_way(counts[size], payload)
            seen, peer_cpu = done.split()
            seen, peer_cpu = int(seen), float(peer_cpu)
            lat = await sender.rtt(rtt_n, payload)
            n = counts[size]
            results[str(size)] = {
                "one_way_msgs": n, "one_way_received": seen,
                "one_way_msgs_per_s": n / elapsed,
                # CPU seconds per message on each side: what one free core could do, whatever the load now
                "sender_cpu_us_per_msg": cpu / n * 1e6, "receiver_cpu_us_per_msg": peer_cpu / n * 1e6,
                "one_core_capacity_msgs_per_s": n / max(cpu, peer_cpu, 1e-9),
                "one_way_MB_per_s": counts[size] * size / elapsed / 1e6,
                "rtt_samples": len(lat),
                "rtt_p50_ms": _quantile(lat, 0.50) * 1e3, "rtt_p99_ms": _quantile(lat, 0.99) * 1e3,
                "rtt_mean_ms": statistics.fmean(lat) * 1e3,
            }
        await sender.close()
        return results
    finally:
        peer.terminate()
        await asyncio.to_thread(peer.wait, 10)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="300,30000", help="payload sizes in bytes, comma separated")
    parser.add_argument("--count", type=int, default=100_000, help="one-way messages for the smallest size")
    parser.add_argument("--bytes", type=int, default=600_000_000,
                        help="one-way byte budget for bigger sizes (count = min(count, bytes/size))")
    parser.add_argument("--rtt", type=int, default=3000, help="round trips per size")
    parser.add_argument("--quick", action="store_true", help="tiny counts (smoke test)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin sender and peer to one core each")
    parser.add_argument("--json", default=None, help="write results here")


def run(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    count, budget, rtt_n = (2000, 20_000_000, 200) if args.quick else (args.count, args.bytes, args.rtt)
    counts = {s: max(100, min(count, budget // s)) for s in sizes}
    pin = not args.no_pin
    if pin:
        _pin(0)
    arms = {}
    for arm in ("weaver", "baseline"):
        arms[arm] = asyncio.run(_run_arm(arm, sizes, counts, rtt_n, pin))
    ratio = {str(s): {
        "one_way_rate_x": arms["weaver"][str(s)]["one_way_msgs_per_s"] / arms["baseline"][str(s)]["one_way_msgs_per_s"],
        "rtt_p50_x": arms["weaver"][str(s)]["rtt_p50_ms"] / arms["baseline"][str(s)]["rtt_p50_ms"],
        "rtt_p99_x": arms["weaver"][str(s)]["rtt_p99_ms"] / arms["baseline"][str(s)]["rtt_p99_ms"],
        "one_core_capacity_x": (arms["weaver"][str(s)]["one_core_capacity_msgs_per_s"]
                                / arms["baseline"][str(s)]["one_core_capacity_msgs_per_s"]),
    } for s in sizes}
    small = arms["weaver"][str(min(sizes))]
    result = {
        "bench": "rmr",
        "arms": arms,
        "ratio_weaver_over_baseline": ratio,
        "targets": {"one_way_msgs_per_s_min": 50_000, "rtt_p99_ms_max": 1.0,
                    "one_way_met": small["one_way_msgs_per_s"] >= 50_000, "rtt_p99_met": small["rtt_p99_ms"] <= 1.0,
                    "one_core_capacity_met": small["one_core_capacity_msgs_per_s"] >= 50_000},
        "host": {"cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0], "pinned_one_core_each": pin,
                 "python": sys.version.split()[0]},
    }
    print(f"RMR loopback, one sender + one echo peer (load avg {result['host']['loadavg_1m']:.1f} "
          f"on {result['host']['cpus']} cpus{', one core each' if pin else ''})")
    print(f"{'arm':<9} {'payload':>8} {'msgs':>7} {'one-way msg/s':>14} {'MB/s':>8} {'rtt p50 ms':>11} "
          f"{'rtt p99 ms':>11} {'cpu us/msg tx/rx':>17} {'1-core cap msg/s':>17}")
    for arm, res in arms.items():
        for s in sizes:
            r = res[str(s)]
            cpu = f"{r['sender_cpu_us_per_msg']:.1f}/{r['receiver_cpu_us_per_msg']:.1f}"
            print(f"{arm:<9} {s:>8} {r['one_way_msgs']:>7} {r['one_way_msgs_per_s']:>14,.0f} "
                  f"{r['one_way_MB_per_s']:>8.1f} {r['rtt_p50_ms']:>11.3f} {r['rtt_p99_ms']:>11.3f} {cpu:>17} "
                  f"{r['one_core_capacity_msgs_per_s']:>17,.0f}")
    for s in sizes:
        x = ratio[str(s)]
        print(f"{'ratio':<9} {s:>8} {'':>7} {x['one_way_rate_x']:>13.2f}x {'':>8} {x['rtt_p50_x']:>10.2f}x "
              f"{x['rtt_p99_x']:>10.2f}x {'':>17} {x['one_core_capacity_x']:>16.2f}x")
    t = result["targets"]
    print(f"targets: >= 50,000 msg/s one way: {'met' if t['one_way_met'] else 'NOT met'} "
          f"(CPU-time capacity of one core: {'met' if t['one_core_capacity_met'] else 'NOT met'}); "
          f"p99 RTT <= 1 ms: {'met' if t['rtt_p99_met'] else 'NOT met'}")
    if result["host"]["loadavg_1m"] > 0.5 * (os.cpu_count() or 1):
        print("note: the host is loaded; wall-clock rates and p99 include waiting for a CPU")
    lost = [(a, s) for a in arms for s in sizes if arms[a][str(s)]["one_way_received"] != counts[s]]
    if lost:
        print(f"ERROR: messages lost in {lost}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 1 if lost else 0


def _peer_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--peer", choices=["weaver", "baseline"], required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pin", action="store_true")
    a = p.parse_args(argv)
    if a.pin:
        _pin(1)
    try:
        asyncio.run(weaver_peer(a.port) if a.peer == "weaver" else baseline_peer(a.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    if "--peer" in sys.argv:
        _peer_main(sys.argv[1:])
    else:
        parser = argparse.ArgumentParser(prog="python -m xapp.rmr.bench")
        add_arguments(parser)
        sys.exit(run(parser.parse_args()))
