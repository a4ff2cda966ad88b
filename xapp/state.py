"""What the xApp must remember across a restart, kept in SDL (ricxappframe's SDLWrapper over ricsdl).

Backend: Redis when the platform's `DBAAS_*` variables are set (as the OSC chart injects them), else
ricsdl's embedded in-process dict store -- `open_store` says which at start, because an embedded store
forgets everything on restart.

Layout in one SDL namespace (default `weaver`), msgpack values:
  sub/<meid>/<ran_function_id>  SubscriptionRecord   (so a restart reuses or deletes, never leaks)
  site/<site_id>                SiteRecord           (last envelope + caps the nodes acknowledged)
  lease/<lease_id>              LeaseRecord          (the ledger; pruned once long expired)
  epoch                         int                  (broker epoch, +1 per start, compare-and-set)
  cost/<site_id>                dict                 (learned PHY cost model)
  control_cursor                int                  (last RC control id used: a restart does not reuse ids)
  leader                        {owner, until}       (the control leader lease, compare-and-set)
  shard/<k>                     {owner, until, epoch} (a shard of sites' claim, compare-and-set: xapp.shards)
  replica/<id>                  {until, broker}      (a live replica's heartbeat: the shard assignment's members)
Times stored here are wall-clock unix seconds: monotonic time means nothing to the next process.

Compare-and-set: ricsdl's `set_if` is OSC DBaaS's SETIE module command; a vanilla Redis has no such
command, so there the same compare-and-set runs as a Lua script on ricsdl's own connection (atomic on the
Redis server either way). The embedded store is one process: its dict `set_if` is atomic as it is.
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import msgpack
from ricsdl.exceptions import RejectedByBackend
from ricxappframe.xapp_sdl import SDLWrapper

from xapp.shards import ShardClaim

log = logging.getLogger("weaver.xapp.state")

DBAAS_VARS = ("DBAAS_SERVICE_HOST", "DBAAS_CLUSTER_ADDR_LIST")
LEADER_KEY = "leader"
LEADER_TTL_S = 3.0       # the leader lease's lifetime in SDL; the holder renews it once a second
LEADER_SKEW_S = 0.5      # the holder acts as leader until TTL - this after its renewal was sent: host clocks
                         # (the record's expiry is wall time) may disagree by up to this much
CURSOR_KEY = "control_cursor"

# KEYS[1] = key, ARGV[1] = the exact old bytes, ARGV[2] = the new bytes (SETIE's semantics)
_CAS_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


class StateError(RuntimeError):
    """SDL is unreachable or holds something this version cannot read."""


@dataclass(frozen=True, kw_only=True)
class SubscriptionRecord:
    subscription_id: str            # SubMgr's SubscriptionId: deleting after a restart needs it
    meid: str
    ran_function_id: int
    xapp_event_instance_id: int
    e2_event_instance_id: int = 0   # RMR sub_id of the indications; 0 = not (yet) confirmed
    kpm_version: str = "v3.00"
    period_ms: int = 100
    created_unix: float = 0.0
    owner: str = ""                 # the replica that made it (replicas.shards: a node's shard owner's)


@dataclass(frozen=True, kw_only=True)
class SiteRecord:
    site_id: str
    envelope_sms: int
    mode: str = "quota"                                      # quota | envelope | none
    caps: tuple[tuple[str, int, int, int], ...] = ()         # (meid, sst, sd or -1, max_ratio %)
    updated_unix: float = 0.0


@dataclass(frozen=True, kw_only=True)
class LeaseRecord:
    lease_id: str
    site_id: str
    sm_count: int
    epoch: int
    seq: int
    issued_unix: float
    valid_until_unix: float
    reason: str = ""
    agent_id: str = ""
    ended: str = ""                 # "" active | revoked | expired | replaced


@dataclass
class Snapshot:
    """Everything read back at start."""
    subscriptions: list[SubscriptionRecord] = field(default_factory=list)
    sites: dict[str, SiteRecord] = field(default_factory=dict)
    leases: list[LeaseRecord] = field(default_factory=list)
    cost_models: dict[str, dict[str, Any]] = field(default_factory=dict)
    epoch: int = 0
    control_cursor: int | None = None     # last RC control id a previous run used; None = never saved


def previous_leases_end(leases: list[LeaseRecord], epoch: int) -> float | None:
    """The latest hard end (wall) among ledger leases of epochs other than `epoch`: until then an agent
    of a previous (or other) instance may still act on its lease. Every ledger state counts, "revoked"
    included: the ledger records that a revoke was sent, not that the agent acknowledged the release
    (architecture.md, the RAN-first invariant). None when there are none."""
    ends = [r.valid_until_unix for r in leases if r.epoch != epoch]
    return max(ends) if ends else None


def _from(cls, d: Any):
    if not isinstance(d, dict):
        raise StateError(f"SDL holds an unreadable {cls.__name__}: {type(d).__name__}")
    try:
        names = cls.__dataclass_fields__.keys()
        obj = cls(**{k: v for k, v in d.items() if k in names})
    except TypeError as exc:
        raise StateError(f"SDL holds an unreadable {cls.__name__}: {exc}") from None
    if cls is SiteRecord:
        obj = SiteRecord(**{**asdict(obj), "caps": tuple(tuple(c) for c in obj.caps)})
    return obj


class XappStore:
    """Typed access to the xApp's SDL namespace. Every method is one SDL round trip or a few."""

    def __init__(self, sdl: SDLWrapper, namespace: str = "weaver", backend: str = "embedded") -> None:
        self.sdl = sdl
        self.ns = namespace
        self.backend = backend
        self._warned_cas = False
        self._cas_script = None

    # subscriptions
    def put_subscription(self, rec: SubscriptionRecord) -> None:
        self.sdl.set(self.ns, f"sub/{rec.meid}/{rec.ran_function_id}", asdict(rec))

    def delete_subscription(self, meid: str, ran_function_id: int) -> None:
        self.sdl.delete(self.ns, f"sub/{meid}/{ran_function_id}")

    def subscriptions(self) -> list[SubscriptionRecord]:
        return [_from(SubscriptionRecord, v) for _, v in sorted(self.sdl.find_and_get(self.ns, "sub/").items())]

    # sites
    def put_site(self, rec: SiteRecord) -> None:
        d = asdict(rec)
        d["caps"] = [list(c) for c in rec.caps]
        self.sdl.set(self.ns, f"site/{rec.site_id}", d)

    def sites(self) -> dict[str, SiteRecord]:
        recs = (_from(SiteRecord, v) for v in self.sdl.find_and_get(self.ns, "site/").values())
        return {r.site_id: r for r in recs}

    # lease ledger
    def put_lease(self, rec: LeaseRecord) -> None:
        self.sdl.set(self.ns, f"lease/{rec.lease_id}", _lease_dict(rec))

    def leases(self) -> list[LeaseRecord]:
        recs = [_from(LeaseRecord, v) for v in self.sdl.find_and_get(self.ns, "lease/").values()]
        return sorted(recs, key=lambda r: (r.epoch, r.seq, r.lease_id))

    def prune_leases(self, now_unix: float, keep_s: float = 600.0) -> int:
        """Drop ledger entries that ended or expired more than `keep_s` ago; returns how many."""
        old = [r for r in self.leases() if r.valid_until_unix < now_unix - keep_s]
        for r in old:
            self.sdl.delete(self.ns, f"lease/{r.lease_id}")
        return len(old)

    def record_leases(self, recs: list[LeaseRecord], drop_ids: set[str] = frozenset()) -> None:
        """Write ledger entries and then delete the entries they replace: two SDL round trips however many
        (ricsdl's SyncStorage takes a key map and a key set; SDLWrapper's own calls take one key each)."""
        if recs:
            self.sdl._sdl.set(self.ns, {f"lease/{r.lease_id}": msgpack.packb(_lease_dict(r), use_bin_type=True)
                                        for r in recs})
        if drop_ids:
            self.sdl._sdl.remove(self.ns, {f"lease/{i}" for i in drop_ids})

    # cost model
    def put_cost_model(self, site_id: str, model: dict[str, Any]) -> None:
        self.sdl.set(self.ns, f"cost/{site_id}", model)

    def cost_models(self) -> dict[str, dict[str, Any]]:
        return {k.split("/", 1)[1]: v for k, v in self.sdl.find_and_get(self.ns, "cost/").items()}

    # epoch
    def epoch(self) -> int:
        v = self.sdl.get(self.ns, "epoch")
        return int(v) if v is not None else 0

    def next_epoch(self) -> int:
        """Advance the broker epoch by compare-and-set (two replicas starting together get two epochs)."""
        for _ in range(100):
            cur = self.sdl.get(self.ns, "epoch", usemsgpack=False)
            nxt = 1 if cur is None else int(msgpack.unpackb(cur)) + 1
            if self._cas("epoch", cur, msgpack.packb(nxt, use_bin_type=True)):
                return nxt
        raise StateError("could not advance the broker epoch: SDL compare-and-set kept failing")

    # compare-and-set on the exact stored bytes
    def _cas(self, key: str, old: bytes | None, new: bytes) -> bool:
        """Write `new` only if the key still holds exactly `old` (None: only if it does not exist)."""
        if old is None:
            return bool(self.sdl.set_if_not_exists(self.ns, key, new, usemsgpack=False))
        try:
            return bool(self.sdl.set_if(self.ns, key, old, new, usemsgpack=False))
        except RejectedByBackend:
            pass                                    # vanilla Redis: no SETIE module
        if not self._warned_cas:
            log.info("SDL backend has no DBaaS modules (SETIE): compare-and-set runs as a Lua script")
            self._warned_cas = True
        try:
            if self._cas_script is None:
                self._cas_script = self._redis_client().register_script(_CAS_LUA)
            return bool(self._cas_script(keys=["{" + self.ns + "}," + key], args=[old, new]))   # ricsdl's key
        except Exception as exc:  # noqa: BLE001 - redis-py raises several unrelated types
            raise StateError(f"SDL compare-and-set on {key!r} failed: {exc}") from exc

    def _redis_client(self):
        """ricsdl's redis-py client for our namespace (ricsdl 3.x private names: SDLWrapper exposes no raw
        command, and a second connection would have to re-read DBAAS_* the way ricsdl does)."""
        backend = getattr(self.sdl._sdl, "_SyncStorage__dbbackend", None)
        get_client = getattr(backend, "_RedisBackend__getClient", None)
        if get_client is None:
            raise StateError(f"SDL backend {type(backend).__name__} offers no compare-and-set")
        return get_client(self.ns)

    # RC control ids
    def put_control_cursor(self, control_id: int) -> None:
        self.sdl.set(self.ns, CURSOR_KEY, int(control_id))

    def control_cursor(self) -> int | None:
        v = self.sdl.get(self.ns, CURSOR_KEY)
        return int(v) if v is not None else None

    # control leader lease: value {"owner": id, "until": wall expiry}
    def leader(self) -> tuple[str, float] | None:
        """(owner, until) of the current leader record, expired or not; None if there is none."""
        raw = self.sdl.get(self.ns, LEADER_KEY, usemsgpack=False)
        return None if raw is None else _leader_value(raw)

    def acquire_leader(self, owner: str, ttl_s: float, now_unix: float) -> bool:
        """Take the leader lease until `now_unix + ttl_s` if nobody holds it, it has expired, or we hold it
        already; True if we hold it now. Taking over an expired lease is a compare-and-set on its exact
        old value, so of two contenders exactly one wins."""
        raw = self.sdl.get(self.ns, LEADER_KEY, usemsgpack=False)
        if raw is not None:
            cur_owner, until = _leader_value(raw)
            if cur_owner != owner and until > now_unix:
                return False
        return self._cas(LEADER_KEY, raw, _leader_bytes(owner, now_unix + ttl_s))

    def renew_leader(self, owner: str, ttl_s: float, now_unix: float) -> bool:
        """Extend our leader lease to `now_unix + ttl_s`; False if the record is not ours any more (taken
        over, released) -- then we are not the leader and must stop controlling at once."""
        raw = self.sdl.get(self.ns, LEADER_KEY, usemsgpack=False)
        if raw is None or _leader_value(raw)[0] != owner:
            return False
        return self._cas(LEADER_KEY, raw, _leader_bytes(owner, now_unix + ttl_s))

    def release_leader(self, owner: str) -> bool:
        """Give the lease up (expire it now) if it is still ours; True if it was."""
        raw = self.sdl.get(self.ns, LEADER_KEY, usemsgpack=False)
        if raw is None or _leader_value(raw)[0] != owner:
            return False
        return self._cas(LEADER_KEY, raw, _leader_bytes(owner, 0.0))

    # shards of sites (xapp.shards): a claim per shard, a heartbeat per replica
    def shard_claims(self) -> dict[int, ShardClaim]:
        out = {}
        for key, raw in self.sdl.find_and_get(self.ns, "shard/", usemsgpack=False).items():
            c = _claim_value(int(key.split("/", 1)[1]), raw)
            out[c.shard] = c
        return out

    def acquire_shard(self, shard: int, owner: str, ttl_s: float, now_unix: float) -> ShardClaim | None:
        """Claim `shard` until `now_unix + ttl_s` if it is unclaimed or its claim has expired: the epoch grows
        by one (the fencing token a takeover is known by). None if another replica holds it, or another
        contender's compare-and-set came first."""
        raw, cur = self._claim(shard)
        if cur is not None and cur.live(now_unix):
            return cur if cur.owner == owner else None
        new = ShardClaim(shard, owner, now_unix + ttl_s, (cur.epoch if cur else 0) + 1)
        return new if self._cas(f"shard/{shard}", raw, _claim_bytes(new)) else None

    def renew_shard(self, shard: int, owner: str, epoch: int, ttl_s: float, now_unix: float) -> bool:
        """Extend our claim taken at `epoch`; False if the claim is not that one any more (expired and taken
        over, released): then we do not control the shard and must stop at once."""
        raw, cur = self._claim(shard)
        if cur is None or cur.owner != owner or cur.epoch != epoch or not cur.live(now_unix):
            return False
        return self._cas(f"shard/{shard}", raw, _claim_bytes(ShardClaim(shard, owner, now_unix + ttl_s, epoch)))

    def release_shard(self, shard: int, owner: str, epoch: int) -> bool:
        """End our claim now (after its sites' leases were revoked); True if it was still ours."""
        raw, cur = self._claim(shard)
        if cur is None or cur.owner != owner or cur.epoch != epoch:
            return False
        return self._cas(f"shard/{shard}", raw, _claim_bytes(ShardClaim(shard, owner, 0.0, epoch)))

    def _claim(self, shard: int) -> tuple[bytes | None, ShardClaim | None]:
        """A claim's exact stored bytes (for the compare-and-set) and their value; (None, None) if unclaimed."""
        raw = self.sdl.get(self.ns, f"shard/{shard}", usemsgpack=False)
        return raw, (None if raw is None else _claim_value(shard, raw))

    def beat_replica(self, replica_id: str, ttl_s: float, now_unix: float, broker: str = "") -> None:
        self.sdl.set(self.ns, f"replica/{replica_id}", {"until": float(now_unix + ttl_s), "broker": broker})

    def leave_replica(self, replica_id: str) -> None:
        self.sdl.delete(self.ns, f"replica/{replica_id}")

    def replica_brokers(self, now_unix: float) -> dict[str, str]:
        """Live replica id -> the lease broker it advertises ("" if none)."""
        out = {}
        for key, v in self.sdl.find_and_get(self.ns, "replica/").items():
            if isinstance(v, dict) and isinstance(v.get("until"), int | float) and v["until"] > now_unix:
                out[key.split("/", 1)[1]] = str(v.get("broker", ""))
        return out

    def live_replicas(self, now_unix: float) -> list[str]:
        return sorted(self.replica_brokers(now_unix))

    def snapshot(self) -> Snapshot:
        return Snapshot(self.subscriptions(), self.sites(), self.leases(), self.cost_models(), self.epoch(),
                        self.control_cursor())

    def healthy(self) -> bool:
        try:
            return bool(self.sdl._sdl.is_active())   # SDLWrapper has no public health call
        except Exception:  # noqa: BLE001 - any backend failure means "not healthy"
            return False


def _leader_bytes(owner: str, until: float) -> bytes:
    return msgpack.packb({"owner": owner, "until": float(until)}, use_bin_type=True)


def _leader_value(raw: bytes) -> tuple[str, float]:
    try:
        d = msgpack.unpackb(raw, raw=False)
        return str(d["owner"]), float(d["until"])
    except Exception as exc:  # noqa: BLE001 - whatever is there, it is not a leader record we can read
        raise StateError(f"SDL holds an unreadable leader record: {exc}") from None


def _claim_bytes(c: ShardClaim) -> bytes:
    return msgpack.packb({"owner": c.owner, "until": float(c.until_unix), "epoch": int(c.epoch)}, use_bin_type=True)


def _claim_value(shard: int, raw: bytes) -> ShardClaim:
    try:
        d = msgpack.unpackb(raw, raw=False)
        return ShardClaim(shard, str(d["owner"]), float(d["until"]), int(d["epoch"]))
    except Exception as exc:  # noqa: BLE001 - whatever is there, it is not a claim we can read
        raise StateError(f"SDL holds an unreadable claim of shard {shard}: {exc}") from None


@dataclass
class LeaseLedger:
    """The SDL ledger of the leases one instance issues (what a takeover reads back, `XappStore.leases`).

    A renewal replaces the site's previous entry, except the first lease after a start or a shard's takeover,
    which stays as the record of when this instance began granting for the site again (the audit of a
    hand-over: testbed.groundtruth.lease_epoch_overlaps). `restart(site)` (or `restart()` for all) marks the
    next lease of a site as such a first one."""

    store: XappStore
    first_grant: dict[str, int | None] = field(default_factory=dict)   # site -> seq of its first lease
    pending: dict[str, LeaseRecord] = field(default_factory=dict)     # lease id -> entry not written yet
    dropping: set[str] = field(default_factory=set)                    # lease ids whose entries go

    def restart(self, site_id: str | None = None) -> None:
        if site_id is None:
            self.first_grant.clear()
        else:
            self.first_grant[site_id] = None

    def add(self, rec: LeaseRecord, granted: bool) -> None:
        """Queue an entry (a later one of the same lease, e.g. its revocation, replaces it); `flush` writes."""
        if granted and self.first_grant.get(rec.site_id) is None:
            self.first_grant[rec.site_id] = rec.seq
        elif granted and rec.seq > 1 and self.first_grant.get(rec.site_id) != rec.seq - 1:
            self.dropping.add(lease_key(rec.site_id, rec.epoch, rec.seq - 1))
        self.pending[rec.lease_id] = rec
        self.dropping.discard(rec.lease_id)

    def flush(self) -> int:
        """Write what is queued, in two SDL round trips; raises what SDL raises (the queue is emptied either
        way: a lost write is a lease the ledger does not hold, which a takeover's wait covers: xapp.invariant)."""
        recs, drops = list(self.pending.values()), self.dropping
        self.pending, self.dropping = {}, set()
        if recs or drops:
            self.store.record_leases(recs, drops)
        return len(recs)

    def write(self, rec: LeaseRecord, granted: bool) -> None:
        self.add(rec, granted)
        self.flush()


def lease_key(site_id: str, epoch: int, seq: int) -> str:
    """A lease's id (the one `xapp.agents.AgentBook.issue` gives it), and so its ledger entry's key."""
    return f"{site_id}.{epoch}.{seq}"


_LEASE_FIELDS = tuple(f.name for f in fields(LeaseRecord))


def _lease_dict(r: LeaseRecord) -> dict[str, Any]:
    # asdict deep-copies every field (a tenth of a lease decision's CPU at 1,000 sites); the fields are scalars
    return {k: getattr(r, k) for k in _LEASE_FIELDS}


def open_store(namespace: str = "weaver", env: dict[str, str] | None = None) -> XappStore:
    """Redis through ricsdl when DBAAS_* is set, the embedded store otherwise (logged either way)."""
    env = os.environ if env is None else env
    if any(env.get(v) for v in DBAAS_VARS):
        where = f"{env.get('DBAAS_SERVICE_HOST', '')}:{env.get('DBAAS_SERVICE_PORT', '6379')}"
        try:
            store = XappStore(SDLWrapper(use_fake_sdl=False), namespace, backend=f"redis {where}")
        except Exception as exc:  # noqa: BLE001 - ricsdl raises several unrelated types
            raise StateError(f"SDL backend at {where} unusable: {exc}") from exc
        log.info("SDL: Redis at %s (namespace %s)", where, namespace)
    else:
        store = XappStore(SDLWrapper(use_fake_sdl=True), namespace, backend="embedded")
        log.warning("SDL: no DBAAS_* set, using the embedded in-process store; state will NOT survive a restart")
    return store
