"""Bad input at every boundary of a running xApp (in-process, against the testbed): garbage on the RMR
port, undecodable E2AP and E2SM, KPM from an unknown node or subscription, junk control replies,
malformed REST bodies, an invalid config file. Each gives a clear error (a log line, a counter, a 4xx)
and changes nothing else: the xApp stays ready, keeps its subscriptions and keeps serving the sites."""
from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from kpm_bytes import indication
from xapp_harness import SimBed, free_port, until, xapp_config

from xapp.app import XappApp
from xapp.config import load_config
from xapp.rmr import RmrEndpoint, RmrMessage

pytestmark = pytest.mark.slow


@pytest.fixture()
def redis_env(redis_env, monkeypatch):  # the shared fixture, plus a config token for PUT /api/v1/config
    monkeypatch.setenv("WEAVER_CONFIG_TOKEN", "tok")
    return redis_env


def test_bad_input_changes_nothing(tmp_path, redis_env, caplog):
    caplog.set_level("WARNING")
    asyncio.run(_bad(tmp_path, caplog))


async def _bad(tmp, caplog):
    rmr_port = free_port()
    tb = await SimBed.start(tmp, rmr_port)
    path = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0)
    x = XappApp(load_config(path), config_path=str(path))
    sender = None
    try:
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        await until(lambda: x.ready() and x.readiness()["subscriptions"], 20, "ready and subscribed")
        await until(lambda: all(rt.last_view and rt.last_view.fresh for rt in x.state.sites.values()), 10,
                    "fresh sites")
        subs = dict(x.subscriptions)
        errors_before = dict(x.ingest.errors)
        good_indications = x.counters.indications
        meid0 = tb.meids[0]
        sub0 = subs[meid0].e2_event_instance_id
        rest = f"http://127.0.0.1:{x.rest_port}"

        # 1. RMR: raw garbage on the socket (the framer drops that connection only)
        with socket.create_connection(("127.0.0.1", x.rmr.port)) as s:
            s.sendall(b"\x00\x00\x00\x10garbage-not-rmr" * 20)
        # 2. RMR frames with bad payloads
        sender = await RmrEndpoint.open(0, src_id="127.0.0.1", env={})
        target = f"127.0.0.1:{x.rmr.port}"
        bad = [
            RmrMessage(mtype=12050, payload=b"\xde\xad\xbe\xef", sub_id=sub0, meid=meid0),              # e2ap
            RmrMessage(mtype=12050, payload=indication({"RRU.PrbUsedDl": [1]})[:-3], sub_id=sub0, meid=meid0),
            RmrMessage(mtype=12050, payload=indication({"RRU.PrbUsedDl": [1]}), sub_id=999, meid=meid0),
            RmrMessage(mtype=12050, payload=indication({"RRU.PrbUsedDl": [1]}), sub_id=sub0, meid="gnb-intruder"),
            RmrMessage(mtype=12041, payload=b"\x01\x02", meid=meid0),                                  # junk ACK
            RmrMessage(mtype=4242, payload=b"?", meid=meid0),                                          # unknown
        ]
        for m in bad:
            await sender.wormhole_send(target, m)
        await until(lambda: sum(x.ingest.errors.values()) >= 4 and x.counters.control_replies_bad >= 1
                    and x.counters.rmr_other >= 1, 5, "the bad frames to be counted")
        assert {"e2ap", "unknown-subscription", "unknown-node"} <= set(x.ingest.errors)
        assert "e2ap" in x.ingest.errors or "e2sm" in x.ingest.errors
        assert "gnb-intruder" in caplog.text
        assert x.ingest.errors["unknown-subscription"] >= errors_before.get("unknown-subscription", 0) + 1

        # 3. REST: malformed bodies and requests get 4xx JSON errors
        async with aiohttp.ClientSession() as s:
            async def call(method, path, **kw):
                async with s.request(method, rest + path, **kw) as r:
                    return r.status, await r.json(content_type=None)
            cases = [
                (("POST", "/ric/v1/subscriptions/response"), {"data": b"{not json"}, 400),
                (("POST", "/ric/v1/subscriptions/response"), {"json": {"SubscriptionId": 5}}, 400),
                (("PUT", "/api/v1/config"), {"json": {"period_ms": 100}}, 401),
                (("PUT", "/api/v1/config"), {"data": b"\xff", "headers": {"Authorization": "Bearer tok"}}, 400),
                (("PUT", "/api/v1/config"), {"json": {"period_ms": 5}, "headers": {"Authorization": "Bearer tok"}}, 400),
                (("GET", "/api/v1/sites/nowhere"), {}, 404),
                (("GET", "/api/v1/sites/site-0/series?minutes=abc"), {}, 400),
                (("DELETE", "/api/v1/sites"), {}, 405),
                (("POST", "/ric/v1/subscriptions/response"), {"data": b"x" * (300 * 1024)}, 413),
            ]
            for (method, p), kw, want in cases:
                status, doc = await call(method, p, **kw)
                assert status == want and isinstance(doc, dict) and doc.get("error"), (method, p, status, doc)
            status, doc = await call("GET", "/api/v1/config")
            assert status == 200 and doc["controls"]["period_ms"] == 100
            status, spec = await call("GET", "/openapi.json")
            assert status == 200 and "/api/v1/sites/{site}/series" in spec["paths"]

        # 4. an invalid config file is refused, the running one kept
        before = x.cfg
        path.write_text(json.dumps({"controls": {"period_ms": 100, "policy": {"name": "bogus"}, "sites": []}}))
        await until(lambda: x.watcher.last_error, 5, "the config watcher to refuse the file")
        assert x.cfg is before and "policy.name" in x.watcher.last_error

        # nothing else changed: still ready, same subscriptions, KPM still flowing, sites fresh
        n = x.counters.indications
        await until(lambda: x.counters.indications > n + 2, 5, "indications to keep flowing")
        assert x.counters.indications > good_indications
        assert x.subscriptions == subs and x.ready() and x.readiness()["subscriptions"]
        assert all(rt.last_view.fresh for rt in x.state.sites.values())
    finally:
        if sender:
            await sender.close()
        await x.stop()
        await tb.close()
