"""The asyncio endpoint over loopback: peer restart, back-pressure, garbage from the network, calls,
route-file reload, shutdown. Waits are on conditions (`eventually`, per-connection ordering), never on
how long something took."""
from __future__ import annotations

import asyncio
import random

import pytest
from rmr_helpers import build_frame, eventually, free_port, raw_connect

from xapp.rmr import (
    RmrClosedError,
    RmrEndpoint,
    RmrMessage,
    RmrSendError,
    RmrState,
    encode_frame,
    parse_port,
)

ENV: dict[str, str] = {}


async def endpoint(port: int = 0, **kw) -> RmrEndpoint:
    kw.setdefault("src_id", "127.0.0.1")
    kw.setdefault("env", ENV)
    kw.setdefault("backoff", (0.01, 0.05))
    return await RmrEndpoint.open(port, **kw)


def test_peer_restart_no_loss_after_reconnect_and_clear_errors(run):
    async def body():
        port = free_port()
        s = await endpoint()
        b = await endpoint(port)
        s.load_route_table(f"newrt|start\nrte|1|127.0.0.1:{port}\nnewrt|end\n")
        for i in range(10):
            await s.send(RmrMessage(1, b"%d" % i))
        first = [(await b.receive(5)).payload for _ in range(10)]
        await b.close()
        await eventually(lambda: not s.connected(f"127.0.0.1:{port}"), what="sender sees the peer go")
        errors = []
        for _ in range(5):  # peer down: every send says so, with a state code
            with pytest.raises(RmrSendError) as e:
                await s.send(RmrMessage(1, b"lost"))
            errors.append(e.value.state)
        b = await endpoint(port)
        delivered = []
        seq = 0
        while len(delivered) < 200:
            try:
                await s.send(RmrMessage(1, b"%d" % seq))
                delivered.append(b"%d" % seq)
            except RmrSendError as exc:
                assert exc.state in (RmrState.RETRY, RmrState.SENDFAILED)
                await asyncio.sleep(0.01)  # let the redial backoff pass
            seq += 1
        got = [(await b.receive(5)).payload for _ in range(len(delivered))]
        extra = b.pending()
        await s.close()
        await b.close()
        return first, errors, delivered, got, extra
    first, errors, delivered, got, extra = run(body())
    assert first == [b"%d" % i for i in range(10)]
    assert set(errors) <= {RmrState.SENDFAILED, RmrState.RETRY} and RmrState.SENDFAILED in errors
    assert got == delivered and extra == 0


def test_receive_queue_back_pressure_loses_nothing(run):
    async def body():
        r = await endpoint(queue_size=8)
        s = await endpoint()
        s.load_route_table(f"newrt|start\nrte|2|{r.src}\nnewrt|end\n")
        n, size = 300, 30_000

        async def sender():
            for i in range(n):
                await s.send(RmrMessage(2, i.to_bytes(4, "big") * (size // 4)))
        task = asyncio.ensure_future(sender())
        await eventually(lambda: r.pending() >= 8, what="queue fills")
        for _ in range(50):  # give the sender every chance to overrun the queue
            await asyncio.sleep(0.005)
        peak = r.pending()
        blocked = not task.done()
        got = [int.from_bytes((await r.receive(5)).payload[:4], "big") for _ in range(n)]
        await task
        await s.close()
        await r.close()
        return peak, blocked, got
    peak, blocked, got = run(body(), timeout=60)
    # reading stops at the limit; frames already in one socket read (<= 256 KiB) still get queued
    assert peak <= 8 + 256 * 1024 // 30_000 + 1
    assert blocked  # the sender felt it: 9 MB do not fit in the socket buffers
    assert got == list(range(300))


def test_garbage_from_the_network_closes_only_that_connection(run):
    rng = random.Random(7)
    valid = encode_frame(RmrMessage(5, b"ok", src="127.0.0.1:1"), b"127.0.0.1:1", b"127.0.0.1:1")
    cases = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000))) for _ in range(30)]
    for _ in range(30):
        m = bytearray(valid * 2)
        for _ in range(rng.randrange(1, 6)):
            m[rng.randrange(len(m))] = rng.randrange(256)
        cases.append(bytes(m))

    async def body():
        ep = await endpoint()
        good = await raw_connect(ep.port)
        closed = 0
        for data in cases:
            evil = await raw_connect(ep.port)
            await evil.send(data)
            # a health check after the garbage: answered (garbage was frames or a valid prefix... or
            # the connection was closed); either way the endpoint must keep serving others
            await good.send(build_frame(100, b""))
            reply, _ = await good.frame()
            assert reply.mtype == 101
            if ep.stats.frame_errors > closed:
                closed = ep.stats.frame_errors
                assert await evil.eof()
            evil.close()
        while ep.pending():
            await ep.receive(1)
        await ep.close()
        good.close()
        return closed
    closed = run(body(), timeout=60)
    assert closed >= 30  # most random garbage has an absurd length word


def test_calls_between_endpoints(run):
    async def body():
        a, b = await endpoint(), await endpoint()
        a.load_route_table(f"newrt|start\nrte|20010|{b.src}\nrte|100|{b.src}\nnewrt|end\n")

        async def responder():
            while True:
                m = await b.receive()
                await b.rts(m, mtype=20011, payload=m.payload + b"!")
        task = asyncio.ensure_future(responder())
        replies = await asyncio.gather(*(a.call(RmrMessage(20010, b"q%d" % i)) for i in range(40)))
        health = await a.call(RmrMessage(100))  # a call-style health probe is still answered
        task.cancel()
        await a.close()
        await b.close()
        return replies, health
    replies, health = run(body())
    assert [r.payload for r in replies] == [b"q%d!" % i for i in range(40)]
    assert all(not r.call for r in replies)
    assert (health.mtype, health.payload) == (101, b"OK\n")


def test_route_file_watch_reloads_on_change(run, tmp_path):
    async def body():
        a, b = await endpoint(), await endpoint()
        path = tmp_path / "seed.rt"
        s = await endpoint(env={"RMR_SEED_RT": str(path)}, route_poll_s=0.02)
        assert not s.ready  # no file yet: retried every poll
        path.write_text(f"newrt|start|one\nrte|3|{a.src}\nnewrt|end|1\n")
        await eventually(lambda: s.ready, what="first table")
        await s.send(RmrMessage(3))
        await a.receive(5)
        path.write_text(f"newrt|start|two\nrte|3|{b.src}\nnewrt|end|1\n")
        await eventually(lambda: s.router.table.table_id == "two", what="reload")
        await s.send(RmrMessage(3))
        await b.receive(5)
        path.write_text("newrt|start|three\nrte|3|x:1\nnewrt|end|9\n")  # bad count: ignored
        await eventually(lambda: s.route_file and s._route_stat and s._route_stat[1] == path.stat().st_size,
                         what="bad table read")
        table_id = s.router.table.table_id
        for ep in (s, a, b):
            await ep.close()
        return table_id
    assert run(body()) == "two"


def test_concurrent_first_sends_share_one_dial(run):
    async def body():
        a, b = await endpoint(), await endpoint()
        a.load_route_table(f"newrt|start\nrte|4|{b.src}\nnewrt|end\n")
        await asyncio.gather(*(a.send(RmrMessage(4, b"%d" % i)) for i in range(50)))
        got = sorted([int((await b.receive(5)).payload) for _ in range(50)])
        dials = a.stats.dials
        await a.close()
        await b.close()
        return got, dials
    got, dials = run(body())
    assert got == list(range(50)) and dials == 1


def test_wormhole_and_backoff(run):
    async def body():
        a, b = await endpoint(), await endpoint()
        await a.wormhole_send(b.src, RmrMessage(7, b"wh"))
        m = await b.receive(5)
        dead = f"127.0.0.1:{free_port()}"
        with pytest.raises(RmrSendError) as e1:
            await a.wormhole_send(dead, RmrMessage(7))
        with pytest.raises(RmrSendError) as e2:
            await a.wormhole_send(dead, RmrMessage(7))  # inside the backoff window: no redial
        with pytest.raises(RmrSendError) as e3:
            await a.wormhole_send("no-port", RmrMessage(7))
        failures = a.stats.dial_failures
        await a.close()
        await b.close()
        return m, a.src, e1.value.state, e2.value.state, e3.value.state, failures
    m, a_src, s1, s2, s3, failures = run(body())
    assert m.payload == b"wh" and m.src == a_src
    assert (s1, s2, s3) == (RmrState.SENDFAILED, RmrState.RETRY, RmrState.BADARG) and failures == 1


def test_close_wakes_receivers_and_refuses_work(run):
    async def body():
        a = await endpoint()
        waiter = asyncio.ensure_future(a.receive())
        await asyncio.sleep(0)
        await a.close()
        with pytest.raises(RmrClosedError):
            await waiter
        with pytest.raises(RmrClosedError):
            await a.send(RmrMessage(1))
        with pytest.raises(RmrClosedError):
            await a.receive(0.1)
        await a.close()  # idempotent
        # the port is free again
        again = await endpoint(a.port)
        await again.close()
    run(body())


def test_receive_timeout(run):
    async def body():
        a = await endpoint()
        with pytest.raises(TimeoutError):
            await a.receive(0.01)
        await a.close()
    run(body())


def test_send_without_table_is_noendpt(run):
    async def body():
        a = await endpoint()
        with pytest.raises(RmrSendError) as e:
            await a.send(RmrMessage(1))
        await a.close()
        return e.value.state
    assert run(body()) == RmrState.NOENDPT


def test_fan_out_reports_partial_success(run):
    async def body():
        a, b = await endpoint(), await endpoint()
        dead = f"127.0.0.1:{free_port()}"
        a.load_route_table(f"newrt|start\nrte|8|{b.src};{dead}\nrte|9|{dead}\nnewrt|end\n")
        n = await a.send(RmrMessage(8))
        with pytest.raises(RmrSendError):
            await a.send(RmrMessage(9))
        await b.receive(5)
        await a.close()
        await b.close()
        return n
    assert run(body()) == 1


def test_concurrent_receivers_each_get_one_message(run):
    async def body():
        a, b = await endpoint(), await endpoint()
        a.load_route_table(f"newrt|start\nrte|5|{b.src}\nnewrt|end\n")
        receivers = [asyncio.ensure_future(b.receive(10)) for _ in range(5)]
        short = asyncio.ensure_future(b.receive(0.01))  # times out and must not swallow a wake-up
        with pytest.raises(TimeoutError):
            await short
        for i in range(5):
            await a.send(RmrMessage(5, b"%d" % i))
        got = sorted([(await r).payload for r in receivers])
        await a.close()
        await b.close()
        return got
    assert run(body()) == [b"0", b"1", b"2", b"3", b"4"]


def test_close_flushes_queued_frames(run):
    async def body():
        a, b = await endpoint(), await endpoint()
        a.load_route_table(f"newrt|start\nrte|6|{b.src}\nnewrt|end\n")
        for i in range(100):
            await a.send(RmrMessage(6, i.to_bytes(4, "big") * 10_000))
        await a.close()  # right away: what send() accepted still goes out
        got = [int.from_bytes((await b.receive(10)).payload[:4], "big") for _ in range(100)]
        await b.close()
        return got
    assert run(body(), timeout=60) == list(range(100))


@pytest.mark.parametrize("src", [b"127.0.0.1:99999", b"127.0.0.1:0", b"host:-1", b"[::1:abc", b"\xff\xfe:80",
                                 b"a" * 63, b":4560", b"no-such-host.invalid:4560", b"127.0.0.1:", b""])
def test_health_check_with_odd_src_is_answered_on_the_socket(run, src):
    """Whatever a peer writes as src, rts falls back to the arriving socket; nothing escapes the loop."""
    async def body():
        ep = await endpoint(connect_timeout=0.5)
        conn = await raw_connect(ep.port)
        await conn.send(build_frame(100, b"", src=src, srcip=src))
        reply, _ = await conn.frame(timeout=10)
        await ep.close()
        conn.close()
        return reply
    reply = run(body())
    assert (reply.mtype, reply.payload) == (101, b"OK\n")


def test_unhealthy_endpoint_answers_err(run):
    async def body():
        ep = await endpoint()
        conn = await raw_connect(ep.port)
        ep.health_status = lambda: "sdl unreachable"
        await conn.send(build_frame(100, b""))
        bad, _ = await conn.frame()
        ep.health_status = lambda: 1 / 0
        await conn.send(build_frame(100, b""))
        broken, _ = await conn.frame()
        ep.health_status = lambda: None
        await conn.send(build_frame(100, b""))
        good, _ = await conn.frame()
        await ep.close()
        conn.close()
        return bad, broken, good
    bad, broken, good = run(body())
    assert bad.payload == b"ERR sdl unreachable\n" and broken.payload.startswith(b"ERR health check raised")
    assert good.payload == b"OK\n"


@pytest.mark.parametrize("text,port", [("4560", 4560), ("tcp:4561", 4561), (":4562", 4562), (4563, 4563)])
def test_port_forms_rmr_init_accepts(text, port):
    assert parse_port(text) == port


def test_endpoint_names_compare_as_strings(run):
    """§7: localhost:P and 127.0.0.1:P are two endpoints, two connections."""
    async def body():
        a, b = await endpoint(), await endpoint()
        a.load_route_table(f"newrt|start\nrte|1|localhost:{b.port};127.0.0.1:{b.port}\nnewrt|end\n")
        await a.send(RmrMessage(1))
        await b.receive(5)
        await b.receive(5)
        names = (a.connected(f"localhost:{b.port}"), a.connected(f"127.0.0.1:{b.port}"), a.stats.dials)
        await a.close()
        await b.close()
        return names
    assert run(body()) == (True, True, 2)
