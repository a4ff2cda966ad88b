"""Log lines a peer can trigger are rate-limited (issue 13, item 4): 10,000 stray RMR frames at a real
running xApp (unknown mtypes, KPM for unknown subscriptions from ever-new node names, junk control
replies, over real RMR framing on TCP from several connections) give a bounded number of log lines,
while every frame is still counted; the filter itself keeps per-template budgets and reports the count
it suppressed."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from xapp.app import XappApp
from xapp.config import XappConfig
from xapp.lograte import RateLimitFilter
from xapp.rmr import RmrEndpoint, RmrMessage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "xapp"))
from kpm_bytes import indication  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N = 10_000


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _record(name: str, msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def test_filter_budgets_per_template_and_reports_the_count():
    t = [0.0]
    f = RateLimitFilter(burst=10, interval_s=60.0, clock=lambda: t[0])
    passed = [r for i in range(1000) if f.filter(r := _record("weaver.xapp", "RMR mtype %d from %r ignored", i, "x"))]
    assert len(passed) == 11 and "suppressed for 60 s" in passed[-1].getMessage()
    assert f.suppressed_total == 989
    # another template, or the same one on another logger, has its own budget
    assert f.filter(_record("weaver.xapp", "control reply dropped (%d)", 1))
    assert f.filter(_record("weaver.xapp.broker", "RMR mtype %d from %r ignored", 1, "y"))
    t[0] = 61.0                                   # next window: the count comes with the first line
    r = _record("weaver.xapp", "RMR mtype %d from %r ignored", 7, "z")
    assert f.filter(r) and r.getMessage() == "RMR mtype 7 from 'z' ignored [989 similar lines suppressed before this one]"
    # self-formatted messages cannot grow the table without end
    g = RateLimitFilter(burst=1, interval_s=60.0, max_keys=100, clock=lambda: 0.0)
    lines = sum(g.filter(_record("weaver.xapp", f"line {i}")) for i in range(5000))
    assert len(g._windows) <= 101 and lines <= 100 + 2


def controls():
    c = json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"]
    c["submgr"].update(url=f"http://127.0.0.1:{_port()}/ric/v1", attempts=1, backoff_s=0.01)
    c["e2"].update(discovery="static", static_nodes=[{"meid": "gnb-a", "kpm_function_id": 2}])
    return c


@pytest.fixture()
def no_dbaas(monkeypatch):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    monkeypatch.delenv("DBAAS_CLUSTER_ADDR_LIST", raising=False)


def test_stray_rmr_flood_gives_bounded_log_lines(no_dbaas, caplog):
    caplog.set_level(logging.INFO)
    asyncio.run(_flood(caplog))


def _counted(x: XappApp) -> int:
    c = x.counters
    return c.rmr_other + c.control_replies_bad + sum(x.ingest.errors.values()) + sum(c.rmr_dropped.values())


async def _flood(caplog):
    x = XappApp(XappConfig.from_controls(controls()))
    await x.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
    senders = [await RmrEndpoint.open(0, src_id="127.0.0.1", env={}) for _ in range(4)]
    target = f"127.0.0.1:{x.rmr.port}"
    try:
        await asyncio.sleep(0.2)
        caplog.clear()
        before = _counted(x)
        kpm = indication({"RRU.PrbUsedDl": [1]})

        async def send(k: int, ep: RmrEndpoint):
            for i in range(k, N, len(senders)):
                kind = i % 3
                if kind == 0:       # an mtype nobody uses, from a node nobody knows
                    m = RmrMessage(mtype=4000 + i % 97, payload=b"?", meid=f"gnb-stray-{i}")
                elif kind == 1:     # KPM for a subscription that does not exist
                    m = RmrMessage(mtype=12050, payload=kpm, sub_id=5000 + i, meid=f"gnb-stray-{i}")
                else:               # a control reply that does not decode
                    m = RmrMessage(mtype=12041, payload=b"\x01\x02", meid=f"gnb-stray-{i}")
                await ep.wormhole_send(target, m)
        await asyncio.gather(*(send(k, ep) for k, ep in enumerate(senders)))
        deadline = asyncio.get_running_loop().time() + 20
        while _counted(x) - before < N and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert _counted(x) - before >= N, (_counted(x) - before, x.counters, x.ingest.errors)

        ours = [r for r in caplog.records if r.name.startswith(("weaver.xapp", "xapp."))]
        # a handful of templates, each at most burst + 1 lines a minute (xapp.lograte)
        assert len(ours) <= 60, (len(ours), [r.getMessage() for r in ours][:80])
        assert any("suppressed for" in r.getMessage() for r in ours), [r.getMessage() for r in ours]
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{x.rest_port}/metrics") as r:
                text = await r.text()
        total = next(float(ln.split()[-1]) for ln in text.splitlines()
                     if ln.startswith("weaver_log_lines_suppressed_total "))
        assert total > 0
        # the xApp is unharmed: it still answers
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{x.rest_port}/ric/v1/health/alive") as r:
                assert r.status == 200
    finally:
        for ep in senders:
            await ep.close()
        await x.stop()
