"""`python -m xapp.rmr`: RMR tools for operators chasing routing problems (like RMR's own sender,
receiver and health probe).

    python -m xapp.rmr listen --port 4560 [--rt FILE] [--count N]   one JSON line per message on stdout
    python -m xapp.rmr send --rt FILE --mtype N [--meid M] [--sub-id S] --payload-hex H [--wait-reply S]
    python -m xapp.rmr probe HOST:PORT [--timeout S]                   health check; exit 0 healthy, 1 not
                                      (honours RMR_BIND_IF, RMR_SRC_ID, RMR_SRC_NAMEONLY)

Exit codes: 0 success, 1 the RMR operation failed (message on stderr), 2 bad arguments.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import time

from .endpoint import RmrEndpoint, split_hostport
from .message import Mtype, RmrError, RmrMessage


def message_json(msg: RmrMessage) -> str:
    return json.dumps({"mtype": msg.mtype, "sub_id": msg.sub_id, "meid": msg.meid, "src": msg.src,
                       "payload": msg.payload.hex(), "xid": msg.xid.decode("ascii", "replace"),
                       "truncated": msg.truncated})


def _err(text: str) -> None:
    print(f"rmr: {text}", file=sys.stderr, flush=True)


async def listen(args: argparse.Namespace) -> int:
    ep = await RmrEndpoint.open(args.port, args.rt, args.src_id)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"listening": ep.port, "src": ep.src, "srcip": ep.srcip, "ready": ep.ready}),
          file=sys.stderr, flush=True)
    seen = 0
    try:
        while not stop.is_set() and (args.count is None or seen < args.count):
            getter = asyncio.ensure_future(ep.receive())
            stopper = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if getter not in done:
                getter.cancel()
                break
            msg = getter.result()
            print(message_json(msg), flush=True)
            seen += 1
            if args.reply_mtype is not None:
                try:
                    await ep.rts(msg, mtype=args.reply_mtype)
                except RmrError as exc:
                    _err(f"rts failed: {exc}")
    finally:
        await ep.close()
    return 0


async def send(args: argparse.Namespace) -> int:
    try:
        payload = bytes.fromhex(args.payload_hex)
        msg = RmrMessage(args.mtype, payload, sub_id=args.sub_id, meid=args.meid or "")
    except ValueError as exc:
        _err(f"bad message: {exc}")
        return 2
    if not os.path.exists(args.rt):
        _err(f"route table {args.rt} not found")
        return 2
    ep = await RmrEndpoint.open(args.port, args.rt, args.src_id, route_poll_s=3600)
    try:
        if not ep.ready:
            _err(f"route table {args.rt} did not commit (needs newrt|start ... newrt|end)")
            return 1
        try:
            n = await ep.send(msg)
        except RmrError as exc:
            _err(f"send failed: {exc}")
            return 1
        print(json.dumps({"sent": n, "mtype": msg.mtype, "src": ep.src}), flush=True)
        if args.wait_reply:
            try:
                print(message_json(await ep.receive(args.wait_reply)), flush=True)
            except TimeoutError:
                _err(f"no reply within {args.wait_reply}s")
                return 1
        return 0
    finally:
        await ep.close()


def _route_to(host: str) -> str:
    """The local address the kernel would use to reach `host` (so the peer's RTS can dial us back)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


# What probe takes from the RMR environment: who it says it is and where it listens. Not the route table
# or the route manager port: inside an xApp's container those belong to the xApp (RMR_RTG_SVC's port is taken).
PROBE_ENV = ("RMR_BIND_IF", "RMR_SRC_ID", "RMR_SRC_NAMEONLY")


def probe_env(environ) -> dict[str, str]:
    return {k: environ[k] for k in PROBE_ENV if environ.get(k)}


def _probe_address(bind_if: str | None, host: str) -> str:
    """The address the health-check reply is to come back to: the bound interface (we listen only there),
    else the one the kernel routes to the target by (a hostname may not resolve at the target)."""
    if bind_if and bind_if not in ("0.0.0.0", "::"):
        return bind_if
    return _route_to(host)


async def probe(args: argparse.Namespace) -> int:
    try:
        host, _ = split_hostport(args.target)
    except RmrError as exc:
        _err(str(exc))
        return 2
    env = probe_env(os.environ)
    src_id = None if env.get("RMR_SRC_ID") else _probe_address(env.get("RMR_BIND_IF"), host)
    ep = await RmrEndpoint.open(0, src_id=src_id, env=env, connect_timeout=args.timeout)
    xid = os.urandom(16).hex().encode()
    started = time.perf_counter()
    try:
        await ep.wormhole_send(args.target, RmrMessage(Mtype.HEALTH_CHECK_REQ, xaction=xid))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + args.timeout
        while True:
            reply = await ep.receive(max(0.0, deadline - loop.time()))
            if reply.mtype == Mtype.HEALTH_CHECK_RESP and reply.xaction == xid:
                break
    except TimeoutError:
        print(f"FAIL: {args.target}: no health-check reply within {args.timeout}s", flush=True)
        return 1
    except RmrError as exc:
        print(f"FAIL: {args.target}: {exc}", flush=True)
        return 1
    finally:
        await ep.close()
    ms = (time.perf_counter() - started) * 1e3
    if reply.payload.startswith(b"OK"):
        print(f"OK: {args.target} healthy ({ms:.1f} ms)", flush=True)
        return 0
    print(f"FAIL: {args.target} unhealthy: {reply.payload.decode('utf-8', 'replace').strip()}", flush=True)
    return 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m xapp.rmr", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("listen", help="print each received message as a JSON line")
    lp.add_argument("--port", default="4560")
    lp.add_argument("--rt", default=None, help="route table file (else RMR_SEED_RT)")
    lp.add_argument("--src-id", default=None, help="name written into src (else RMR_SRC_ID, hostname)")
    lp.add_argument("--count", type=int, default=None, help="exit after this many messages")
    lp.add_argument("--reply-mtype", type=int, default=None, help="answer each message by rts with this mtype")
    sp = sub.add_parser("send", help="send one message by the route table")
    sp.add_argument("--rt", required=True)
    sp.add_argument("--mtype", type=int, required=True)
    sp.add_argument("--meid", default=None)
    sp.add_argument("--sub-id", type=int, default=-1)
    sp.add_argument("--payload-hex", default="")
    sp.add_argument("--port", default="0", help="our listen port (replies come back here); 0 = any")
    sp.add_argument("--src-id", default=None)
    sp.add_argument("--wait-reply", type=float, default=0.0, help="wait this long for one reply and print it")
    pp = sub.add_parser("probe", help="RMR health check (mtype 100 -> 101 OK)")
    pp.add_argument("target", help="HOST:PORT")
    pp.add_argument("--timeout", type=float, default=2.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run({"listen": listen, "send": send, "probe": probe}[args.cmd](args))
    except OSError as exc:  # e.g. the listen port is taken
        _err(str(exc))
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
