"""`weaver-xapp`: one asyncio process wiring RMR, SubMgr subscriptions, SDL, the control loop, the lease
broker and the REST API. This is the I/O shell; every decision is made by `xapp.loop.step`.

Start: config -> SDL snapshot (+1 broker epoch) -> RMR endpoint -> REST (health, notifications) ->
broker -> node discovery and subscriptions (reusing the SubscriptionIds SDL remembers, so a restart
neither duplicates nor leaks them) -> the loop task. SubMgr's list is audited on a period and when a
node's KPM goes silent: a subscription it lost (deleted by any client, or a SubMgr restart) is made again
(`xapp.subaudit`); readiness reports it but gates on RMR and SDL only (READY_GATES). Stop (SIGTERM/SIGINT): revoke every lease first,
then delete the subscriptions (unless told to keep them), then close. Nothing here sleeps on a fixed
schedule: the loop task waits for the next RMR message or `next_deadline`, whichever comes first.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections import deque
from dataclasses import dataclass, field, replace

import aiohttp

from e2sm import E2DecodeError
from e2sm.kpm import (
    ActionDefFormat1,
    KpmActionDefinition,
    KpmEventTrigger,
    KpmVersion,
    MeasInfo,
    MeasLabel,
    Snssai,
    decode_ran_function_description,
    encode_action_definition,
    encode_event_trigger,
    kpm_version_from_oid,
)
from e2sm.rc import SliceQuota
from xapp import logs
from xapp.actuate import CONTROL_REQUESTOR, NodeControl, node_control, parse_control_reply
from xapp.agents import AgentBook
from xapp.broker import LeaseBroker
from xapp.config import ConfigWatcher, XappConfig
from xapp.gcpolicy import GcPolicy
from xapp.ingest import Ingest, IngestError, KpmRefusal, KpmSample, KpmSubscription, KpmValueError, meas_key
from xapp.inputs import POLICY_INPUTS
from xapp.invariant import loosenings, policy_violations, start_up_changes
from xapp.loop import (
    ControlOutcome,
    GrantLease,
    Inputs,
    LeaseRelease,
    RevokeLease,
    SendControl,
    lift_shaping,
    new_state,
    next_deadline,
    refresh_policy,
    reply_owner,
    set_control_tag,
    set_node,
    step,
)
from xapp.metrics import XappMetrics
from xapp.rmr import NativeUnavailable, RmrError, RmrMessage, open_backend
from xapp.rnib import E2Node, read_rnib, static_nodes
from xapp.shardkeeper import ShardKeeper
from xapp.shards import shard_map
from xapp.state import (
    LEADER_SKEW_S,
    LEADER_TTL_S,
    LeaseLedger,
    LeaseRecord,
    SiteRecord,
    SubscriptionRecord,
    XappStore,
    open_store,
    previous_leases_end,
)
from xapp.subaudit import SubscriptionStatus, missing, same_subscription
from xapp.submgr import ActionSpec, SubmgrClient, SubmgrError, SubscriptionSpec

log = logging.getLogger("weaver.xapp")

MT_INDICATION, MT_CONTROL_REQ, MT_CONTROL_ACK, MT_CONTROL_FAILURE = 12050, 12040, 12041, 12042
MT_ERROR_INDICATION = 10030

# RMR from hostile peers (issue 13). RMR itself authenticates nobody; these bound what a peer on the RMR
# port can cost. A KPM indication is a few KiB: a bigger one is refused before decoding. The endpoint
# bounds frames, buffered bytes and connections (xapp.rmr.endpoint); the python backend takes these.
RMR_BOUNDS = {"max_frame": 4 << 20, "max_buffered": 32 << 20, "max_connections": 256}
MAX_INDICATION_BYTES = 64 << 10
RX_BATCH = 64              # RMR messages handled per event-loop turn: ticks, REST and the broker get theirs
BAD_PER_SOURCE = 50        # undecodable frames per connection and second; past that its frames are dropped
BAD_PER_WINDOW = 200       # past this many from all sources together, every source that sent one is dropped
BAD_WINDOW_S = 1.0
SUBSCRIBE_AT_ONCE = 16     # REST subscriptions in flight together (each waits for SubMgr's notification)


@dataclass
class Counters:
    indications: int = 0
    rmr_other: int = 0
    controls_sent: int = 0
    controls_acked: int = 0
    controls_failed: int = 0
    control_replies_bad: int = 0
    control_replies_unmatched: int = 0   # decodable replies to no control of ours (another xApp's, late)
    grants: int = 0
    revocations: dict = field(default_factory=dict)
    send_errors: int = 0
    resubscriptions: int = 0          # subscriptions made again because SubMgr lost them or KPM went silent
    rmr_dropped: dict = field(default_factory=dict)   # reason -> RMR frames dropped undecoded (oversize, throttled)
    subscription_audits: int = 0      # checks of SubMgr's list that got an answer
    appmgr_registered: int = 0        # 1 once appmgr accepted our registration (xapp.appmgr)


@dataclass
class SiteCounters:
    """Per-site totals since start (the run summary of `weaver up` and the dashboard read them)."""

    kpm_indications: int = 0
    rc_controls_sent: int = 0
    rc_controls_acked: int = 0
    rc_controls_failed: int = 0
    leases_granted: int = 0
    sm_s_granted: float = 0.0   # each grant or renewal covers one control period at its size


def _log_task_death(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s died", task.get_coro().__qualname__, exc_info=task.exception())


def kpm_measurements(cfg: XappConfig, site_id: str, supported: frozenset[str] | None = None) -> tuple[MeasInfo, ...]:
    """What we ask every node of a site for: the configured names, plus per-slice PRB counters of the
    site's declared slices (quota sizing needs the best-effort share), plus the compute-aware policy inputs
    (xapp.inputs POLICY_INPUTS) the node's definition lists. `supported`: the names the node's RAN
    function description lists for report style 1 (None = unknown: ask for everything configured, but no
    vendor input a stock node would refuse the whole subscription for)."""
    site = cfg.site(site_id)
    ok = (lambda n: True) if not supported else (lambda n: n in supported or f"{n}.SNSSAI" in supported)
    names = list(cfg.e2.kpm_measurements)
    names += [n for n in POLICY_INPUTS if supported and n in supported and n not in names]
    out = [MeasInfo(n) for n in names if ok(n)]
    if ok("RRU.PrbUsedDl"):
        for s in (*site.protected_slices, *site.best_effort_slices):
            out.append(MeasInfo("RRU.PrbUsedDl", (MeasLabel(Snssai(s.sst, s.sd)),)))
    return tuple(out)


def supported_measurements(definition: bytes, version: KpmVersion) -> frozenset[str] | None:
    """Measurement names of report style 1 in a KPM RAN function description; None if unreadable."""
    if not definition:
        return None
    try:
        desc = decode_ran_function_description(definition, version)
    except (E2DecodeError, ValueError):
        return None
    style = desc.report_style(1)
    return frozenset(style.meas_names) if style is not None and style.meas_names else None


def kpm_request(cfg: XappConfig, node: E2Node) -> tuple[KpmVersion, tuple[MeasInfo, ...], bytes, bytes]:
    """What the xApp asks a node's KPM function for: (version, measurements, event trigger, action
    definition) -- the version `e2.kpm_version_override` names for the node, else its OID's. The bench's
    nodes are subscribed by this too (testbed.bench.liveloop)."""
    kpm = node.kpm
    override = cfg.e2.kpm_version_override.get(node.meid)
    version = {"v2.03": KpmVersion.V2_03, "v3.00": KpmVersion.V3_00, "v4.00": KpmVersion.V4_00}[override] if override else \
        kpm_version_from_oid(kpm.oid)
    site = cfg.site_of(node.meid)
    meas = kpm_measurements(cfg, site.site_id, supported_measurements(kpm.definition, version))
    trigger = encode_event_trigger(KpmEventTrigger(cfg.period_ms), version)
    action = encode_action_definition(KpmActionDefinition(1, ActionDefFormat1(meas, cfg.period_ms)), version) \
        if meas else b""
    return version, meas, trigger, action


# /health/ready gates on the RMR endpoint and SDL only, as both OSC frameworks do. The rest is reported:
# - subscriptions: the xapp-std chart's Services have no publishNotReadyAddresses, so a pod that is not
#   ready gets neither SubMgr's notification, rtmgr's routes nor e2term's indications; waiting for them
#   would deadlock. Their state is at /api/v1/subscriptions and /metrics.
# - leader: a follower replica is ready, or a rolling update (the new replica must be ready before the
#   old one, which holds the leader lease, stops) would deadlock.
# - broker: start() fails if the gRPC server does not bind; agents reach it whether we are ready or not.
READY_GATES = frozenset({"rmr", "sdl"})
REPORTED_ONLY = frozenset({"subscriptions", "broker", "leader"})


class XappApp:
    """The running xApp. REST handlers read it; only the loop task changes loop state."""

    def __init__(self, cfg: XappConfig, *, config_path: str | None = None, keep_subscriptions: bool = False,
                 clock=time.monotonic, wall=time.time, record_path: str | None = None,
                 allow_live_loosening: bool = False) -> None:
        self.cfg = cfg
        self.allow_live_loosening = allow_live_loosening   # the operator's flag: a config PUT may loosen RAN first
        self.record_path = record_path       # --record: every loop step's inputs and actions (xapp.record)
        self.recorder = None
        self.config_path = config_path
        self.keep_subscriptions = keep_subscriptions
        self.now, self.wall = clock, wall
        self.started = clock()
        self.counters = Counters()
        self.gc_policy = GcPolicy()
        self.metrics = XappMetrics(self)      # the Prometheus registry (xapp.metrics)
        self.site_counters: dict[str, SiteCounters] = {}
        self.controls_log: deque = deque(maxlen=1000)
        self.ingest = Ingest()
        self.ingest.set_limits(cfg.sites)        # physical bounds of KPM values per node (xapp.ingest)
        self.store: XappStore | None = None
        self.rmr = None
        self.broker: LeaseBroker | None = None
        self.submgr: SubmgrClient | None = None
        self.http: aiohttp.ClientSession | None = None
        self.rest_runner = None
        self.rest_port = 0
        self.nodes: dict[str, E2Node] = {}
        self.node_controls: dict[str, NodeControl] = {}
        self.subscriptions: dict[str, SubscriptionRecord] = {}      # meid -> live subscription
        self.subscribe_errors: dict[str, str] = {}
        self.state = new_state(cfg, clock())
        self.samples: list[KpmSample | KpmRefusal] = []
        self.results: list[ControlOutcome] = []
        self.releases: list[LeaseRelease] = []
        self.lost_nodes: set[str] = set()
        self.watcher = ConfigWatcher(config_path) if config_path else None
        self._wake = asyncio.Event()
        self._drops: dict[tuple[str, str], int] = {}
        self._bad_sources: dict[str, int] = {}       # RMR source -> bad frames in this window (handle_rmr)
        self._bad_total = 0
        self._bad_window_end = -math.inf
        self._pending_subs: dict[int, tuple] = {}
        self._xids_in_use: set[int] = set()     # the XappEventInstanceIds of subscriptions in flight
        self.last_kpm: dict[str, float] = {}
        self.resubscribe_after_s: float | None = None    # None: max(10 s, 50 periods)
        self._resubscribing: set[str] = set()
        # The subscription audit (xapp.subaudit): one status per wanted node, one audit and one
        # subscriber task at a time; a node that went silent is audited once per silence.
        self.sub_status: dict[str, SubscriptionStatus] = {
            m: SubscriptionStatus(meid=m, since_unix=wall()) for s in cfg.sites for m in s.nodes}
        self.last_audit_unix: float | None = None
        self._next_audit = -math.inf
        self._audit_task: asyncio.Task | None = None
        self._subscriber: asyncio.Task | None = None
        self._silence_audited: set[str] = set()
        self._audit_error = ""
        self._sub_wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self.epoch = 0
        # SDL leader lease: only its holder sends RC controls and grants (a second replica follows)
        self.leader_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.leader_until = -math.inf          # loop clock: we act as leader until then
        self.shards: ShardKeeper | None = None  # replicas.shards >= 1: the claims of this replica
        self._site_shard: dict[str, int] = {}           # replicas.shards: each site's shard (xapp.shards)
        self.lift_ack_wait_s = 0.5             # stop(): how long the shaping lift waits for its ACKs
        self._ledger_batched = False           # inside a tick's actions: lease entries wait for its end

    # ------------------------------------------------------------------ readiness
    def readiness(self) -> dict[str, bool]:
        # Not only made once: SubMgr still listed it at the last audit (a lost one is missing until remade).
        subs_ok = all(m in self.subscriptions and self._status(m).state == "active" for m in self._wanted())
        return {"rmr": self.rmr is not None, "sdl": self.store is not None and self.store.healthy(),
                "subscriptions": subs_ok, "broker": self.broker is not None and self.broker.server is not None,
                "leader": self.state.control_leader and self.state.controlled_sites != frozenset()}

    def subscription_view(self) -> dict:
        """Each wanted node's subscription state for REST and the dashboard (xapp.subaudit)."""
        now = self.now()
        subs = []
        wanted = self._wanted()
        for site in self.cfg.sites:
            for m in site.nodes:
                if m not in wanted:           # another replica's shard: its subscription, not ours
                    continue
                last = self.last_kpm.get(m)
                subs.append({**self._status(m).view(), "site_id": site.site_id,
                             "kpm_age_s": None if last is None or m not in self.subscriptions else round(now - last, 3)})
        return {"subscriptions": subs, "audit_period_s": self.cfg.submgr.audit_period_s,
                "last_audit_unix": self.last_audit_unix, "resubscriptions": self.counters.resubscriptions}

    def ready(self) -> bool:
        """What /health/ready and the appmgr registration gate on: READY_GATES (RMR and SDL up)."""
        parts = self.readiness()
        return all(parts[k] for k in READY_GATES)

    # ------------------------------------------------------------------ leadership, lease wait, control ids
    def _wait_out_leases(self, leases: list[LeaseRecord], whose: str, sites: set[str] | None = None) -> float:
        """Grant nothing until every lease another instance may have issued has passed its hard end (its
        agent may act on it until then; RAN first), and count those leases in their sites' invariant
        meanwhile. Returns the wait in seconds from now.

        Two kinds: the ledger's leases of another epoch, each to its own hard end; and, for one lease
        lifetime from now, one of the largest size a site allows (its GPU less the guard) that the ledger
        may not hold: a grant whose SDL write failed, a previous instance's on an embedded store that forgot
        it, a leader's grant just before it stepped down. No envelope may loosen beside either.

        `sites`: only those (a shard taken over: the wait is theirs, not every site's)."""
        if sites is not None:
            leases = [r for r in leases if r.site_id in sites]
        end = previous_leases_end(leases, self.epoch)
        wall, now = self.wall(), self.now()
        lifetime = self.cfg.lease_valid_periods * self.cfg.period_s
        for sid, rt in self.state.sites.items():
            if sites is None or sid in sites:
                rt.safety.inherit_unknown(now, now + lifetime)
        for r in leases:
            rt = self.state.sites.get(r.site_id)
            if r.epoch != self.epoch and r.valid_until_unix > wall and rt is not None:
                rt.safety.inherit(r.sm_count, now + r.issued_unix - wall, now + r.valid_until_unix - wall)
        wait = max(lifetime, 0.0 if end is None else end - wall)
        if wait > 0:
            nb = self.now() + wait
            if sites is None:
                self.state.grant_not_before = max(self.state.grant_not_before, nb)
            else:
                until = self.state.site_grant_not_before
                for sid in sites:
                    until[sid] = max(until.get(sid, -math.inf), nb)
            log.info("no grant for %.2f s: %s leases may be acted on until then", wait, whose)
        return max(0.0, wait)

    # ------------------------------------------------------------------ shards (replicas.shards >= 1)
    def _start_shards(self) -> None:
        """Several active replicas: this one controls the sites of the shards it claims (xapp.shards)."""
        n = self.cfg.shards
        self._site_shard = shard_map((s.site_id for s in self.cfg.sites), n)   # fixed: sites and n are start-up
        self.state.controlled_sites = frozenset()
        self.shards = ShardKeeper(
            self.store, self.leader_id, n, gained=self._shard_gained,
            lost=lambda k, why: self._shard_ended(k, "lost-shard", why),
            handing_over=lambda k: self._shard_ended(k, "shard-handover", "assigned to another replica"))
        log.info("replica %s: %d shards over the live replicas", self.leader_id, n)
        self._tick_shards()

    def _broker_of(self, site_id: str) -> str | None:
        """For the broker: None if this replica controls the site now, else the broker of the replica whose
        claim does ("" when none does, or SDL cannot say)."""
        wall, k = self.wall(), self._site_shard[site_id]
        if self.shards.controls(k, wall):
            return None
        try:
            claim = self.store.shard_claims().get(k)
            brokers = self.store.replica_brokers(wall)
        except Exception as exc:  # noqa: BLE001 - the agent tries its other brokers
            log.warning("shard %d's owner not read: %s", k, exc)
            return ""
        return brokers.get(claim.owner, "") if claim is not None and claim.live(wall) else ""

    def _shard_sites(self, k: int) -> set[str]:
        return {sid for sid, shard in self._site_shard.items() if shard == k}

    def _tick_shards(self) -> None:
        self.shards.tick(self.wall())
        self._refresh_controlled()

    def _refresh_controlled(self) -> None:
        """The sites this replica acts on now: those of the shards it holds, each until its claim's expiry
        less the skew (so also when the claims' renewals stop getting through)."""
        if self.shards is None:
            return
        wall = self.wall()
        self.state.controlled_sites = frozenset(sid for sid, k in self._site_shard.items()
                                                if self.shards.controls(k, wall))

    def _shard_gained(self, k: int, claim) -> None:
        """A shard taken (at start, from a dead replica, or handed over): its nodes' envelopes are unknown
        (another replica controlled them), and its sites grant nothing until every lease another replica
        may have issued for them has passed its hard end."""
        sites = self._shard_sites(k)
        try:
            leases = self.store.leases()
        except Exception as exc:  # noqa: BLE001 - then the lifetime bound alone
            log.warning("ledger not read at the takeover of shard %d: %s", k, exc)
            leases = []
        for sid in sites:
            rt = self.state.sites.get(sid)
            if rt is None:
                continue
            for m in rt.cfg.nodes:
                rt.safety.node_unknown(m, "shard-taken")
            rt.grant_sms = 0
            self.ledger.restart(sid)
        self._wait_out_leases(leases, f"shard {k}'s earlier owners'", sites=sites)
        self._end_others_leases(leases, sites)
        log.warning("shard %d taken (epoch %d): controlling %d sites", k, claim.epoch, len(sites))
        self._refresh_controlled()
        self._wake.set()
        if self.submgr is not None:      # its nodes' KPM comes to us from now on (at start: the first subscriber)
            self._ensure_subscriber()

    def _shard_ended(self, k: int, reason: str, why: str) -> None:
        """A shard that is not ours any more (lost, or handed over): stop controlling, revoke its leases."""
        self._refresh_controlled()
        self._revoke_sites(sorted(self._shard_sites(k)), reason, close_streams=True)
        log.warning("shard %d ended (%s): its sites' leases revoked, their agents' streams closed", k, why)
        self._wake.set()
        for sid in self._shard_sites(k):     # its KPM is the next owner's: our subscriptions go
            for m in self.cfg.site(sid).nodes:
                rec = self.subscriptions.get(m)
                if rec is not None and self.submgr is not None and not self._stopping:
                    self._spawn(self._delete_subscription(rec))

    def _take_leadership(self, now: float, *, at_start: bool = False,
                         leases: list[LeaseRecord] | None = None) -> bool:
        """Acquire (follower) or renew (leader) the SDL leader lease; True if we hold it now. A refused
        renewal, or none accepted within the lease's lifetime, ends our leadership at once."""
        was = self.state.control_leader and not at_start
        try:
            ok = (self.store.renew_leader if was else self.store.acquire_leader)(self.leader_id, LEADER_TTL_S,
                                                                                self.wall())
        except Exception as exc:  # noqa: BLE001 - SDL down: unknown; the local expiry decides
            log.warning("leader lease %s failed: %s", "renewal" if was else "acquisition", exc)
            ok = None
        if ok:
            self.leader_until = now + LEADER_TTL_S - LEADER_SKEW_S
            if not was:
                self._became_leader(at_start, leases or [])
        elif at_start:
            self.state.control_leader = False
            holder = None
            with contextlib.suppress(Exception):
                holder = self.store.leader()
            log.warning("follower: the leader lease is held by %s; no RC control, no grant until it is ours",
                        holder[0] if holder else "?")
        elif was and (ok is False or self.now() >= self.leader_until):
            self._lost_leadership("renewal refused" if ok is False else "not renewed within its lifetime")
        return self.state.control_leader

    def _became_leader(self, at_start: bool, leases: list[LeaseRecord]) -> None:
        self.state.control_leader = True
        if at_start:
            log.info("leader lease taken (%s)", self.leader_id)
        else:
            # Taking over from another replica: wait out its leases (the ledger, and at least one lease
            # lifetime for a grant it made just before it stepped down) and go on with its control ids.
            cursor = None
            try:
                leases, cursor = self.store.leases(), self.store.control_cursor()
            except Exception as exc:  # noqa: BLE001 - then the lifetime bound alone
                log.warning("ledger not read at takeover: %s", exc)
            if cursor is not None:
                self.state.next_control_id = (cursor % 0xFFFF) + 1
            self._wait_out_leases(leases, "the previous leader's")
            log.warning("leader lease taken over (%s): controlling the nodes from now on", self.leader_id)
            self._wake.set()
        self.ledger.restart()
        self._end_others_leases(leases)

    def _end_others_leases(self, leases: list[LeaseRecord], sites: set[str] | None = None) -> None:
        """A takeover (of every site, or of `sites`): the ledger's leases of other epochs are ours to close,
        nobody renews them any more."""
        try:
            for lease in leases:
                if (sites is None or lease.site_id in sites) and not lease.ended and lease.epoch != self.epoch:
                    self.store.put_lease(replace(lease, ended="epoch-ended"))
        except Exception as exc:  # noqa: BLE001 - SDL hiccup: the entries expire on their own
            log.warning("ledger not updated at takeover: %s", exc)

    def _revoke_sites(self, sites, reason: str, *, close_streams: bool = False) -> None:
        """Stop granting for `sites` and revoke their leases; `close_streams`: also close their agents' streams,
        so that an agent registers again and is sent to the replica that controls its site now."""
        for sid in sites:
            rt = self.state.sites.get(sid)
            if rt is None:
                continue
            rt.grant_sms = 0
            if self.broker is None:
                continue
            if self.broker.revoke(sid, reason):
                self.counters.revocations[reason] = self.counters.revocations.get(reason, 0) + 1
            if close_streams:
                self.broker.drop(sid, f"{reason}: another replica controls the site")

    def _lost_leadership(self, why: str) -> None:
        """Another replica may control the nodes from now on: stop controlling, revoke every lease."""
        self.state.control_leader = False
        self.leader_until = -math.inf
        log.error("leader lease lost (%s): no RC control, no grant; revoking every lease", why)
        self._revoke_sites(list(self.state.sites), "lost-leadership")
        self._wake.set()

    def note_control_id(self, control_id: int) -> None:
        """Remember the last RC control id sent (a restart goes on after it); SDL errors are logged."""
        try:
            self.store.put_control_cursor(control_id)
        except Exception as exc:  # noqa: BLE001 - SDL down: the control is sent anyway
            log.warning("control id cursor not saved: %s", exc)

    async def _lift_shaping(self) -> int:
        """Shutdown: every envelope-mode node back to the whole GPU, caps cleared (a node left shaped
        throttles the RAN for nobody). Waits out the leases the agents may still act on first (the
        rule: a looser envelope waits for the SMs it gives back), then up to `lift_ack_wait_s` for the
        ACKs. Returns how many were acknowledged."""
        if self.rmr is None or not self.state.control_leader:
            return 0                                # a follower's nodes are the leader's to control
        # The loop task is gone: what it would have learnt, we set. broker.stop revoked every lease, and
        # a control still in flight is overtaken by the lift behind it on the same RMR connection.
        for rt in self.state.sites.values():
            rt.grant_sms = 0
        # Controls to a node share its RIC instance ID and are answered in order: the replies of those
        # still in flight come before the lift's own.
        ahead: dict[tuple[str, int], int] = {}
        for p in (*self.state.pending.values(), *self.state.orphans.values()):
            k = (p.control.meid, p.control.wire_instance)
            ahead[k] = ahead.get(k, 0) + 1
        self.state.busy_nodes.clear()
        held = [h.hard_end for rt in self.state.sites.values()
                for h in rt.safety.held(self.now())]
        if held:
            await asyncio.sleep(max(0.0, min(max(held) - self.now(),
                                             self.cfg.lease_valid_periods * self.cfg.period_s)) + 1e-3)
        try:
            controls = lift_shaping(self.state, self.now())
        except Exception:  # noqa: BLE001 - the shutdown goes on: leases are revoked already
            log.exception("shaping not lifted at shutdown")
            return 0
        waiting: dict[tuple[str, int], int] = {}    # (meid, instance) -> earlier replies still to come
        for c in controls:
            try:
                await self.rmr.send(RmrMessage(mtype=MT_CONTROL_REQ, payload=c.payload, meid=c.meid,
                                               sub_id=c.wire_instance))
            except RmrError as exc:
                log.warning("shaping lift to %s not sent: %s", c.meid, exc)
                continue
            self.counters.controls_sent += 1
            waiting[(c.meid, c.wire_instance)] = ahead.get((c.meid, c.wire_instance), 0)
            self.note_control_id(c.control_id)
        acked, deadline = 0, self.now() + self.lift_ack_wait_s
        while waiting and self.now() < deadline:       # the rx task is gone: read the replies here
            try:
                msg = await self.rmr.receive(timeout=max(0.0, deadline - self.now()))
            except (TimeoutError, RmrError):
                break
            if msg.mtype not in (MT_CONTROL_ACK, MT_CONTROL_FAILURE):
                continue
            with contextlib.suppress(E2DecodeError, ValueError):
                r = parse_control_reply(msg.payload)
                k = (msg.meid, r.instance)
                if k in waiting and r.requestor == CONTROL_REQUESTOR:
                    if waiting[k]:
                        waiting[k] -= 1               # a control sent before the lift
                    else:
                        del waiting[k]
                        acked += int(r.ok)
        log.info("shaping lifted at shutdown: %d controls, %d acknowledged", len(controls), acked)
        return acked

    # ------------------------------------------------------------------ start
    async def start(self, *, rest_port: int | None = None, broker_listen: str | None = None,
                    rmr_port: int | None = None) -> None:
        from xapp import lograte
        from xapp.rest import start_rest

        lograte.install()       # peers decide how often some lines are logged (stray RMR frames, bad HTTP)
        cfg = self.cfg
        self.store = open_store(cfg.sdl_namespace)
        self.ledger = LeaseLedger(self.store)
        snap = self.store.snapshot()
        self.epoch = self.store.next_epoch()
        log.info("SDL %s: %d subscriptions, %d sites, %d ledger entries; broker epoch %d", self.store.backend,
                 len(snap.subscriptions), len(snap.sites), len(snap.leases), self.epoch)
        self.state = new_state(cfg, self.now(), snap.cost_models)
        if self.record_path:
            from xapp.record import LoopRecorder
            self.recorder = LoopRecorder(self.record_path)
            self.recorder.begin(self.state, snap.cost_models)
        # What the nodes last acknowledged is shown, never trusted: a node may have restarted while we
        # were down, so every envelope is unknown (the whole GPU) until a node acknowledges one again.
        for sid, rec in snap.sites.items():
            rt = self.state.sites.get(sid)
            if rt is not None:
                rt.acked_caps = tuple(SliceQuota(sst=sst, sd=None if sd < 0 else sd, max_ratio=ratio)
                                      for _meid, sst, sd, ratio in rec.caps)
        if snap.control_cursor is not None:             # RC control ids go on where the last run stopped
            self.state.next_control_id = (snap.control_cursor % 0xFFFF) + 1
        self._wait_out_leases(snap.leases, "a previous instance's")
        if cfg.shards:
            self._start_shards()
        else:
            self._take_leadership(self.now(), at_start=True, leases=snap.leases)
        port = cfg.rmr.port if rmr_port is None else rmr_port
        try:
            self.rmr = await open_backend(cfg.rmr.backend, port, cfg.rmr.route_table, **RMR_BOUNDS)
        except NativeUnavailable as exc:
            # "native when configured and available": the pure-Python endpoint speaks the same wire
            log.warning("RMR native backend unavailable (%s); using the python backend", exc)
            self.rmr = await open_backend("python", port, cfg.rmr.route_table, **RMR_BOUNDS)
        log.info("RMR (%s backend) on port %d", cfg.rmr.backend, self.rmr.port)
        if hasattr(self.rmr, "health_status"):     # RMR health check (mtype 100): "ERR <reason>" when SDL is down
            self.rmr.health_status = lambda: None if self.store.healthy() else "SDL unreachable"
        self.rest_runner, self.rest_port = await start_rest(self, cfg.rest.port if rest_port is None else rest_port,
                                                              cfg.rest.host)
        log.info("REST on port %d", self.rest_port)
        b = cfg.broker
        self.broker = LeaseBroker(cfg, AgentBook(epoch=self.epoch, period_ms=cfg.period_ms,
                                                 valid_periods=cfg.lease_valid_periods, heartbeat_ms=b.heartbeat_ms,
                                                 timeout_heartbeats=b.agent_timeout_heartbeats),
                                  now=self.now, wall=self.wall, on_lease=self._ledger, on_release=self._released)
        if self.shards is not None:
            self.broker.serves = self._broker_of
        port = await self.broker.start(broker_listen)
        log.info("lease broker on port %d (epoch %d)", port, self.epoch)
        if self.shards is not None:
            self.shards.address = advertised_broker(broker_listen or b.listen, port)
            self._tick_shards()          # the other replicas' brokers redirect to ours from now on
        self.http = aiohttp.ClientSession()
        self.submgr = SubmgrClient(replace(cfg.submgr, http_port=self.rest_port or cfg.submgr.http_port,
                                           rmr_port=self.rmr.port), self.http, on_instance=self._early_instance)
        self._subscriber = asyncio.ensure_future(self._subscribe_all(snap.subscriptions))
        self._tasks = [asyncio.ensure_future(self._rx()), asyncio.ensure_future(self._run_loop()), self._subscriber]
        for t in self._tasks:  # a background task that dies must say so, not vanish with its exception
            t.add_done_callback(_log_task_death)
        if self.watcher is not None:
            self.watcher.poll()                         # the digest of the config we started with
        # Codec tables (pycrate, asn1tools) are large, long-lived object graphs, and so become the loop's
        # histories: out of the collector's reach, or a full collection stalls the loop for tens of ms.
        self.gc_policy.settle()
        self._tasks.append(asyncio.ensure_future(self._watch()))

    # ------------------------------------------------------------------ discovery + subscriptions
    def _wanted(self) -> set[str]:
        """The nodes this instance subscribes to: every site's, or with shards those of the shards it holds
        (a shard's KPM goes to its owner only; another replica's nodes are its own to subscribe)."""
        if self.shards is None:
            return {m for s in self.cfg.sites for m in s.nodes}
        held = self.shards.held
        return {m for s in self.cfg.sites if self._site_shard[s.site_id] in held for m in s.nodes}

    def _discover(self) -> dict[str, E2Node]:
        wanted = self._wanted()
        if self.cfg.e2.discovery == "rnib":
            nodes, problems = read_rnib(self.store.sdl)
            for p in problems:
                log.warning("R-NIB: %s", p)
        else:
            nodes = static_nodes(self.cfg.e2)
        return {n.meid: n for n in nodes if n.meid in wanted}

    def _spec(self, node: E2Node, xid: int) -> tuple[SubscriptionSpec, KpmVersion, tuple[MeasInfo, ...]]:
        kpm = node.kpm
        version, meas, trigger, action = kpm_request(self.cfg, node)
        site = self.cfg.site_of(node.meid)
        if not meas:
            raise SubmgrError(f"{node.meid} supports none of the configured KPM measurements")
        if len(meas) < len(kpm_measurements(self.cfg, site.site_id)) and \
                supported_measurements(kpm.definition, version) is not None:
            log.info("%s: asking for %s (the rest is not in its RAN function description)", node.meid,
                     ", ".join(str(m.name) for m in meas))
        spec = SubscriptionSpec(meid=node.meid, ran_function_id=kpm.ran_function_id, xapp_event_instance_id=xid,
                                event_trigger=trigger, actions=(ActionSpec(action_id=1, definition=action),))
        return spec, version, meas

    async def _subscribe_all(self, remembered: list[SubscriptionRecord]) -> None:
        by_meid = {r.meid: r for r in remembered}
        wanted = self._wanted()
        every = {m for s in self.cfg.sites for m in s.nodes}
        # Subscriptions a previous run left for nodes we no longer want: delete, do not leak. (With shards, a
        # node of another replica's shard keeps its record: the owner's, or the next owner's to replace.)
        for r in remembered:
            if r.meid not in (every if self.shards is not None else wanted):
                await self._delete_subscription(r)
        delay = 0.2
        while not self._stopping:
            wanted = self._wanted()
            todo = wanted - set(self.subscriptions) - set(by_meid)
            if self.shards is not None and todo:   # a node taken over: its last owner's record, to delete, not leak
                try:
                    for r in self.store.subscriptions():
                        if r.meid in wanted and r.meid not in self.subscriptions and r.owner != self.leader_id:
                            by_meid.setdefault(r.meid, r)
                except Exception as exc:  # noqa: BLE001 - SDL hiccup: subscribe anyway
                    log.warning("subscription records not read: %s", exc)
            try:
                nodes = self._discover()
            except Exception as exc:  # noqa: BLE001 - SDL hiccup: retry
                log.warning("node discovery failed: %s", exc)
                nodes = {}
            # A node whose old subscription is still being deleted waits: an identical POST before the
            # DELETE is done would be merged by SubMgr into the one about to go.
            jobs: list[tuple[E2Node, SubscriptionRecord | None]] = []
            for meid in sorted(wanted - set(self.subscriptions) - self._resubscribing):
                node = nodes.get(meid)
                st = self._status(meid)
                if node is None or not node.connected or node.kpm is None:
                    why = "node not in R-NIB or not connected" if node is None or \
                        not node.connected else "node has no KPM function"
                    self.subscribe_errors[meid] = why
                    if st.state != "pending":
                        st.enter("failed", self.wall(), why)
                    continue
                self.nodes[meid] = node
                nc = node_control(node, self.cfg.actuation)
                self.node_controls[meid] = nc
                set_node(self.state, nc)
                if st.state != "pending":
                    st.enter("resubscribing", self.wall())
                jobs.append((node, by_meid.pop(meid, None)))
            await self._subscribe_each(jobs)
            if wanted <= set(self.subscriptions):
                return
            with contextlib.suppress(TimeoutError):     # a heal cuts the backoff short
                await asyncio.wait_for(self._sub_wake.wait(), delay)
            delay = 0.2 if self._sub_wake.is_set() else min(delay * 2, 5.0)
            self._sub_wake.clear()

    async def _subscribe_each(self, jobs: list[tuple[E2Node, SubscriptionRecord | None]]) -> None:
        """Up to SUBSCRIBE_AT_ONCE subscriptions in flight (one at a time, a region's 1,000 nodes took minutes
        to subscribe: each waits for SubMgr's notification); the first unexpected error is raised after all."""
        gate = asyncio.Semaphore(SUBSCRIBE_AT_ONCE)

        async def one(node: E2Node, old: SubscriptionRecord | None) -> None:
            async with gate:
                await self._subscribe(node, old)
        results = await asyncio.gather(*(one(n, o) for n, o in jobs), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    def _status(self, meid: str) -> SubscriptionStatus:
        return self.sub_status.setdefault(meid, SubscriptionStatus(meid=meid, since_unix=self.wall()))

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        task.add_done_callback(_log_task_death)
        self._tasks = [t for t in self._tasks if not t.done()] + [task]    # stop() cancels what is left
        return task

    def _ensure_subscriber(self) -> None:
        """Subscribe what is wanted and not live: wake the running subscriber, or start one."""
        if self._stopping:
            return
        if self._subscriber is not None and not self._subscriber.done():
            self._sub_wake.set()
        else:
            self._subscriber = self._spawn(self._subscribe_all([]))

    def _forget(self, rec: SubscriptionRecord) -> None:
        """Drop a subscription locally (SDL record, KPM route, live set); SubMgr is the caller's business."""
        try:
            self.store.delete_subscription(rec.meid, rec.ran_function_id)
        except Exception as exc:  # noqa: BLE001 - SDL down: a restart verifies it against SubMgr's list
            log.warning("subscription record %s not deleted: %s", rec.subscription_id, exc)
        self.ingest.remove(rec.e2_event_instance_id)
        if self.subscriptions.get(rec.meid) is rec:
            self.subscriptions.pop(rec.meid)
            set_control_tag(self.state, rec.meid, None)      # its sub_id no longer routes replies to us

    def _heal(self, rec: SubscriptionRecord, why: str, *, delete: bool) -> None:
        """Subscribe `rec`'s node again. `delete`: SubMgr still holds `rec` (silent KPM), delete it first;
        otherwise SubMgr lost it already. Readiness is false from here until the new one is active."""
        meid = rec.meid
        self._resubscribing.add(meid)
        self._forget(rec)
        self.counters.resubscriptions += 1
        st = self._status(meid)
        st.resubscriptions += 1
        st.enter("resubscribing" if delete else "missing", self.wall(), why)

        async def again() -> None:
            try:
                if delete:
                    try:
                        await self.submgr.unsubscribe(rec.subscription_id)
                    except SubmgrError as exc:
                        log.warning("could not delete subscription %s: %s", rec.subscription_id, exc)
            finally:
                self._resubscribing.discard(meid)
                self.last_kpm[meid] = self.now()        # the silence clock restarts with the new one
            self._ensure_subscriber()
        self._spawn(again())

    def _start_audit(self, why: str) -> bool:
        """Check SubMgr's list now (one audit at a time); the next periodic one is a period from now."""
        if self.submgr is None or self._stopping or (self._audit_task is not None and not self._audit_task.done()):
            return False
        self._next_audit = self.now() + self.cfg.submgr.audit_period_s
        self._audit_task = self._spawn(self._audit(why))
        return True

    async def _audit(self, why: str) -> None:
        """Every live subscription that SubMgr's list no longer holds is made again."""
        # Only what was live before the GET: one made meanwhile may be newer than the list.
        before = dict(self.subscriptions)
        try:
            live = await self.submgr.list(attempts=1)
        except SubmgrError as exc:
            for m in before:
                self._status(m).check_error = str(exc)[:300]
            if str(exc) != self._audit_error:            # once per distinct failure, not every period
                log.warning("subscription audit (%s): %s", why, exc)
            self._audit_error = str(exc)
            return
        self._audit_error = ""
        self.counters.subscription_audits += 1
        now = self.last_audit_unix = self.wall()
        for st in self.sub_status.values():
            st.last_checked_unix, st.check_error = now, ""
        for rec in missing(before.values(), live):
            if self.subscriptions.get(rec.meid) is not rec or rec.meid in self._resubscribing:
                continue
            log.warning("%s: subscription %s (sub_id %d) is gone at SubMgr (audit: %s); subscribing again",
                        rec.meid, rec.subscription_id, rec.e2_event_instance_id, why)
            self._heal(rec, f"missing at SubMgr (audit: {why})", delete=False)

    async def _subscribe(self, node: E2Node, old: SubscriptionRecord | None) -> None:
        xid = sum(node.meid.encode()) % 60000 + 1
        while xid in self._xids_in_use:       # subscriptions in flight together: an instance id each
            xid = xid % 60000 + 1
        self._xids_in_use.add(xid)
        try:
            await self._subscribe_as(node, old, xid)
        finally:
            self._xids_in_use.discard(xid)

    async def _subscribe_as(self, node: E2Node, old: SubscriptionRecord | None, xid: int) -> None:
        try:
            spec, version, meas = self._spec(node, xid)
        except (SubmgrError, ValueError) as exc:       # unknown KPM OID, nothing to ask for, refused encode
            # Retried every few seconds until the node or the config changes: log a new reason once.
            if self.subscribe_errors.get(node.meid) != str(exc):
                log.warning("%s: cannot subscribe: %s", node.meid, exc)
            self.subscribe_errors[node.meid] = str(exc)
            self._status(node.meid).enter("failed", self.wall(), str(exc)[:300])
            if old is not None:                          # a previous run's subscription we cannot reuse
                await self._delete_subscription(old)
            return
        keys = tuple(meas_key(m.name, m.labels[0]) for m in meas)
        # With shards a record is reused only by the replica that made it: another's routes its KPM elsewhere
        mine = self.shards is None or old is None or old.owner == self.leader_id
        if old is not None and mine and old.e2_event_instance_id and old.ran_function_id == spec.ran_function_id \
                and old.period_ms == self.cfg.period_ms and old.kpm_version == version.name:
            try:
                live = await self.submgr.list()
            except SubmgrError as exc:
                live = None
                log.warning("cannot list SubMgr subscriptions (%s); reusing %s unverified", exc, old.subscription_id)
            if live is None or any(same_subscription(d, old) for d in live):
                log.info("%s: reusing subscription %s (sub_id %d)", node.meid, old.subscription_id,
                         old.e2_event_instance_id)
                self._activate(old, version, keys)
                return
        if old is not None:
            await self._delete_subscription(old)
        self._pending_subs[xid] = (node.meid, spec.ran_function_id, version, keys)
        try:
            out = await self.submgr.subscribe(spec)
        except SubmgrError as exc:
            self._pending_subs.pop(xid, None)
            for sub_id, sub in list(self.ingest.subs.items()):     # an early route for a failed subscription
                if sub.meid == node.meid:
                    self.ingest.remove(sub_id)
            self.subscribe_errors[node.meid] = str(exc)
            self._status(node.meid).enter("failed", self.wall(), str(exc)[:300])
            log.warning("%s: subscription failed: %s", node.meid, exc)
            return
        self._pending_subs.pop(xid, None)
        rec = SubscriptionRecord(subscription_id=out.subscription_id, meid=node.meid,
                                 ran_function_id=spec.ran_function_id, xapp_event_instance_id=xid,
                                 e2_event_instance_id=out.e2_event_instance_id, kpm_version=version.name,
                                 period_ms=self.cfg.period_ms, created_unix=self.wall(),
                                 owner=self.leader_id if self.shards is not None else "")
        self.store.put_subscription(rec)
        log.info("%s: subscribed %s (sub_id %d, KPM %s)", node.meid, rec.subscription_id,
                 rec.e2_event_instance_id, version.name)
        self._activate(rec, version, keys)

    def _early_instance(self, inst) -> None:
        """A notification names the RMR sub_id before `subscribe` returns; route its KPM from now on."""
        pending = self._pending_subs.get(inst.xapp_event_instance_id)
        if pending is not None and inst.e2_event_instance_id not in self.ingest.subs:
            meid, fn, version, keys = pending
            self.ingest.add(KpmSubscription(inst.e2_event_instance_id, meid, fn, version, keys))

    def _activate(self, rec: SubscriptionRecord, version: KpmVersion, keys: tuple[str, ...]) -> None:
        self.last_kpm[rec.meid] = self.now()          # the silence clock starts at activation
        self.subscriptions[rec.meid] = rec
        self.subscribe_errors.pop(rec.meid, None)
        st = self._status(rec.meid)
        st.enter("active", self.wall())
        st.subscription_id, st.sub_id = rec.subscription_id, rec.e2_event_instance_id
        set_control_tag(self.state, rec.meid, rec.e2_event_instance_id)   # controls' replies route by it
        self.ingest.add(KpmSubscription(rec.e2_event_instance_id, rec.meid, rec.ran_function_id, version, keys))

    async def _delete_subscription(self, rec: SubscriptionRecord) -> None:
        try:
            await self.submgr.unsubscribe(rec.subscription_id)
        except SubmgrError as exc:
            log.warning("could not delete subscription %s: %s", rec.subscription_id, exc)
            return
        self._forget(rec)

    # ------------------------------------------------------------------ RMR in
    async def _rx(self) -> None:
        # receive() does not yield while messages are queued: without the explicit yield a flood already
        # queued (up to the endpoint's queue_size) would hold the loop tick until all of it was handled.
        n = 0
        while True:
            try:
                msg = await self.rmr.receive()
            except RmrError:
                return
            self.handle_rmr(msg)
            n += 1
            if n >= RX_BATCH:
                n = 0
                await asyncio.sleep(0)

    def _rmr_source(self, msg: RmrMessage) -> str:
        # The connection it came on (python backend), else the src it claims: RMR authenticates nobody,
        # but a flooder's own socket is not the E2 termination's.
        return getattr(msg.via, "peer", None) or msg.src

    def _throttled(self, source: str, now: float) -> bool:
        """True when `source` sent too many bad frames this window: its frames are dropped undecoded, so
        a flood costs a dict lookup per frame, not a decode. A source with no bad frame is never held up."""
        if now >= self._bad_window_end or len(self._bad_sources) > 4096:
            self._bad_sources.clear()
            self._bad_total = 0
            self._bad_window_end = now + BAD_WINDOW_S
        n = self._bad_sources.get(source, 0)
        return n >= BAD_PER_SOURCE or (n > 0 and self._bad_total >= BAD_PER_WINDOW)

    def _bad_frame(self, source: str) -> None:
        self._bad_sources[source] = self._bad_sources.get(source, 0) + 1
        self._bad_total += 1

    def _rmr_drop(self, reason: str, msg: RmrMessage) -> None:
        n = self.counters.rmr_dropped[reason] = self.counters.rmr_dropped.get(reason, 0) + 1
        if n <= 5 or n & (n - 1) == 0:
            log.warning("RMR frame dropped undecoded (%s; mtype %d, %d bytes, from %s; %d so far)", reason,
                        msg.mtype, len(msg.payload), self._rmr_source(msg) or "?", n)

    def handle_rmr(self, msg: RmrMessage) -> None:
        """One received RMR message; bad ones are counted and logged, nothing else changes. Cheap checks
        first (size, the sender's bad-frame budget), so a flood of bad frames cannot starve the loop."""
        now = self.now()
        source = self._rmr_source(msg)
        if self._throttled(source, now):
            self._rmr_drop("throttled", msg)
            if self._bad_sources.get(source, 0) >= BAD_PER_SOURCE and hasattr(self.rmr, "hold"):
                # past its own budget: stop reading that connection for the rest of the window, so the
                # flood waits in the kernel rather than ahead of the E2 termination's frames in our queue
                self.rmr.favour(msg.via, False)
                self.rmr.hold(msg.via, max(0.0, self._bad_window_end - now))
            return
        if msg.mtype == MT_INDICATION:
            if len(msg.payload) > MAX_INDICATION_BYTES:
                self._bad_frame(source)
                self._rmr_drop("oversize", msg)
                return
            try:
                sample = self.ingest.indication(msg.sub_id, msg.meid, msg.payload, now)
                self.samples.append(sample)
                if not getattr(msg.via, "favoured", True) and not self._bad_sources.get(source):
                    self.rmr.favour(msg.via)   # it carries real KPM: its frames go ahead of other connections
                self.last_kpm[sample.meid] = now
                self.counters.indications += 1
                site = self.cfg.site_of(msg.meid)
                if site is not None:
                    self.site_tally(site.site_id).kpm_indications += 1
                return          # samples wait for the period tick; only control replies wake the loop
            except IngestError as exc:
                if isinstance(exc, KpmValueError):
                    self.samples.append(exc.refusal)   # the loop: this node is not fresh until a valid frame
                # A frame that cost a decode counts against its connection's budget - but not a refused value:
                # it costs no more than a valid frame (valid frames are never throttled either), and on a real
                # RIC every node's KPM shares e2term's one connection, so one node's nonsense must not
                # throttle the others (that node is not fresh anyway, and counted per node).
                elif exc.kind != "unknown-node" and msg.sub_id in self.ingest.subs:
                    self._bad_frame(source)
                key = (exc.kind, msg.meid)
                if key not in self._drops and len(self._drops) >= 1024:     # meids are the peer's choice
                    self._drops.clear()
                n = self._drops[key] = self._drops.get(key, 0) + 1
                if n <= 5 or n & (n - 1) == 0:       # per kind and node: 1..5, then powers of two (no flood)
                    log.warning("indication dropped (node %r, mtype %d, %d so far): %s", msg.meid, msg.mtype, n, exc)
                return
        elif msg.mtype in (MT_CONTROL_ACK, MT_CONTROL_FAILURE):
            try:
                r = parse_control_reply(msg.payload)
            except (E2DecodeError, ValueError) as exc:
                self._bad_frame(source)
                n = self.counters.control_replies_bad = self.counters.control_replies_bad + 1
                if n <= 5 or n & (n - 1) == 0:
                    log.warning("control reply dropped (node %r, mtype %d, %d so far): %s", msg.meid, msg.mtype,
                                n, exc)
                return
            out = ControlOutcome(instance=r.instance, ok=r.ok, cause=r.cause, meid=msg.meid, requestor=r.requestor)
            if reply_owner(self.state, out) is None:
                # on a RIC with several xApps the default route brings other xApps' replies here
                self.counters.control_replies_unmatched += 1
                return
            self.results.append(out)
        else:                   # cheap to refuse: not held against the source (an E2 term may relay some)
            n = self.counters.rmr_other = self.counters.rmr_other + 1
            if n <= 5 or n & (n - 1) == 0:
                log.info("RMR mtype %d from %r ignored (%d so far)", msg.mtype, msg.meid, n)
            return
        self._wake.set()

    # ------------------------------------------------------------------ the loop
    async def _run_loop(self) -> None:
        ticks = 0
        while not self._stopping:
            timeout = max(0.0, next_deadline(self.state) - self.now())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            ticked = self.now() >= self.state.next_tick
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - a bug must not leave leases running on a dead loop
                log.exception("control loop step failed; revoking every lease (fail-safe)")
                for site_id in list(self.state.sites):
                    self.state.sites[site_id].grant_sms = 0
                    if self.broker is not None:
                        self.broker.revoke(site_id, "xapp-error")
            if ticked:
                ticks += 1
                self.gc_policy.after_tick()
                if ticks % 50 == 0:
                    self._save_cost_models()
                if ticks % 600 == 0:
                    with contextlib.suppress(Exception):
                        self.store.prune_leases(self.wall())

    async def tick(self) -> None:
        if self.broker is not None:
            for site_id in self.broker.book.lost(self.now()):       # silent agent: drop stream and lease
                if self.broker.drop(site_id, "no heartbeat"):
                    self.counters.revocations["lost-agent"] = self.counters.revocations.get("lost-agent", 0) + 1
        agents = frozenset(self.broker.sessions) if self.broker else frozenset()
        inputs = Inputs(samples=tuple(self.samples), results=tuple(self.results), agents=agents,
                        lost_nodes=frozenset(self.lost_nodes), releases=tuple(self.releases))
        self.samples, self.results, self.releases = [], [], []
        now = self.now()
        self._refresh_controlled()       # a shard whose claim ran out is not acted on, renewed or not
        if self.recorder is not None:
            self.recorder.before(self.state)
        t0 = time.perf_counter()
        _, actions = step(self.state, now, inputs)
        self.metrics.stepped(self.state, now, time.perf_counter() - t0)
        if self.recorder is not None:
            self.recorder.after(self.state, now, inputs, actions)
        for c, outcome in self.state.settled:      # the replies and timeouts as the loop matched them
            self._control_done(c, outcome)
        # one SDL round trip for the tick's lease entries, not two a lease (issue 27: at 1,000 sites the
        # per-lease writes were a third of the tick)
        self._ledger_batched = True
        try:
            for a in actions:
                await self._perform(a)
        finally:
            self._ledger_batched = False
            self._flush_ledger()

    def site_tally(self, site_id: str) -> SiteCounters:
        return self.site_counters.setdefault(site_id, SiteCounters())

    def _control_done(self, c: SendControl, outcome: str) -> None:
        self.metrics.control_done(c.site_id, c.control_id, outcome, self.now())
        tally = self.site_tally(c.site_id)
        if outcome == "ack":
            tally.rc_controls_acked += 1
        else:
            tally.rc_controls_failed += 1
        if outcome == "ack":
            self.counters.controls_acked += 1
            rt = self.state.sites[c.site_id]
            caps = tuple((c.meid, q.sst, q.sd if q.sd is not None else -1, q.max_ratio) for q in c.quotas)
            try:
                self.store.put_site(SiteRecord(site_id=c.site_id, envelope_sms=c.envelope_sms,
                                               mode=self.node_controls[c.meid].mode if c.meid in self.node_controls
                                               else c.kind, caps=caps, updated_unix=self.wall()))
            except Exception as exc:  # noqa: BLE001 - SDL down: the node still holds the envelope
                log.warning("site record not saved: %s", exc)
            rt.acked_caps = c.quotas or rt.acked_caps
        else:
            self.counters.controls_failed += 1
        self.controls_log.append({"t": self.wall(), "site": c.site_id, "meid": c.meid, "kind": c.kind,
                                  "envelope_sms": c.envelope_sms, "control_id": c.control_id, "result": outcome,
                                  "quotas": [[q.sst, q.sd, q.min_ratio, q.max_ratio] for q in c.quotas]})

    async def _perform(self, a) -> None:
        if isinstance(a, SendControl):
            # sub_id = the RIC instance ID, as a framework xApp sends it (e2term routes the request by meid)
            msg = RmrMessage(mtype=MT_CONTROL_REQ, payload=a.payload, meid=a.meid, sub_id=a.wire_instance)
            try:
                await self.rmr.send(msg)
                self.note_control_id(a.control_id)
                self.metrics.control_sent(a.control_id, self.now())
                self.counters.controls_sent += 1
                self.site_tally(a.site_id).rc_controls_sent += 1
                self.controls_log.append({"t": self.wall(), "site": a.site_id, "meid": a.meid, "kind": a.kind,
                                          "envelope_sms": a.envelope_sms, "control_id": a.control_id,
                                          "result": "sent",
                                          "quotas": [[q.sst, q.sd, q.min_ratio, q.max_ratio] for q in a.quotas]})
            except RmrError as exc:
                # Unsent = unacknowledged: the loop's ACK timeout turns it into a fail-safe revoke.
                self.counters.send_errors += 1
                log.warning("control to %s not sent: %s", a.meid, exc)
        elif isinstance(a, GrantLease):
            if self.broker.grant(a.site_id, a.sm_count, a.reason, seq=a.seq, decided_at=a.decided_at,
                                 basis=a.basis) is not None:
                self.counters.grants += 1
                t = self.site_tally(a.site_id)
                t.leases_granted += 1
                t.sm_s_granted += a.sm_count * self.cfg.period_ms / 1000.0
        elif isinstance(a, RevokeLease):
            self.broker.revoke(a.site_id, a.reason)
            self.counters.revocations[a.reason.split(":")[0]] = \
                self.counters.revocations.get(a.reason.split(":")[0], 0) + 1
            log.info("site %s: lease revoked (%s)", a.site_id, a.reason)

    def _released(self, site_id: str, seq: int, reason: str) -> None:
        """A LeaseReleased from the agent: the loop may now loosen what that lease held back."""
        self.releases.append(LeaseRelease(site_id=site_id, seq=seq, reason=reason))
        self._wake.set()

    def _ledger(self, issued, what: str) -> None:
        self.ledger.add(issued.ledger_record("" if what == "granted" else "revoked"), granted=what == "granted")
        if not self._ledger_batched:     # a tick writes its decisions' entries together, at its end
            self._flush_ledger()

    def _flush_ledger(self) -> None:
        try:
            self.ledger.flush()
        except Exception as exc:  # noqa: BLE001 - SDL down: the lease still expires on its own
            log.warning("lease ledger write failed: %s", exc)

    def _save_cost_models(self) -> None:
        try:
            for sid, rt in self.state.sites.items():
                if rt.estimator.model.n:
                    self.store.put_cost_model(sid, rt.estimator.model.to_dict())
        except Exception as exc:  # noqa: BLE001
            log.warning("cost model not saved: %s", exc)

    # ------------------------------------------------------------------ config
    async def _watch(self) -> None:
        """Once a second: the leader lease (renew, or try to take it), config file (content hash), the
        subscription audit (on its period, and at once when a node's KPM goes silent) and node
        connection state in the R-NIB."""
        while not self._stopping:
            await asyncio.sleep(1.0)
            if self.shards is not None:
                self._tick_shards()
            else:
                self._take_leadership(self.now())
            if self.watcher is not None:
                change = self.watcher.poll()
                if change is not None:
                    self.apply_config(change.config)
            self._audit_if_due()
            if self.cfg.e2.discovery != "rnib":
                # Static nodes are taken as connected: one silent for long is subscribed again too.
                self._resubscribe_silent(dict(self.nodes))
            else:
                try:
                    nodes, _ = read_rnib(self.store.sdl)
                except Exception as exc:  # noqa: BLE001 - SDL hiccup: keep the last view
                    log.warning("R-NIB poll failed: %s", exc)
                    continue
                lost = {n.meid for n in nodes if not n.connected and n.meid in self.nodes}
                if lost != self.lost_nodes:
                    log.warning("E2 nodes disconnected: %s", sorted(lost) or "none")
                    self.lost_nodes = lost
                    self._wake.set()
                self._resubscribe_silent({n.meid: n for n in nodes if n.connected})

    def _audit_if_due(self) -> None:
        """The periodic audit, or one at once for a node whose KPM just went silent (once per silence:
        SubMgr may have lost its subscription, which the periodic audit would find only later)."""
        now = self.now()
        after = max(1.0, 10 * self.cfg.period_s)
        quiet = {m for m in self.subscriptions if now - self.last_kpm.get(m, now) >= after}
        self._silence_audited &= quiet
        newly = quiet - self._silence_audited
        if newly:
            if self._start_audit(f"KPM silent from {', '.join(sorted(newly))}"):
                self._silence_audited |= newly
        elif now >= self._next_audit:
            self._start_audit("period")

    def _resubscribe_silent(self, connected: dict[str, E2Node]) -> None:
        """A connected node that has sent no KPM for a long while although SubMgr still lists its
        subscription (it restarted and redid E2 setup, so the E2 side forgot it) gets a fresh one: the
        old one is deleted first. Leases are long revoked by then."""
        limit = self.resubscribe_after_s or max(10.0, 50 * self.cfg.period_s)
        now = self.now()
        for meid, rec in list(self.subscriptions.items()):
            if meid not in connected or meid in self._resubscribing or now - self.last_kpm.get(meid, now) < limit:
                continue
            log.warning("%s: connected but silent for %.0f s; resubscribing", meid, now - self.last_kpm[meid])
            self._heal(rec, f"KPM silent for {now - self.last_kpm[meid]:.0f} s", delete=True)

    def apply_config(self, cfg: XappConfig) -> str | None:
        """Take a new, already validated config live. Site/node layout changes need a restart (refused)."""
        old = self.cfg
        if [(s.site_id, s.nodes) for s in cfg.sites] != [(s.site_id, s.nodes) for s in old.sites] or \
                cfg.period_ms != old.period_ms or cfg.rmr != old.rmr or cfg.broker.listen != old.broker.listen:
            why = "sites, nodes, period, RMR or broker address changed: restart the xApp to apply"
            log.error("config not applied: %s", why)
            return why
        unsafe = policy_violations(cfg)     # from_controls refuses these; a config built in code may not
        if unsafe:
            why = "; ".join(f"controls.{u.field}: {u.why}" for u in unsafe)
            log.error("config not applied: unsafe for RAN first: %s", why)
            return why
        fixed = start_up_changes(old, cfg)
        if fixed:
            why = f"{', '.join('controls.' + f for f in fixed)}: authentication and listeners are start-up settings"
            log.error("config not applied: %s", why)
            return why
        looser = loosenings(old, cfg)
        if looser and not self.allow_live_loosening:
            why = ("loosens RAN first at run time (" + "; ".join(f"controls.{f} {a} -> {b}" for f, a, b in looser)
                   + "): restart the xApp with the new config, or start it with --allow-live-loosening")
            log.error("config not applied: %s", why)
            return why
        for f, a, b in looser:
            log.warning("config loosened live (--allow-live-loosening): controls.%s %s -> %s", f, a, b)
        if cfg.log_level != old.log_level:
            logs.set_level(cfg.log_level)        # the log level is live config (xapp.logs)
        self.cfg = cfg
        self.state.cfg = cfg
        self.ingest.set_limits(cfg.sites)
        for rt in self.state.sites.values():
            rt.cfg = cfg.site(rt.cfg.site_id)
            refresh_policy(self.state, rt)       # the policy, and the guard and node roles of the invariant
        if self.broker is not None:
            before = self.broker.cross_site()
            self.broker.cfg = cfg
            if self.broker.cross_site() != before:
                log.info("cross-site config changed: pushed to %d agents", self.broker.publish_cross_site())
        log.info("config applied (policy %s)", cfg.policy.name)
        return None

    # ------------------------------------------------------------------ stop
    async def stop(self) -> None:
        """RAN first: revoke every lease, lift the shaping, release the leader lease, then unsubscribe
        (unless kept), then close."""
        self._stopping = True
        for t in self._tasks:           # the loop first: no grant may slip out after the revocations
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.broker is not None:
            await self.broker.stop(0.5)
        await self._lift_shaping()      # after the revocations (RAN first), while RMR is still up
        if self.shards is not None:
            self.shards.leave(self.wall())     # the leases are revoked already: the claims go at once
        elif self.store is not None and self.state.control_leader:
            try:
                self.store.release_leader(self.leader_id)
            except Exception as exc:  # noqa: BLE001 - it expires on its own within its TTL
                log.warning("leader lease not released: %s", exc)
        if self.submgr is not None and not self.keep_subscriptions:
            for rec in list(self.subscriptions.values()):
                await self._delete_subscription(rec)
        if self.store is not None:
            self._save_cost_models()
        if self.http is not None:
            await self.http.close()
        if self.rest_runner is not None:
            await self.rest_runner.cleanup()
        if self.rmr is not None:
            await self.rmr.close()
        if self.recorder is not None:
            self.recorder.close()
        log.info("stopped")


def advertised_broker(listen: str, port: int, env=os.environ) -> str:
    """The broker address the other replicas name in a redirect: $WEAVER_BROKER_ADVERTISE (a pod's DNS name
    or IP and port), else the listen host with the bound port; for a wildcard listen, the address this host's
    name resolves to (a pod's IP in Kubernetes), or "" where it does not resolve (no redirect then: the agents
    try their configured brokers in turn). An agent follows a redirect only to a broker it was given."""
    if env.get("WEAVER_BROKER_ADVERTISE"):
        return env["WEAVER_BROKER_ADVERTISE"]
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            return ""
    return f"{host}:{port}"


def env_overrides(env=os.environ) -> dict:
    """Ports from the environment (tests and `weaver up` run several processes on one host)."""
    out = {}
    for key, name in (("rest_port", "WEAVER_REST_PORT"), ("rmr_port", "WEAVER_RMR_PORT")):
        if env.get(name):
            out[key] = int(env[name])
    if env.get("WEAVER_BROKER_LISTEN"):
        out["broker_listen"] = env["WEAVER_BROKER_LISTEN"]
    return out
