"""Controls whose replies route back to this xApp on a RIC with several (issue 15 item 2), in the pure loop
with real E2AP bytes. e2term gives an ACK the request's RIC instance ID as RMR sub_id and rtmgr routes it
to the xApp owning that subscription, so a control carries the sub_id of one of our live subscriptions;
every control to a node then shares it, and replies are matched by requestor, node and instance in send
order -- a late reply of a timed-out control must never acknowledge the next one."""
from __future__ import annotations

from test_xapp_loop import cfg, kpm, of, run, setup

from e2sm.e2ap import RicControlRequest, RicRequestId, decode_e2ap
from xapp.actuate import CONTROL_REQUESTOR
from xapp.loop import ORPHAN_TIMEOUTS, ControlOutcome, GrantLease, SendControl, set_control_tag

AGENTS = frozenset({"s1", "s2"})


def _rid(ctl: SendControl) -> RicRequestId:
    req = decode_e2ap(ctl.payload)
    assert isinstance(req, RicControlRequest)
    return req.request_id


def _reply(ctl: SendControl, ok=True, **over) -> ControlOutcome:
    rid = _rid(ctl)
    return ControlOutcome(**{"instance": rid.instance, "requestor": rid.requestor, "meid": ctl.meid, "ok": ok,
                             **over})


def test_a_control_carries_the_sub_id_of_our_subscription_as_instance_id():
    st = setup(cfg())
    set_control_tag(st, "n1", 41)
    a = run(st, 0.1, [kpm("n1", 0.1), kpm("n2", 0.1)], agents=AGENTS)
    by_node = {c.meid: c for c in of(a, SendControl)}
    assert _rid(by_node["n1"]) == RicRequestId(CONTROL_REQUESTOR, 41)
    # n2 has no subscription of its own: any of ours routes the reply back here (rtmgr keys on sub_id alone)
    assert _rid(by_node["n2"]) == RicRequestId(CONTROL_REQUESTOR, 41)
    assert by_node["n1"].wire_instance == 41 and by_node["n1"].instance == 41
    # replies matched by requestor + node + instance: the n1 ACK acknowledges n1's control only
    a = run(st, 0.2, [kpm("n1", 0.2), kpm("n2", 0.2)], results=[_reply(by_node["n1"])], agents=AGENTS)
    assert [g.site_id for g in of(a, GrantLease)] == ["s1"]
    assert by_node["n2"].control_id in st.pending


def test_without_any_subscription_the_instance_id_is_the_control_id():
    st = setup(cfg())
    a = run(st, 0.1, [kpm("n1", 0.1)], agents=AGENTS)
    [c] = of(a, SendControl, "s1")
    assert c.instance is None and _rid(c).instance == c.control_id & 0xFFFF
    a = run(st, 0.2, [kpm("n1", 0.2)], results=[_reply(c)], agents=AGENTS)
    assert of(a, GrantLease, "s1")


def test_replies_from_another_node_requestor_or_instance_are_not_ours():
    st = setup(cfg())
    set_control_tag(st, "n1", 41)
    set_control_tag(st, "n2", 42)
    a = run(st, 0.1, [kpm("n1", 0.1), kpm("n2", 0.1)], agents=AGENTS)
    c = next(x for x in of(a, SendControl) if x.meid == "n1")
    wrong = [_reply(c, meid="n2"), _reply(c, requestor=123), _reply(c, instance=42), _reply(c, instance=7)]
    a = run(st, 0.2, [kpm("n1", 0.2), kpm("n2", 0.2)], results=wrong, agents=AGENTS)
    assert not of(a, GrantLease, "s1") and c.control_id in st.pending


def test_a_late_ack_of_a_timed_out_control_does_not_acknowledge_the_next():
    """20 ms periods, so the fail-safe hold after the timeout (10 periods) ends long before the late reply
    is given up on (`ORPHAN_TIMEOUTS` x 300 ms): only the orphan keeps the next control back."""
    st = setup(cfg(period_ms=20))
    set_control_tag(st, "n1", 41)
    t = 0.02
    [first] = of(run(st, t, [kpm("n1", t)], agents=AGENTS), SendControl, "s1")
    sent = []
    while t < 0.02 + 0.3 * ORPHAN_TIMEOUTS - 0.1:          # timed out, its reply not in: n1 takes nothing new
        t = round(t + 0.02, 6)
        a = run(st, t, [kpm("n1", t)], agents=AGENTS)
        sent += of(a, SendControl, "s1")
        assert not of(a, GrantLease)
    assert first.control_id not in st.pending and sent == [], sent
    # the late ACK of the first control arrives: it is the first's (n1 stays unknown), not a later one's
    t = round(t + 0.01, 6)
    a = run(st, t, [kpm("n1", t)], results=[_reply(first)], agents=AGENTS)
    assert not of(a, GrantLease) and st.orphans == {} and st.sites["s1"].safety.nodes["n1"].known is None
    t = round(t + 0.01, 6)
    a = run(st, t, [kpm("n1", t)], agents=AGENTS)
    [second] = of(a, SendControl, "s1")                  # the node is free again at once
    assert _rid(second) == _rid(first) and not of(a, GrantLease)   # the same RIC request ID on the wire
    t = round(t + 0.02, 6)
    run(st, t, [kpm("n1", t)], results=[_reply(second)], agents=AGENTS)
    assert st.sites["s1"].safety.nodes["n1"].known == second.envelope_sms


def test_a_lost_reply_frees_the_node_after_the_orphan_wait():
    st = setup(cfg())
    set_control_tag(st, "n1", 41)
    a = run(st, 0.1, [kpm("n1", 0.1)], agents=AGENTS)
    [first] = of(a, SendControl, "s1")
    t, sent = 0.1, []
    while not sent and t < 5:
        t = round(t + 0.1, 6)
        sent = of(run(st, t, [kpm("n1", t)], agents=AGENTS), SendControl, "s1")
    assert sent and 0.1 + 0.3 * ORPHAN_TIMEOUTS <= t < 0.1 + 0.3 * ORPHAN_TIMEOUTS + 0.25, t
    a = run(st, round(t + 0.05, 6), [kpm("n1", t + 0.05)], results=[_reply(sent[0])], agents=AGENTS)
    assert st.sites["s1"].safety.nodes["n1"].known == sent[0].envelope_sms
