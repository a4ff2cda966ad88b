"""The interop checklist of `shared/design/rmr-wire.md` §15, one test per bullet (test_cNN = bullet NN).

| # | bullet (short) | Python side (this file) | (C) part (test_rmr_native.py) |
|---|---|---|---|
| 1-5 | §4 frame decodes; garbage 9..49; BE word/'$' ignored; every split; batching | test_c01..c05 | - |
| 6 | 300 KB payload | test_c06 (Python<->Python) | test_c06_300kb_python_c |
| 7-12 | trace; d1/xid garbage echoed; absurd L; plen clamp; encoder bytes; defaults | test_c07..c12 | - |
| 13 | RMRXapp receives our fields | test_c13 (offsets C reads) | test_c13_ricxappframe_... |
| 14 | RTS dials live src on a new connection | test_c14 | test_c14_c_rts_dials_src_... |
| 15-18 | RTS fallbacks; dialled sockets read; redial; src/srcip | test_c15..c18 | - |
| 19 | call flag + d1 echo | test_c19 | test_c19_c_reply_to_our_call_frame |
| 20 | our call() matching | test_c20 | - |
| 21 | health check 100 -> 101 OK | test_c21 | test_c21_our_health_check_... |
| 22-27 | rr vs fan-out; %meid; sub_id fallback; filters/self; bad count; comments/half tables | test_c22..c27 | - |

The (C) tests need `librmr_si.so` (loaded by ricxappframe) and skip with the loader's reason where it is
absent. Everything here runs over loopback (real sockets, our endpoint, raw TCP peers that see the exact
bytes).
"""
from __future__ import annotations

import asyncio
import os
import random
import struct

import pytest
from rmr_helpers import EXAMPLE_PAYLOAD, RawListener, build_frame, eventually, free_port, raw_connect

from xapp.rmr import (
    NEED_DATA,
    RmrEncodeError,
    RmrEndpoint,
    RmrFrameError,
    RmrFramer,
    RmrMessage,
    RmrSendError,
    RmrState,
    decode_frame,
    encode_frame,
)

ENV: dict[str, str] = {}  # hermetic: tests never read the developer's RMR_* variables


def frame_with(base: bytes, **patch: bytes) -> bytes:
    """`base` with bytes replaced at frame offsets: frame_with(f, o242=b"...")."""
    out = bytearray(base)
    for key, value in patch.items():
        off = int(key[1:])
        out[off:off + len(value)] = value
    return bytes(out)


async def endpoint(**kw) -> RmrEndpoint:
    kw.setdefault("src_id", "127.0.0.1")
    kw.setdefault("env", ENV)
    return await RmrEndpoint.open(0, **kw)


# -- Framing and decoding ---------------------------------------------------------------------------

def test_c01_example_frame_decodes(example_frame):
    m = decode_frame(example_frame)
    assert (m.mtype, len(m.payload), m.src, m.srcip, m.sub_id, m.call_id) == (
        12050, 65, "127.0.0.1:43086", "127.0.0.1:43086", -1, 0)
    assert m.payload == EXAMPLE_PAYLOAD and not m.truncated and not m.call
    assert m.meid == "" and m.xaction == bytes(32) and m.trace == b""


def test_c02_garbage_in_unused_transport_bytes(example_frame):
    rng = random.Random(2)
    for _ in range(50):
        junk = bytes(rng.randrange(256) for _ in range(41))  # bytes 9..49
        assert decode_frame(frame_with(example_frame, o9=junk)) == decode_frame(example_frame)
    # the P1 sample: ricxappframe heap bytes in 16..49
    p1 = bytes.fromhex("28020000") + b"\xff" * 8 + b'{ "RMR_MAX_XID": 3'
    assert decode_frame(frame_with(example_frame, o16=p1[:34])) == decode_frame(example_frame)


@pytest.mark.parametrize("patch", [
    {"o4": b"\0\0\0\0"},                  # BE word wrong
    {"o4": b"\xff\xff\xff\xff"},          # BE word absurd
    {"o8": b"\0"},                        # no '$'
    {"o4": b"\x01\x02\x03\x04", "o8": b"#"},
])
def test_c03_be_word_and_marker_do_not_matter(example_frame, patch):
    assert decode_frame(frame_with(example_frame, **patch)) == decode_frame(example_frame)


def test_c04_one_byte_per_read_and_every_split(example_frame):
    f = RmrFramer()
    out = []
    for b in example_frame:
        f.receive_data(bytes([b]))
        m = f.next_frame()
        if m is not NEED_DATA:
            out.append(m)
    assert out == [decode_frame(example_frame)]
    for cut in range(1, len(example_frame)):
        f = RmrFramer()
        f.receive_data(example_frame[:cut])
        assert f.next_frame() is NEED_DATA
        f.receive_data(example_frame[cut:])
        assert f.next_frame() == decode_frame(example_frame)
        assert f.next_frame() is NEED_DATA and f.buffered == 0


def test_c05_batched_frames(example_frame):
    second = encode_frame(RmrMessage(12051, b"second"), b"h:1", b"h:1")
    f = RmrFramer()
    f.receive_data(example_frame + second)
    assert [f.next_frame().mtype, f.next_frame().mtype, f.next_frame()] == [12050, 12051, NEED_DATA]
    both = example_frame + second
    half = len(example_frame) + len(second) // 2
    f = RmrFramer()
    f.receive_data(both[:half])
    assert f.next_frame().mtype == 12050 and f.next_frame() is NEED_DATA
    f.receive_data(both[half:])
    assert f.next_frame().payload == b"second"


def test_c06_300kb_payload_python_to_python(run):
    payload = os.urandom(307_200)

    async def body():
        a, b = await endpoint(), await endpoint()
        a.load_route_table(f"newrt|start\nrte|9|{b.src}\nnewrt|end|1\n")
        await a.send(RmrMessage(9, payload))
        got = await b.receive(10)
        await b.rts(got, payload=got.payload[::-1])
        back = await a.receive(10)
        await a.close()
        await b.close()
        return got, back
    got, back = run(body())
    assert got.payload == payload and back.payload == payload[::-1] and not got.truncated
    # the C half of this bullet: test_native.py::test_c06_300kb_python_c


def test_c07_trace_moves_payload_and_rts_returns_it(run):
    trace = b"\x01\x02\x03\x04\x05\x06\x07\x08"
    frame = build_frame(77, b"hello", trace=trace)
    assert frame.index(b"hello") == 342
    m = decode_frame(frame)
    assert m.trace == trace and m.payload == b"hello"

    async def body():
        ep = await endpoint()
        listener = await RawListener().start()
        conn = await raw_connect(ep.port)
        await conn.send(build_frame(77, b"hello", trace=trace, src=listener.name.encode()))
        got = await ep.receive(5)
        await ep.rts(got, payload=b"reply")
        reply, raw = await (await listener.accepted()).frame()
        await ep.close()
        await listener.close()
        conn.close()
        return reply, raw
    reply, raw = run(body())
    assert reply.trace == trace
    assert raw[330:338] == trace and raw[342:] == b"reply"


def test_c08_garbage_in_d1_and_after_xid_nul_is_echoed(run):
    xid = b"xid-0000\0" + bytes.fromhex("e8b48f9d7f000001") + b"\xaa" * 15
    assert len(xid) == 32
    frame = build_frame(60, b"p", xid=xid, d1=bytes.fromhex("005f4e4f"))
    m = decode_frame(frame)
    assert m.call_id == 0 and not m.call and m.xaction == xid and m.xid == b"xid-0000"

    async def body():
        ep = await endpoint()
        conn = await raw_connect(ep.port)
        await conn.send(frame)  # src 127.0.0.1:1 is dead: the reply comes back on this socket
        got = await ep.receive(5)  # d1[1..3] garbage must not turn it into a call reply (P3)
        await ep.rts(got, mtype=61)
        reply, raw = await conn.frame()
        await ep.close()
        conn.close()
        return reply, raw
    reply, raw = run(body())
    assert raw[62:94] == xid and raw[330:334] == b"\0\0\0\0" and reply.mtype == 61


@pytest.mark.parametrize("length", [1 << 31, 0xFFFFFFFF, 329, 0, 4])
def test_c09_absurd_length_closes_only_that_connection(run, length):
    bad = struct.pack("<I", length) + bytes(400)
    f = RmrFramer()
    f.receive_data(bad)
    with pytest.raises(RmrFrameError):
        f.next_frame()
    with pytest.raises(RmrFrameError):  # broken for good
        f.next_frame()

    async def body():
        ep = await endpoint()
        good = await raw_connect(ep.port)
        evil = await raw_connect(ep.port)
        await evil.send(bad)
        closed = await evil.eof()
        await good.send(build_frame(5, b"still here"))
        m = await ep.receive(5)
        errors = ep.stats.frame_errors
        await ep.close()
        good.close()
        return closed, m, errors
    closed, m, errors = run(body())
    assert closed and m.payload == b"still here" and errors == 1


def test_c09_encoder_refuses_oversized_frames():
    class Huge(bytes):
        def __len__(self):
            return 1 << 31
    msg = RmrMessage(1)
    object.__setattr__(msg, "payload", Huge())
    with pytest.raises(RmrEncodeError):
        encode_frame(msg, b"a:1", b"a:1")


def test_c10_plen_beyond_frame_truncates_short_plen_ignores_extra():
    over = build_frame(8, b"abcdef", plen=100)
    m = decode_frame(over)
    assert m.truncated and m.payload == b"abcdef"
    under = build_frame(8, b"abcdef", plen=3)
    m = decode_frame(under)
    assert not m.truncated and m.payload == b"abc"


# -- Encoder output ---------------------------------------------------------------------------------

def test_c11_transport_header_and_exact_length(example_frame):
    msg = RmrMessage(12050, EXAMPLE_PAYLOAD)
    out = encode_frame(msg, b"127.0.0.1:43086", b"127.0.0.1:43086")
    n = len(out)
    assert out[0:9] == struct.pack("<I", n) + struct.pack(">I", n) + b"$"
    assert out[9:50] == bytes(41)
    assert out == example_frame  # byte for byte the frame C emitted


def test_c12_header_defaults_flags_le_and_d1_cleared(run):
    out = encode_frame(RmrMessage(5, b"p", call=True, call_id=9), b"a:1", b"a:1")
    assert struct.unpack(">iiiii", out[246:266]) == (280, 0, 4, 0, -1)
    assert struct.unpack(">i", out[58:62]) == (3,)
    assert out[242:246] == b"\x04\0\0\0"  # flags LE (P4)
    assert out[330:334] == b"\x09\0\0\0"
    plain = encode_frame(RmrMessage(5, b"p"), b"a:1", b"a:1")
    assert plain[242:246] == bytes(4) and plain[330:334] == bytes(4)

    async def body():  # send() of a message received as a call buffer goes out as a plain send
        ep = await endpoint()
        listener = await RawListener().start()
        ep.load_route_table(f"newrt|start\nrte|5|{listener.name}\nnewrt|end\n")
        conn = await raw_connect(ep.port)
        await conn.send(build_frame(5, b"call", flags=4, d1=b"\x07\0\0\0"))
        got = await ep.receive(5)
        assert got.call and got.call_id == 7
        await ep.send(got)
        _, raw = await (await listener.accepted()).frame()
        await ep.close()
        await listener.close()
        conn.close()
        return raw
    raw = run(body())
    assert raw[242:246] == bytes(4) and raw[330:334] == bytes(4)


def test_c13_our_frames_as_ricxappframe_sees_them():
    """(C) part: test_native.py. Python side: the fields an RMRXapp reads sit where C reads them."""
    xid = b"tx-13".ljust(32, b"\0")
    out = encode_frame(RmrMessage(12040, b"ctl", sub_id=42, meid="gnb_734_733_b5c67788", xaction=xid),
                       b"x:4560", b"10.0.0.1:4560")
    assert struct.unpack(">i", out[50:54])[0] == 12040
    assert struct.unpack(">i", out[54:58])[0] == 3 and out[334:] == b"ctl"
    assert out[62:94] == xid
    assert out[190:222] == b"gnb_734_733_b5c67788".ljust(32, b"\0")
    assert struct.unpack(">i", out[262:266])[0] == 42
    assert out[126:190] == b"x:4560".ljust(64, b"\0") and out[266:330] == b"10.0.0.1:4560".ljust(64, b"\0")


# -- Connections and RTS ----------------------------------------------------------------------------

def test_c14_rts_dials_a_live_src_on_a_new_connection(run):
    async def body():
        ep = await endpoint()
        listener = await RawListener().start()
        conn = await raw_connect(ep.port)
        await conn.send(build_frame(30, b"q", src=listener.name.encode()))
        got = await ep.receive(5)
        await ep.rts(got, payload=b"a")
        reply, _ = await (await listener.accepted()).frame()
        # the arriving socket did not get the reply: the first frame on it is the answer to this probe
        await conn.send(build_frame(100, b""))
        first_on_arrival, _ = await conn.frame()
        nothing_on_arrival_socket = first_on_arrival.mtype == 101
        await ep.close()
        await listener.close()
        conn.close()
        return reply, nothing_on_arrival_socket
    reply, quiet = run(body())
    assert reply.payload == b"a" and quiet


def test_c15_rts_fallbacks_arriving_socket_then_srcip_then_noendpt(run):
    async def body():
        ep = await endpoint()
        dead = f"127.0.0.1:{free_port()}".encode()
        # 1) dead src -> the arriving socket
        conn = await raw_connect(ep.port)
        await conn.send(build_frame(31, b"q", src=dead))
        got = await ep.receive(5)
        await ep.rts(got, payload=b"via-socket")
        r1, _ = await conn.frame()
        # 2) dead src, arriving socket gone -> srcip
        listener = await RawListener().start()
        conn2 = await raw_connect(ep.port)
        await conn2.send(build_frame(31, b"q", src=b"127.0.0.1:1", srcip=listener.name.encode()))
        got2 = await ep.receive(5)
        conn2.close()
        await eventually(lambda: got2.via.closed, what="arriving socket closed")
        await ep.rts(got2, payload=b"via-srcip")
        r2, _ = await (await listener.accepted()).frame()
        # 3) all gone -> NOENDPT
        conn3 = await raw_connect(ep.port)
        await conn3.send(build_frame(31, b"q", src=dead, srcip=dead))
        got3 = await ep.receive(5)
        conn3.close()
        await eventually(lambda: got3.via.closed, what="arriving socket closed")
        with pytest.raises(RmrSendError) as err:
            await ep.rts(got3)
        await ep.close()
        await listener.close()
        conn.close()
        return r1, r2, err.value
    r1, r2, err = run(body())
    assert r1.payload == b"via-socket" and r2.payload == b"via-srcip"
    assert err.state == RmrState.NOENDPT


def test_c16_frames_on_a_dialled_socket_are_delivered(run):
    async def body():
        ep = await endpoint()
        listener = await RawListener().start()
        ep.load_route_table(f"newrt|start\nrte|40|{listener.name}\nnewrt|end\n")
        await ep.send(RmrMessage(40, b"out"))
        peer = await listener.accepted()
        await peer.frame()
        await peer.send(build_frame(41, b"back on the dialled socket", src=b"127.0.0.1:1"))
        m = await ep.receive(5)
        await ep.close()
        await listener.close()
        return m
    assert run(body()).payload == b"back on the dialled socket"


def test_c17_next_send_after_disconnect_redials(run):
    async def body():
        ep = await endpoint()
        listener = await RawListener().start()
        ep.load_route_table(f"newrt|start\nrte|40|{listener.name}\nnewrt|end\n")
        await ep.send(RmrMessage(40, b"1"))
        first = await listener.accepted(1)
        await first.frame()
        first.close()
        await eventually(lambda: not ep.connected(listener.name), what="disconnect noticed")
        await ep.send(RmrMessage(40, b"2"))
        m, _ = await (await listener.accepted(2)).frame()
        dials = ep.stats.dials
        await ep.close()
        await listener.close()
        return m, dials
    m, dials = run(body())
    assert m.payload == b"2" and dials == 2


def test_c18_src_and_srcip_name_our_listener(run):
    async def body():
        out = []
        for env, kw in [({"RMR_SRC_ID": "myxapp:9999"}, {}),
                        ({"RMR_SRC_ID": "myxapp", "RMR_SRC_NAMEONLY": "1"}, {}),
                        ({}, {"src_id": "10.9.8.7", "bind_if": "127.0.0.1"})]:
            ep = await RmrEndpoint.open(0, env=env, **kw)
            listener = await RawListener().start()
            ep.load_route_table(f"newrt|start\nrte|1|{listener.name}\nnewrt|end\n")
            await ep.send(RmrMessage(1))
            m, _ = await (await listener.accepted()).frame()
            out.append((ep.port, m.src, m.srcip))
            await ep.close()
            await listener.close()
        return out
    (p1, s1, i1), (p2, s2, i2), (p3, s3, i3) = run(body())
    assert s1 == f"myxapp:{p1}" and i1.endswith(f":{p1}") and i1 != s1
    assert s2 == f"myxapp:{p2}" and i2 == s2
    assert s3 == f"10.9.8.7:{p3}" and i3 == f"127.0.0.1:{p3}"


# -- Calls and health -------------------------------------------------------------------------------

def test_c19_incoming_call_delivered_and_reply_echoes_call_id(run):
    xid = os.urandom(32)

    async def body():
        ep = await endpoint()
        conn = await raw_connect(ep.port)
        await conn.send(build_frame(50, b"call me", flags=4, d1=b"\x05\xaa\xbb\xcc", xid=xid))
        got = await ep.receive(5)
        await ep.rts(got, mtype=51, payload=b"answer")
        reply, raw = await conn.frame()
        await ep.close()
        conn.close()
        return got, raw
    got, raw = run(body())
    assert got.call and got.call_id == 5
    assert raw[242:246] == bytes(4) and raw[330:334] == b"\x05\0\0\0" and raw[62:94] == xid


def test_c20_call_matches_call_id_and_xid(run):
    async def body():
        ep = await endpoint()
        listener = await RawListener().start()
        ep.load_route_table(f"newrt|start\nrte|60|{listener.name}\nnewrt|end\n")

        async def peer():
            conn = await listener.accepted()
            req, raw = await conn.frame()
            assert req.call and 2 <= req.call_id <= 255
            d1 = bytes([req.call_id, 0, 0, 0])
            wrong_xid = bytes(b ^ 0xFF for b in req.xaction)
            await conn.send(build_frame(61, b"wrong xid", xid=wrong_xid, d1=d1))
            await conn.send(build_frame(61, b"wrong id", xid=req.xaction, d1=bytes([1, 0, 0, 0])))
            await conn.send(build_frame(61, b"right", xid=req.xaction, d1=d1))
            return conn, req
        task = asyncio.ensure_future(peer())
        reply = await ep.call(RmrMessage(60, b"req"), timeout=5)
        conn, req = await task
        # a late reply (after the call is over) is dropped, not queued
        with pytest.raises(RmrSendError) as err:
            await ep.call(RmrMessage(60, b"req2"), timeout=0.05)
        req2, _ = await conn.frame()
        await conn.send(build_frame(61, b"late", xid=req2.xaction, d1=bytes([req2.call_id, 0, 0, 0])))
        await eventually(lambda: ep.stats.replies_dropped == 3, what="late reply dropped")
        pending = ep.pending()
        await ep.close()
        await listener.close()
        return reply, err.value, pending
    reply, err, pending = run(body())
    assert reply.payload == b"right" and err.state == RmrState.TIMEOUT and pending == 0


def test_c21_health_check_answered_by_rts(run):
    xid = b"probe-xid".ljust(32, b"\0")

    async def body():
        ep = await endpoint()
        conn = await raw_connect(ep.port)
        await conn.send(build_frame(100, b"", xid=xid, meid=b"gnb1", sub_id=3))
        reply, _ = await conn.frame()
        queued = ep.pending()
        await ep.close()
        conn.close()
        return reply, queued
    reply, queued = run(body())
    assert (reply.mtype, reply.payload, reply.xaction, reply.meid, reply.sub_id) == (101, b"OK\n", xid, "gnb1", 3)
    assert queued == 0  # the app never sees health checks


# -- Routing ----------------------------------------------------------------------------------------

async def _count_until_marker(ep: RmrEndpoint, marker_mtype: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    while True:
        m = await ep.receive(5)
        if m.mtype == marker_mtype:
            return counts
        counts[m.mtype] = counts.get(m.mtype, 0) + 1


@pytest.mark.parametrize("sep,expect", [(",", (2, 2)), (";", (4, 4))])
def test_c22_round_robin_vs_fan_out(run, sep, expect):
    async def body():
        s, a, b = await endpoint(), await endpoint(), await endpoint()
        s.load_route_table(f"newrt|start\nrte|70|{a.src}{sep}{b.src}\nrte|99|{a.src};{b.src}\nnewrt|end|2\n")
        for _ in range(4):
            await s.send(RmrMessage(70))
        await s.send(RmrMessage(99))  # per-connection order makes this a "no more coming" marker
        ca, cb = await _count_until_marker(a, 99), await _count_until_marker(b, 99)
        for ep in (s, a, b):
            await ep.close()
        return ca.get(70, 0), cb.get(70, 0)
    assert run(body()) == expect


def test_c23_meid_routing(run):
    async def body():
        s, a, b = await endpoint(), await endpoint(), await endpoint()
        s.load_route_table(f"newrt|start\nmse|80|-1|%meid\nrte|99|{b.src}\nnewrt|end|2\n"
                           f"meid_map|start\nmme_ar|{a.src}|other\nmme_ar|{b.src}|X Y\nmeid_map|end|2\n")
        for _ in range(4):
            await s.send(RmrMessage(80, meid="X"))
        errs = []
        for meid in ("unknown", ""):
            with pytest.raises(RmrSendError) as e:
                await s.send(RmrMessage(80, meid=meid))
            errs.append(e.value.state)
        await s.send(RmrMessage(99))
        cb = await _count_until_marker(b, 99)
        got_a = a.pending()
        for ep in (s, a, b):
            await ep.close()
        return cb, got_a, errs
    cb, got_a, errs = run(body())
    assert cb == {80: 4} and got_a == 0 and errs == [RmrState.NOENDPT, RmrState.NOENDPT]


def test_c24_sub_id_lookup_and_fallback(run):
    async def body():
        s, a, b = await endpoint(), await endpoint(), await endpoint()
        s.load_route_table(f"newrt|start\nrte|90|{a.src}\nmse|90|77|{b.src}\nmse|91|5|{b.src}\n"
                           f"rte|99|{a.src};{b.src}\nnewrt|end|4\n")
        await s.send(RmrMessage(90, sub_id=77))  # (77, 90) exists -> b
        await s.send(RmrMessage(90, sub_id=12))  # no (12, 90) -> (-1, 90) -> a
        await s.send(RmrMessage(90))              # -> a
        with pytest.raises(RmrSendError) as e1:
            await s.send(RmrMessage(91, sub_id=6))  # no (6, 91), no (-1, 91)
        with pytest.raises(RmrSendError) as e2:
            await s.send(RmrMessage(91))
        await s.send(RmrMessage(99))
        ca, cb = await _count_until_marker(a, 99), await _count_until_marker(b, 99)
        for ep in (s, a, b):
            await ep.close()
        return ca, cb, e1.value.state, e2.value.state
    ca, cb, s1, s2 = run(body())
    assert ca == {90: 2} and cb == {90: 1} and s1 == s2 == RmrState.NOENDPT


def test_c25_sender_filters_and_self_endpoints(run):
    async def body():
        s, a, b = await endpoint(), await endpoint(), await endpoint()
        table = (f"newrt|start\n"
                 f"rte|100,{s.src}|{a.src}\n"            # not used: 100 is the health check, see 101
                 f"rte|101,{s.src}|{a.src}\n"            # applies in s
                 f"rte|102,someone-else:4560|{a.src}\n"  # does not apply in s
                 f"rte|103|{s.src},{a.src}\n"            # s is dropped from its own group
                 f"rte|104|{s.src}\n"                    # only s: emptied -> NOENDPT
                 f"rte|99|{a.src}\nnewrt|end|6\n")
        s.load_route_table(table)
        await s.send(RmrMessage(101))
        with pytest.raises(RmrSendError) as e102:
            await s.send(RmrMessage(102))
        for _ in range(3):
            await s.send(RmrMessage(103))
        with pytest.raises(RmrSendError) as e104:
            await s.send(RmrMessage(104))
        await s.send(RmrMessage(99))
        ca = await _count_until_marker(a, 99)
        for ep in (s, a, b):
            await ep.close()
        return ca, e102.value.state, e104.value.state, s.stats.frames_in
    ca, s102, s104, self_frames = run(body())
    assert ca == {101: 1, 103: 3} and s102 == s104 == RmrState.NOENDPT and self_frames == 0


def test_c26_wrong_count_discards_and_keeps_previous(run):
    async def body():
        s, a, b = await endpoint(), await endpoint(), await endpoint()
        s.load_route_table(f"newrt|start|v1\nrte|110|{a.src}\nrte|99|{a.src};{b.src}\nnewrt|end|2\n")
        notes = s.load_route_table(f"newrt|start|v2\nrte|110|{b.src}\nnewrt|end|5\n")
        await s.send(RmrMessage(110))
        await s.send(RmrMessage(99))
        ca, cb = await _count_until_marker(a, 99), await _count_until_marker(b, 99)
        table_id = s.router.table.table_id
        for ep in (s, a, b):
            await ep.close()
        return ca, cb, notes, table_id
    ca, cb, notes, table_id = run(body())
    assert ca == {110: 1} and cb == {} and table_id == "v1" and any("count 5" in n for n in notes)


def test_c27_comments_crlf_blank_lines_and_half_read_tables(run, tmp_path):
    async def body():
        s, a, b = await endpoint(), await endpoint(), await endpoint()
        text = (f"# a comment line\r\n\r\n  newrt | start | t1   # trailing comment\r\n"
                f"rte|120|{a.src}#not-a-comment-here\r\n"   # '#' not after whitespace is data
                f"rte | 121 | {a.src} \r\n\n   \n"
                f"rte|99|{a.src};{b.src}\r\nnewrt|end|3\r\n")
        path = tmp_path / "rt"
        path.write_bytes(text.encode())
        s.route_file = str(path)
        assert s.check_route_file()
        # a half-written table (no end yet) never replaces the committed one
        path.write_text(f"newrt|start|t2\nrte|121|{b.src}\n")
        assert s.check_route_file()
        assert s.router.table.table_id == "t1"
        await s.send(RmrMessage(121))
        await s.send(RmrMessage(99))
        ca, cb = await _count_until_marker(a, 99), await _count_until_marker(b, 99)
        eps = s.router.table.lookup(120, -1).groups
        for ep in (s, a, b):
            await ep.close()
        return ca, cb, eps
    ca, cb, eps = run(body())
    assert ca == {121: 1} and cb == {}
    assert eps[0][0].endswith("#not-a-comment-here")
