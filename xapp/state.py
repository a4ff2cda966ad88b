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
Times stored here are wall-clock unix seconds: monotonic time means nothing to the next process.
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ricsdl.exceptions import RejectedByBackend
from ricxappframe.xapp_sdl import SDLWrapper

log = logging.getLogger("weaver.xapp.state")

DBAAS_VARS = ("DBAAS_SERVICE_HOST", "DBAAS_CLUSTER_ADDR_LIST")


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
        self.sdl.set(self.ns, f"lease/{rec.lease_id}", asdict(rec))

    def leases(self) -> list[LeaseRecord]:
        recs = [_from(LeaseRecord, v) for v in self.sdl.find_and_get(self.ns, "lease/").values()]
        return sorted(recs, key=lambda r: (r.epoch, r.seq, r.lease_id))

    def prune_leases(self, now_unix: float, keep_s: float = 600.0) -> int:
        """Drop ledger entries that ended or expired more than `keep_s` ago; returns how many."""
        old = [r for r in self.leases() if r.valid_until_unix < now_unix - keep_s]
        for r in old:
            self.sdl.delete(self.ns, f"lease/{r.lease_id}")
        return len(old)

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
        """Advance the broker epoch: compare-and-set where the backend has OSC DBaaS's Redis modules
        (SETIE), plain get+set otherwise (a vanilla Redis; one xApp replica, so no race in practice)."""
        for _ in range(100):
            cur = self.sdl.get(self.ns, "epoch")
            nxt = 1 if cur is None else int(cur) + 1
            try:
                ok = (self.sdl.set_if_not_exists(self.ns, "epoch", nxt) if cur is None
                      else self.sdl.set_if(self.ns, "epoch", cur, nxt))
            except RejectedByBackend:
                if not self._warned_cas:
                    log.info("SDL backend has no DBaaS modules (SETIE): epoch advanced without compare-and-set")
                    self._warned_cas = True
                self.sdl.set(self.ns, "epoch", nxt)
                ok = True
            if ok:
                return nxt
        raise StateError("could not advance the broker epoch: SDL compare-and-set kept failing")

    def snapshot(self) -> Snapshot:
        return Snapshot(self.subscriptions(), self.sites(), self.leases(), self.cost_models(), self.epoch())

    def healthy(self) -> bool:
        try:
            return bool(self.sdl._sdl.is_active())   # SDLWrapper has no public health call
        except Exception:  # noqa: BLE001 - any backend failure means "not healthy"
            return False


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
