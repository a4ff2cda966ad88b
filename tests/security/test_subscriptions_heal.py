"""Issue 13 item 3, subscriptions that heal: a subscription that SubMgr loses (a hostile client DELETEs it,
or SubMgr restarts without its store) is noticed, readiness says so, and the xApp subscribes again; KPM
and grants come back. The real mini-RIC (SubMgr REST + E2 termination + E2 nodes over the RAN model) runs
in this event loop with a real Redis R-NIB, the xApp runs in this process, a minimal lease client stands
in for the site agent; the hostile client is a plain HTTP client of SubMgr's REST API."""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "xapp"))
from xapp_harness import LeaseClient, SimBed, free_port, until, xapp_config  # noqa: E402

from testbed.e2node.functions import kpm_oid  # noqa: E402
from xapp.app import XappApp  # noqa: E402
from xapp.config import load_config  # noqa: E402

pytestmark = pytest.mark.slow

AUDIT_PERIOD_S = 2.0


def _config(tb: SimBed, tmp: Path, rmr_port: int, discovery: str) -> Path:
    path = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0)
    doc = json.loads(path.read_text())
    c = doc["controls"]
    c["submgr"]["audit_period_s"] = AUDIT_PERIOD_S
    if discovery == "static":
        c["e2"] = {"discovery": "static", "static_nodes": [
            {"meid": n.meid, "kpm_function_id": n.node.config.kpm_function_id, "kpm_oid": kpm_oid(n.node.config),
             "rc_function_id": n.node.config.rc_function_id} for n in tb.sim.nodes]}
    path.write_text(json.dumps(doc))
    return path


class ReadinessTrace:
    """Samples `subscriptions` readiness every 10 ms, and once more the moment the xApp drops a
    subscription it has found lost: a heal can take less than 10 ms on one host, and a sampler alone
    would miss the false stretch."""

    def __init__(self, x: XappApp) -> None:
        self.x = x
        self.samples: list[tuple[float, bool]] = []
        self.task = asyncio.ensure_future(self._run())
        forget = x._forget

        def spy(rec):
            forget(rec)
            self.samples.append((time.monotonic(), x.readiness()["subscriptions"]))
        x._forget = spy

    async def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), self.x.readiness()["subscriptions"]))
            await asyncio.sleep(0.01)

    def first(self, value: bool, after: float) -> float | None:
        return next((t for t, v in self.samples if t >= after and v is value), None)

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _get(url: str):
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.json(content_type=None)


async def _metrics(x: XappApp) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{x.rest_port}/metrics") as r:
        return await r.text()


async def _bed(tmp: Path, discovery: str):
    rmr_port = free_port()
    tb = await SimBed.start(tmp, rmr_port, n_sites=1)
    x = XappApp(load_config(_config(tb, tmp, rmr_port, discovery)))
    await x.start(rest_port=0, broker_listen="127.0.0.1:0")
    agent = LeaseClient(x.broker.port, "site-0").start()
    await until(lambda: x.ready() and x.readiness()["subscriptions"], 20, "ready and subscribed")
    await until(lambda: [le for _, le in agent.leases() if le.sm_count > 0], 20, "a first grant")
    return tb, x, agent


async def _heals(x: XappApp, tb: SimBed, agent: LeaseClient, lose, how: str) -> None:
    """`lose()` makes SubMgr lose the subscription; everything after it must come back on its own."""
    meid = tb.meids[0]
    old = x.subscriptions[meid]
    trace = ReadinessTrace(x)
    try:
        t_lost = time.monotonic()
        await lose(old)
        # Noticed within the audit period (KPM silence triggers an audit sooner): readiness goes false...
        await until(lambda: trace.first(False, t_lost) is not None, AUDIT_PERIOD_S + 2.0,
                    f"readiness to report the {how} subscription")
        noticed = trace.first(False, t_lost) - t_lost
        assert noticed <= AUDIT_PERIOD_S + 1.5, noticed
        # ... then true again with a new subscription, made by the xApp itself.
        await until(lambda: trace.first(True, t_lost + noticed) is not None and x.readiness()["subscriptions"], 15, "a new subscription")
        new = x.subscriptions[meid]
        assert new.subscription_id != old.subscription_id or new.e2_event_instance_id != old.e2_event_instance_id
        st, live = await _get(tb.sim.ric.submgr_url + "/subscriptions")
        assert st == 200 and [d["Meid"] for d in live] == [meid]
        assert live[0]["SubscriptionId"] == new.e2_event_instance_id and "RestSubscriptionId" not in live[0]
        assert [r.subscription_id for r in x.store.subscriptions()] == [new.subscription_id]   # SDL follows
        # KPM flows again on the new sub_id, and the site is granted again.
        n = x.counters.indications
        await until(lambda: x.counters.indications > n + 5, 10, "KPM again")
        t_back = time.monotonic()
        await until(lambda: [le for t, le in agent.leases() if t > t_back and le.sm_count > 0], 15, "a grant again")
        # REST, /metrics: the subscription's story.
        st, doc = await _get(f"http://127.0.0.1:{x.rest_port}/api/v1/subscriptions")
        [sub] = doc["subscriptions"]
        assert st == 200 and sub["meid"] == meid and sub["site_id"] == "site-0" and sub["state"] == "active"
        assert sub["resubscriptions"] == 1 and doc["resubscriptions"] == 1
        assert sub["subscription_id"] == new.subscription_id and sub["sub_id"] == new.e2_event_instance_id
        assert "missing at SubMgr" in sub["last_error"] and sub["kpm_age_s"] < 1.0
        assert sub["last_checked_unix"] is not None and doc["audit_period_s"] == AUDIT_PERIOD_S
        text = await _metrics(x)
        assert "weaver_resubscriptions_total 1.0\n" in text
        assert f'weaver_subscription_active{{meid="{meid}"}} 1.0\n' in text
    finally:
        await trace.close()


async def _hostile_delete(tmp: Path, discovery: str) -> None:
    tb, x, agent = await _bed(tmp, discovery)
    try:
        # The periodic audit runs and finds everything in place: nothing is redone, readiness holds.
        a = x.counters.subscription_audits
        await until(lambda: x.counters.subscription_audits >= a + 2, 3 * AUDIT_PERIOD_S + 2, "two audits")
        assert x.ready() and x.readiness()["subscriptions"] and x.counters.resubscriptions == 0
        meid = tb.meids[0]

        async def delete(old):
            # Anyone who can reach SubMgr can list the xApp's subscription (its REST id on SubMgr's debug
            # route) and delete it; SubMgr deletes in the background.
            st, mine = await _get(f"{tb.sim.ric.submgr_url}/get_e2node_rest_subscriptions/{meid}")
            [rest_id] = list(mine)
            async with aiohttp.ClientSession() as s, \
                    s.delete(f"{tb.sim.ric.submgr_url}/subscriptions/{rest_id}") as r:
                assert r.status == 204
            for _ in range(250):         # the background delete
                if (await _get(tb.sim.ric.submgr_url + "/subscriptions"))[1] == []:
                    break
                await asyncio.sleep(0.02)
            assert (await _get(tb.sim.ric.submgr_url + "/subscriptions"))[1] == []
        await _heals(x, tb, agent, delete, "deleted")
    finally:
        await agent.close()
        await x.stop()
        await tb.close()


@pytest.mark.timeout(90)
def test_subscription_deleted_at_submgr_is_remade_static_discovery(tmp_path, redis_env):
    asyncio.run(_hostile_delete(tmp_path, "static"))


@pytest.mark.timeout(90)
def test_subscription_deleted_at_submgr_is_remade_rnib_discovery(tmp_path, redis_env):
    asyncio.run(_hostile_delete(tmp_path, "rnib"))


async def _submgr_restart(tmp: Path) -> None:
    tb, x, agent = await _bed(tmp, "static")
    try:
        async def restart(old):
            # SubMgr comes back without its store: no subscription, no route, the node keeps its old one.
            assert tb.sim.ric.submgr.forget_all() == 1
            assert (await _get(tb.sim.ric.submgr_url + "/subscriptions"))[1] == []
        await _heals(x, tb, agent, restart, "forgotten")
    finally:
        await agent.close()
        await x.stop()
        await tb.close()


@pytest.mark.timeout(90)
def test_subscriptions_lost_by_a_submgr_restart_are_remade(tmp_path, redis_env):
    asyncio.run(_submgr_restart(tmp_path))


def test_audit_matches_both_list_shapes_and_ignores_garbage():
    """OSC's SubMgr lists the E2 instance id as SubscriptionId (with Meid); the mini-RIC adds the REST id.
    A hostile or broken list entry (not an object, wrong types) matches nothing and raises nothing."""
    from xapp.state import SubscriptionRecord
    from xapp.subaudit import SubscriptionStatus, missing

    def rec(meid, rest, e2):
        return SubscriptionRecord(subscription_id=rest, meid=meid, ran_function_id=2, xapp_event_instance_id=1,
                                  e2_event_instance_id=e2, kpm_version="V3_00", period_ms=100, created_unix=0.0)
    a, b, c = rec("gnb-a", "r-a", 7), rec("gnb-b", "r-b", 8), rec("gnb-c", "r-c", 9)
    live = [{"SubscriptionId": 7, "Meid": "gnb-a"}, {"SubscriptionId": 1, "RestSubscriptionId": "r-b"},
            {"SubscriptionId": 9, "Meid": "gnb-x"}, "junk", None, [], {"SubscriptionId": {"nested": 1}}]
    assert missing([a, b, c], live) == [c]
    assert missing([a], []) == [a] and missing([], live) == []
    st = SubscriptionStatus(meid="gnb-a", since_unix=1.0)
    st.enter("missing", 2.0, "gone")
    st.enter("missing", 3.0)                      # same state: `since` stays where it entered
    assert (st.state, st.since_unix, st.last_error) == ("missing", 2.0, "gone")
    with pytest.raises(ValueError):
        st.enter("hijacked", 4.0)
