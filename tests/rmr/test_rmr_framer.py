"""Framer edge cases and fuzzing. Invariant of the fuzz tests (h11's afl-server style): whatever bytes come
in, in whatever chunks, `next_frame` returns a message or NEED_DATA or raises `RmrFrameError`, nothing else;
after an error the framer stays broken; a valid frame always round-trips."""
from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xapp.rmr import (
    NEED_DATA,
    RmrEncodeError,
    RmrFrameError,
    RmrFramer,
    RmrMessage,
    decode_frame,
    encode_frame,
)
from xapp.rmr.framer import MIN_FRAME

SRC = b"sender:4560"
SRCIP = b"10.1.2.3:4560"

messages = st.builds(
    RmrMessage,
    mtype=st.integers(-(1 << 31), (1 << 31) - 1),
    payload=st.binary(max_size=2000),
    sub_id=st.integers(-(1 << 31), (1 << 31) - 1),
    meid=st.text(st.characters(min_codepoint=1, max_codepoint=127), max_size=31),
    xaction=st.binary(min_size=32, max_size=32),
    trace=st.binary(max_size=40),
    call_id=st.integers(0, 255),
    call=st.booleans(),
)


def drain(framer: RmrFramer) -> list[RmrMessage]:
    out = []
    while (m := framer.next_frame()) is not NEED_DATA:
        out.append(m)
    return out


@given(messages)
def test_roundtrip(msg):
    m = decode_frame(encode_frame(msg, SRC, SRCIP))
    assert m == msg.replace(src=SRC.decode(), srcip=SRCIP.decode())


@given(st.lists(messages, min_size=1, max_size=6), st.lists(st.integers(1, 3000), max_size=20))
def test_any_chunking_gives_the_same_messages(msgs, cuts):
    stream = b"".join(encode_frame(m, SRC, SRCIP) for m in msgs)
    f = RmrFramer()
    out = []
    pos = 0
    for c in cuts + [len(stream)]:
        f.receive_data(stream[pos:pos + c])
        pos += c
        out += drain(f)
    f.receive_data(stream[pos:])
    out += drain(f)
    assert [m.payload for m in out] == [m.payload for m in msgs]
    assert f.buffered == 0


def test_large_payload_in_8k_reads():
    payload = os.urandom(300 * 1024 + 7)
    frame = encode_frame(RmrMessage(1, payload), SRC, SRCIP)
    f = RmrFramer()
    got = []
    for i in range(0, len(frame), 8192):  # C's SI95 reads at most 8 KB at a time
        f.receive_data(frame[i:i + 8192])
        got += drain(f)
    assert len(got) == 1 and got[0].payload == payload


def test_max_frame_is_configurable():
    frame = encode_frame(RmrMessage(1, bytes(5000)), SRC, SRCIP)
    f = RmrFramer(max_frame=4096)
    f.receive_data(frame[:9])  # refused as soon as the length is known, before buffering the rest
    with pytest.raises(RmrFrameError, match="max_frame"):
        f.next_frame()
    with pytest.raises(RmrFrameError):
        f.receive_data(b"more")


@pytest.mark.parametrize("field,offset,value", [
    ("len0 < 280", 246, struct.pack(">i", 279)),
    ("negative len1", 250, struct.pack(">i", -1)),
    ("negative len2", 254, struct.pack(">i", -4)),
    ("lengths past L", 258, struct.pack(">i", 10_000)),
    ("negative plen", 54, struct.pack(">i", -5)),
])
def test_bad_header_lengths_are_frame_errors(field, offset, value):
    frame = bytearray(encode_frame(RmrMessage(1, b"abc"), SRC, SRCIP))
    frame[offset:offset + 4] = value
    f = RmrFramer()
    f.receive_data(bytes(frame))
    with pytest.raises(RmrFrameError):
        f.next_frame()


def test_len0_above_280_is_honoured():
    base = encode_frame(RmrMessage(3, b"payload", trace=b"TT"), SRC, SRCIP)
    # grow the header to 300 bytes: 20 extra header bytes before the trace
    frame = bytearray(base[:330] + bytes(20) + base[330:])
    frame[246:250] = struct.pack(">i", 300)
    n = len(frame)
    frame[0:4] = struct.pack("<I", n)
    m = decode_frame(bytes(frame))
    assert m.trace == b"TT" and m.payload == b"payload"


def test_no_d1_at_all():
    frame = bytearray(encode_frame(RmrMessage(3, b"pp"), SRC, SRCIP))
    del frame[330:334]
    frame[254:258] = struct.pack(">i", 0)
    frame[0:4] = struct.pack("<I", len(frame))
    m = decode_frame(bytes(frame))
    assert m.payload == b"pp" and m.call_id == 0 and len(frame) == MIN_FRAME + 2


def test_non_ascii_and_unterminated_addresses_never_raise():
    frame = bytearray(encode_frame(RmrMessage(3, b"pp"), SRC, SRCIP))
    frame[126:190] = b"\xff" * 64   # src with no NUL, not ASCII
    frame[190:222] = b"\x80" * 32   # meid with no NUL, not ASCII
    m = decode_frame(bytes(frame))
    assert len(m.meid) == 31 and m.meid.isascii()
    m.replace(mtype=4)  # still a valid message (an rts of it would not fail on the meid)


def test_message_validation():
    with pytest.raises(RmrEncodeError):
        RmrMessage(1, meid="x" * 32)  # P9
    with pytest.raises(RmrEncodeError):
        RmrMessage(1, xaction=bytes(33))
    with pytest.raises(RmrEncodeError):
        RmrMessage(1 << 31)
    with pytest.raises(RmrEncodeError):
        RmrMessage(1, call_id=256)
    assert RmrMessage(1, xaction=b"abc").xaction == b"abc".ljust(32, b"\0")
    f = RmrFramer()
    with pytest.raises(RmrEncodeError):
        f.encode(RmrMessage(1), "s" * 64, "ip:1")


def test_decode_frame_rejects_partial_and_trailing():
    frame = encode_frame(RmrMessage(3, b"pp"), SRC, SRCIP)
    with pytest.raises(RmrFrameError):
        decode_frame(frame[:-1])
    with pytest.raises(RmrFrameError):
        decode_frame(frame + b"x")


def test_buffer_is_compacted():
    f = RmrFramer()
    frame = encode_frame(RmrMessage(3, bytes(1000)), SRC, SRCIP)
    for _ in range(500):
        f.receive_data(frame + frame[:100])
        drain(f)
        f.receive_data(frame[100:])
        drain(f)
    assert len(f._buf) < 4 * len(frame)


# -- fuzz -------------------------------------------------------------------------------------------

def feed_all(data: bytes, chunk: int) -> list[RmrMessage]:
    """Feed in chunks; return the messages; stop at the first RmrFrameError (any other exception fails)."""
    f = RmrFramer(max_frame=1 << 20)
    out = []
    try:
        for i in range(0, len(data), chunk):
            f.receive_data(data[i:i + chunk])
            out += drain(f)
    except RmrFrameError:
        with pytest.raises(RmrFrameError):
            f.next_frame()
    return out


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=3000), st.integers(1, 512))
def test_fuzz_random_bytes(data, chunk):
    for m in feed_all(data, chunk):
        assert isinstance(m, RmrMessage)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(messages, st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(1, 700), st.sampled_from(["flip", "truncate", "insert", "duplicate"]))
def test_fuzz_mutated_frames(msg, edits, chunk, how):
    frame = bytearray(encode_frame(msg, SRC, SRCIP))
    if how == "flip":
        for pos, val in edits:
            frame[pos % len(frame)] = val
    elif how == "truncate":
        frame = frame[: edits[0][0] % len(frame)]
    elif how == "insert":
        pos, val = edits[0]
        frame[pos % len(frame):pos % len(frame)] = bytes([val]) * (1 + len(edits))
    else:
        frame = frame + frame
    for m in feed_all(bytes(frame), chunk):
        assert len(m.xaction) == 32 and len(m.meid) <= 31
        m.replace(payload=b"reply")  # every delivered message can be answered


def test_multi_megabyte_frame_in_small_reads():
    payload = os.urandom(6 << 20)
    frame = encode_frame(RmrMessage(2, payload), SRC, SRCIP) + encode_frame(RmrMessage(3, b"next"), SRC, SRCIP)
    f = RmrFramer()
    got = []
    for i in range(0, len(frame), 65536):
        f.receive_data(frame[i:i + 65536])
        got += drain(f)
    assert [m.mtype for m in got] == [2, 3] and got[0].payload == payload and f.buffered == 0


def test_rmr_get_consts_json_matches_c():
    """§12: same keys, values and order as C's rmr_get_consts(); NOTSUPP is not in it."""
    import json

    from xapp.rmr.message import rmr_consts_json
    text = rmr_consts_json()
    assert text.startswith("{ ") and text.endswith(" }") and ", " not in text
    left = [("RMR_MAX_XID", 32), ("RMR_MAX_SID", 32), ("RMR_MAX_MEID", 32), ("RMR_MAX_SRC", 64),
            ("RMR_MAX_RCV_BYTES", 2048), ("RMRFL_NONE", 0), ("RMRFL_AUTO_ALLOC", 3), ("RMRFL_MTCALL", 2),
            ("RMR_DEF_SIZE", 0), ("RMR_VOID_MSGTYPE", -1), ("RMR_VOID_SUBID", -1), ("RMR_OK", 0)]
    right = [(f"RMR_ERR_{n}", i) for i, n in enumerate(
        "BADARG NOENDPT EMPTY NOHDR SENDFAILED CALLFAILED NOWHOPEN WHID OVERFLOW RETRY RCVFAILED TIMEOUT UNSET "
        "TRUNC INITFAILED".split(), start=1)]
    assert list(json.loads(text).items()) == left + right
