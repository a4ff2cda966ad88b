"""The RAN-first invariant, owned here and nowhere else (architecture.md, "The RAN-first invariant").

For every site, at every instant:

    max over the site's nodes of the envelope that node MAY be applying
  + SMs of every lease the agent MAY still act on
  + guard                 (counted while the agent may act on any lease)
  <= the site's GPU SMs

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
instead: the grant then rests on a forecast, not on an enforced envelope (`basis`).

What the agent MAY act on: a lease counts from the moment it is decided until the agent acknowledges its
release (a release of seq N releases every lease of the site up to N) or its hard end has passed. The
hard end is the decision instant plus `valid_for`: the broker stamps the lease with that instant and the
agent maps it onto its own clock, so transit never extends it. The agent acts on one lease at a time (a
newer lease replaces an older at receipt), so the SMs it may use are the largest of the leases it may
still act on.

Consequences: tightening an envelope is always safe (the old value bounds the flight); loosening waits
until the leases that the new value would collide with are released or past their hard end; a lease
may shrink at once and grows only on an acknowledged tighter envelope.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

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

    def bound(self, gpu_sms: int, forecast_sms: int | None) -> int:
        """This node's term of the rule: its envelope, or the forecast for a node that takes none."""
        if self.enforced:
            return self.may_apply(gpu_sms)
        return gpu_sms if forecast_sms is None else forecast_sms


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

    def held(self, now: float) -> list[LeaseHold]:
        self.leases = [h for h in self.leases if h.seq > self.released_seq and h.hard_end > now]
        return self.leases

    def agent_sms(self, now: float) -> int:
        return max((h.sm_count for h in self.held(now)), default=0)

    def next_expiry(self) -> float:
        return min((h.hard_end for h in self.leases), default=math.inf)

    # ----------------------------------------------------------------- the rule
    def basis(self) -> str:
        """`envelope` when every node enforces a known envelope, else `forecast`."""
        return ENVELOPE if self.nodes and all(n.enforced for n in self.nodes.values()) else FORECAST

    def envelope_bound(self) -> int:
        """The first term of the rule: the largest envelope any node may be applying (whole GPU when
        there are no nodes yet; the forecast stands in for nodes that take no envelope)."""
        if not self.nodes:
            return self.gpu_sms
        return min(self.gpu_sms, max(n.bound(self.gpu_sms, self.forecast_sms) for n in self.nodes.values()))

    def slack(self, now: float) -> int:
        """GPU SMs minus the three terms: < 0 means the rule is broken at `now`. With no lease held the
        guard protects nothing and is not counted (an unshaped node on an idle site is no violation)."""
        held = self.agent_sms(now)
        return self.gpu_sms - self.envelope_bound() - (held + self.guard_sms if held else 0)

    def grant_ceiling(self, now: float) -> int:
        room = self.gpu_sms - self.envelope_bound() - self.guard_sms
        return max(0, room // self.granularity * self.granularity)

    def may_send_envelope(self, meid: str, envelope_sms: int, now: float) -> bool:
        """Sending `envelope_sms` to `meid` keeps the rule. Tightening a known value always does (the old
        value bounds the flight); anything else -- loosening, or any value to an unknown node, which may
        in fact be applying something tighter (a timed-out control may have landed) -- only when the new
        value itself fits beside the leases the agent may still act on."""
        n = self.nodes.get(meid)
        if n is None or not n.enforced:
            return False
        if n.known is not None and not n.inflight and envelope_sms <= n.known:
            return True
        held = self.agent_sms(now)
        return held == 0 or max([envelope_sms, *n.inflight.values()]) + held + self.guard_sms <= self.gpu_sms
