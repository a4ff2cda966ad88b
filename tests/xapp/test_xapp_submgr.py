"""SubMgr REST client against a fake SubMgr that really behaves: it validates the CamelCase body,
answers 503 while the node is 'disconnected', notifies before or after the 201, and deletes by id."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from xapp.config import SubmgrConfig
from xapp.submgr import (
    ActionSpec,
    SubmgrClient,
    SubmgrError,
    SubscriptionSpec,
    parse_subscription_response,
    subscription_body,
)

SPEC = SubscriptionSpec(meid="gnb-a", ran_function_id=2, xapp_event_instance_id=7, event_trigger=bytes([0, 99]),
                        actions=(ActionSpec(action_id=1, definition=bytes([0, 1, 255])),))


def test_body_is_camelcase_with_int_arrays():
    cfg = SubmgrConfig(client_host="xapp", http_port=8081, rmr_port=4560)
    b = subscription_body(SPEC, cfg)
    assert b["ClientEndpoint"] == {"Host": "xapp", "HTTPPort": 8081, "RMRPort": 4560}
    assert b["Meid"] == "gnb-a" and b["RANFunctionID"] == 2 and b["SubscriptionId"] == ""
    d = b["SubscriptionDetails"][0]
    assert d["XappEventInstanceId"] == 7 and d["EventTriggers"] == [0, 99]
    assert d["ActionToBeSetupList"][0] == {"ActionID": 1, "ActionType": "report", "ActionDefinition": [0, 1, 255],
                                           "SubsequentAction": {"SubsequentActionType": "continue", "TimeToWait": "zero"}}
    assert b["E2SubscriptionDirectives"]["E2TimeoutTimerValue"] == 2


@pytest.mark.parametrize("kw", [dict(ran_function_id=4096), dict(xapp_event_instance_id=-1), dict(actions=())])
def test_spec_refuses_out_of_range(kw):
    with pytest.raises(ValueError):
        SubscriptionSpec(**{**SPEC.__dict__, **kw})


@pytest.mark.parametrize("doc", [None, [], "x", {}, {"SubscriptionId": 5}, {"SubscriptionId": ""},
                                 {"SubscriptionId": "a", "SubscriptionInstances": {}},
                                 {"SubscriptionId": "a", "SubscriptionInstances": [{"XappEventInstanceId": "1"}]},
                                 {"SubscriptionId": "a", "SubscriptionInstances": [
                                     {"XappEventInstanceId": 1, "E2EventInstanceId": 70000}]},
                                 {"SubscriptionId": "a", "SubscriptionInstances": [
                                     {"XappEventInstanceId": 1, "E2EventInstanceId": 3, "ErrorCause": 5}]}])
def test_malformed_responses_are_refused(doc):
    with pytest.raises(SubmgrError):
        parse_subscription_response(doc)


class FakeSubmgr:
    def __init__(self, unavailable: int = 0, notify_first: bool = False, fail_e2: bool = False):
        self.unavailable = unavailable
        self.notify_first = notify_first
        self.fail_e2 = fail_e2
        self.subs: dict[str, dict] = {}
        self.bodies: list[dict] = []
        self.client: SubmgrClient | None = None
        self.n = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/ric/v1/subscriptions", self.post)
        app.router.add_delete("/ric/v1/subscriptions/{sid}", self.delete)
        app.router.add_get("/ric/v1/subscriptions", self.list)
        return app

    async def post(self, req):
        if self.unavailable:
            self.unavailable -= 1
            return web.Response(status=503, text="No E2 connection")
        body = await req.json()
        for k in ("SubscriptionId", "ClientEndpoint", "Meid", "RANFunctionID", "SubscriptionDetails"):
            if k not in body:
                return web.json_response({"error": f"missing {k}"}, status=400)
        self.bodies.append(body)
        self.n += 1
        sid = f"sub-{self.n}"
        self.subs[sid] = body
        x = body["SubscriptionDetails"][0]["XappEventInstanceId"]
        note = {"SubscriptionId": sid, "SubscriptionInstances": [
            {"XappEventInstanceId": x, "E2EventInstanceId": 0 if self.fail_e2 else 40 + self.n,
             "ErrorCause": "E2 failure" if self.fail_e2 else "", "ErrorSource": "E2Node" if self.fail_e2 else ""}]}
        if self.notify_first:
            self.client.on_notification(note)
        else:
            asyncio.get_running_loop().call_later(0.01, self.client.on_notification, note)
        return web.json_response({"SubscriptionId": sid, "SubscriptionInstances": None}, status=201)

    async def delete(self, req):
        return web.Response(status=204) if self.subs.pop(req.match_info["sid"], None) else web.Response(status=404)

    async def list(self, req):
        return web.json_response([{"SubscriptionId": s, "Meid": b["Meid"]} for s, b in self.subs.items()])


async def _with_fake(fake: FakeSubmgr, body):
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    slept: list[float] = []

    async def no_sleep(s):
        slept.append(s)

    try:
        async with aiohttp.ClientSession() as session:
            cfg = SubmgrConfig(url=f"http://127.0.0.1:{port}/ric/v1", attempts=4, backoff_s=0.5)
            client = SubmgrClient(cfg, session, sleep=no_sleep)
            fake.client = client
            return await body(client), slept
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("notify_first", [False, True])
def test_subscribe_then_delete(notify_first):
    fake = FakeSubmgr(notify_first=notify_first)

    async def body(c):
        out = await c.subscribe(SPEC, timeout_s=2)
        listed = await c.list()
        gone = await c.unsubscribe(out.subscription_id)
        again = await c.unsubscribe(out.subscription_id)
        return out, listed, gone, again

    (out, listed, gone, again), _ = asyncio.run(_with_fake(fake, body))
    assert out.subscription_id == "sub-1" and out.e2_event_instance_id == 41
    assert listed == [{"SubscriptionId": "sub-1", "Meid": "gnb-a"}]
    assert gone is True and again is False and fake.subs == {}


def test_503_is_retried_with_backoff():
    fake = FakeSubmgr(unavailable=2)
    out, slept = asyncio.run(_with_fake(fake, lambda c: c.subscribe(SPEC, timeout_s=2)))
    assert out.e2_event_instance_id == 41 and slept == [0.5, 1.0]


def test_gives_up_with_a_clear_error():
    fake = FakeSubmgr(unavailable=10)
    with pytest.raises(SubmgrError, match="after 4 attempts: HTTP 503"):
        asyncio.run(_with_fake(fake, lambda c: c.subscribe(SPEC, timeout_s=2)))


def test_e2_failure_deletes_the_subscription_so_nothing_leaks():
    fake = FakeSubmgr(fail_e2=True)
    with pytest.raises(SubmgrError, match="E2Node: E2 failure"):
        asyncio.run(_with_fake(fake, lambda c: c.subscribe(SPEC, timeout_s=2)))
    assert fake.subs == {}


def test_missing_notification_times_out():
    fake = FakeSubmgr()

    async def body(c):
        c.on_notification = lambda doc: None      # SubMgr's notification is lost on the way
        fake.client = c
        return await c.subscribe(SPEC, timeout_s=0.1)

    with pytest.raises(SubmgrError, match="no notification"):
        asyncio.run(_with_fake(fake, body))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["SubscriptionId", "SubscriptionInstances", "XappEventInstanceId",
                                         "E2EventInstanceId", "ErrorCause", "ErrorSource", "x"]), inner, max_size=5),
                    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_fuzz_notification_bodies_parse_or_raise_submgr_error(doc):
    try:
        parse_subscription_response(doc)
    except SubmgrError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=120))
def test_fuzz_control_replies_parse_or_raise_value_error(data):
    from xapp.actuate import parse_control_reply

    try:
        parse_control_reply(data)
    except ValueError:           # E2DecodeError is a ValueError
        pass
