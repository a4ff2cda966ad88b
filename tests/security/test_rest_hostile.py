"""Hostile clients of the xApp's REST API (issue 13, item 4), against a real XappApp serving on a real
port: bodies too deep for the JSON parser, wrong types and non-finite numbers, missing and escaping
static paths, and connections that hold a slot without finishing a request (slowloris). Every error
is JSON with a 4xx, no traceback reaches the client, the slow connections are cut within the bound
and a normal request is answered meanwhile."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from xapp.app import XappApp
from xapp.config import XappConfig
from xapp.rest import HEAD_TIMEOUT_S
from xapp.restguard import nesting_exceeds, parse_json

ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def controls():
    c = json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"]
    c["submgr"].update(url=f"http://127.0.0.1:{_port()}/ric/v1", attempts=1, backoff_s=0.01)
    c["e2"].update(discovery="static", static_nodes=[{"meid": "gnb-a", "kpm_function_id": 2}])
    return c


@pytest.fixture()
def no_dbaas(monkeypatch):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    monkeypatch.delenv("DBAAS_CLUSTER_ADDR_LIST", raising=False)
    monkeypatch.setenv("WEAVER_CONFIG_TOKEN", "s3cret")


async def _xapp() -> XappApp:
    x = XappApp(XappConfig.from_controls(controls()))
    await x.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
    return x


def test_depth_scan_ignores_brackets_in_strings():
    assert nesting_exceeds('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', 32) is None
    assert nesting_exceeds('["\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]', 32) is None
    assert nesting_exceeds("[" * 33, 32) == 32
    assert parse_json(b'{"a": [[1, 2.5]]}') == {"a": [[1, 2.5]]}


def test_hostile_bodies_get_json_4xx(no_dbaas, caplog):
    asyncio.run(_bodies(caplog))


async def _bodies(caplog):
    x = await _xapp()
    base = f"http://127.0.0.1:{x.rest_port}"
    auth = {"Authorization": "Bearer s3cret"}
    cfg_before = x.cfg
    try:
        async with aiohttp.ClientSession() as s:
            async def call(method, path, **kw):
                async with s.request(method, base + path, allow_redirects=False, **kw) as r:
                    body = await r.read()
                    return r.status, r.content_type, body

            deep = [b"[" * 100_000, b'{"a":' * 50_000, b"[" * 200 + b"]" * 200, b'{"controls":' + b"[" * 5000]
            odd = [b"NaN", b'{"a": Infinity}', b'{"a": 1e999}', b"-Infinity", b"1" * 5000, b"\xff\xfe[",
                   b'"\\ud800"x', b"", b"[1,", b'{"SubscriptionId": "x", "SubscriptionInstances": 5}',
                   b'{"SubscriptionId": 1, "SubscriptionInstances": [{"E2EventInstanceId": "x"}]}',
                   b'{"SubscriptionId": "a", "SubscriptionInstances": [null, 7, "s", []]}',
                   b"[]", b"7", b"null", b'"text"', b'{"controls": 5}', b'{"controls": {"period_ms": "100"}}',
                   b'{"controls": {"sites": {"a": 1}}}', b'{"controls": []}', b'{"controls": null}']
            for body in deep + odd:
                for method, path, kw in (("POST", "/ric/v1/subscriptions/response", {}),
                                         ("PUT", "/api/v1/config", {"headers": auth})):
                    status, ctype, raw = await call(method, path, data=body, **kw)
                    assert 400 <= status < 500 and ctype == "application/json", (path, body[:60], status, raw[:200])
                    doc = json.loads(raw)
                    assert doc.get("error") and "Traceback" not in doc["error"], (path, body[:60], doc)
                    if body in deep:
                        assert status == 400 and "deeper than 32" in doc["error"], (path, body[:60], doc)
            # too large without a Content-Length (chunked), unknown path, wrong method: JSON too
            async def chunks():
                for _ in range(40):
                    yield b"[" * 10_000
            status, ctype, raw = await call("POST", "/ric/v1/subscriptions/response", data=chunks())
            assert status == 413 and ctype == "application/json", (status, raw[:200])
            for method, path, want in (("GET", "/nowhere", 404), ("DELETE", "/api/v1/config", 405),
                                       ("GET", "/api/v1/sites/%00", 404)):
                status, ctype, raw = await call(method, path)
                assert status == want and ctype == "application/json" and json.loads(raw)["error"], (path, raw)

            # static files: a missing one is a JSON 404; nothing outside xapp/static/ is served
            status, ctype, raw = await call("GET", "/static/no-such-file.js")
            assert status == 404 and ctype == "application/json" and json.loads(raw)["error"]
            for p in ("/static/../rest.py", "/static/%2e%2e/rest.py", "/static/..%2frest.py", "/static/%2e%2e%2frest.py",
                      "/static//etc/passwd", "/static/%2fetc%2fpasswd", "/static/", "/static/%00", "/static/.",
                      "/static/..%5crest.py"):
                status, ctype, raw = await call("GET", p)
                assert status in (403, 404) and ctype == "application/json" and b"import" not in raw, (p, status, raw)
            status, ctype, raw = await call("GET", "/static/index.html")
            assert status == 200 and ctype == "text/html"

            # the server is unharmed: it still answers, and nothing was applied
            status, _, raw = await call("GET", "/ric/v1/health/alive")
            assert status == 200 and json.loads(raw) == {"alive": True}
            assert x.cfg is cfg_before
            status, _, raw = await call("GET", "/metrics")
            assert 'weaver_rest_errors_total{status="400"}' in raw.decode()
        assert "RecursionError" not in caplog.text
    finally:
        await x.stop()


def test_slowloris_is_cut_and_others_are_served(no_dbaas):
    asyncio.run(_slowloris())


async def _slowloris():
    x = await _xapp()
    port = x.rest_port
    n = 50
    try:
        # 50 connections trickle a request head one byte a second; 10 more open and send nothing
        async def slow(stop: asyncio.Event, idle: bool):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            t0 = time.monotonic()
            head = b"GET /ric/v1/health/alive HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
            try:
                for i in range(len(head)):
                    if stop.is_set():
                        break
                    if not idle:
                        w.write(head[i:i + 1])
                        await w.drain()
                    try:
                        got = await asyncio.wait_for(r.read(4096), 1.0)
                    except TimeoutError:
                        continue
                    if got == b"" or got.startswith(b"HTTP/1.1 408"):
                        return time.monotonic() - t0
                return None
            except ConnectionError:
                return time.monotonic() - t0
            finally:
                w.close()

        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(slow(stop, idle=i >= n)) for i in range(n + 10)]
        await asyncio.sleep(1.5)
        # a normal client is served while they hang on
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            async with s.get(f"http://127.0.0.1:{port}/ric/v1/health/alive", timeout=aiohttp.ClientTimeout(5)) as r:
                assert r.status == 200 and (await r.json()) == {"alive": True}
            assert time.monotonic() - t0 < 2
        cut = await asyncio.wait_for(asyncio.gather(*tasks), HEAD_TIMEOUT_S + 10)
        stop.set()
        assert all(t is not None and t <= HEAD_TIMEOUT_S + 2.5 for t in cut), cut
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
        assert f'weaver_rest_connections_cut_total{{reason="head_timeout"}} {n + 10}' in text, text
    finally:
        await x.stop()


def test_connection_bound_evicts_the_slow_first(no_dbaas):
    asyncio.run(_bound())


async def _bound():
    from xapp.rest import start_rest
    runner, port = await start_rest(None, 0, host="127.0.0.1", max_connections=20)
    try:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        await asyncio.sleep(0.2)
        # past the bound a new client still gets in: the oldest silent connection makes room
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/ric/v1/health/alive") as r:
                assert r.status == 200
        first = await asyncio.wait_for(held[0][0].read(4096), 2)
        assert first.startswith(b"HTTP/1.1 503") and b"too many connections" in first, first
        for _, w in held:
            w.close()
    finally:
        await runner.cleanup()


def test_malformed_http_is_json_and_its_log_is_bounded(caplog):
    caplog.set_level("INFO")
    asyncio.run(_malformed(caplog))


async def _malformed(caplog):
    from xapp import lograte
    from xapp.rest import start_rest
    lograte.install()                   # as XappApp.start does
    runner, port = await start_rest(None, 0, host="127.0.0.1")
    try:
        bad = [b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
               b"GET / HTTP/1.1\r\nX: " + b"b" * 20_000 + b"\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
               b"GET / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"]
        for i in range(300):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(bad[i % len(bad)])
            got = await asyncio.wait_for(r.read(), 5)
            w.close()
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.split(b" ")[1].startswith(b"4") and b"application/json" in head, (i, got[:300])
            assert json.loads(body)["error"], got[:300]
        lines = [rec for rec in caplog.records if rec.name.startswith("aiohttp")]
        assert len(lines) <= 2 * 11, len(lines)     # two templates (debug-level ones are not captured)
    finally:
        await runner.cleanup()


def test_a_trickled_second_request_is_cut_at_the_keepalive_bound():
    asyncio.run(_second())


async def _second():
    from xapp.rest import start_rest
    keepalive = 3.0
    runner, port = await start_rest(None, 0, host="127.0.0.1", keepalive_s=keepalive)
    try:
        # a client that sends one good request, keeps the connection and then trickles the next head
        async def slow_second():
            r, w = await asyncio.open_connection("127.0.0.1", port)
            try:
                w.write(b"GET /ric/v1/health/alive HTTP/1.1\r\nHost: x\r\n\r\n")
                first = await asyncio.wait_for(r.read(4096), 5)
                assert first.startswith(b"HTTP/1.1 200"), first
                t0 = time.monotonic()
                for b in b"GET /ric/v1/health/alive HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
                    w.write(bytes([b]))
                    try:
                        if await asyncio.wait_for(r.read(4096), 1.0) == b"":
                            return time.monotonic() - t0
                    except TimeoutError:
                        pass
                    except ConnectionError:
                        return time.monotonic() - t0
                return None
            finally:
                w.close()
        late = await asyncio.wait_for(slow_second(), keepalive + 10)
        assert late is not None and late <= keepalive + 2.5, late
    finally:
        await runner.cleanup()
