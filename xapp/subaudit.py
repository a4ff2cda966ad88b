"""Subscription audit: what SubMgr still holds of the xApp's subscriptions, and each one's state.

A subscription can vanish behind the xApp's back: any client may DELETE it at SubMgr, and a SubMgr that
restarts without its store forgets them all. Nothing tells the xApp, so it compares its own records with
SubMgr's `GET /ric/v1/subscriptions` list, on a period and whenever a node's KPM goes silent, and
re-subscribes what is gone (`xapp.app`). This module is the pure part: matching list entries to records,
and the per-node status the REST API and the dashboard show. No I/O.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from xapp.state import SubscriptionRecord

# pending: not subscribed yet (start); active: SubMgr listed it at the last check (or it was just made);
# missing: SubMgr no longer lists it; resubscribing: a new subscription is under way; failed: the last
# attempt to subscribe failed (retried with backoff).
STATES = ("pending", "active", "missing", "resubscribing", "failed")


@dataclass(kw_only=True)
class SubscriptionStatus:
    meid: str
    state: str = "pending"
    subscription_id: str = ""
    sub_id: int = 0                              # the RMR sub_id its indications carry
    since_unix: float = 0.0                      # when `state` was entered
    last_checked_unix: float | None = None       # the last audit that covered this node
    check_error: str = ""                        # the last audit's failure ("" = SubMgr answered)
    resubscriptions: int = 0
    last_error: str = ""                         # why it went missing or failed

    def enter(self, state: str, now_unix: float, why: str = "") -> None:
        if state not in STATES:
            raise ValueError(f"unknown subscription state {state!r}")
        if state != self.state:
            self.state, self.since_unix = state, now_unix
        if why:
            self.last_error = why

    def view(self) -> dict:
        return {"meid": self.meid, "state": self.state, "subscription_id": self.subscription_id,
                "sub_id": self.sub_id, "since_unix": self.since_unix, "last_checked_unix": self.last_checked_unix,
                "check_error": self.check_error, "resubscriptions": self.resubscriptions,
                "last_error": self.last_error}


def same_subscription(d: object, rec: SubscriptionRecord) -> bool:
    """A GET /ric/v1/subscriptions entry is ours. OSC's SubMgr (registry.go QueryHandler) lists each E2
    subscription as {SubscriptionId: its E2 instance ID, Meid, ClientEndpoint, SubscriptionInstances:
    null}, with no REST id -- the mini-RIC lists the same since issue 15 -- so that is the match that
    counts; a REST id as SubscriptionId or RestSubscriptionId (other lists' shapes) matches too."""
    if not isinstance(d, dict):
        return False
    if rec.subscription_id in (d.get("SubscriptionId"), d.get("RestSubscriptionId")):
        return True
    return d.get("SubscriptionId") == rec.e2_event_instance_id and d.get("Meid") == rec.meid


def missing(records: Iterable[SubscriptionRecord], live: list) -> list[SubscriptionRecord]:
    """The records SubMgr's list does not hold (anything not an entry of the documented shape is ignored)."""
    return [r for r in records if not any(same_subscription(d, r) for d in live)]
