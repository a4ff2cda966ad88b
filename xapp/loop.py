"""The control loop as a pure state machine: `step(state, now, inputs) -> (state, actions)`.

Per site and period: ingest (the samples the shell decoded) -> estimate -> policy -> actuate. Actuate
*returns* actions -- RC controls, lease grants, revocations -- and the async shell (`xapp.app`) performs
them, feeding ACK/FAILURE back in as `ControlResult`s. Time is the caller's monotonic seconds; nothing
here reads a clock, sleeps or logs. `next_deadline(state)` is when `step` next has work of its own (the
period tick, a KPM staleness limit, an RC ACK timeout), so a virtual clock can jump straight there.

Fail-safe rules (RAN first; architecture.md): a site's lease is revoked at once when
- its KPM is stale (no sample from one of its nodes for `stale_periods` periods) or a node is lost,
- an RC control to one of its nodes fails or is not acknowledged within `control_timeout_ms`
  (the site then stays conservative -- no grant -- for `FAILSAFE_PERIODS` periods),
- its agent is gone (the broker drops the lease itself; the loop just stops granting).
Grants only grow on acknowledged envelopes: while a control that tightens the envelope is pending, the
grant is computed from the envelope the nodes last acknowledged.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from e2sm.rc import SliceQuota
from xapp.actuate import NodeControl, envelope_request, quota_request
from xapp.config import SiteConfig, XappConfig
from xapp.estimate import AVAIL_DL, CostModel, DemandEstimate, SiteEstimator
from xapp.ingest import KpmSample, meas_key
from xapp.policy import CellCap, QuotaCost, SiteHistory, SiteObservation, make_policy

FAILSAFE_PERIODS = 10
TICK_SLACK = 1e-6        # float sums of periods drift; a tick 1 us early is the same tick


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True, kw_only=True)
class SendControl:
    control_id: int
    site_id: str
    meid: str
    payload: bytes                   # complete E2AP RICcontrolRequest
    kind: str                        # envelope | quota
    envelope_sms: int
    quotas: tuple[SliceQuota, ...] = ()


@dataclass(frozen=True, kw_only=True)
class GrantLease:
    site_id: str
    sm_count: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class RevokeLease:
    site_id: str
    reason: str


Action = SendControl | GrantLease | RevokeLease


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True, kw_only=True)
class ControlOutcome:
    control_id: int
    ok: bool
    cause: str = ""


@dataclass(frozen=True, kw_only=True)
class Inputs:
    samples: tuple[KpmSample, ...] = ()
    results: tuple[ControlOutcome, ...] = ()
    agents: frozenset[str] = frozenset()          # sites with a connected agent
    lost_nodes: frozenset[str] = frozenset()


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


@dataclass
class PendingControl:
    control: SendControl
    sent: float


@dataclass
class SiteRuntime:
    cfg: SiteConfig
    estimator: SiteEstimator
    nodes: dict[str, NodeControl] = field(default_factory=dict)
    last: dict[str, KpmSample] = field(default_factory=dict)
    acked_envelope: int | None = None
    acked_caps: tuple[SliceQuota, ...] = ()
    sent_envelope: int | None = None
    sent_caps_by_node: dict[str, tuple[SliceQuota, ...]] = field(default_factory=dict)
    policy: Any = None                   # xapp.policy Policy for this site (mode follows its nodes)
    history: SiteHistory = field(default_factory=SiteHistory)
    grant_sms: int = 0
    conservative_until: float = -math.inf
    views: deque = field(default_factory=lambda: deque(maxlen=6000))
    last_view: SiteDecisionView | None = None
    last_estimate: DemandEstimate | None = None
    misses: int = 0


@dataclass
class LoopState:
    cfg: XappConfig
    sites: dict[str, SiteRuntime]
    next_tick: float
    pending: dict[int, PendingControl] = field(default_factory=dict)
    busy_nodes: dict[str, int] = field(default_factory=dict)     # meid -> pending control id
    busy_sites: dict[str, int] = field(default_factory=dict)     # site -> pending controls
    next_control_id: int = 1
    events: deque = field(default_factory=lambda: deque(maxlen=1000))   # (t, site, kind, detail)
    started: float = 0.0


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
        sites[s.site_id] = SiteRuntime(cfg=s, policy=policy_for(cfg, "envelope"), estimator=SiteEstimator(
            s.site_id, cfg.estimate.quantile, cfg.estimate.window_periods, cfg.estimate.min_samples, model),
            history=SiteHistory(maxlen=cfg.estimate.window_periods))
    return LoopState(cfg=cfg, sites=sites, next_tick=now + cfg.period_s, started=now)


def set_node(state: LoopState, nc: NodeControl) -> None:
    """Tell the loop how a node is controlled (after discovery/subscription)."""
    site = state.cfg.site_of(nc.meid)
    if site is not None:
        rt = state.sites[site.site_id]
        rt.nodes[nc.meid] = nc
        modes = {n.mode for n in rt.nodes.values()}
        rt.policy = policy_for(state.cfg, "envelope" if "envelope" in modes else "quota" if "quota" in modes
                               else "envelope")


def stale_limit(state: LoopState) -> float:
    return state.cfg.stale_periods * state.cfg.period_s


def fresh(state: LoopState, rt: SiteRuntime, now: float, lost: frozenset[str] = frozenset()) -> bool:
    limit = stale_limit(state)
    return all(m not in lost and m in rt.last and now - rt.last[m].received <= limit for m in rt.cfg.nodes)


def next_deadline(state: LoopState) -> float:
    t = state.next_tick
    timeout = state.cfg.actuation.control_timeout_ms / 1000.0
    for p in state.pending.values():
        t = min(t, p.sent + timeout)
    limit = stale_limit(state)
    for rt in state.sites.values():
        if rt.grant_sms > 0:
            for m in rt.cfg.nodes:
                if m in rt.last:
                    t = min(t, rt.last[m].received + limit + 1e-6)
    return t


def _pop_pending(state: LoopState, cid: int) -> PendingControl | None:
    p = state.pending.pop(cid, None)
    if p is not None:
        state.busy_nodes.pop(p.control.meid, None)
        n = state.busy_sites.get(p.control.site_id, 1) - 1
        if n > 0:
            state.busy_sites[p.control.site_id] = n
        else:
            state.busy_sites.pop(p.control.site_id, None)
    return p


def _add_pending(state: LoopState, ctl: SendControl, now: float) -> None:
    state.pending[ctl.control_id] = PendingControl(ctl, now)
    state.busy_nodes[ctl.meid] = ctl.control_id
    state.busy_sites[ctl.site_id] = state.busy_sites.get(ctl.site_id, 0) + 1


def _round_down(x: float, step: int) -> int:
    return max(0, int(math.floor(x / step)) * step)


def _round_up(x: float, step: int) -> int:
    return int(math.ceil(x / step)) * step


def _revoke(state: LoopState, rt: SiteRuntime, now: float, reason: str, actions: list) -> None:
    if rt.grant_sms > 0:
        actions.append(RevokeLease(site_id=rt.cfg.site_id, reason=reason))
        state.events.append((now, rt.cfg.site_id, "revoke", reason))
    rt.grant_sms = 0


def _failsafe(state: LoopState, rt: SiteRuntime, now: float, reason: str, actions: list) -> None:
    rt.conservative_until = now + FAILSAFE_PERIODS * state.cfg.period_s
    rt.sent_envelope = None                       # resend the next decision, whatever hysteresis says
    rt.sent_caps_by_node.clear()
    _revoke(state, rt, now, reason, actions)


def step(state: LoopState, now: float, inputs: Inputs) -> tuple[LoopState, list[Action]]:
    actions: list[Action] = []
    # 1. ingest
    for s in inputs.samples:
        site = state.cfg.site_of(s.meid)
        if site is not None:
            rt = state.sites[site.site_id]
            rt.last[s.meid] = s
            rt.misses += int(s.values.get("GPU.DeadlineMiss", 0))
    # 2. control results, then timeouts
    for r in inputs.results:
        p = _pop_pending(state, r.control_id)
        if p is None:
            continue
        rt = state.sites[p.control.site_id]
        if r.ok:
            rt.acked_envelope = p.control.envelope_sms
            rt.acked_caps = p.control.quotas
            state.events.append((now, rt.cfg.site_id, "control-ack", f"{p.control.kind} {p.control.meid}"))
        else:
            state.events.append((now, rt.cfg.site_id, "control-failure", f"{p.control.meid}: {r.cause}"))
            _failsafe(state, rt, now, f"control-failure: {r.cause}", actions)
    timeout = state.cfg.actuation.control_timeout_ms / 1000.0
    for cid, p in list(state.pending.items()):
        if now - p.sent >= timeout:
            _pop_pending(state, cid)
            rt = state.sites[p.control.site_id]
            state.events.append((now, rt.cfg.site_id, "control-timeout", p.control.meid))
            _failsafe(state, rt, now, "control-timeout", actions)
    # 3. fail-safe between ticks: stale KPM, lost node, lost agent revoke at once
    for rt in state.sites.values():
        if rt.grant_sms > 0:
            if not fresh(state, rt, now, inputs.lost_nodes):
                _revoke(state, rt, now, "lost-node" if set(rt.cfg.nodes) & inputs.lost_nodes else "stale-kpm", actions)
            elif rt.cfg.site_id not in inputs.agents:
                rt.grant_sms = 0      # the broker already dropped the lease with the stream
    # 4. the period tick
    if now >= state.next_tick - TICK_SLACK:
        period = state.cfg.period_s
        state.next_tick += period * max(1, math.floor((now + TICK_SLACK - state.next_tick) / period) + 1)
        for rt in state.sites.values():
            _decide(state, rt, now, inputs, actions)
    return state, actions


def step_site(state: LoopState, site_id: str, now: float, samples: tuple[KpmSample, ...] = (),
              results: tuple[ControlOutcome, ...] = (), agents: frozenset[str] = frozenset()) -> list[Action]:
    """One site's period decision on its own (a shell that ticks sites as their KPM arrives; the bench).
    Same rules as `step`, restricted to `site_id`."""
    actions: list[Action] = []
    rt = state.sites[site_id]
    for s in samples:
        rt.last[s.meid] = s
    for r in results:
        p = _pop_pending(state, r.control_id)
        if p is not None and r.ok:
            rt.acked_envelope = p.control.envelope_sms
        elif p is not None:
            _failsafe(state, rt, now, f"control-failure: {r.cause}", actions)
    _decide(state, rt, now, Inputs(samples=samples, agents=agents), actions)
    return actions


def _observation(state: LoopState, rt: SiteRuntime, est: DemandEstimate, now: float) -> SiteObservation:
    """KPM -> what the policy sees. Cells per node from RRU.PrbAvailDl / cell_prbs; best-effort PRBs per
    cell from the node's per-slice counters of the site's best-effort slices."""
    site, cell_prbs = rt.cfg, state.cfg.policy.cell_prbs
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
                           prb_util=tuple(utils), fresh=True,
                           be_delay_budget_ms=float(state.cfg.actuation.be_delay_budget_ms),
                           be_prb_per_cell=tuple(be_per_cell), n_cells=max(1, n_cells))


@dataclass(frozen=True)
class _Label:
    snssai: Any


def _decide(state: LoopState, rt: SiteRuntime, now: float, inputs: Inputs, actions: list) -> None:
    cfg, site = state.cfg, rt.cfg
    is_fresh = fresh(state, rt, now, inputs.lost_nodes)
    samples = [rt.last[m] for m in site.nodes if m in rt.last]
    est = rt.estimator.estimate(samples) if is_fresh else DemandEstimate(
        site_id=site.site_id, mean=None, peak=None, peak_q=None, source="none")
    rt.last_estimate = est
    reason = ""
    if not is_fresh or est.mean is None:
        reason = "stale-kpm" if not is_fresh else "no-estimate"
    elif now < rt.conservative_until:
        reason = "failsafe"
    if reason:
        _revoke(state, rt, now, reason, actions)
        rt.last_view = SiteDecisionView(t=now, envelope_sms=rt.acked_envelope or site.gpu_sms, grant_sms=0,
                                        demand_mean=est.mean, demand_peak=est.peak, source=est.source,
                                        fresh=is_fresh, reason=reason)
        rt.views.append(rt.last_view)
        return
    obs = _observation(state, rt, est, now)
    decision = rt.policy.decide(obs, rt.history)
    rt.history.record(obs, decision)
    sized = decision.sized_for_sms if decision.sized_for_sms is not None else decision.envelope_sms
    envelope = min(site.gpu_sms, max(0, int(sized if sized is not None else site.gpu_sms - decision.grant_sms)))
    _actuate(state, rt, now, decision.envelope_sms, _node_quotas(rt, decision.caps, state.cfg.actuation.min_ratio),
             envelope, actions)
    # Grant from the envelope the nodes will honour: a pending tighter envelope does not count yet, and
    # quota-mode grants do not grow while new caps are in flight.
    modes = {nc.mode for nc in rt.nodes.values()}
    binding = envelope
    if "envelope" in modes and decision.envelope_sms is not None:
        binding = max(envelope, rt.acked_envelope if rt.acked_envelope is not None else site.gpu_sms)
    ceiling = _round_down(site.gpu_sms - binding - _guard(rt), site.granularity) if binding < site.gpu_sms else 0
    grant = min(_round_down(max(0, int(decision.grant_sms)), site.granularity), ceiling)
    if "quota" in modes and site.site_id in state.busy_sites:
        grant = min(grant, rt.grant_sms)
    if site.site_id not in inputs.agents:
        grant = 0
    if grant > 0:
        actions.append(GrantLease(site_id=site.site_id, sm_count=grant, reason=f"{cfg.policy.name}: {decision.reason}"))
    elif rt.grant_sms > 0:
        actions.append(RevokeLease(site_id=site.site_id, reason="grant-zero"))
    rt.grant_sms = grant
    rt.last_view = SiteDecisionView(t=now, envelope_sms=envelope, grant_sms=grant, demand_mean=est.mean,
                                    demand_peak=est.peak, source=est.source, fresh=True,
                                    reason=decision.reason)
    rt.views.append(rt.last_view)


def _guard(rt: SiteRuntime) -> int:
    # weaver grants C - E - guard; the others size their margin into the grant itself
    return int(getattr(rt.policy, "guard_sms", 0)) if getattr(rt.policy, "name", "") == "weaver" else 0


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
    busy = state.busy_nodes
    for nc in rt.nodes.values():
        if nc.meid in busy:
            continue                                  # one control in flight per node
        cid = state.next_control_id
        if nc.mode == "envelope" and envelope is not None:
            sent = rt.sent_envelope
            # Raising E (the RAN needs more) goes out at once; lowering it waits for hysteresis.
            if sent is not None and (envelope == sent or (envelope < sent and sent - envelope < act.hysteresis_sms)):
                continue
            payload = envelope_request(nc, cid, envelope, act.be_delay_budget_ms, act.ue_id)
            ctl = SendControl(control_id=cid, site_id=rt.cfg.site_id, meid=nc.meid, payload=payload,
                              kind="envelope", envelope_sms=envelope)
        elif nc.mode == "quota" and nc.meid in quotas:
            q = quotas[nc.meid]
            if _caps_unchanged(rt.sent_caps_by_node.get(nc.meid), q, act.caps_hysteresis_pct):
                continue
            payload = quota_request(nc, cid, q, act.ue_id)
            ctl = SendControl(control_id=cid, site_id=rt.cfg.site_id, meid=nc.meid, payload=payload,
                              kind="quota", envelope_sms=sized, quotas=q)
        else:
            continue
        state.next_control_id = (state.next_control_id % 0xFFFF) + 1
        _add_pending(state, ctl, now)
        actions.append(ctl)
        if ctl.kind == "envelope":
            rt.sent_envelope = envelope
        else:
            rt.sent_caps_by_node[nc.meid] = ctl.quotas
