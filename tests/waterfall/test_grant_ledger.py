"""The xApp's leg of the waterfall (usable spare -> granted) through the real control loop, in virtual
time: real KPM samples and RC definitions, the loop's own decisions; the test plays the shell (ACKs,
agents). Every decision's causes must add up to what it did not grant of the SMs above the measured peak,
and each step of the loop that withholds SMs must show under its own name."""
from __future__ import annotations

import pytest

from e2sm.rc import encode_ran_function_definition, node_ran_function_definition
from xapp.actuate import node_control
from xapp.config import XappConfig
from xapp.ingest import KpmSample
from xapp.loop import ControlOutcome, GrantLease, Inputs, SendControl, new_state, set_node, step
from xapp.rnib import RC_OID, E2Node, RanFunction
from xapp.waterfall import HYSTERESIS, NO_AGENT, UNACKED, GrantLedger

KPM3 = "1.3.6.1.4.1.53148.1.3.2.2"
GPU, GUARD, G = 128, 8, 8


def setup(**over):
    c = XappConfig.from_controls({
        **over, "period_ms": 100, "policy": {"name": "weaver", "guard_sms": GUARD, "hold_periods": 3},
        "actuation": {"mode": "auto", "control_timeout_ms": 300, "hysteresis_sms": 8},
        "estimate": {"window_periods": 8},       # a short window, so that a drop in demand shows soon
        "sites": [{"site_id": "s1", "nodes": ["n1"], "gpu_sms": GPU, "granularity": G}]})
    st = new_state(c, now=0.0)
    d = node_ran_function_definition(weaver=True)
    set_node(st, node_control(E2Node(meid="n1", connected=True, functions=(
        RanFunction(ran_function_id=2, oid=KPM3, definition=b""),
        RanFunction(ran_function_id=3, oid=RC_OID, definition=encode_ran_function_definition(d)))), c.actuation))
    return st


def kpm(t, mean, peak):
    return KpmSample(meid="n1", received=t, collected=t, values={
        "GPU.SmUsed.Mean": mean, "GPU.SmUsed.Max": peak, "RRU.PrbUsedDl": 120.0, "RRU.PrbAvailDl": 273.0})


class Shell:
    """Feeds the loop and ACKs every control one step later; records each decision's causes."""

    def __init__(self, **cfg):
        self.st = setup(**cfg)
        self.rt = self.st.sites["s1"]
        self.pending = []
        self.decisions = []      # (t, causes in SMs, grant)
        real = self.rt.waterfall.decided

        def spy(**kw):
            parts = real(**kw)
            self.decisions.append((self.t, parts, kw["grant"], kw.get("peak")))
            return parts
        self.rt.waterfall.decided = spy

    def tick(self, t, mean=None, peak=None, agent=True, ack=True):
        self.t = t
        samples = (kpm(t, mean, peak),) if mean is not None else ()
        results = tuple(ControlOutcome(control_id=c, ok=True) for c in self.pending) if ack else ()
        _, actions = step(self.st, t, Inputs(samples=samples, results=results,
                                             agents=frozenset({"s1"}) if agent else frozenset()))
        self.pending = [a.control_id for a in actions if isinstance(a, SendControl)] + ([] if ack else self.pending)
        return actions


def test_every_decision_adds_up_and_each_step_is_named():
    sh = Shell()
    t = 0.0
    for _ in range(10):                                  # start: the grant waits for the envelope's ACK
        t = round(t + 0.1, 6)
        sh.tick(t, 30, 40)
    for _ in range(12):                                  # demand drops: past the window, E holds (hold_periods 3)
        t = round(t + 0.1, 6)
        sh.tick(t, 10, 16)
    for _ in range(3):                                   # the agent goes away: nothing is granted
        t = round(t + 0.1, 6)
        sh.tick(t, 10, 16, agent=False)
    t = round(t + 0.1, 6)
    sh.tick(t, 10, 16)
    grants = 0
    for t_, parts, grant, peak in sh.decisions:
        # the decision's own view of usable: SMs above its measured peak less the guard, in steps
        usable = max(0, int((GPU - GUARD - peak) // G) * G)
        assert sum(parts.values()) == pytest.approx(usable - grant), (t_, parts, grant, peak)
        grants += grant > 0
    led: GrantLedger = sh.rt.waterfall
    assert led.usable_sm_s - led.granted_sm_s == pytest.approx(sum(led.lost.values()))
    assert grants >= 8
    assert led.lost.get(UNACKED, 0) > 0          # the first decision: no acknowledged envelope yet
    assert led.lost.get(HYSTERESIS, 0) > 0       # the envelope held above what the policy wanted
    assert led.lost.get(NO_AGENT, 0) > 0


def test_a_stale_revoke_between_decisions_cuts_the_granted_period_short():
    sh = Shell()
    t = 0.0
    for _ in range(5):
        t = round(t + 0.1, 6)
        sh.tick(t, 30, 40)
    assert any(isinstance(a, GrantLease) for a in sh.tick(round(t + 0.1, 6), 30, 40))
    granted = sh.rt.grant_sms
    t = round(t + 0.15, 6)
    sh.tick(t, 30, 40)                          # the last report arrives mid-period
    # then KPM stops: the loop revokes once it is stale (two periods), between two ticks
    while not sh.rt.waterfall.cut_short and t < 2.0:
        t = round(t + 0.03, 6)
        sh.tick(t)
    cut = sh.rt.waterfall.cut_short
    assert list(cut) == ["revoked-mid-period:stale-kpm"]
    assert 0 < cut["revoked-mid-period:stale-kpm"] <= granted * 0.1 + 1e-9
    for _ in range(3):                           # the decisions after it: revoked by the fresh-KPM rule
        t = round(t + 0.1, 6)
        sh.tick(t)
    assert sh.rt.waterfall.lost.get("revoked:stale-kpm", 0) > 0


def test_ticks_the_loop_passed_late_carry_the_last_decision():
    sh = Shell(stale_periods=5)                  # KPM still fresh when the loop comes back late
    for i in range(1, 6):
        sh.tick(round(0.1 * i, 6), 30, 40)
    led = sh.rt.waterfall
    before, (usable, grant, _) = (led.usable_sm_s, led.granted_sm_s), led.last
    assert grant > 0
    sh.tick(0.85, 30, 40)                         # 0.6, 0.7 and 0.8 passed: one decision for three periods
    assert led.carried_periods == 2
    now_usable, now_grant, _ = led.last
    assert now_grant > 0
    assert led.usable_sm_s - before[0] == pytest.approx((2 * usable + now_usable) * 0.1)
    assert led.granted_sm_s - before[1] == pytest.approx((2 * grant + now_grant) * 0.1)
    assert led.usable_sm_s - led.granted_sm_s == pytest.approx(sum(led.lost.values()))
