"""The SDL lease ledger (xapp.state.LeaseLedger) against a real Redis: a tick's entries go in one write and
one delete, and the ledger they leave is the one per-lease writes leave (the first lease after a start or a
takeover stays, a renewal replaces its predecessor, a revocation overwrites its lease's entry)."""
from __future__ import annotations

import redis

from xapp.state import LeaseLedger, LeaseRecord, lease_key, open_store


def _rec(site: str, epoch: int, seq: int, ended: str = "") -> LeaseRecord:
    return LeaseRecord(lease_id=lease_key(site, epoch, seq), site_id=site, sm_count=8 * seq, epoch=epoch, seq=seq,
                       issued_unix=100.0 + seq, valid_until_unix=100.3 + seq, ended=ended)


def _story() -> list[tuple[LeaseRecord, bool]]:
    out = []
    for seq in range(1, 6):
        for site in ("s1", "s2", "s3"):
            out.append((_rec(site, 4, seq), True))
    out.append((_rec("s2", 4, 5, ended="revoked"), False))
    return out


def _ledger(store) -> dict[str, tuple[int, str]]:
    return {r.lease_id: (r.sm_count, r.ended) for r in store.leases()}


def _commands(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def test_a_batch_leaves_the_ledger_per_lease_writes_leave_in_two_round_trips(redis_env):
    r = redis.Redis(redis_env["host"], redis_env["port"])
    one_by_one = open_store("ledger-a")
    ledger = LeaseLedger(one_by_one)
    for rec, granted in _story():
        ledger.write(rec, granted)
    expected = _ledger(one_by_one)
    # first leases stay; seq 5 replaced seq 4 (which replaced 3, 2); s2's last lease is marked revoked
    assert expected == {**{lease_key(s, 4, 1): (8, "") for s in ("s1", "s2", "s3")},
                        lease_key("s1", 4, 5): (40, ""), lease_key("s3", 4, 5): (40, ""),
                        lease_key("s2", 4, 5): (40, "revoked")}

    batched = open_store("ledger-b")
    ledger = LeaseLedger(batched)
    before = _commands(r)
    for seq in range(1, 6):        # one tick a sequence number: each tick's entries in one flush
        for rec, granted in [x for x in _story() if x[0].seq == seq]:
            ledger.add(rec, granted)
        ledger.flush()
    after = _commands(r)
    assert _ledger(batched) == expected
    writes = sum(after.get(c, 0) - before.get(c, 0) for c in ("set", "mset"))
    deletes = after.get("del", 0) - before.get("del", 0)
    assert writes == 5 and deletes <= 5, (writes, deletes)     # per tick, not per lease (16 entries)


def test_a_restart_keeps_the_next_lease_as_the_first_of_the_site(redis_env):
    store = open_store("ledger-c")
    ledger = LeaseLedger(store)
    for seq in (1, 2, 3):
        ledger.add(_rec("s1", 7, seq), True)
    ledger.restart("s1")           # a shard's takeover: the next lease opens a new record
    for seq in (4, 5):
        ledger.add(_rec("s1", 7, seq), True)
    ledger.flush()
    assert sorted(_ledger(store)) == [lease_key("s1", 7, 1), lease_key("s1", 7, 3), lease_key("s1", 7, 4),
                                      lease_key("s1", 7, 5)]
