"""`testbed.up.ledger_check`'s served-again figure, on a ledger written to the real Redis: the killed
replica's own last grant, stamped just after the kill (SIGKILL landing mid-write), is not another replica
serving the site again."""
from __future__ import annotations

import uuid

import msgpack
import redis

from testbed.up import REDIS, ledger_check


def _lease(site, epoch, issued):
    return {"site_id": site, "epoch": epoch, "lease_id": f"{epoch}-{issued}", "issued_unix": issued,
            "valid_until_unix": issued + 0.3}


def test_served_again_counts_only_another_epochs_lease():
    r = redis.Redis(*REDIS, socket_timeout=2)
    ns = f"weaver-test-{uuid.uuid4().hex[:8]}"
    kill = 1000.0
    ledger = [_lease("site-2", 1, 990.0),           # replica A owned site-2 first
              _lease("site-2", 3, 995.0),           # then C (a later start), the one killed
              _lease("site-2", 3, kill + 0.014),    # C's last grant, written as the signal landed
              _lease("site-2", 1, kill + 3.2),      # A takes the shard over: served again
              _lease("site-2", 1, kill + 3.5)]
    try:
        for i, rec in enumerate(ledger):
            r.set("{" + ns + "},lease/" + str(i), msgpack.packb(rec, use_bin_type=True))
        out = ledger_check(ns, [{"kind": "replica-kill", "start_unix": kill, "sites": ["site-2"]}])
    finally:
        for i in range(len(ledger)):
            r.delete("{" + ns + "},lease/" + str(i))
    assert out["ledger_leases"] == 5 and out["epochs_by_site"] == {"site-2": [1, 3]}
    assert out["served_again_s"] == {"site-2": 3.2}
    assert out["lease_epoch_overlaps"] == []       # A's first lease came 3.2 s after C's last one ended
