"""RAN-first rules of the control loop that the invariant module enforces, one fault each (virtual time,
real RC definitions and E2AP bytes). Each of these failed on the loop before xapp/invariant.py."""
from __future__ import annotations

from dataclasses import replace

from test_xapp_loop import ack_all, cfg, kpm, of, run, setup

from xapp.loop import LIFT_AFTER_PERIODS, ControlOutcome, GrantLease, LeaseRelease, RevokeLease, SendControl


def two_node_cfg():
    return cfg(sites=[{"site_id": "s1", "nodes": ["n1", "n2"], "gpu_sms": 128, "granularity": 8}])


def test_every_node_of_a_site_gets_the_envelope_and_the_grant_waits_for_all_acks():
    st = setup(two_node_cfg())
    light = lambda m, t: kpm(m, t, mean=10.0, peak=15.0)   # noqa: E731  (two envelopes must fit beside a lease)
    a = run(st, 0.1, [light("n1", 0.1), light("n2", 0.1)], agents=frozenset({"s1"}))
    ctls = of(a, SendControl, "s1")
    assert sorted(c.meid for c in ctls) == ["n1", "n2"]
    first = [x for x in ctls if x.meid == "n1"]
    a = run(st, 0.2, [light("n1", 0.2), light("n2", 0.2)], results=ack_all(first), agents=frozenset({"s1"}))
    assert not of(a, GrantLease)                      # n2 has not acknowledged: it may apply anything
    a = run(st, 0.3, [light("n1", 0.3), light("n2", 0.3)], results=ack_all(ctls[1:]), agents=frozenset({"s1"}))
    grant = of(a, GrantLease, "s1")
    # the nodes share the GPU: the lease fits beside both envelopes, not only beside the larger one
    assert grant and sum(c.envelope_sms for c in ctls) + grant[0].sm_count + 8 <= 128


def test_a_node_back_from_an_outage_gets_its_envelope_again_before_any_grant():
    st = setup(cfg())
    a = run(st, 0.1, [kpm("n1", 0.1)], agents=frozenset({"s1"}))
    env = of(a, SendControl, "s1")[0].envelope_sms
    a = run(st, 0.2, [kpm("n1", 0.2)], results=ack_all(a), agents=frozenset({"s1"}))
    assert of(a, GrantLease, "s1")
    # n1 goes silent for a second (it may have restarted without its envelope), then reports again
    run(st, 0.5, agents=frozenset({"s1"}))
    a = run(st, 1.3, [kpm("n1", 1.3)], agents=frozenset({"s1"}))
    again = of(a, SendControl, "s1")
    assert again and again[0].envelope_sms == env      # the same value is sent again: hysteresis no excuse
    assert not of(a, GrantLease)
    a = run(st, 1.4, [kpm("n1", 1.4)], results=ack_all(a), agents=frozenset({"s1"}))
    assert of(a, GrantLease, "s1")


def test_a_reported_deadline_miss_holds_the_site_conservative():
    st = setup(cfg())
    a = run(st, 0.1, [kpm("n1", 0.1)], agents=frozenset({"s1"}))
    run(st, 0.2, [kpm("n1", 0.2)], results=ack_all(a), agents=frozenset({"s1"}))
    miss = replace(kpm("n1", 0.25), values={**kpm("n1", 0.25).values, "GPU.DeadlineMiss": 3.0})
    a = run(st, 0.25, [miss], agents=frozenset({"s1"}))
    assert of(a, RevokeLease, "s1")[0].reason == "deadline-miss"
    for t in (0.3, 0.4, 2.0):
        a = run(st, t, [kpm("n1", t)], agents=frozenset({"s1"}))
        assert not of(a, GrantLease)
    assert st.sites["s1"].last_view.reason == "deadline-miss" and st.sites["s1"].misses == 3


def test_shaping_is_lifted_after_a_while_without_a_lease():
    st = setup(cfg())
    t, a = 0.1, run(st, 0.1, [kpm("n1", 0.1)], agents=frozenset())
    sent = of(a, SendControl, "s1")
    for _ in range(LIFT_AFTER_PERIODS + 2):
        t = round(t + 0.1, 6)
        a = run(st, t, [kpm("n1", t)], results=ack_all(a), agents=frozenset())
        sent += of(a, SendControl, "s1")
    assert sent[-1].envelope_sms == 128 and st.sites["s1"].lifted
    # training comes back: the tighter envelope goes out at once, the grant after its ack
    t = round(t + 0.1, 6)
    a = run(st, t, [kpm("n1", t)], results=ack_all(a), agents=frozenset({"s1"}))
    assert of(a, SendControl, "s1")[0].envelope_sms < 128 and not of(a, GrantLease)


def test_a_control_reply_from_another_node_or_requestor_is_not_ours():
    st = setup(cfg())
    a = run(st, 0.1, [kpm("n1", 0.1), kpm("n2", 0.1)], agents=frozenset({"s1"}))
    c = of(a, SendControl, "s1")[0]
    wrong = [ControlOutcome(control_id=c.control_id, ok=True, meid="n2"),
             ControlOutcome(control_id=c.control_id, ok=True, meid="n1", requestor=123)]
    a = run(st, 0.2, [kpm("n1", 0.2)], results=wrong, agents=frozenset({"s1"}))
    assert not of(a, GrantLease) and c.control_id in st.pending


def test_kpm_out_of_sequence_or_delayed_by_its_collection_time_is_not_fresh():
    st = setup(cfg())
    feed = lambda t, sn, collected: replace(kpm("n1", t), sn=sn, collected_s=collected)  # noqa: E731
    run(st, 0.05, [feed(0.05, 0, 999.95)], agents=frozenset({"s1"}))   # the node's delay baseline
    a = run(st, 0.1, [feed(0.1, 1, 1000.0)], agents=frozenset({"s1"}))
    run(st, 0.2, [feed(0.2, 2, 1000.1)], results=ack_all(a), agents=frozenset({"s1"}))
    assert st.sites["s1"].last["n1"].sn == 2
    run(st, 0.25, [feed(0.25, 2, 1000.1), feed(0.25, 1, 1000.0)], agents=frozenset({"s1"}))
    assert st.sites["s1"].last["n1"].sn == 2             # duplicate and older: dropped
    # after a stall, old indications dequeued at once: their transit delay is 0.5 s over the floor
    a = run(st, 0.8, [feed(0.8, 3, 1000.2)], agents=frozenset({"s1"}))
    assert st.sites["s1"].last["n1"].sn == 2 and of(a, RevokeLease, "s1")


def test_a_nodes_first_timestamped_sample_is_only_its_delay_baseline():
    # Failed before: with no floor to judge it against, any first sample passed, however long it queued.
    st = setup(cfg())
    feed = lambda t, sn, collected: replace(kpm("n1", t), sn=sn, collected_s=collected)  # noqa: E731
    a = run(st, 0.1, [feed(0.1, 1, 1000.0)], agents=frozenset({"s1"}))
    assert not of(a, SendControl) and "n1" not in st.sites["s1"].last
    assert st.sites["s1"].last_view.reason == "stale-kpm"
    a = run(st, 0.2, [feed(0.2, 2, 1000.1)], agents=frozenset({"s1"}))
    assert of(a, SendControl, "s1") and st.sites["s1"].last["n1"].sn == 2
    assert list(st.sites["s1"].feeds["n1"].delays) == [0.1 - 1000.0, 0.2 - 1000.1]


def test_a_whole_second_stamp_is_read_as_old_as_it_may_be():
    # Failed before: KPM v2.03 stamps whole seconds and its resolution widened the 0.2 s limit to 1.2 s,
    # so a sample 1.1 s past the floor passed. Read conservatively (its period started at the stamp) it
    # is held to max(limit, resolution) = 1 s: a fresh sample late in its second still passes.
    st = setup(cfg())
    feed = lambda t, sn, stamp: replace(kpm("n1", t), sn=sn, collected_s=stamp, collected_res_s=1.0)  # noqa: E731
    run(st, 0.05, [feed(0.05, 0, 1000.0)], agents=frozenset({"s1"}))    # baseline: delay 0.05 - 1000
    run(st, 0.1, [feed(0.1, 1, 1000.0)], agents=frozenset({"s1"}))
    run(st, 1.0, [feed(1.0, 2, 1000.0)], agents=frozenset({"s1"}))      # 0.95 s into its second: fresh
    assert st.sites["s1"].last["n1"].sn == 2
    run(st, 1.15, [feed(1.15, 3, 1000.0)], agents=frozenset({"s1"}))    # 1.1 s past the floor: too old
    assert st.sites["s1"].last["n1"].sn == 2 and st.sites["s1"].feeds["n1"].dropped == 1
    run(st, 1.2, [feed(1.2, 4, 1001.0)], agents=frozenset({"s1"}))      # the next second's stamp: fresh
    assert st.sites["s1"].last["n1"].sn == 4


def test_loosening_waits_for_the_release_and_the_hard_end_bounds_the_wait():
    st = setup(cfg())
    a = run(st, 0.1, [kpm("n1", 0.1, mean=20, peak=30)], agents=frozenset({"s1"}))
    a = run(st, 0.2, [kpm("n1", 0.2, mean=20, peak=30)], results=ack_all(a), agents=frozenset({"s1"}))
    big = of(a, GrantLease, "s1")[0]
    a = run(st, 0.3, [kpm("n1", 0.3, mean=70, peak=90)], agents=frozenset({"s1"}))
    assert of(a, GrantLease, "s1")[0].sm_count < big.sm_count and not of(a, SendControl)
    # no release ever comes (lost): the looser envelope goes once the big lease's hard end passed
    t, sent = 0.3, []
    while not sent and t < 1.0:
        t = round(t + 0.05, 6)
        a = run(st, t, [kpm("n1", t, mean=70, peak=90)], agents=frozenset({"s1"}))
        sent = of(a, SendControl, "s1")
    assert sent and t >= big.decided_at + big.valid_for_s
    assert run(st, t, releases=[LeaseRelease(site_id="s1", seq=10**6)]) == []     # a bogus release: ignored


def test_a_live_config_reload_reaches_the_invariant():
    from xapp.app import XappApp

    c = cfg()
    x = XappApp(c)
    assert x.state.sites["s1"].safety.guard_sms == 8
    assert x.apply_config(replace(c, policy=replace(c.policy, guard_sms=24))) is None
    assert x.state.sites["s1"].safety.guard_sms == 24


def test_a_lost_node_with_a_control_in_flight_is_unknown_and_its_late_ack_proves_nothing():
    st = setup(cfg())
    a = run(st, 0.1, [kpm("n1", 0.1)], agents=frozenset({"s1"}))
    c = of(a, SendControl, "s1")[0]
    run(st, 0.15, agents=frozenset({"s1"}), lost=frozenset({"n1"}))
    assert not st.sites["s1"].safety.nodes["n1"].inflight
    run(st, 0.16, results=ack_all([c]), agents=frozenset({"s1"}))
    assert st.sites["s1"].safety.nodes["n1"].known is None


def test_an_inherited_lease_holds_back_the_first_envelope_to_an_unknown_node():
    """After a restart every node is unknown, so any envelope to it goes out while no lease is held. A lease the
    previous instance issued (read from the ledger) is held by its agent to its hard end: the loop sends no
    envelope that does not fit beside it, and sends the wanted one once it has ended."""
    c = cfg()
    st = setup(c)
    st.grant_not_before = 1.0
    st.sites["s1"].safety.inherit(96, -1.0, 1.0)        # 96 + guard 8 leave 24 of 128 SMs for the node
    sent = []
    t, a = 0.0, []
    while t < 2.0:
        t = round(t + 0.1, 6)
        a = run(st, t, [kpm("n1", t), kpm("n2", t)], results=ack_all(a))
        for ctl in of(a, SendControl, "s1"):
            sent.append((t, ctl.envelope_sms))
            if t < 1.0:
                assert ctl.envelope_sms + 96 + 8 <= 128, (t, ctl.envelope_sms)
    assert any(t >= 1.0 and e > 24 for t, e in sent), sent                      # and then what it wanted
