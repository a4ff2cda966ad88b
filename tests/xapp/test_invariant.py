"""The RAN-first invariant module (`xapp.invariant`) against an adversarial world.

The test plays the xApp: it tries actions at random and takes only those the module allows (that is the
contract: every grant and every envelope goes through it). A physical world stands beside it: what each
node really applies (a control changes it when it is delivered, in order per node; its ACK may be delayed, lost,
duplicated or reordered) and what the agent really acts on (leases arrive late or not at all, in-flight
work finishes after a replacement, releases are delayed, lost or duplicated, revokes race grants).
After every event: the module's view is conservative (no node applies more than the module thinks it
may; the agent acts on no more SMs than the module counts), and the physical rule holds: the sum of the
envelopes the nodes apply (they share the site's GPU) + SMs the agent acts on + guard <= GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xapp.invariant import InvariantViolation, SiteSafety

GPU, GRAN, GUARD, VALID = 128, 8, 8, 0.3


@dataclass
class World:
    safety: SiteSafety
    now: float = 0.0
    applied: dict = field(default_factory=dict)      # meid -> envelope the node applies (None: unshaped)
    to_node: list = field(default_factory=list)      # (arrive, meid, cid, envelope) controls in flight
    to_xapp: list = field(default_factory=list)      # (arrive, kind, payload) acks/timeouts/releases in flight
    to_agent: list = field(default_factory=list)     # (arrive, kind, seq, sm, hard_end): one ordered stream
    newest: int = 0                                  # newest lease seq the agent adopted
    acting: tuple | None = None                      # (seq, sm, hard_end) the agent works under
    finishing: tuple | None = None                   # (until, seq, sm) in-flight work of a replaced lease
    sent_at: dict = field(default_factory=dict)      # cid -> send time (for timeouts)
    restarted: set = field(default_factory=set)
    broken: bool = False

    def agent_physical(self) -> int:
        sm = 0
        if self.acting is not None and self.now < self.acting[2]:
            sm = self.acting[1]
        if self.finishing is not None and self.now < self.finishing[0]:
            sm = max(sm, self.finishing[2])
        return sm

    def check(self) -> None:
        s = self.safety
        for meid, real in self.applied.items():
            if meid in self.restarted:
                continue
            assert s.nodes[meid].may_apply(GPU) >= (GPU if real is None else real), (meid, real, s.nodes[meid])
        assert s.agent_sms(self.now) >= self.agent_physical(), (self.acting, self.finishing, s.leases)
        if not self.restarted and not self.broken and self.agent_physical() > 0:
            ran = sum(GPU if v is None else v for v in self.applied.values())
            assert ran + self.agent_physical() + GUARD <= GPU, (self.applied, self.acting, self.finishing)


# Weighted so that schedules get somewhere: envelopes acknowledged, leases granted, replaced, released.
KINDS = ["envelope"] * 6 + ["grant"] * 8 + ["advance"] * 8 + ["deliver"] * 4 + ["revoke"] * 2 + ["restart", "timeout"]
ops = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**16), st.floats(0.0, 0.1)),
               min_size=100, max_size=200)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 3), schedule=ops, seed=st.randoms(use_true_random=False))
def test_invariant_holds_under_adversarial_delivery(nodes, schedule, seed):
    safety = SiteSafety("s", GPU, GRAN, GUARD, VALID)
    w = World(safety)
    meids = [f"n{i}" for i in range(nodes)]
    for m in meids:
        safety.add_node(m, enforced=True)
        w.applied[m] = None
    cid = 0
    for kind, k, dt in schedule:
        if kind == "envelope":
            meid, env = meids[k % nodes], (k // 7 % 10) * GRAN
            if safety.may_send_envelope(meid, env, w.now):
                cid += 1
                safety.control_sent(meid, cid, env, w.now)
                w.sent_at[cid] = (w.now, meid)
                # delayed at random, but in order per node (one SCTP association through the E2T)
                arrive = max([w.now + seed.uniform(0, 0.2)] + [x[0] for x in w.to_node if x[1] == meid])
                w.to_node.append((arrive, meid, cid, env))
            else:
                with pytest.raises(InvariantViolation):
                    safety.control_sent(meid, 10**6, env, w.now)
        elif kind == "grant":
            ceiling = safety.grant_ceiling(w.now)
            sm = min(ceiling, (k % (GPU // GRAN + 1)) * GRAN)
            if sm > 0:
                hold = safety.lease_sent(sm, w.now)
                if seed.random() < 0.9:                      # some leases are lost in transit
                    w.to_agent.append((_stream_time(w, seed, 0.15), "lease", hold.seq, sm, hold.hard_end))
            with pytest.raises(InvariantViolation):
                safety.lease_sent(ceiling + GRAN, w.now)
        elif kind == "revoke":
            w.to_agent.append((_stream_time(w, seed, 0.2), "revoke", 0, 0, 0.0))
        elif kind == "restart":
            # a node restarts and loses its envelope; the xApp learns of it some time later (stale KPM)
            meid = meids[k % nodes]
            w.applied[meid] = None
            w.restarted.add(meid)
            w.to_xapp.append((w.now + seed.uniform(0, 0.3), "unknown", meid))
        elif kind == "timeout":
            for c, (t, meid) in list(w.sent_at.items()):
                if w.now - t >= 0.3:
                    safety.control_timed_out(meid, c)
                    del w.sent_at[c]
        elif kind == "advance":
            w.now += dt
        # deliver whatever is due, in a shuffled order (reordering), sometimes twice (duplication)
        due = [x for x in w.to_node if x[0] <= w.now]
        w.to_node = [x for x in w.to_node if x[0] > w.now]
        for _, meid, c, env in due:                          # in send order per node
            w.applied[meid] = env                            # the node applies it when it arrives
            fate = seed.random()
            if fate < 0.15:
                continue                                     # ACK lost
            w.to_xapp.append((w.now + seed.uniform(0, 0.3), "ack", (meid, c)))
            if fate > 0.9:
                w.to_xapp.append((w.now + seed.uniform(0, 0.3), "ack", (meid, c)))   # duplicated
        due = [x for x in w.to_xapp if x[0] <= w.now]
        w.to_xapp = [x for x in w.to_xapp if x[0] > w.now]
        seed.shuffle(due)
        for _, what, payload in due:
            if what == "ack":
                meid, c = payload
                if c in w.sent_at:
                    del w.sent_at[c]
                safety.control_acked(meid, c)
            elif what == "release":
                safety.released(payload)
            elif what == "unknown":
                safety.node_unknown(payload, "kpm-resumed")
                w.restarted.discard(payload)
                w.broken = True
        if w.broken:
            # A restart breaks the physical rule by itself while the agent holds a lease; the physical
            # check resumes once everything granted before it is gone.
            w.broken = safety.agent_sms(w.now) > 0 or w.agent_physical() > 0
        _agent(w, seed)
        w.check()


def _finish(w: World, seed) -> None:
    """In-flight work under the lease it stops acting on ends a little later, never past that lease's
    hard end (the enforcer plans no launch past it; an overrun beyond is what the guard is for)."""
    seq, sm, hard_end = w.acting
    w.finishing = (min(w.now + seed.uniform(0, 0.05), hard_end), seq, sm)


def _stream_time(w: World, seed, spread: float) -> float:
    """Arrival on the lease stream: delayed at random, never before what was sent earlier (gRPC order)."""
    return max([w.now + seed.uniform(0, spread)] + [x[0] for x in w.to_agent])


def _agent(w: World, seed) -> None:
    """The agent: acts on the newest lease it received until its hard end; a replacement lets in-flight
    work finish first; every lease it stops acting on is released (the release may be lost)."""
    due = sorted((x for x in w.to_agent if x[0] <= w.now), key=lambda x: x[0])
    w.to_agent = [x for x in w.to_agent if x[0] > w.now]

    def release(seq):
        if seed.random() < 0.8:
            w.to_xapp.append((w.now + seed.uniform(0, 0.2), "release", seq))

    for _, kind, seq, sm, hard_end in due:
        if kind == "lease":
            if seq <= w.newest:
                continue                                   # older than what it adopted: ignored
            w.newest = seq
            if hard_end <= w.now:
                release(seq)
                continue
            if w.acting is not None and w.now < w.acting[2]:
                _finish(w, seed)
            w.acting = (seq, sm, hard_end)
        elif w.acting is not None:
            _finish(w, seed)
            w.acting = None
    if w.finishing is not None and w.now >= w.finishing[0]:
        release(w.finishing[1])
        w.finishing = None
    if w.acting is not None and w.now >= w.acting[2]:
        w.finishing = (w.now, w.acting[0], w.acting[1])
        w.acting = None


def test_unknown_node_counts_as_the_whole_gpu_and_blocks_grants():
    s = SiteSafety("s", GPU, GRAN, GUARD, VALID)
    s.add_node("a", enforced=True)
    assert s.grant_ceiling(0.0) == 0                       # after E2 setup: unknown
    s.control_sent("a", 1, 40, 0.0)
    assert s.grant_ceiling(0.0) == 0                       # in flight: the looser of unknown and 40
    s.control_acked("a", 1)
    assert s.grant_ceiling(0.0) == 80
    s.control_sent("a", 2, 72, 0.0)                       # looser, with nothing leased: may go out
    assert s.grant_ceiling(0.0) == 48                      # ... and bounds the grant while in flight
    s.node_unknown("a", "lost-node")
    assert s.grant_ceiling(0.0) == 0 and s.basis() == "envelope"


def test_loosening_waits_for_the_release_or_the_hard_end():
    s = SiteSafety("s", GPU, GRAN, GUARD, VALID)
    s.add_node("a", enforced=True)
    s.control_sent("a", 1, 40, 0.0)
    s.control_acked("a", 1)
    big = s.lease_sent(80, 0.0)
    small = s.lease_sent(64, 0.1)                          # shrinking is immediate
    assert not s.may_send_envelope("a", 56, 0.1)           # 56 + 80 (still held) + 8 > 128
    s.released(small.seq - 1)                              # the agent moved to the smaller lease
    assert s.may_send_envelope("a", 56, 0.1) and s.agent_sms(0.1) == 64
    assert not s.may_send_envelope("a", 64, 0.1)
    assert s.may_send_envelope("a", 64, small.hard_end)    # past the hard end nothing is held
    assert big.seq < small.seq
    s.released(999)                                        # a release of a lease never decided: ignored
    assert s.released_seq == small.seq - 1


def test_multi_node_site_is_bounded_by_the_sum_of_its_nodes_and_the_forecast_once():
    s = SiteSafety("s", GPU, GRAN, GUARD, VALID)
    s.add_node("a", enforced=True)
    s.add_node("b", enforced=True)
    s.control_sent("a", 1, 24, 0.0)
    s.control_acked("a", 1)
    assert s.grant_ceiling(0.0) == 0                       # b is still unknown: no grant on a's ack alone
    s.control_sent("b", 2, 32, 0.0)
    s.control_acked("b", 2)
    assert s.grant_ceiling(0.0) == 64                      # 128 - (24 + 32) - 8
    s.add_node("c", enforced=False)
    s.add_node("d", enforced=False)
    s.forecast_sms = 24                                    # the site's forecast: counted once for c and d
    assert s.basis() == "forecast" and s.grant_ceiling(0.0) == 40
    s.control_sent("a", 3, 16, 0.0)
    s.control_failed("a", 3)                               # refused: a keeps 24
    assert s.nodes["a"].known == 24 and math.isinf(s.next_expiry())


def test_two_nodes_sharing_the_gpu_get_no_lease_that_fits_only_beside_the_larger_envelope():
    # Failed on the old rule (max over nodes): 128 - max(48, 48) - 8 = 72 SMs granted beside two nodes
    # that may together run 96 SMs, 176 SMs on a 128-SM GPU.
    s = SiteSafety("s", GPU, GRAN, GUARD, VALID)
    for cid, m in enumerate(("a", "b"), start=1):
        s.add_node(m, enforced=True)
        s.control_sent(m, cid, 48, 0.0)
        s.control_acked(m, cid)
    assert s.envelope_bound() == 96 and s.grant_ceiling(0.0) == 24
    with pytest.raises(InvariantViolation):
        s.lease_sent(72, 0.0)
    s.lease_sent(24, 0.0)
    assert s.slack(0.0) == 0
    # loosening one node counts the other's envelope too: 56 + 48 + 24 + 8 > 128, 48 + 48 + 24 + 8 fits
    assert not s.may_send_envelope("a", 56, 0.0) and s.may_send_envelope("a", 48, 0.0)
