"""The backend switch, and the (C) bullets of rmr-wire.md §15 against the reference library.

The same transport test runs on both backends; the native runs and the (C) interop checks need
`librmr_si.so` (ricxappframe loads it on import) and skip with the loader's reason where it is absent.
The Python side of every (C) bullet is in test_rmr_conformance.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rmr_helpers import RawListener, build_frame, raw_connect

from xapp.rmr import RmrEndpoint, RmrMessage
from xapp.rmr.backend import BACKENDS, NativeUnavailable, RmrBackend, native_status, open_backend

NATIVE, WHY = native_status()
needs_native = pytest.mark.skipif(not NATIVE, reason=f"(C) check needs librmr_si.so: {WHY}")
ROOT = Path(__file__).resolve().parents[2]


def test_python_backend_never_imports_the_native_binding():
    code = ("import sys, xapp.rmr, xapp.rmr.backend, xapp.rmr.endpoint; "
            "assert not any(m.startswith('ricxappframe.rmr') for m in sys.modules), sorted(sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_switch_rejects_unknown_and_explains_missing_native(run):
    async def body():
        with pytest.raises(ValueError, match="python, native"):
            await open_backend("zmq", 0)
        if not NATIVE:
            with pytest.raises(NativeUnavailable, match="librmr_si"):
                await open_backend("native", 0)
        ep = await open_backend("python", 0, src_id="127.0.0.1", env={})
        assert isinstance(ep, RmrEndpoint) and isinstance(ep, RmrBackend)
        await ep.close()
    run(body())


@pytest.mark.parametrize("kind", [pytest.param(k, marks=needs_native if k == "native" else ()) for k in BACKENDS])
def test_same_transport_test_on_each_backend(run, tmp_path, kind):
    """Send by route, receive, rts, wormhole, health check: identical expectations for both backends."""
    async def body():
        peer = await RmrEndpoint.open(0, src_id="127.0.0.1", env={})
        rt = tmp_path / "rt"
        rt.write_text(f"newrt|start\nrte|12050|{peer.src}\nnewrt|end|1\n")
        ep = await open_backend(kind, 0 if kind == "python" else 43871, str(rt), src_id="127.0.0.1")
        await ep.send(RmrMessage(12050, b"ind", sub_id=5, meid="gnb1", xaction=b"x1"))
        got = await peer.receive(10)
        await peer.rts(got, mtype=12051, payload=b"back")
        back = await ep.receive(10)
        await ep.wormhole_send(peer.src, RmrMessage(12052, b"wh"))
        wh = await peer.receive(10)
        await peer.wormhole_send(f"127.0.0.1:{ep.port}", RmrMessage(100, xaction=b"hc"))
        hc = await peer.receive(10)
        await ep.close()
        await peer.close()
        return got, back, wh, hc
    got, back, wh, hc = run(body(), timeout=60)
    assert (got.mtype, got.payload, got.sub_id, got.meid, got.xid) == (12050, b"ind", 5, "gnb1", b"x1")
    assert (back.mtype, back.payload, back.xid) == (12051, b"back", b"x1")
    assert wh.payload == b"wh"
    assert (hc.mtype, hc.payload, hc.xid) == (101, b"OK\n", b"hc")


async def _native(port: int, rt: Path | None = None):
    return await open_backend("native", port, str(rt) if rt else None, src_id="127.0.0.1")


@needs_native
def test_c06_300kb_python_c(run, tmp_path):
    payload = os.urandom(307_200)

    async def body():
        py = await RmrEndpoint.open(0, src_id="127.0.0.1", env={})
        rt = tmp_path / "rt"
        rt.write_text(f"newrt|start\nrte|9|{py.src}\nnewrt|end|1\n")
        c = await _native(43872, rt)
        py.load_route_table("newrt|start\nrte|9|127.0.0.1:43872\nnewrt|end|1\n")
        await py.send(RmrMessage(9, payload))
        at_c = await c.receive(10)
        await c.send(RmrMessage(9, payload[::-1]))
        at_py = await py.receive(10)
        await c.close()
        await py.close()
        return at_c, at_py
    at_c, at_py = run(body(), timeout=60)
    assert at_c.payload == payload and at_py.payload == payload[::-1]


@needs_native
def test_c13_ricxappframe_receives_our_fields_intact(run):
    async def body():
        c = await _native(43873)
        py = await RmrEndpoint.open(0, src_id="127.0.0.1", env={})
        xid = b"tx-13".ljust(32, b"\0")
        await py.wormhole_send("127.0.0.1:43873", RmrMessage(12040, b"ctl", sub_id=42, meid="gnb_1", xaction=xid))
        m = await c.receive(10)
        await c.close()
        await py.close()
        return m, xid
    m, xid = run(body(), timeout=60)
    assert (m.mtype, m.payload, m.sub_id, m.meid, m.xaction) == (12040, b"ctl", 42, "gnb_1", xid)


@needs_native
def test_c14_c_rts_dials_src_on_a_new_connection(run):
    async def body():
        c = await _native(43874)
        listener = await RawListener().start()
        conn = await raw_connect(43874)
        await conn.send(build_frame(30, b"q", src=listener.name.encode()))
        got = await c.receive(10)
        await c.rts(got, payload=b"a")
        reply, _ = await (await listener.accepted()).frame()
        await c.close()
        await listener.close()
        return reply
    assert run(body(), timeout=60).payload == b"a"


@needs_native
def test_c19_c_reply_to_our_call_frame(run):
    async def body():
        c = await _native(43875)
        conn = await raw_connect(43875)
        xid = os.urandom(32)
        await conn.send(build_frame(50, b"call", flags=4, d1=b"\x05\0\0\0", xid=xid, src=b"127.0.0.1:1"))
        got = await c.receive(10)
        await c.rts(got, mtype=51)
        _, raw = await conn.frame()
        await c.close()
        return raw, xid
    raw, xid = run(body(), timeout=60)
    assert raw[242:246] == bytes(4) and raw[330] == 5 and raw[62:94] == xid


@needs_native
def test_c21_our_health_check_answer_satisfies_c(run):
    async def body():
        py = await RmrEndpoint.open(0, src_id="127.0.0.1", env={})
        c = await _native(43876)
        await c.wormhole_send(f"127.0.0.1:{py.port}", RmrMessage(100, xaction=b"probe"))
        m = await c.receive(10)
        await c.close()
        await py.close()
        return m
    m = run(body(), timeout=60)
    assert (m.mtype, m.payload) == (101, b"OK\n")


def test_native_skip_reason_is_reported():
    if NATIVE:
        pytest.skip("native library present: the (C) tests above ran")
    assert "librmr_si" in WHY or "ricxappframe" in WHY
