"""`/api/v1/transfers/aggregates` on the xApp's REST app over real HTTP: an announcement is stored and
listed, a re-announcement replaces it, and hostile bodies get a 400 that names the field (or a 413)."""
from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from xapp.rest import build_app, openapi_spec

GOOD = {"site_id": "site-0", "round": 3, "bytes": 35896, "earliest_start_unix_ms": 1.7e12,
        "deadline_unix_ms": 1.7e12 + 200.0}


def test_announcements_round_trip_and_hostile_bodies_are_refused():
    asyncio.run(_run())


async def _run():
    runner = web.AppRunner(build_app(None))   # these routes need no xApp behind them
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/api/v1/transfers/aggregates"
    try:
        async with aiohttp.ClientSession() as s:
            async def post(body, raw=None):
                async with s.post(url, data=raw if raw is not None else json.dumps(body),
                                  headers={"Content-Type": "application/json"}) as r:
                    return r.status, await r.json()

            assert (await post(GOOD))[0] == 201
            assert await post(dict(GOOD, bytes=40000)) == (200, {"accepted": True, "replaced": True})
            assert (await post(dict(GOOD, site_id="site-1", destination="dc-east")))[0] == 201
            async with s.get(url) as r:
                listed = (await r.json())["aggregates"]
            assert [(a["site_id"], a["bytes"], a["destination"]) for a in listed] == \
                [("site-0", 40000, "cloud"), ("site-1", 35896, "dc-east")]
            bad = {"round": dict(GOOD, round=-1), "bytes": dict(GOOD, bytes=0),
                   "bytes ": dict(GOOD, bytes=2 ** 41), "bytes  ": dict(GOOD, bytes=True),
                   "bytes   ": dict(GOOD, bytes="35896"), "site_id": dict(GOOD, site_id="x" * 65),
                   "site_id ": dict(GOOD, site_id="a/b"), "deadline_unix_ms": dict(GOOD, deadline_unix_ms=1.7e12),
                   "earliest_start_unix_ms": dict(GOOD, earliest_start_unix_ms=-5),
                   "unknown field": dict(GOOD, extra=1), "body": [GOOD]}
            missing = dict(GOOD)
            del missing["bytes"]
            bad["bytes    "] = missing
            for field, body in bad.items():
                status, doc = await post(body)
                assert status == 400 and field.strip() in doc["error"], (field, status, doc)
            for raw in (b"{", b'{"bytes": NaN}', b"\xff\xfe", b"[" * 100 + b"]" * 100):
                assert (await post(None, raw=raw))[0] == 400
            assert (await post(None, raw=b" " * (300 * 1024)))[0] == 413
            async with s.get(url) as r:
                assert len((await r.json())["aggregates"]) == 2   # refused requests changed nothing
    finally:
        await runner.cleanup()
    ops = openapi_spec()["paths"]["/api/v1/transfers/aggregates"]
    assert {"get", "post"} <= set(ops) and "400" in ops["post"]["responses"]
