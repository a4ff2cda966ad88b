"""The control loop as a pure state machine, in virtual time: real KPM samples, real RC definitions and
real E2AP control bytes; the shell's job (sending, receiving ACKs) is played by the test."""
from __future__ import annotations

from e2sm.e2ap import RicControlRequest, decode_e2ap
from e2sm.rc import (
    OAI_IDS,
    decode_control_message,
    encode_ran_function_definition,
    node_ran_function_definition,
    parse_envelope_control,
    parse_prb_quota_control,
)
from xapp.actuate import node_control
from xapp.config import XappConfig
from xapp.ingest import KpmSample
from xapp.loop import (
    ControlOutcome,
    GrantLease,
    Inputs,
    LeaseRelease,
    RevokeLease,
    SendControl,
    new_state,
    next_deadline,
    set_node,
    step,
    step_site,
)
from xapp.rnib import RC_OID, E2Node, RanFunction

KPM3 = "1.3.6.1.4.1.53148.1.3.2.2"


def cfg(policy="weaver", mode="auto", **over):
    c = {"period_ms": 100, "policy": {"name": policy, "guard_sms": 8, "static_reserve_sms": 64, "hold_periods": 3},
         "actuation": {"mode": mode, "control_timeout_ms": 300, "hysteresis_sms": 8},
         "sites": [{"site_id": "s1", "nodes": ["n1"], "gpu_sms": 128, "granularity": 8,
                    "protected_slices": [{"sst": 2, "sd": 1}], "best_effort_slices": [{"sst": 1, "sd": 2}]},
                   {"site_id": "s2", "nodes": ["n2"], "gpu_sms": 128, "granularity": 8}]}
    c.update(over)
    return XappConfig.from_controls(c)


def node(meid, weaver=True, ids=None):
    d = node_ran_function_definition(ids, weaver=weaver) if ids else node_ran_function_definition(weaver=weaver)
    return E2Node(meid=meid, connected=True, functions=(
        RanFunction(ran_function_id=2, oid=KPM3, definition=b""),
        RanFunction(ran_function_id=3, oid=RC_OID, definition=encode_ran_function_definition(d))))


def kpm(meid, t, mean=30.0, peak=40.0, be_prb=100.0):
    return KpmSample(meid=meid, received=t, collected=0, values={
        "GPU.SmUsed.Mean": mean, "GPU.SmUsed.Max": peak, "RRU.PrbUsedDl": be_prb + 20, "RRU.PrbAvailDl": 273.0,
        "RRU.PrbUsedDl@1:2": be_prb, "RRU.PrbUsedDl@2:1": 20.0})


def setup(c, weaver=True, ids=None):
    st = new_state(c, now=0.0)
    for s in c.sites:
        for m in s.nodes:
            set_node(st, node_control(node(m, weaver, ids), c.actuation))
    return st


def run(st, t, samples=(), results=(), agents=frozenset({"s1", "s2"}), lost=frozenset(), releases=()):
    _, actions = step(st, t, Inputs(samples=tuple(samples), results=tuple(results), agents=agents, lost_nodes=lost,
                                    releases=tuple(releases)))
    return actions


def of(actions, kind, site=None):
    return [a for a in actions if isinstance(a, kind) and (site is None or a.site_id == site)]


def ack_all(actions):
    return [ControlOutcome(control_id=a.control_id, ok=True) for a in of(actions, SendControl)]


def test_envelope_mode_control_then_grant_only_after_ack():
    c = cfg()
    st = setup(c)
    assert {nc.mode for rt in st.sites.values() for nc in rt.nodes.values()} == {"envelope"}
    a = run(st, 0.1, [kpm("n1", 0.1), kpm("n2", 0.1)])
    ctl = of(a, SendControl, "s1")[0]
    req = decode_e2ap(ctl.payload)
    assert isinstance(req, RicControlRequest) and req.ran_function_id == 3 and req.request_id.instance == ctl.control_id
    env = parse_envelope_control(decode_control_message(req.message))
    assert env.envelope_sms == ctl.envelope_sms and ctl.envelope_sms % 8 == 0 and ctl.envelope_sms >= 40
    assert of(a, GrantLease) == []            # nothing acknowledged yet: RAN first
    a = run(st, 0.2, [kpm("n1", 0.2), kpm("n2", 0.2)], results=ack_all(a))
    g = of(a, GrantLease, "s1")[0]
    assert g.sm_count == 128 - ctl.envelope_sms - 8 and g.sm_count % 8 == 0 and g.reason.startswith("weaver")
    assert of(a, SendControl) == []           # same envelope: no new control


def test_stale_kpm_revokes_within_the_staleness_limit():
    c = cfg()
    st = setup(c)
    a = run(st, 0.1, [kpm("n1", 0.1), kpm("n2", 0.1)])
    t = 0.2
    a = run(st, t, [kpm("n1", t), kpm("n2", t)], results=ack_all(a))
    assert of(a, GrantLease, "s1")
    # n1 goes silent after 0.2; n2 keeps reporting
    revoked_at = None
    while t < 1.0:
        t = max(min(next_deadline(st), t + 0.1), t + 1e-6)
        a = run(st, t, [kpm("n2", t)])
        if of(a, RevokeLease, "s1"):
            revoked_at = t
            break
    assert revoked_at is not None and revoked_at - 0.2 <= 2 * 0.1 + 1e-6    # stale after 2 periods, at once
    a = run(st, t + 0.1, [kpm("n2", t + 0.1)])
    assert not of(a, GrantLease, "s1") and of(a, GrantLease, "s2")


def test_control_failure_and_timeout_revoke_and_hold_conservative():
    c = cfg()
    st = setup(c)
    a = run(st, 0.1, [kpm("n1", 0.1), kpm("n2", 0.1)])
    ctl1 = of(a, SendControl, "s1")[0]
    ctl2 = of(a, SendControl, "s2")[0]
    a = run(st, 0.2, [kpm("n1", 0.2), kpm("n2", 0.2)], results=[ControlOutcome(control_id=ctl1.control_id, ok=True),
                                                               ControlOutcome(control_id=ctl2.control_id, ok=True)])
    assert of(a, GrantLease, "s1") and of(a, GrantLease, "s2")
    first = of(a, GrantLease, "s1")[0]
    # s1's node now needs a bigger envelope: the grant shrinks at once, the looser envelope waits until
    # the agent released the larger lease (RAN first: never both at once)
    a = run(st, 0.3, [kpm("n1", 0.3, mean=60, peak=80), kpm("n2", 0.3)])
    shrunk = of(a, GrantLease, "s1")[0]
    assert shrunk.sm_count < first.sm_count and not of(a, SendControl, "s1")
    a = run(st, 0.305, releases=[LeaseRelease(site_id="s1", seq=first.seq, reason="replaced")])
    big = of(a, SendControl, "s1")[0]
    assert big.envelope_sms > ctl1.envelope_sms and shrunk.sm_count == 128 - big.envelope_sms - 8
    # the control fails -> revoke now, no grant for a while
    a = run(st, 0.31, results=[ControlOutcome(control_id=big.control_id, ok=False, cause="ricRequest/unspecified")])
    assert of(a, RevokeLease, "s1")[0].reason.startswith("control-failure")
    a = run(st, 0.4, [kpm("n1", 0.4), kpm("n2", 0.4)])
    assert not of(a, GrantLease, "s1") and of(a, GrantLease, "s2")
    held = of(a, GrantLease, "s2")[0]
    # s2: a control nobody answers times out (sent once the agent released the larger lease)
    a = run(st, 0.5, [kpm("n1", 0.5), kpm("n2", 0.5, mean=70, peak=90)])
    assert not of(a, SendControl, "s2")
    a = run(st, 0.5, releases=[LeaseRelease(site_id="s2", seq=held.seq)])
    pend = of(a, SendControl, "s2")[0]
    assert next_deadline(st) <= 0.5 + 0.3 + 1e-9
    a = run(st, 0.8, [kpm("n1", 0.8), kpm("n2", 0.8, mean=70, peak=90)])
    assert any(isinstance(x, RevokeLease) and x.site_id == "s2" and x.reason == "control-timeout" for x in a)
    assert pend.control_id not in st.pending


def test_a_sites_own_step_times_out_its_control_and_no_other_sites():
    # step_site looks only at its site's controls (busy_sites): a lost reply must still time out there,
    # and a neighbour's step must leave it alone
    c = cfg()
    st = setup(c)
    agents = frozenset({"s1", "s2"})
    a1 = step_site(st, "s1", 0.1, (kpm("n1", 0.1),), agents=agents)
    a2 = step_site(st, "s2", 0.1, (kpm("n2", 0.1),), agents=agents)
    lost = of(a1, SendControl, "s1")[0]                 # its reply never comes
    answered = of(a2, SendControl, "s2")[0]
    assert st.busy_sites == {"s1": {lost.control_id}, "s2": {answered.control_id}}
    step_site(st, "s2", 0.2, (kpm("n2", 0.2),), (ControlOutcome(control_id=answered.control_id, ok=True),),
              agents=agents)
    assert st.busy_sites == {"s1": {lost.control_id}}
    a = step_site(st, "s2", 0.45, (kpm("n2", 0.45),), agents=agents)   # past s1's timeout, but s2's step
    assert lost.control_id in st.pending and not of(a, RevokeLease, "s1")
    step_site(st, "s1", 0.45, (kpm("n1", 0.45),), agents=agents)
    assert lost.control_id not in st.pending and "s1" not in st.busy_sites
    assert (lost, "timeout") in st.settled and "n1" not in st.busy_nodes
    assert [e for e in st.events if e[2] == "control-timeout"] == [(0.45, "s1", "control-timeout", "n1")]


def test_quota_mode_sends_slice_caps_for_best_effort_only():
    c = cfg()
    st = setup(c, weaver=False, ids=OAI_IDS)
    rt = st.sites["s1"]
    assert rt.nodes["n1"].mode == "quota" and rt.policy.mode == "quota"
    a = run(st, 0.1, [kpm("n1", 0.1), kpm("n2", 0.1)])
    ctl = of(a, SendControl, "s1")[0]
    assert ctl.kind == "quota"
    req = decode_e2ap(ctl.payload)
    quotas = parse_prb_quota_control(decode_control_message(req.message), rt.nodes["n1"].ids)
    assert [(q.sst, q.sd) for q in quotas] == [(1, 2)] and 1 <= quotas[0].max_ratio <= 100
    assert not of(a, SendControl, "s2")       # s2 declares no best-effort slice: nothing to cap
    a = run(st, 0.2, [kpm("n1", 0.2), kpm("n2", 0.2)], results=ack_all(a))
    assert of(a, GrantLease, "s1") and not of(a, SendControl, "s1")    # same caps: no new control


def test_no_agent_no_grant_and_lost_node_revokes():
    c = cfg(policy="reactive")
    st = setup(c)
    a = run(st, 0.1, [kpm("n1", 0.1), kpm("n2", 0.1)], agents=frozenset({"s2"}))
    assert not of(a, GrantLease, "s1") and of(a, GrantLease, "s2")
    g = of(a, GrantLease, "s2")[0]
    assert g.sm_count == 128 - 40 - 16 - (128 - 40 - 16) % 8        # reactive: last peak + margin
    a = run(st, 0.15, [kpm("n2", 0.15)], agents=frozenset({"s2"}), lost=frozenset({"n2"}))
    assert of(a, RevokeLease, "s2")[0].reason == "lost-node"


def test_next_deadline_is_the_period_tick_when_idle():
    st = setup(cfg())
    assert next_deadline(st) == 0.1
    run(st, 0.1)
    assert abs(next_deadline(st) - 0.2) < 1e-9


def test_grant_grows_only_after_the_smaller_envelope_is_acknowledged():
    st = setup(cfg(estimate={"window_periods": 8}))
    t, a = 0.1, run(st, 0.1, [kpm("n1", 0.1, mean=60, peak=80)], agents=frozenset({"s1"}))
    big = of(a, SendControl, "s1")[0]
    seen = []
    for _ in range(40):
        t = round(t + 0.1, 6)
        a = run(st, t, [kpm("n1", t, mean=20, peak=30)], results=ack_all(a), agents=frozenset({"s1"}))
        seen.append((of(a, SendControl, "s1"), of(a, GrantLease, "s1")))
        ctl = of(a, SendControl, "s1")
        if ctl and ctl[0].envelope_sms < big.envelope_sms:
            smaller = ctl[0]
            assert of(a, GrantLease, "s1")[0].sm_count == 128 - big.envelope_sms - 8   # not yet
            t = round(t + 0.1, 6)
            a = run(st, t, [kpm("n1", t, mean=20, peak=30)], results=ack_all(a), agents=frozenset({"s1"}))
            assert of(a, GrantLease, "s1")[0].sm_count >= 128 - smaller.envelope_sms - 8
            return
    raise AssertionError(f"the envelope never stepped down: {seen}")


def test_quota_caps_hysteresis_tightens_at_once_loosens_in_steps():
    from e2sm.rc import SliceQuota
    from xapp.loop import _caps_unchanged

    q = lambda r: (SliceQuota(sst=1, sd=2, max_ratio=r),)   # noqa: E731
    assert _caps_unchanged(q(50), q(50), 5)
    assert _caps_unchanged(q(50), q(53), 5)           # small loosening waits
    assert not _caps_unchanged(q(50), q(55), 5)       # big loosening goes
    assert not _caps_unchanged(q(50), q(49), 5)       # any tightening goes at once
    assert not _caps_unchanged(None, q(50), 5)


def test_silent_agent_is_reported_lost():
    from xapp.agents import AgentBook, Registration

    book = AgentBook(epoch=1, period_ms=100, valid_periods=3, heartbeat_ms=100, timeout_heartbeats=3)
    reg = Registration(site_id="s1", agent_id="a", kind="cpu", sm_count=8, granularity=1, capabilities=(), mode="cpu")
    sid, _ = book.connect(reg, now=0.0)
    book.seen("s1", sid, 0.25)
    assert book.lost(0.5) == [] and book.lost(0.56) == ["s1"]
