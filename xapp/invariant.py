"""The RAN-first invariant, owned here and nowhere else (architecture.md, "The RAN-first invariant").

For every site, at every instant:

    sum over the site's nodes of the envelope that node MAY be applying
  + SMs of every lease the agent MAY still act on
  + guard                 (counted while the agent may act on any lease)
  <= the site's GPU SMs

The node terms add up because the nodes of a site share its GPU: each node's envelope bounds that
node's own SMs (its GPU.* KPM counters add up to the site's, docs/contracts.md), so two nodes under an
envelope of E each may together run 2E. On a one-node site the sum is that node's envelope.

`SiteSafety` is a pure, clock-free ledger of both terms for one site. The control loop tells it every
envelope it sends, every answer (or silence) from a node, every lease it sends and every release the
agent acknowledges, and asks it three questions: how large a lease may be now (`grant_ceiling`), may
this envelope go out now (`may_send_envelope`), and how much room is left (`slack`). Nothing else
computes a grant.

What a node MAY be applying:
- `None` (unknown) counts as the whole GPU: after E2 setup, an xApp start, a node restart or loss, stale
  KPM (the node may have restarted unseen) and a control timeout;
- while controls are in flight, the loosest of the acknowledged value and every value in flight;
- only an acknowledgement makes a value known. A FAILURE means the node kept the value it had.
  Assumption: controls to one node arrive in the order they were sent (one SCTP association through the
  E2 termination), so an ACK also settles every control sent before it.
A node that takes no envelope (quota or monitor-only) is bounded by the policy's demand forecast
instead: the grant then rests on a forecast, not on an enforced envelope (`basis`). The forecast is one
bound of the site's demand (sized on the site's summed KPM, floored at the site's measured peak), so it
is counted once for all such nodes, beside the sum of the enforcing nodes' envelopes.

What the agent MAY act on: a lease counts from the moment it is decided until the agent acknowledges its
release (a release of seq N releases every lease of the site up to N) or its hard end has passed. The
hard end is the decision instant plus `valid_for`: the broker stamps the lease with that instant and the
agent maps it onto its own clock, so transit never extends it. The agent acts on one lease at a time (a
newer lease replaces an older at receipt), so the SMs it may use are the largest of the leases it may
still act on. That includes the leases of another xApp instance (a killed one, a leader before a
takeover), which the shell reads from the SDL ledger at start (`inherit`), and for one lease lifetime
one of the largest size the site allows, for a lease the ledger may not hold (a failed SDL write, an
embedded store that forgot, a leader's last grant): only their hard end ends them, since the agent
acknowledges its releases to the instance that issued them. Without them a restarted xApp, whose nodes
are all unknown, would send a looser envelope at once beside a lease the agent still acts on.

Consequences: tightening an envelope is always safe (the old value bounds the flight); loosening waits
until the leases that the new value would collide with are released or past their hard end; a lease
may shrink at once and grows only on an acknowledged tighter envelope.

Configurations are held to the same rule (`policy_violations`): a setting that would let a grant exceed
what the rule allows -- no guard, no reservation, a forecast that ignores the measured peak -- is
refused wherever a config enters (xapp.config's parse, so a REST PUT and a file reload alike, and
`XappApp.apply_config`). And a forecast-based bound is never below the RAN peak measured this period
(`SiteSafety.set_forecast`), so even a reservation that passes the floors cannot grant SMs the RAN is
using now.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xapp.config import XappConfig

ENVELOPE, FORECAST = "envelope", "forecast"


class InvariantViolation(RuntimeError):
    """A grant or an envelope the rule refuses; a caller that sees this has a bug."""


@dataclass
class NodeEnvelope:
    enforced: bool                      # the node takes an SM envelope (envelope mode)
    known: int | None = None            # acknowledged envelope; None = unknown (counts as the whole GPU)
    inflight: dict[int, int] = field(default_factory=dict)   # control id -> envelope, unanswered, in send order
    unknown_reason: str = "e2-setup"

    def may_apply(self, gpu_sms: int) -> int:
        base = gpu_sms if self.known is None else self.known
        return max(base, *self.inflight.values()) if self.inflight else base


@dataclass(frozen=True)
class LeaseHold:
    seq: int
    sm_count: int
    sent_at: float                      # loop clock: the decision instant, which the broker stamps
    hard_end: float


@dataclass
class SiteSafety:
    site_id: str
    gpu_sms: int
    granularity: int
    guard_sms: int
    valid_for_s: float
    nodes: dict[str, NodeEnvelope] = field(default_factory=dict)
    leases: list[LeaseHold] = field(default_factory=list)      # decided, not yet released (pruned lazily)
    inherited: list[LeaseHold] = field(default_factory=list)   # a previous instance's, from the ledger
    released_seq: int = 0
    next_seq: int = 1
    forecast_sms: int | None = None     # policy's RAN demand bound for nodes that take no envelope

    # ----------------------------------------------------------------- nodes
    def add_node(self, meid: str, enforced: bool) -> None:
        old = self.nodes.get(meid)
        if old is None or old.enforced != enforced:
            self.nodes[meid] = NodeEnvelope(enforced=enforced)

    def node_unknown(self, meid: str, reason: str) -> None:
        """Node restart, loss, stale KPM, E2 setup: nothing is known about what it applies."""
        n = self.nodes.get(meid)
        if n is not None:
            n.known, n.unknown_reason = None, reason
            n.inflight.clear()            # replies to controls sent before the loss prove nothing now

    def control_sent(self, meid: str, control_id: int, envelope_sms: int, now: float) -> None:
        if not self.may_send_envelope(meid, envelope_sms, now):
            raise InvariantViolation(f"{self.site_id}/{meid}: envelope {envelope_sms} SMs with "
                                     f"{self.agent_sms(now)} SMs leased and guard {self.guard_sms} "
                                     f"exceeds {self.gpu_sms}")
        self.nodes[meid].inflight[control_id] = envelope_sms

    def control_acked(self, meid: str, control_id: int) -> None:
        """The node applies this control's value. Controls to one node arrive in order (one SCTP
        association through the E2 termination), so every control sent before it was applied before it
        and overwritten; those sent after it are still in flight and still count."""
        n = self.nodes.get(meid)
        if n is None or control_id not in n.inflight:
            return                        # duplicate, late (timed out) or never sent: proves nothing
        for cid in list(n.inflight):
            value = n.inflight.pop(cid)
            if cid == control_id:
                n.known = value
                return

    def control_failed(self, meid: str, control_id: int) -> None:
        n = self.nodes.get(meid)
        if n is not None:
            n.inflight.pop(control_id, None)     # the node refused it: it kept what it had

    def control_timed_out(self, meid: str, control_id: int) -> None:
        n = self.nodes.get(meid)
        if n is not None and n.inflight.pop(control_id, None) is not None:
            self.node_unknown(meid, "control-timeout")

    # ----------------------------------------------------------------- leases
    def lease_sent(self, sm_count: int, now: float) -> LeaseHold:
        """Record a lease decided at `now`; refuses one the rule does not allow."""
        if sm_count > self.grant_ceiling(now):
            raise InvariantViolation(f"{self.site_id}: lease of {sm_count} SMs over the ceiling "
                                     f"{self.grant_ceiling(now)} (envelope bound {self.envelope_bound()})")
        hold = LeaseHold(self.next_seq, sm_count, now, now + self.valid_for_s)
        self.next_seq += 1
        self.leases.append(hold)
        return hold

    def released(self, seq: int) -> None:
        """The agent acknowledged that it acts on no lease up to `seq` any more."""
        if seq >= self.next_seq:
            return                        # a release of a lease never decided: ignore, change nothing
        self.released_seq = max(self.released_seq, seq)
        self.leases = [h for h in self.leases if h.seq > self.released_seq]

    def inherit(self, sm_count: int, issued_at: float, hard_end: float) -> None:
        """A lease another xApp instance issued (a killed one, or the leader before a takeover): its agent may
        act on it to its hard end, and no release of this instance's ends it."""
        self.inherited.append(LeaseHold(0, sm_count, issued_at, hard_end))

    def inherit_unknown(self, now: float, hard_end: float) -> None:
        """A lease another instance may have issued that no ledger shows: the largest this site allows (its
        GPU less the guard, in partition steps), until `hard_end`."""
        largest = max(0, (self.gpu_sms - self.guard_sms) // self.granularity * self.granularity)
        self.inherit(largest, now, hard_end)

    def held(self, now: float) -> list[LeaseHold]:
        self.leases = [h for h in self.leases if h.seq > self.released_seq and h.hard_end > now]
        self.inherited = [h for h in self.inherited if h.hard_end > now]
        return self.leases + self.inherited

    def agent_sms(self, now: float) -> int:
        return max((h.sm_count for h in self.held(now)), default=0)

    def own_and_inherited_sms(self, now: float) -> tuple[int, int]:
        """The leases the agent may act on, split: this instance's, and those inherited from another."""
        self.held(now)
        return (max((h.sm_count for h in self.leases), default=0),
                max((h.sm_count for h in self.inherited), default=0))

    def next_expiry(self) -> float:
        return min((h.hard_end for h in (*self.leases, *self.inherited)), default=math.inf)

    # ----------------------------------------------------------------- the rule
    def basis(self) -> str:
        """`envelope` when every node enforces a known envelope, else `forecast`."""
        return ENVELOPE if self.nodes and all(n.enforced for n in self.nodes.values()) else FORECAST

    def envelope_bound(self) -> int:
        """The first term of the rule: the sum of the envelopes the nodes may be applying (whole GPU when
        there are no nodes yet; the forecast stands in, once, for the nodes that take no envelope)."""
        return self._nodes_bound()

    def _nodes_bound(self, meid: str | None = None, envelope_sms: int = 0) -> int:
        """The node terms summed, capped at the GPU (the nodes together cannot run more than all of it); with `meid`,
        as if `envelope_sms` replaced that node's acknowledged value (its flight still counts)."""
        if not self.nodes:
            return self.gpu_sms
        total, forecast_nodes = 0, False
        for m, n in self.nodes.items():
            if not n.enforced:
                forecast_nodes = True
            elif m == meid:
                total += max([envelope_sms, *n.inflight.values()])
            else:
                total += n.may_apply(self.gpu_sms)
        if forecast_nodes:
            total += self.gpu_sms if self.forecast_sms is None else self.forecast_sms
        return min(self.gpu_sms, total)

    def slack(self, now: float) -> int:
        """GPU SMs minus the three terms: < 0 means the rule is broken at `now`. With no lease held the
        guard protects nothing and is not counted (an unshaped node on an idle site is no violation)."""
        held = self.agent_sms(now)
        return self.gpu_sms - self.envelope_bound() - (held + self.guard_sms if held else 0)

    def set_forecast(self, policy_bound: int, measured_peak: float | None) -> None:
        """The bound of nodes that take no envelope: the policy's forecast, but never below the peak the
        nodes measured this period (rounded up to a partition step), since a forecast the measurement
        already contradicts bounds nothing."""
        floor = 0 if measured_peak is None or not math.isfinite(measured_peak) else \
            math.ceil(max(0.0, measured_peak) / self.granularity - 1e-9) * self.granularity
        self.forecast_sms = min(self.gpu_sms, max(int(policy_bound), floor))

    def grant_ceiling(self, now: float) -> int:
        room = self.gpu_sms - self.envelope_bound() - self.guard_sms
        return max(0, room // self.granularity * self.granularity)

    def may_send_envelope(self, meid: str, envelope_sms: int, now: float) -> bool:
        """Sending `envelope_sms` to `meid` keeps the rule. Tightening a known value always does (the old
        value bounds the flight); anything else -- loosening, or any value to an unknown node, which may
        in fact be applying something tighter (a timed-out control may have landed) -- only when the new
        value itself fits beside the other nodes' terms and the leases the agent may still act on."""
        n = self.nodes.get(meid)
        if n is None or not n.enforced:
            return False
        if n.known is not None and not n.inflight and envelope_sms <= n.known:
            return True
        held = self.agent_sms(now)
        # the other nodes' terms count too: they share the GPU with this one
        return held == 0 or self._nodes_bound(meid, envelope_sms) + held + self.guard_sms <= self.gpu_sms


# ----------------------------------------------------------------------------- safe configurations

# Floors (and ceilings) below which a setting breaks RAN first whatever the load. They bound what a
# config may claim; a calibrated value is usually far inside them.
# - weaver `guard_sms` and reactive `reactive_margin_sms` >= one partition step of every site: the RAN's
#   demand moves between two KPM periods and a partition moves in whole steps, so a band smaller than one
#   step cannot absorb even one step of overshoot; 0 is no band at all.
# - static `static_reserve_sms` >= one partition step of every site: a static reservation is a forecast
#   of the RAN's peak (architecture.md, Policy); 0 forecasts a RAN that uses no GPU. Above the floor the
#   measured peak still bounds every grant (`SiteSafety.set_forecast`).
# - weaver `reliability_target` <= 1e-3 of slots: one miss every 0.5 s of 0.5 ms slots is no reliability
#   class any RAN runs at; the design's target is 1e-5.
# - quota sizing: (`quota_dl_sms_per_prb` + `quota_ul_sms_per_prb`) x `cell_prbs` >= one partition step:
#   below it a whole cell of best-effort PRBs would count as costing less than one step (as free), and
#   the caps would let best-effort traffic take SMs the envelope never reserved. `cell_prbs` within
#   [11, 275]: NR's smallest and largest carriers (TS 38.101-1/-2); a smaller value than the real cell
#   inflates the caps.
# - `estimate.quantile` >= 0.99: the peak predicted from PRBs is mean x this quantile of max/mean
#   ratios; below p99 the prediction is exceeded in more than one period in a hundred.
# - `estimate.min_samples` >= 10: the PRB cost model fits three coefficients; fewer points fit noise
#   (with none it predicts a RAN that needs no GPU).
# Not floored: `estimate.window_periods` (the schema's 8 periods; weaver adds a partition step while its
# window holds fewer than 1/target slots), `hold_periods` (it only delays E's step down, never below
# what the window wants), the hysteresis knobs (they only ever skip a loosening or keep a looser known
# envelope the rule already counts), the lease length (the rule counts a lease to its hard end).
MAX_RELIABILITY_TARGET = 1e-3
MIN_CELL_PRBS, MAX_CELL_PRBS = 11, 275
MIN_QUANTILE = 0.99
MIN_MODEL_SAMPLES = 10


@dataclass(frozen=True)
class UnsafeSetting:
    field: str                          # dotted path under `controls`, e.g. "policy.guard_sms"
    why: str


def policy_violations(cfg: XappConfig) -> list[UnsafeSetting]:
    """Every setting of `cfg` that could let a grant exceed what the RAN-first rule allows (floors
    above), in a stable order; empty when the config is safe. Only the knobs of the configured policy
    count: a knob no policy reads cannot enlarge a grant (the shipped descriptor keeps a static reserve of
    0 beside the weaver policy)."""
    p, e = cfg.policy, cfg.estimate
    step = max((s.granularity for s in cfg.sites), default=1)
    out: list[UnsafeSetting] = []
    if p.name == "weaver":
        if p.guard_sms < step:
            out.append(UnsafeSetting("policy.guard_sms", f"{p.guard_sms} SMs is below one partition step "
                                     f"({step} SMs): the guard band must absorb a step of overshoot"))
        if p.reliability_target > MAX_RELIABILITY_TARGET:
            out.append(UnsafeSetting("policy.reliability_target", f"{p.reliability_target} of slots is above "
                                     f"{MAX_RELIABILITY_TARGET}: no RAN runs at that miss rate"))
        if cfg.actuation.mode in ("auto", "quota"):
            per_cell = (p.quota_dl_sms_per_prb + p.quota_ul_sms_per_prb) * p.cell_prbs
            if per_cell < step:
                out.append(UnsafeSetting("policy.quota_dl_sms_per_prb", f"(dl + ul) x cell_prbs = {per_cell:g} SMs "
                                         f"is below one partition step ({step}): best-effort PRBs would count "
                                         "as free when caps are sized"))
            if not MIN_CELL_PRBS <= p.cell_prbs <= MAX_CELL_PRBS:
                out.append(UnsafeSetting("policy.cell_prbs", f"{p.cell_prbs} is outside NR's carriers "
                                         f"[{MIN_CELL_PRBS}, {MAX_CELL_PRBS}] PRBs"))
    elif p.name == "reactive" and p.reactive_margin_sms < step:
        out.append(UnsafeSetting("policy.reactive_margin_sms", f"{p.reactive_margin_sms} SMs is below one "
                                 f"partition step ({step} SMs)"))
    elif p.name == "static" and p.static_reserve_sms < step:
        out.append(UnsafeSetting("policy.static_reserve_sms", f"{p.static_reserve_sms} SMs is below one "
                                 f"partition step ({step} SMs): a reservation is a forecast of the RAN's peak; "
                                 "size it on a calibration trace"))
    if e.quantile < MIN_QUANTILE:
        out.append(UnsafeSetting("estimate.quantile", f"{e.quantile} is below {MIN_QUANTILE}: the predicted "
                                 "peak would be exceeded more than once in a hundred periods"))
    if e.min_samples < MIN_MODEL_SAMPLES:
        out.append(UnsafeSetting("estimate.min_samples", f"{e.min_samples} is below {MIN_MODEL_SAMPLES}: the "
                                 "cost model would predict demand from too few periods"))
    return out


# Settings whose change at run time would loosen RAN first (a smaller margin, a longer-lived lease or session, a
# staler KPM sample), with the direction that loosens: applied live only when the operator started the xApp with
# --allow-live-loosening, and logged each time (xapp.app.XappApp.apply_config).
LOOSENING: tuple[tuple[str, int], ...] = (
    ("policy.guard_sms", -1), ("policy.reactive_margin_sms", -1), ("policy.static_reserve_sms", -1),
    ("policy.reliability_target", +1), ("estimate.quantile", -1), ("lease_valid_periods", +1),
    ("stale_periods", +1), ("broker.heartbeat_ms", +1), ("broker.agent_timeout_heartbeats", +1),
    ("actuation.control_timeout_ms", +1),
)
# Authentication and listeners are start-up settings: a config PUT cannot turn a credential check off or point it
# at another secret (issue 26 item 5).
START_UP_ONLY = ("broker.token_env", "broker.tls_cert", "broker.tls_key", "broker.tls_client_ca", "broker.listen",
                 "broker.tier_pass_s", "rest.config_token_env", "rest.host", "rest.port", "shards")


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def start_up_changes(old: XappConfig, new: XappConfig) -> list[str]:
    return [f for f in START_UP_ONLY if _get(old, f) != _get(new, f)]


def loosenings(old: XappConfig, new: XappConfig) -> list[tuple[str, object, object]]:
    """(field, old, new) for every setting `new` moves in the direction that loosens RAN first."""
    out = []
    for f, sign in LOOSENING:
        a, b = _get(old, f), _get(new, f)
        if (b - a) * sign > 0:
            out.append((f, a, b))
    return out
