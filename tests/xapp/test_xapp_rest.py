"""REST API adapters on a real XappApp with no platform around it (embedded SDL, SubMgr unreachable):
health/readiness, OpenAPI, config GET/PUT (token, live apply, 409 for restart-only changes), sites,
series, agents, transfers, metrics, static files; plus appmgr registration's environment rules."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from xapp_harness import free_port

from xapp.app import XappApp
from xapp.appmgr import registration
from xapp.config import XappConfig

ROOT = Path(__file__).resolve().parents[2]


def controls(**over):
    c = json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"]
    c["submgr"].update(url=f"http://127.0.0.1:{free_port()}/ric/v1", attempts=1, backoff_s=0.01)
    c["e2"].update(discovery="static", static_nodes=[{"meid": "gnb-a", "kpm_function_id": 2}])
    c.update(over)
    return c


@pytest.fixture()
def no_dbaas(monkeypatch):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    monkeypatch.delenv("DBAAS_CLUSTER_ADDR_LIST", raising=False)
    monkeypatch.setenv("WEAVER_CONFIG_TOKEN", "s3cret")


def test_rest_api(no_dbaas):
    asyncio.run(_rest())


async def _rest():
    x = XappApp(XappConfig.from_controls(controls()))
    await x.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
    base = f"http://127.0.0.1:{x.rest_port}"
    auth = {"Authorization": "Bearer s3cret"}
    try:
        async with aiohttp.ClientSession() as s:
            async def req(method, path, **kw):
                async with s.request(method, base + path, allow_redirects=False, **kw) as r:
                    ctype = r.headers.get("Content-Type", "")
                    return r.status, (await r.json() if "json" in ctype else await r.text()), r.headers

            assert (await req("GET", "/ric/v1/health/alive"))[0] == 200
            status, doc, _ = await req("GET", "/ric/v1/health/ready")
            # SubMgr unreachable: ready all the same (RMR and SDL gate), the subscription reported as not up
            assert status == 200 and doc["ready"] is True and doc["subscriptions"] is False and doc["rmr"] is True
            status, spec, _ = await req("GET", "/openapi.json")
            assert status == 200 and spec["openapi"].startswith("3.") and "/metrics" in spec["paths"]
            status, doc, _ = await req("GET", "/api/v1/config")
            assert doc["controls"]["policy"]["name"] == "weaver"

            new = controls()
            new["policy"]["name"] = "reactive"
            status, doc, _ = await req("PUT", "/api/v1/config", json={"controls": new}, headers=auth)
            assert status == 200 and x.cfg.policy.name == "reactive"
            assert x.state.sites["site-a"].policy.name == "reactive"
            moved = controls(period_ms=200)
            status, doc, _ = await req("PUT", "/api/v1/config", json=moved, headers=auth)
            assert status == 409 and "restart" in doc["error"] and x.cfg.period_ms == 100

            status, doc, _ = await req("GET", "/api/v1/sites")
            site = doc["sites"][0]
            assert site["site_id"] == "site-a" and site["grant_sms"] == 0 and site["fresh"] is False
            pts = (await req("GET", "/api/v1/sites/site-a/series?minutes=1"))[1]["points"]
            assert all(p["fresh"] is False and p["grant_sms"] == 0 for p in pts)   # no KPM yet: no grants
            # what each period's grant rests on: static discovery, no node controlled yet -> a forecast
            assert all(p["basis"] == "forecast" and p["slack_sms"] >= 0 for p in pts)   # may be none yet
            assert site["safety"]["basis"] == "forecast" and site["safety"]["leased_sms_held"] == 0
            assert (await req("GET", "/api/v1/agents"))[1] == {"agents": [], "epoch": x.epoch}
            assert (await req("GET", "/api/v1/transfers"))[1] == {"transfers": []}
            assert (await req("GET", "/api/v1/controls"))[1] == {"controls": []}
            status, text, _ = await req("GET", "/metrics")
            assert status == 200 and "weaver_indications_total 0" in text and 'weaver_site_grant_sms{site="site-a"} 0' in text
            assert 'weaver_site_grant_basis{basis="forecast",site="site-a"} 1' in text, text
            # the RMR health check (mtype 100) answers 101 "OK" (rmr-wire.md §10), or ERR when SDL is down
            from xapp.rmr import Mtype, RmrEndpoint, RmrMessage
            ep = await RmrEndpoint.open(0, src_id="127.0.0.1", env={})
            try:
                await ep.wormhole_send(f"127.0.0.1:{x.rmr.port}", RmrMessage(Mtype.HEALTH_CHECK_REQ, xaction=b"h" * 32))
                reply = await ep.receive(5)
                assert reply.mtype == Mtype.HEALTH_CHECK_RESP and reply.payload.startswith(b"OK")
                x.store.healthy = lambda: False
                await ep.wormhole_send(f"127.0.0.1:{x.rmr.port}", RmrMessage(Mtype.HEALTH_CHECK_REQ, xaction=b"i" * 32))
                reply = await ep.receive(5)
                assert reply.payload.startswith(b"ERR") and b"SDL" in reply.payload
                del x.store.healthy
            finally:
                await ep.close()
            status, _, headers = await req("GET", "/")
            assert status == 302 and headers["Location"] == "/static/index.html"
            if (ROOT / "xapp" / "static" / "index.html").exists():
                assert (await req("GET", "/static/index.html"))[0] == 200
    finally:
        await x.stop()


def test_appmgr_registration_needs_the_platform(tmp_path):
    cfg = tmp_path / "config-file.json"
    cfg.write_text(json.dumps({"name": "weaver", "version": "0.1.0"}))
    assert "not on an OSC platform" in registration({})
    env = {"CONFIG_FILE": str(cfg), "HOSTNAME": "weaver-7f9", "APP_NAMESPACE": "ricxapp"}
    assert "SERVICE_RICXAPP_WEAVER_7F9_HTTP_PORT" in registration(env)
    env |= {"SERVICE_RICXAPP_WEAVER_7F9_HTTP_PORT": "tcp://10.0.0.5:8080",
            "SERVICE_RICXAPP_WEAVER_7F9_RMR_PORT": "tcp://10.0.0.5:4560"}
    url, body = registration(env)
    assert url == "http://service-ricplt-appmgr-http.ricplt:8080/ric/v1/register"
    assert body["appName"] == "weaver-7f9" and body["appInstanceName"] == "weaver" and body["appVersion"] == "0.1.0"
    assert body["httpEndpoint"] == "10.0.0.5:8080" and body["rmrEndpoint"] == "10.0.0.5:4560"
    assert json.loads(body["config"])["name"] == "weaver"


def test_kpm_request_follows_the_nodes_ran_function_description():
    from e2sm.kpm import (
        KpmRanFunctionDescription,
        KpmReportStyle,
        KpmVersion,
        ReportableMeas,
        encode_ran_function_description,
    )
    from xapp.app import kpm_measurements, supported_measurements

    cfg = XappConfig.from_controls(controls())
    desc = KpmRanFunctionDescription(report_styles=(KpmReportStyle(1, "E2 Node Measurement", 1, tuple(
        ReportableMeas(n) for n in ("RRU.PrbUsedDl", "RRU.PrbAvailDl", "DRB.UEThpDl"))),))
    supported = supported_measurements(encode_ran_function_description(desc, KpmVersion.V3_00), KpmVersion.V3_00)
    assert supported == {"RRU.PrbUsedDl", "RRU.PrbAvailDl", "DRB.UEThpDl"}
    names = [(m.name, m.labels[0].snssai) for m in kpm_measurements(cfg, "site-a", supported)]
    assert [n for n, _ in names] == ["RRU.PrbUsedDl", "RRU.PrbAvailDl", "DRB.UEThpDl", "RRU.PrbUsedDl", "RRU.PrbUsedDl"]
    assert len(kpm_measurements(cfg, "site-a", None)) == 7          # unknown: ask for everything configured
    assert supported_measurements(b"\xff\x00", KpmVersion.V3_00) is None
