"""The control loop as a pure state machine: `step(state, now, inputs) -> (state, actions)`.

Per site and period: ingest (the samples the shell decoded) -> estimate -> policy -> actuate. Actuate
*returns* actions -- RC controls, lease grants, revocations -- and the async shell (`xapp.app`) performs
them, feeding ACK/FAILURE back in as `ControlResult`s. Time is the caller's monotonic seconds; nothing
here reads a clock, sleeps or logs. `next_deadline(state)` is when `step` next has work of its own (the
period tick, a KPM staleness limit, an RC ACK timeout), so a virtual clock can jump straight there.

Every grant and every envelope goes through the site's `xapp.invariant.SiteSafety`, which owns the
RAN-first rule (the sum of the envelopes its nodes may apply + leases the agent may act on + guard <=
GPU): grants are cut to its ceiling, a looser envelope waits for the release of the SMs it gives back,
and a node whose state is unknown (E2 setup, restart, loss, stale KPM, control timeout) counts as the
whole GPU until an envelope sent to it is acknowledged.

Fail-safe rules (RAN first; architecture.md): a site's lease is revoked at once when
- its KPM is stale (no fresh sample from one of its nodes for `stale_periods` periods) or a node is lost;
  a sample is fresh by its own collection time, not by when the xApp dequeued it (a burst of old
  indications after a stall is not fresh), and out-of-sequence samples are dropped; a node whose latest
  frame ingest refused for impossible values (`KpmRefusal`) is not fresh until it sends a valid one;
- an RC control to one of its nodes fails or is not acknowledged within `control_timeout_ms`
  (the site then stays conservative -- no grant -- for `FAILSAFE_PERIODS` periods);
- a node reports a deadline miss (`GPU.DeadlineMiss`): conservative for `MISS_HOLDOFF_PERIODS`;
- its agent is gone (the broker drops the lease itself; the loop just stops granting).
A site that held no lease for `LIFT_AFTER_PERIODS` has its shaping lifted (envelope = whole GPU, caps
cleared); `lift_shaping` does the same for every node at shutdown.

Control replies on a RIC with several xApps: e2term sets an ACK's RMR sub_id to the request's RIC
instance ID and rtmgr routes it by sub_id to the xApp owning that subscription (any other sub_id to one
arbitrary xApp). So a control's instance ID is the sub_id of one of this xApp's live subscriptions -- the
node's own (`set_control_tag`), else any -- and every control to a node shares it. A reply is matched by
requestor, node and instance to the control in flight there (one per node, replies in send order); a
control that timed out stays an orphan, which takes the next reply with its instance and keeps the node
busy until then (or `ORPHAN_TIMEOUTS` timeouts), so a late ACK never acknowledges a newer control.

Isolation: each site's part of a step (its samples, control results, fail-safe checks and decision) runs
on its own; an exception there revokes that site's lease and holds it conservative for
`FAILSAFE_PERIODS` (`site-error`), while every other site is decided as usual. A grant that the failing
part had decided is withheld; controls it had sent stay (the ledger already counts them).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from e2sm.rc import SliceQuota
from xapp.actuate import CONTROL_REQUESTOR, NodeControl, envelope_request, quota_request
from xapp.config import SiteConfig, XappConfig
from xapp.estimate import AVAIL_DL, CostModel, DemandEstimate, SiteEstimator
from xapp.ingest import KpmRefusal, KpmSample, meas_key
from xapp.inputs import NO_INPUTS, PolicyInputs, policy_inputs
from xapp.invariant import SiteSafety
from xapp.policy import CellCap, QuotaCost, SiteHistory, SiteObservation, make_policy
from xapp.waterfall import GrantLedger

FAILSAFE_PERIODS = 10
MISS_HOLDOFF_PERIODS = 50      # a reported deadline miss: no grant for 5 s at 100 ms periods
LIFT_AFTER_PERIODS = 50        # no lease held for this long: lift the shaping
DELAY_WINDOW = 64              # samples per node in the window of the transit-delay floor
TICK_SLACK = 1e-6        # float sums of periods drift; a tick 1 us early is the same tick
ORPHAN_TIMEOUTS = 4      # a timed-out control's late reply is awaited this many control timeouts


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True, kw_only=True)
class SendControl:
    control_id: int                  # the loop's own id of this control (unique, never on the wire as such)
    site_id: str
    meid: str
    payload: bytes                   # complete E2AP RICcontrolRequest
    kind: str                        # envelope | quota
    envelope_sms: int
    quotas: tuple[SliceQuota, ...] = ()
    # The RIC instance ID on the wire (and the RMR sub_id to send with): one of this xApp's live
    # subscriptions' sub_id, so the reply routes back here (`control_instance`); every control to the
    # node shares it. None: no subscription to route by; the wire carries `control_id & 0xffff`.
    instance: int | None = None

    @property
    def wire_instance(self) -> int:
        return self.control_id & 0xFFFF if self.instance is None else self.instance


@dataclass(frozen=True, kw_only=True)
class GrantLease:
    site_id: str
    sm_count: int
    reason: str
    seq: int = 0                     # per-site lease sequence (the ledger in SiteSafety); 0: unnumbered
    decided_at: float = 0.0          # loop clock; the lease's hard end is decided_at + valid_for_s
    valid_for_s: float = 0.0
    basis: str = "envelope"          # envelope | forecast (xapp.invariant)


@dataclass(frozen=True, kw_only=True)
class RevokeLease:
    site_id: str
    reason: str


Action = SendControl | GrantLease | RevokeLease


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True, kw_only=True)
class ControlOutcome:
    """A control's reply. From the wire: `instance` = the RIC instance ID it echoes, matched to the control
    in flight by requestor, node and instance (`reply_owner`). `instance` None: `control_id` names the
    control directly (a caller that matched it itself, as the virtual-time bench)."""
    ok: bool
    control_id: int = 0
    cause: str = ""
    meid: str = ""                   # node the reply came from ("": not checked, the virtual-time bench)
    requestor: int = CONTROL_REQUESTOR
    instance: int | None = None


@dataclass(frozen=True, kw_only=True)
class LeaseRelease:
    """The agent acts on no lease of `site_id` up to `seq` any more (weaver.v1.LeaseReleased)."""
    site_id: str
    seq: int
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Inputs:
    samples: tuple[KpmSample | KpmRefusal, ...] = ()      # in arrival order: a refusal, then a valid one
    results: tuple[ControlOutcome, ...] = ()
    agents: frozenset[str] = frozenset()          # sites with a connected agent
    lost_nodes: frozenset[str] = frozenset()
    releases: tuple[LeaseRelease, ...] = ()


# ----------------------------------------------------------------------------- state


@dataclass(frozen=True, kw_only=True)
class SiteDecisionView:
    """What one period decided for a site (for REST, the time series and the bench)."""
    t: float
    envelope_sms: int
    grant_sms: int
    demand_mean: float | None
    demand_peak: float | None
    source: str
    fresh: bool
    reason: str
    basis: str = "envelope"          # what the grant rests on: envelope | forecast
    slack_sms: int = 0               # GPU - envelope bound - leases the agent may act on - guard


@dataclass
class PendingControl:
    control: SendControl
    sent: float


@dataclass
class NodeFeed:
    """Sequence and transit-delay bookkeeping of one node's KPM (freshness by collection time)."""
    sn: int | None = None
    accepted_at: float = -math.inf
    delays: deque = field(default_factory=lambda: deque(maxlen=DELAY_WINDOW))   # received - collected
    dropped: int = 0
    refused: str = ""                    # reason ingest refused the node's latest frame ("": it was valid)
    refused_total: int = 0


@dataclass
class SiteRuntime:
    cfg: SiteConfig
    estimator: SiteEstimator
    safety: SiteSafety
    nodes: dict[str, NodeControl] = field(default_factory=dict)
    last: dict[str, KpmSample] = field(default_factory=dict)
    feeds: dict[str, NodeFeed] = field(default_factory=dict)
    acked_caps: tuple[SliceQuota, ...] = ()
    sent_caps_by_node: dict[str, tuple[SliceQuota, ...]] = field(default_factory=dict)
    policy: Any = None                   # xapp.policy Policy for this site (mode follows its nodes)
    history: SiteHistory = field(default_factory=SiteHistory)
    grant_sms: int = 0
    conservative_until: float = -math.inf
    conservative_reason: str = ""
    idle_since: float = 0.0              # last instant the site's agent held (or was granted) a lease
    lifted: bool = False                 # shaping lifted (envelope = whole GPU, caps cleared)
    deferred_envelope: int | None = None  # a looser envelope waiting for the agent's release
    views: deque = field(default_factory=lambda: deque(maxlen=6000))
    last_view: SiteDecisionView | None = None
    last_estimate: DemandEstimate | None = None
    misses: int = 0
    site_errors: int = 0                 # steps in which this site's part raised (revoked: site-error)
    inputs: PolicyInputs = NO_INPUTS     # what the latest decision's policy inputs rest on (xapp.inputs)
    input_periods: dict = field(default_factory=dict)   # basis -> periods decided on it (measured | estimated)
    waterfall: GrantLedger = field(default_factory=GrantLedger)   # usable -> granted, by cause (xapp.waterfall)

    @property
    def acked_envelope(self) -> int | None:
        """The largest acknowledged envelope of the site's enforcing nodes (None: any unknown)."""
        known = [n.known for n in self.safety.nodes.values() if n.enforced]
        return None if not known or None in known else max(known)


@dataclass
class LoopState:
    cfg: XappConfig
    sites: dict[str, SiteRuntime]
    next_tick: float
    pending: dict[int, PendingControl] = field(default_factory=dict)
    busy_nodes: dict[str, int] = field(default_factory=dict)     # meid -> pending (or orphaned) control id
    control_tags: dict[str, int] = field(default_factory=dict)   # meid -> its live subscription's sub_id
    orphans: dict[str, PendingControl] = field(default_factory=dict)   # meid -> timed out, reply not seen
    busy_sites: dict[str, set[int]] = field(default_factory=dict)   # site -> its pending control ids
    next_control_id: int = 1
    events: deque = field(default_factory=lambda: deque(maxlen=1000))   # (t, site, kind, detail)
    started: float = 0.0
    grant_not_before: float = -math.inf     # a restarted xApp waits out the previous epoch's leases
    control_leader: bool = True             # False: another instance holds the SDL leader lease
    # With shards (xapp.shards): the sites whose shard claim this replica holds; None: every site
    controlled_sites: frozenset[str] | None = None
    # A shard taken over waits out its previous owner's leases, site by site (xapp.app)
    site_grant_not_before: dict[str, float] = field(default_factory=dict)
    # The controls the latest step settled, in order, with how: "ack", "failure <cause>" or "timeout" (the
    # shell counts them from here instead of matching the replies a second time).
    settled: list = field(default_factory=list)


def controls_site(state: LoopState, site_id: str) -> bool:
    """Whether this instance controls the site: it holds the leader lease and, with shards, the site's shard."""
    return state.control_leader and (state.controlled_sites is None or site_id in state.controlled_sites)


def grants_from(state: LoopState, site_id: str) -> float:
    """The earliest instant a grant for the site may go out: every earlier lease it must wait out has ended."""
    return max(state.grant_not_before, state.site_grant_not_before.get(site_id, -math.inf))


def policy_for(cfg: XappConfig, mode: str):
    """The configured policy; `weaver` runs in the actuation mode the site's nodes support."""
    p = cfg.policy
    if p.name == "static":
        return make_policy("static", reserve_sms=p.static_reserve_sms)
    if p.name == "reactive":
        return make_policy("reactive", margin_sms=p.reactive_margin_sms)
    if p.name == "oracle":
        return make_policy("oracle")
    cost = QuotaCost(dl_sms_per_prb=p.quota_dl_sms_per_prb, ul_sms_per_prb=p.quota_ul_sms_per_prb,
                     cell_prbs=p.cell_prbs)
    return make_policy("weaver", mode="quota" if mode == "quota" else "envelope", guard_sms=p.guard_sms,
                       target=p.reliability_target, window_periods=cfg.estimate.window_periods,
                       hold_periods=p.hold_periods, cost=cost)


def new_state(cfg: XappConfig, now: float, cost_models: dict | None = None) -> LoopState:
    sites = {}
    for s in cfg.sites:
        model = CostModel.from_dict(cost_models[s.site_id], cfg.estimate.window_periods) \
            if cost_models and s.site_id in cost_models else None
        policy = policy_for(cfg, "envelope")
        sites[s.site_id] = SiteRuntime(cfg=s, policy=policy, estimator=SiteEstimator(
            s.site_id, cfg.estimate.quantile, cfg.estimate.window_periods, cfg.estimate.min_samples, model),
            history=SiteHistory(maxlen=cfg.estimate.window_periods), idle_since=now,
            safety=SiteSafety(s.site_id, s.gpu_sms, s.granularity, _guard_of(policy),
                              cfg.lease_valid_periods * cfg.period_s))
    return LoopState(cfg=cfg, sites=sites, next_tick=now + cfg.period_s, started=now)


def set_node(state: LoopState, nc: NodeControl) -> None:
    """Tell the loop how a node is controlled (after discovery/subscription)."""
    site = state.cfg.site_of(nc.meid)
    if site is not None:
        rt = state.sites[site.site_id]
        rt.nodes[nc.meid] = nc
        refresh_policy(state, rt)


def refresh_policy(state: LoopState, rt: SiteRuntime) -> None:
    """The site's policy follows its nodes' modes; a node enforces an envelope only when it takes one
    and the policy shapes (the baselines do not: their grants rest on their own forecast)."""
    modes = {n.mode for n in rt.nodes.values()}
    rt.policy = policy_for(state.cfg, "envelope" if "envelope" in modes else "quota" if "quota" in modes
                           else "envelope")
    shapes = getattr(rt.policy, "name", "") == "weaver" and getattr(rt.policy, "mode", "envelope") == "envelope"
    rt.safety.guard_sms = _guard_of(rt.policy)
    rt.safety.valid_for_s = state.cfg.lease_valid_periods * state.cfg.period_s
    for meid, nc in rt.nodes.items():
        rt.safety.add_node(meid, enforced=shapes and nc.mode == "envelope")


def stale_limit(state: LoopState) -> float:
    return state.cfg.stale_periods * state.cfg.period_s


def not_fresh_reason(state: LoopState, rt: SiteRuntime, now: float, lost: frozenset[str] = frozenset()) -> str:
    """"" when fresh (every node of the site connected, its latest frame valid and its latest sample
    recent: the one rule a grant's freshness rests on), else why not: lost-node | refused-kpm | stale-kpm."""
    limit = stale_limit(state)
    why = ""
    for m in rt.cfg.nodes:
        if m in lost:
            return "lost-node"
        feed = rt.feeds.get(m)
        if feed is not None and feed.refused:
            why = "refused-kpm"
        elif not why and (m not in rt.last or now - rt.last[m].received > limit):
            why = "stale-kpm"
    return why


def next_deadline(state: LoopState) -> float:
    t = state.next_tick
    timeout = state.cfg.actuation.control_timeout_ms / 1000.0
    for p in state.pending.values():
        t = min(t, p.sent + timeout)
    for o in state.orphans.values():
        t = min(t, o.sent + ORPHAN_TIMEOUTS * timeout)
    limit = stale_limit(state)
    for rt in state.sites.values():
        if rt.grant_sms > 0:
            for m in rt.cfg.nodes:
                if m in rt.last:
                    t = min(t, rt.last[m].received + limit + 1e-6)
        if rt.safety.leases:      # a hard end frees SMs a deferred looser envelope may be waiting for
            t = min(t, rt.safety.next_expiry() + 1e-6)
    return t


def _accept(state: LoopState, rt: SiteRuntime, s: KpmSample) -> str:
    """Sequence and age of one sample: "ok" to act on it, "baseline" to keep it only as the node's delay
    baseline, "drop". Dropped: a duplicate or older RICindicationSN (within the staleness window; after a
    silence a restarted node's numbering starts again), and a sample whose transit delay exceeds the
    node's recent floor by more than the staleness limit (it waited in a queue: its data is old however
    recently it was dequeued). The floor is the windowed minimum of received - collected, so the two
    clocks need no common origin.
    - The delay is the conservative reading of a coarse stamp: a period stamped t (whole seconds in KPM
      v2.03) started in [t, t + resolution), so received - t is the oldest the sample may be. Its
      resolution is not added to the limit (that reading let a sample 1.1 s past the floor through a
      0.2 s limit); a clock that shows whole seconds cannot show a fresh sample younger than one second,
      so the bound such a node is held to is max(limit, resolution), stated, not limit + resolution.
    - A node's first timestamped sample has no floor to be judged against, and the clocks share no
      origin, so nothing bounds its age: it becomes the baseline and is not acted on; the next sample,
      judged against it, is (a queued first sample has the larger delay, so a fresh second one sets the
      floor and passes)."""
    feed = rt.feeds.setdefault(s.meid, NodeFeed())
    limit = stale_limit(state)
    recent = s.received - feed.accepted_at <= limit
    if s.sn is not None and feed.sn is not None and recent and 0 <= (feed.sn - s.sn) % 65536 < 32768:
        feed.dropped += 1
        return "drop"
    verdict = "ok"
    if s.collected_s is not None:
        delay = s.received - s.collected_s
        verdict = "ok" if feed.delays else "baseline"
        feed.delays.append(delay)
        if delay - min(feed.delays) > max(limit, s.collected_res_s):
            feed.dropped += 1
            return "drop"
    feed.sn, feed.accepted_at = s.sn, s.received
    return verdict


def _drop_orphan(state: LoopState, meid: str) -> None:
    o = state.orphans.pop(meid, None)
    if o is not None and state.busy_nodes.get(meid) == o.control.control_id:
        del state.busy_nodes[meid]


def _pop_pending(state: LoopState, cid: int) -> PendingControl | None:
    p = state.pending.pop(cid, None)
    if p is not None:
        state.busy_nodes.pop(p.control.meid, None)
        ids = state.busy_sites.get(p.control.site_id)
        if ids is not None:
            ids.discard(cid)
            if not ids:
                del state.busy_sites[p.control.site_id]
    return p


def _add_pending(state: LoopState, ctl: SendControl, now: float) -> None:
    state.pending[ctl.control_id] = PendingControl(ctl, now)
    state.busy_nodes[ctl.meid] = ctl.control_id
    state.busy_sites.setdefault(ctl.site_id, set()).add(ctl.control_id)


def set_control_tag(state: LoopState, meid: str, sub_id: int | None) -> None:
    """The shell's: `meid`'s live KPM subscription is `sub_id` (None: it has none now). Controls to the
    node carry it as RIC instance ID, so their replies route back to this xApp."""
    if sub_id is None:
        state.control_tags.pop(meid, None)
    else:
        state.control_tags[meid] = sub_id & 0xFFFF


def control_instance(state: LoopState, meid: str) -> int | None:
    """The RIC instance ID for a control to `meid`: its own subscription's sub_id, else any of this
    xApp's (rtmgr's routes go by sub_id alone), else None (no route back; a unique id then)."""
    tag = state.control_tags.get(meid)
    if tag is None and state.control_tags:
        tag = next(iter(state.control_tags.values()))
    return tag


def reply_owner(state: LoopState, r: ControlOutcome) -> int | None:
    """The control id a reply belongs to: the orphan at its node with its instance ID if there is one
    (sent earlier, so answered first), else the control in flight there with that instance ID."""
    if r.instance is None:
        return r.control_id
    o = state.orphans.get(r.meid)
    if o is not None and o.control.wire_instance == r.instance:
        return o.control.control_id
    cid = state.busy_nodes.get(r.meid)
    p = state.pending.get(cid) if cid is not None else None
    return cid if p is not None and p.control.wire_instance == r.instance else None


def _new_control(state: LoopState, rt: SiteRuntime, nc: NodeControl, kind: str, envelope_sms: int,
                 quotas: tuple[SliceQuota, ...] = ()) -> SendControl:
    cid, act, tag = state.next_control_id, state.cfg.actuation, control_instance(state, nc.meid)
    wire = cid if tag is None else tag
    payload = (envelope_request(nc, wire, envelope_sms, act.be_delay_budget_ms, act.ue_id) if kind == "envelope"
               else quota_request(nc, wire, quotas, act.ue_id))
    return SendControl(control_id=cid, site_id=rt.cfg.site_id, meid=nc.meid, payload=payload, kind=kind,
                       envelope_sms=envelope_sms, quotas=quotas, instance=tag)


def _round_down(x: float, step: int) -> int:
    return max(0, int(math.floor(x / step)) * step)


def _round_up(x: float, step: int) -> int:
    return int(math.ceil(x / step)) * step


def _revoke(state: LoopState, rt: SiteRuntime, now: float, reason: str, actions: list) -> None:
    if rt.grant_sms > 0:
        actions.append(RevokeLease(site_id=rt.cfg.site_id, reason=reason))
        state.events.append((now, rt.cfg.site_id, "revoke", reason))
    rt.grant_sms = 0


def _conservative(state: LoopState, rt: SiteRuntime, now: float, periods: int, reason: str, actions: list) -> None:
    until = now + periods * state.cfg.period_s
    if until > rt.conservative_until:
        rt.conservative_until, rt.conservative_reason = until, reason
    _revoke(state, rt, now, reason, actions)


def _ingest(state: LoopState, samples: tuple[KpmSample, ...], now: float, actions: list,
            only: str | None = None) -> None:
    for s in samples:
        site = state.cfg.site_of(s.meid)
        if site is None or (only is not None and site.site_id != only):
            continue
        rt = state.sites[site.site_id]
        try:
            _ingest_one(state, rt, s, now, actions)
        except Exception as exc:  # noqa: BLE001 - a sample must not take the other sites down
            _site_error(state, rt, now, "ingest", exc, actions)


def _ingest_one(state: LoopState, rt: SiteRuntime, s: KpmSample | KpmRefusal, now: float, actions: list) -> None:
    if isinstance(s, KpmRefusal):
        feed = rt.feeds.setdefault(s.meid, NodeFeed())
        feed.refused, feed.refused_total = s.reason, feed.refused_total + 1
        return
    if _accept(state, rt, s) != "ok":
        return
    if s.meid not in rt.last or s.received - rt.last[s.meid].received > stale_limit(state):
        # first sample, or the first after a silence: the node may have restarted without its
        # envelope, so it is unknown (the whole GPU) until it acknowledges one again
        rt.safety.node_unknown(s.meid, "kpm-resumed" if s.meid in rt.last else "e2-setup")
    rt.last[s.meid] = s
    rt.feeds[s.meid].refused = ""       # a valid frame: the node is fresh again
    missed = int(s.values.get("GPU.DeadlineMiss", 0) or 0)
    if missed > 0:
        rt.misses += missed
        state.events.append((now, rt.cfg.site_id, "deadline-miss", f"{s.meid}: {missed} slots"))
        _conservative(state, rt, now, MISS_HOLDOFF_PERIODS, "deadline-miss", actions)


def _results(state: LoopState, results: tuple[ControlOutcome, ...], now: float, actions: list,
             only: str | None = None) -> None:
    for r in results:
        cid = reply_owner(state, r)
        o = state.orphans.get(r.meid) if r.instance is not None else None
        if o is not None and o.control.control_id == cid and r.requestor == CONTROL_REQUESTOR \
                and (only is None or o.control.site_id == only):
            _drop_orphan(state, r.meid)       # the late reply of a timed-out control: proves nothing now
            state.events.append((now, o.control.site_id, "control-late-reply", r.meid))
            continue
        p = state.pending.get(cid) if cid is not None else None
        # a reply is ours when requestor, node and instance id all match a control in flight
        if p is None or r.requestor != CONTROL_REQUESTOR or (r.meid and r.meid != p.control.meid) \
                or (only is not None and p.control.site_id != only):
            continue
        _pop_pending(state, cid)
        state.settled.append((p.control, "ack" if r.ok else f"failure {r.cause}"))
        rt = state.sites[p.control.site_id]
        try:
            _result_one(state, rt, p, r, now, actions)
        except Exception as exc:  # noqa: BLE001 - one site's failure must not revoke the others
            _site_error(state, rt, now, "control-result", exc, actions)
    _timeouts(state, now, actions, only)


def _result_one(state: LoopState, rt: SiteRuntime, p: PendingControl, r: ControlOutcome, now: float,
                actions: list) -> None:
    if r.ok:
        if p.control.kind == "envelope":
            rt.safety.control_acked(p.control.meid, p.control.control_id)
        rt.acked_caps = p.control.quotas or rt.acked_caps
        state.events.append((now, rt.cfg.site_id, "control-ack", f"{p.control.kind} {p.control.meid}"))
    else:
        rt.safety.control_failed(p.control.meid, p.control.control_id)
        rt.sent_caps_by_node.pop(p.control.meid, None)      # resend the next decision
        state.events.append((now, rt.cfg.site_id, "control-failure", f"{p.control.meid}: {r.cause}"))
        _conservative(state, rt, now, FAILSAFE_PERIODS, f"control-failure: {r.cause}", actions)


def _timeouts(state: LoopState, now: float, actions: list, only: str | None) -> None:
    timeout = state.cfg.actuation.control_timeout_ms / 1000.0
    # step_site looks at its own site's controls only: scanning every site's would make a period of N
    # sites stepped one by one (weaver bench xapp) cost N^2; `step` scans them once for every site.
    if only is None:
        orphans, pending = list(state.orphans.items()), list(state.pending.items())
    else:
        rt = state.sites.get(only)
        nodes = rt.cfg.nodes if rt is not None else ()
        orphans = [(m, state.orphans[m]) for m in nodes if m in state.orphans]
        pending = [(cid, state.pending[cid]) for cid in sorted(state.busy_sites.get(only, ()))]
    for meid, o in orphans:
        if now - o.sent >= ORPHAN_TIMEOUTS * timeout and (only is None or o.control.site_id == only):
            _drop_orphan(state, meid)         # its reply is lost for good: the node may be sent to again
    for cid, p in pending:
        if now - p.sent >= timeout and (only is None or p.control.site_id == only):
            _pop_pending(state, cid)
            state.settled.append((p.control, "timeout"))
            if p.control.instance is not None:
                # its instance ID is shared: a late reply would pass for the next control's, so the
                # node takes none until that reply is in (or is given up on)
                state.orphans[p.control.meid] = p
                state.busy_nodes[p.control.meid] = cid
            rt = state.sites[p.control.site_id]
            rt.safety.control_timed_out(p.control.meid, cid)
            rt.sent_caps_by_node.pop(p.control.meid, None)
            state.events.append((now, rt.cfg.site_id, "control-timeout", p.control.meid))
            _conservative(state, rt, now, FAILSAFE_PERIODS, "control-timeout", actions)


def _releases(state: LoopState, releases: tuple[LeaseRelease, ...]) -> None:
    for r in releases:
        rt = state.sites.get(r.site_id)
        if rt is not None:
            rt.safety.released(r.seq)


def _between_ticks(state: LoopState, rt: SiteRuntime, now: float, inputs: Inputs, actions: list) -> None:
    """Fail-safe at once (stale KPM, lost node, lost agent), then any looser envelope whose SMs the
    agent has released since the tick."""
    lost = set(rt.cfg.nodes) & inputs.lost_nodes
    for m in lost:
        n = rt.safety.nodes.get(m)
        if n is not None and (n.known is not None or n.inflight):
            rt.safety.node_unknown(m, "lost-node")
    if rt.grant_sms > 0:
        why = not_fresh_reason(state, rt, now, inputs.lost_nodes)
        gone = not why and rt.cfg.site_id not in inputs.agents
        if why or gone:   # the rest of the granted period is not held (xapp.waterfall)
            rt.waterfall.revoked_mid_period(why or "agent-disconnected", rt.grant_sms, state.next_tick - now)
        if why:
            _revoke(state, rt, now, why, actions)
        elif gone:
            rt.grant_sms = 0      # the broker already dropped the lease with the stream
    if rt.deferred_envelope is not None and controls_site(state, rt.cfg.site_id):
        _send_envelopes(state, rt, now, rt.deferred_envelope, actions)


def step(state: LoopState, now: float, inputs: Inputs) -> tuple[LoopState, list[Action]]:
    actions: list[Action] = []
    state.settled = []
    _ingest(state, inputs.samples, now, actions)
    _releases(state, inputs.releases)
    _results(state, inputs.results, now, actions)
    for rt in state.sites.values():
        _isolated(state, rt, now, "fail-safe", _between_ticks, inputs, actions)
    if now >= state.next_tick - TICK_SLACK:
        period = state.cfg.period_s
        ticks = max(1, math.floor((now + TICK_SLACK - state.next_tick) / period) + 1)
        state.next_tick += period * ticks
        for rt in state.sites.values():
            rt.waterfall.carried(ticks - 1, period)    # ticks passed late, without a decision
            _isolated(state, rt, now, "decide", _decide, inputs, actions)
    return state, actions


def _isolated(state: LoopState, rt: SiteRuntime, now: float, stage: str, fn, inputs: Inputs, actions: list) -> None:
    """`fn(state, rt, now, inputs, own)` for one site; its actions join `actions` unless it raises, in
    which case `_site_error` revokes that site alone."""
    own: list = []
    try:
        fn(state, rt, now, inputs, own)
    except Exception as exc:  # noqa: BLE001 - one site's failure must not revoke the others
        actions += [a for a in own if not isinstance(a, GrantLease)]
        _site_error(state, rt, now, stage, exc, actions)
        return
    actions += own


def _site_error(state: LoopState, rt: SiteRuntime, now: float, stage: str, exc: BaseException,
                actions: list) -> None:
    """A failure confined to one site: revoke its lease (whatever it was decided to be this step) and
    hold it conservative. Controls already sent stay in the ledger and in `pending`, so their replies
    and timeouts are still tracked."""
    site = rt.cfg.site_id
    actions[:] = [a for a in actions if not (isinstance(a, GrantLease) and a.site_id == site)]
    actions.append(RevokeLease(site_id=site, reason="site-error"))
    rt.grant_sms = 0
    rt.site_errors += 1
    state.events.append((now, site, "site-error", f"{stage}: {type(exc).__name__}: {exc}"[:300]))
    until = now + FAILSAFE_PERIODS * state.cfg.period_s
    if until > rt.conservative_until:
        rt.conservative_until, rt.conservative_reason = until, "site-error"


def step_site(state: LoopState, site_id: str, now: float, samples: tuple[KpmSample, ...] = (),
              results: tuple[ControlOutcome, ...] = (), agents: frozenset[str] = frozenset(),
              releases: tuple[LeaseRelease, ...] = ()) -> list[Action]:
    """One site's period decision on its own (a shell that ticks sites as their KPM arrives; the bench).
    The same rules as `step`, restricted to `site_id`."""
    actions: list[Action] = []
    state.settled = []
    inputs = Inputs(samples=samples, results=results, agents=agents, releases=releases)
    _ingest(state, samples, now, actions, only=site_id)
    _releases(state, tuple(r for r in releases if r.site_id == site_id))
    _results(state, results, now, actions, only=site_id)
    rt = state.sites[site_id]
    _isolated(state, rt, now, "fail-safe", _between_ticks, inputs, actions)
    _isolated(state, rt, now, "decide", _decide, inputs, actions)
    return actions


def lift_shaping(state: LoopState, now: float) -> list[SendControl]:
    """Controls that hand every node its whole GPU back (envelope = GPU, best-effort caps cleared): at
    shutdown, after every lease is revoked, so no node stays shaped for a training that is gone."""
    actions: list = []
    for rt in state.sites.values():
        if controls_site(state, rt.cfg.site_id):     # another replica's sites are its to lift
            _lift(state, rt, now, actions, force=True)
    return [a for a in actions if isinstance(a, SendControl)]



def _observation(state: LoopState, rt: SiteRuntime, est: DemandEstimate, now: float) -> SiteObservation:
    """KPM -> what the policy sees. Cells per node from RRU.PrbAvailDl / cell_prbs; best-effort PRBs per
    cell from the node's per-slice counters of the site's best-effort slices; offered and non-deferrable
    demand, best-effort delay and backlog from the node's compute-aware measurements, or their estimate
    from standard counters (xapp.inputs; `rt.inputs` says which)."""
    site, cell_prbs = rt.cfg, state.cfg.policy.cell_prbs
    samples = [rt.last[m] for m in site.nodes]
    prot_keys = [meas_key("RRU.PrbUsedDl", _Label(p)) for p in site.protected_slices]
    defers = any(nc.mode in ("envelope", "quota") for nc in rt.nodes.values())
    pi = policy_inputs(samples, est, rt.estimator.model, protected_keys=prot_keys, defers=defers,
                       quantile=state.cfg.estimate.quantile, min_samples=state.cfg.estimate.min_samples)
    rt.inputs = pi
    rt.input_periods[pi.basis] = rt.input_periods.get(pi.basis, 0) + 1
    utils, be_per_cell, n_cells = [], [], 0
    be_keys = [meas_key("RRU.PrbUsedDl", _Label(b)) for b in site.best_effort_slices]
    for m in site.nodes:
        v = rt.last[m].values
        avail = v.get(AVAIL_DL)
        cells = max(1, round(avail / cell_prbs)) if avail else 1
        n_cells += cells
        if avail:
            utils.append(v.get("RRU.PrbUsedDl", 0.0) / avail)
        be = sum(v.get(k, 0.0) for k in be_keys)
        be_per_cell += [be / cells] * cells
    return SiteObservation(site_id=site.site_id, now=now, gpu_sms=site.gpu_sms, granularity=site.granularity,
                           period_s=state.cfg.period_s, demand_mean=est.mean, demand_max=est.peak,
                           prb_util=tuple(utils), fresh=True, offered_mean=pi.offered_mean,
                           offered_max=pi.offered_max, nondeferrable_max=pi.nondeferrable_max,
                           be_delay_ms=pi.be_delay_ms, be_deferred_bytes=pi.be_deferred_bytes,
                           be_delay_budget_ms=float(state.cfg.actuation.be_delay_budget_ms),
                           be_prb_per_cell=tuple(be_per_cell), n_cells=max(1, n_cells))


@dataclass(frozen=True)
class _Label:
    snssai: Any


def _decide(state: LoopState, rt: SiteRuntime, now: float, inputs: Inputs, actions: list) -> None:
    cfg, site = state.cfg, rt.cfg
    stale_why = not_fresh_reason(state, rt, now, inputs.lost_nodes)
    is_fresh = not stale_why
    samples = [rt.last[m] for m in site.nodes if m in rt.last]
    est = rt.estimator.estimate(samples) if is_fresh else DemandEstimate(
        site_id=site.site_id, mean=None, peak=None, peak_q=None, source="none")
    rt.last_estimate = est
    rt.deferred_envelope = None
    if rt.grant_sms > 0 or rt.safety.held(now):
        rt.idle_since = now
    reason = ""
    if not is_fresh or est.mean is None:
        reason = stale_why or "no-estimate"
    elif now < rt.conservative_until:
        reason = rt.conservative_reason.split(":")[0] or "failsafe"
    elif not controls_site(state, site.site_id):
        reason = "not-leader" if not state.control_leader else "other-shard"
    if reason:
        rt.input_periods["none"] = rt.input_periods.get("none", 0) + 1   # rt.inputs: the last decision's
        _revoke(state, rt, now, reason, actions)
        if is_fresh and controls_site(state, site.site_id):
            _lift(state, rt, now, actions)
        if reason != "other-shard":      # that replica's decision and its ledger: the sum over replicas holds
            _account(state, rt, est, grant=0, reason=reason)
        _view(rt, now, rt.acked_envelope or site.gpu_sms, 0, est, is_fresh, reason)
        return
    obs = _observation(state, rt, est, now)
    decision = rt.policy.decide(obs, rt.history)
    rt.history.record(obs, decision)
    sized = decision.sized_for_sms if decision.sized_for_sms is not None else decision.envelope_sms
    envelope = min(site.gpu_sms, max(0, int(sized if sized is not None else site.gpu_sms - decision.grant_sms)))
    wanted = _round_down(max(0, int(decision.grant_sms)), site.granularity)
    not_before = grants_from(state, site.site_id)
    training = site.site_id in inputs.agents and now >= not_before
    if rt.lifted:
        if not (training and wanted > 0):
            _account(state, rt, est, grant=0, reason="lifted")
            _view(rt, now, site.gpu_sms, 0, est, True, "lifted: no training to shape for")
            return
        rt.lifted, rt.idle_since = False, now        # training is back: shape again (tightening is safe)
    elif _lift(state, rt, now, actions):
        _account(state, rt, est, grant=0, reason="lifted")
        _view(rt, now, site.gpu_sms, 0, est, True, "lifted: no lease for a while")
        return
    _actuate(state, rt, now, decision.envelope_sms, _node_quotas(rt, decision.caps, state.cfg.actuation.min_ratio),
             envelope, actions)
    # The grant is what the invariant allows now: nodes that take no envelope are bounded by the
    # forecast the policy sized; enforcing nodes by what they may be applying (acknowledged, or the
    # looser side of a control in flight), so a grant grows only on an acknowledged tighter envelope.
    rt.safety.set_forecast(envelope, est.peak)       # never below the peak measured this period
    ceiling = rt.safety.grant_ceiling(now)
    grant = min(wanted, ceiling)
    capped = None
    if "quota" in {nc.mode for nc in rt.nodes.values()} and site.site_id in state.busy_sites:
        capped = rt.grant_sms
        grant = min(grant, capped)            # quota-mode grants do not grow while new caps are in flight
    if not training:
        grant = 0
    if grant > 0:
        hold = rt.safety.lease_sent(grant, now)
        actions.append(GrantLease(site_id=site.site_id, sm_count=grant, reason=f"{cfg.policy.name}: {decision.reason}",
                                  seq=hold.seq, decided_at=now, valid_for_s=rt.safety.valid_for_s,
                                  basis=rt.safety.basis()))
    elif rt.grant_sms > 0:
        actions.append(RevokeLease(site_id=site.site_id, reason="grant-zero"))
    rt.grant_sms = grant
    _account(state, rt, est, grant=grant, wanted_env=decision.wanted_sms,
             wanted=wanted, ceiling=ceiling, capped=capped, training=site.site_id in inputs.agents,
             epoch_wait=now < not_before)
    why = decision.reason if now >= not_before else "waiting out the previous epoch's leases"
    _view(rt, now, envelope, grant, est, True, why)


def _account(state: LoopState, rt: SiteRuntime, est: DemandEstimate, **decision) -> None:
    """The decision's share of the utilisation waterfall (xapp.waterfall.GrantLedger.decided)."""
    s = rt.cfg
    # the configured guard for every policy (the others size their margin into the grant itself), so that
    # usable spare means the same whichever policy decides
    rt.waterfall.decided(period_s=state.cfg.period_s, gpu=s.gpu_sms, guard=state.cfg.policy.guard_sms,
                         granularity=s.granularity, peak=est.peak, **decision)


def _view(rt: SiteRuntime, now: float, envelope: int, grant: int, est: DemandEstimate, is_fresh: bool,
          reason: str) -> None:
    rt.last_view = SiteDecisionView(t=now, envelope_sms=envelope, grant_sms=grant, demand_mean=est.mean,
                                    demand_peak=est.peak, source=est.source, fresh=is_fresh, reason=reason,
                                    basis=rt.safety.basis(), slack_sms=rt.safety.slack(now))
    rt.views.append(rt.last_view)


def _lift(state: LoopState, rt: SiteRuntime, now: float, actions: list, force: bool = False) -> bool:
    """Hand the nodes their whole GPU back once the site held no lease for LIFT_AFTER_PERIODS (or at
    once with `force`); True when the site is (being) lifted. Loosening goes through the invariant
    like any envelope, so nothing is lifted under a lease the agent may still act on."""
    if not force and now - rt.idle_since < LIFT_AFTER_PERIODS * state.cfg.period_s:
        return False
    if rt.safety.agent_sms(now) > 0 or rt.grant_sms > 0:
        return False
    for nc in rt.nodes.values():
        if nc.meid in state.busy_nodes:
            continue
        if nc.mode == "envelope" and nc.meid in rt.safety.nodes:
            _send_envelope(state, rt, nc, rt.cfg.gpu_sms, now, actions, hysteresis=0)
        elif nc.mode == "quota" and rt.cfg.best_effort_slices:
            q = tuple(SliceQuota(sst=b.sst, sd=b.sd, min_ratio=0, max_ratio=100) for b in rt.cfg.best_effort_slices)
            if rt.sent_caps_by_node.get(nc.meid) != q:
                _send_control(state, rt, nc, _new_control(state, rt, nc, "quota", rt.cfg.gpu_sms, q), now, actions)
    if not rt.lifted:
        state.events.append((now, rt.cfg.site_id, "lift", "shaping lifted: envelope = whole GPU, caps cleared"))
    rt.lifted = True
    return True


def _guard_of(policy) -> int:
    # weaver grants C - E - guard; the others size their margin into the grant itself
    return int(getattr(policy, "guard_sms", 0)) if getattr(policy, "name", "") == "weaver" else 0



def _node_quotas(rt: SiteRuntime, caps: tuple[CellCap, ...], min_ratio: int) -> dict[str, tuple[SliceQuota, ...]]:
    """Per-cell best-effort caps -> one slice-quota control per node (cells numbered node by node in
    site order; a node takes the tightest cap of its cells). Protected slices are never capped."""
    if not caps:
        return {}
    by_cell = {c.cell: c.be_max_ratio for c in caps}
    out, cell = {}, 0
    for m in rt.cfg.nodes:
        avail = rt.last[m].values.get(AVAIL_DL) if m in rt.last else None
        cells = max(1, round(avail / 273)) if avail else 1
        ratios = [by_cell[c] for c in range(cell, cell + cells) if c in by_cell]
        cell += cells
        if not ratios or not rt.cfg.best_effort_slices:
            continue
        r = max(1, min(100, min(ratios)))
        out[m] = tuple(SliceQuota(sst=b.sst, sd=b.sd, min_ratio=min(min_ratio, r), max_ratio=r)
                       for b in rt.cfg.best_effort_slices)
    return out


def _caps_unchanged(sent: tuple[SliceQuota, ...] | None, new: tuple[SliceQuota, ...], hysteresis: int) -> bool:
    """Tightening goes out at once (the envelope counts on it); loosening by less than `hysteresis`
    percentage points waits (it only delays best-effort traffic a little), so the RAN is not flooded."""
    if sent is None or [(q.sst, q.sd) for q in sent] != [(q.sst, q.sd) for q in new]:
        return False
    if sent == new:
        return True
    return all(n.max_ratio >= o.max_ratio and n.max_ratio - o.max_ratio < hysteresis and n.min_ratio == o.min_ratio
               for o, n in zip(sent, new, strict=True))


def _actuate(state: LoopState, rt: SiteRuntime, now: float, envelope: int | None,
             quotas: dict[str, tuple[SliceQuota, ...]], sized: int, actions: list) -> None:
    act = state.cfg.actuation
    for nc in rt.nodes.values():
        if nc.meid in state.busy_nodes:
            continue                                  # one control in flight per node
        if nc.mode == "envelope" and envelope is not None and rt.safety.nodes[nc.meid].enforced:
            _send_envelope(state, rt, nc, envelope, now, actions, act.hysteresis_sms)
        elif nc.mode == "quota" and nc.meid in quotas:
            q = quotas[nc.meid]
            if _caps_unchanged(rt.sent_caps_by_node.get(nc.meid), q, act.caps_hysteresis_pct):
                continue
            _send_control(state, rt, nc, _new_control(state, rt, nc, "quota", sized, q), now, actions)


def _send_envelope(state: LoopState, rt: SiteRuntime, nc: NodeControl, target: int, now: float, actions: list,
                   hysteresis: int) -> None:
    """Tightening goes out unless within hysteresis of the acknowledged value; an unknown node always
    gets it; loosening only once the invariant allows it, else it waits (`deferred_envelope`) for the
    agent's release or the old lease's hard end while the grant is already cut to the new value."""
    n = rt.safety.nodes[nc.meid]
    if n.known is not None and (target == n.known or (target < n.known and n.known - target < hysteresis)):
        return
    if not rt.safety.may_send_envelope(nc.meid, target, now):
        rt.deferred_envelope = max(target, rt.deferred_envelope or 0)
        return
    _send_control(state, rt, nc, _new_control(state, rt, nc, "envelope", target), now, actions)


def _send_envelopes(state: LoopState, rt: SiteRuntime, now: float, target: int, actions: list) -> None:
    """Retry a deferred looser envelope (between ticks, as soon as a release or a hard end allows)."""
    rt.deferred_envelope = None
    for nc in rt.nodes.values():
        if nc.mode == "envelope" and nc.meid not in state.busy_nodes and rt.safety.nodes[nc.meid].enforced:
            _send_envelope(state, rt, nc, target, now, actions, state.cfg.actuation.hysteresis_sms)


def _send_control(state: LoopState, rt: SiteRuntime, nc: NodeControl, ctl: SendControl, now: float,
                  actions: list) -> None:
    if ctl.kind == "envelope":
        rt.safety.control_sent(nc.meid, ctl.control_id, ctl.envelope_sms, now)
    else:
        rt.sent_caps_by_node[nc.meid] = ctl.quotas
    state.next_control_id = (state.next_control_id % 0xFFFF) + 1
    _add_pending(state, ctl, now)
    actions.append(ctl)
