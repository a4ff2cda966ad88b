"""SDL state against a real Redis (and the embedded store): records round-trip, the epoch only grows."""
from __future__ import annotations

import pytest

from xapp.state import LeaseRecord, SiteRecord, StateError, SubscriptionRecord, XappStore, open_store


@pytest.fixture()
def redis_store(redis_env):
    return open_store("weaver-test")


def _fill(store: XappStore):
    store.put_subscription(SubscriptionRecord(subscription_id="sub-1", meid="gnb-a", ran_function_id=2,
                                              xapp_event_instance_id=7, e2_event_instance_id=41))
    store.put_site(SiteRecord(site_id="s1", envelope_sms=48, caps=(("gnb-a", 1, 1, 60),), updated_unix=5.0))
    store.put_lease(LeaseRecord(lease_id="L1", site_id="s1", sm_count=64, epoch=3, seq=9, issued_unix=100.0,
                                valid_until_unix=100.3))
    store.put_cost_model("s1", {"a": 1.5, "b": 0.2, "n": 40})


def test_redis_roundtrip_survives_a_new_store(redis_store, redis_server):
    assert redis_store.backend.startswith("redis") and redis_store.healthy()
    _fill(redis_store)
    again = open_store("weaver-test")          # a fresh process would do exactly this
    snap = again.snapshot()
    assert snap.subscriptions[0].subscription_id == "sub-1" and snap.subscriptions[0].e2_event_instance_id == 41
    assert snap.sites["s1"].caps == (("gnb-a", 1, 1, 60),) and snap.sites["s1"].envelope_sms == 48
    assert snap.leases[0].lease_id == "L1" and snap.leases[0].valid_until_unix == 100.3
    assert snap.cost_models == {"s1": {"a": 1.5, "b": 0.2, "n": 40}}
    again.delete_subscription("gnb-a", 2)
    assert redis_store.subscriptions() == []


def test_epoch_increments_atomically(redis_store):
    assert redis_store.epoch() == 0
    assert [redis_store.next_epoch() for _ in range(3)] == [1, 2, 3]
    assert open_store("weaver-test").next_epoch() == 4


def test_prune_drops_only_long_expired_leases(redis_store):
    for i, until in enumerate((10.0, 1000.0)):
        redis_store.put_lease(LeaseRecord(lease_id=f"L{i}", site_id="s", sm_count=8, epoch=1, seq=i,
                                          issued_unix=until - 0.3, valid_until_unix=until))
    assert redis_store.prune_leases(now_unix=1000.0, keep_s=600) == 1
    assert [r.lease_id for r in redis_store.leases()] == ["L1"]


def test_embedded_store_when_no_dbaas(monkeypatch, caplog):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    monkeypatch.delenv("DBAAS_CLUSTER_ADDR_LIST", raising=False)
    with caplog.at_level("WARNING"):
        store = open_store("w")
    assert store.backend == "embedded" and "embedded" in caplog.text
    _fill(store)
    assert store.snapshot().sites["s1"].envelope_sms == 48


def test_unreadable_record_is_a_state_error(monkeypatch):
    monkeypatch.delenv("DBAAS_SERVICE_HOST", raising=False)
    store = open_store("w")
    store.sdl.set("w", "site/x", {"nonsense": True})
    with pytest.raises(StateError, match="SiteRecord"):
        store.sites()
