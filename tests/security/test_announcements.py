"""Issue 26 item 6: federated aggregate announcements are authenticated per site, and a flood evicts nothing.

Before: `POST /api/v1/transfers/aggregates` took any body: a forged re-announcement replaced site-0's round,
`site-99` was accepted, and 4,200 posts in 8.6 s evicted every real entry. Now, on an xApp with a broker
secret, a POST carries the announcing site's own credential (HMAC-SHA256(secret, site_id), as on the lease
stream) and names one of the xApp's sites; the book keeps at most 64 entries a site (a site's flood drops only
its own oldest) and refuses a new key when full rather than evicting another site's. Real XappApp, real HTTP."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from xapp.agents import site_credential
from xapp.app import XappApp
from xapp.config import XappConfig

ROOT = Path(__file__).resolve().parents[2]
SECRET = "announce-secret-0123456789abcdef"


def controls() -> dict:
    c = json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"]
    c["submgr"].update(url="http://127.0.0.1:9/ric/v1", attempts=1, backoff_s=0.01)
    c["e2"].update(discovery="static", static_nodes=[{"meid": "gnb-a", "kpm_function_id": 2},
                                                     {"meid": "gnb-b", "kpm_function_id": 2}])
    c["sites"] = [{"site_id": "site-0", "nodes": ["gnb-a"]}, {"site_id": "site-1", "nodes": ["gnb-b"]}]
    c["broker"]["token_env"] = "TEST_ANNOUNCE_SECRET"
    return c


def body(site, rnd, nbytes=1000):
    return {"site_id": site, "round": rnd, "bytes": nbytes, "earliest_start_unix_ms": 1.7e12 + rnd * 1000,
            "deadline_unix_ms": 1.7e12 + rnd * 1000 + 200}


def test_a_site_announces_only_its_own_aggregates_and_a_flood_evicts_no_one_else(monkeypatch):
    monkeypatch.setenv("TEST_ANNOUNCE_SECRET", SECRET)
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)

    async def main():
        x = XappApp(XappConfig.from_controls(controls()))
        await x.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
        url = f"http://127.0.0.1:{x.rest_port}/api/v1/transfers/aggregates"
        auth = {s: {"Authorization": f"Bearer {site_credential(SECRET, s)}"} for s in ("site-0", "site-1")}
        out = {}
        try:
            async with aiohttp.ClientSession() as s:
                async def post(b, headers=None):
                    async with s.post(url, json=b, headers=headers or {}) as r:
                        return r.status, await r.json()
                out["real"] = await post(body("site-0", 3, 35896), auth["site-0"])
                out["no credential"] = await post(body("site-0", 3, 1), None)
                out["another site's credential"] = await post(body("site-0", 3, 1), auth["site-1"])
                out["unknown site"] = await post(body("site-99", 3), auth["site-1"])
                for i in range(300):                          # site-1 floods with its own, valid credential
                    await post(body("site-1", 1000 + i), auth["site-1"])
                async with s.get(url) as r:
                    out["listed"] = (await r.json())["aggregates"]
        finally:
            await x.stop()
        return out

    out = asyncio.run(main())
    assert out["real"][0] == 201
    assert out["no credential"][0] == 401 and out["another site's credential"][0] == 401
    assert out["unknown site"][0] == 403
    mine = [a for a in out["listed"] if a["site_id"] == "site-0"]
    assert [(a["round"], a["bytes"]) for a in mine] == [(3, 35896)]         # neither replaced nor evicted
    theirs = [a for a in out["listed"] if a["site_id"] == "site-1"]
    assert len(theirs) == 64 and min(a["round"] for a in theirs) == 1000 + 300 - 64


def test_the_book_refuses_a_new_key_when_full_of_other_sites():
    import pytest

    from xapp.aggregates import AnnouncementBook, AnnouncementError, parse_announcement
    book = AnnouncementBook(capacity=4, per_site=2)
    for site, rnd in (("a", 1), ("a", 2), ("b", 1), ("b", 2)):
        book.add(parse_announcement(body(site, rnd)))
    with pytest.raises(AnnouncementError, match="other sites"):
        book.add(parse_announcement(body("c", 1)))
    book.add(parse_announcement(body("a", 3)))                # a's own oldest goes
    assert sorted((v["site_id"], v["round"]) for v in book.view()) == [("a", 2), ("a", 3), ("b", 1), ("b", 2)]
