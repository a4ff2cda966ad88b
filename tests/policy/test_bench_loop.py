"""`weaver bench policies` decides by the live loop's code and nothing else (issue 14 item 2): every grant
and every RC control of every arm is an action `xapp.loop.step` returned, the controls reach the E2 node's
control code as bytes and come back acknowledged, and a loop that decides nothing leaves every arm with
nothing -- so no decision can come from a second path (as `WeaverPolicy.decide` called by the bench did)."""
from __future__ import annotations

import numpy as np
import pytest

import xapp.loop as xloop
from e2sm.e2ap import decode_e2ap
from e2sm.kpm import KpmVersion
from testbed import scenarios
from testbed.bench import policies as bench
from testbed.bench.liveloop import LiveLoop, replay_trace, xapp_config
from testbed.model import RanModel
from xapp.loop import GrantLease, RevokeLease, SendControl
from xapp.rnib import E2Node as NodeInfo
from xapp.rnib import RanFunction

P = 40


@pytest.fixture(scope="module")
def sc():
    return scenarios.get("gh200-multicell")


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = xloop.step

    def step(state, now, inputs):
        state, actions = real(state, now, inputs)
        calls.append((now, list(actions)))
        return state, actions

    monkeypatch.setattr(xloop, "step", step)
    return calls


def grants_from(calls, sc) -> np.ndarray:
    """The lease each site holds per period, from the actions step returned alone."""
    out = np.zeros((P, sc.n_sites), dtype=int)
    held = np.zeros(sc.n_sites, dtype=int)
    D = sc.period_s
    for now, actions in calls:
        for a in actions:
            s = int(a.site_id.split("-")[1])
            if isinstance(a, GrantLease):
                held[s] = a.sm_count
            elif isinstance(a, RevokeLease):
                held[s] = 0
        p = int(round(now / D))         # a tick at the end of period p - 1 decides period p
        if abs(now - p * D) < 1e-9 and p < P:
            out[p] = held
    return out


@pytest.mark.parametrize("mode", ["auto", "quota"])
def test_shaped_arm_grants_and_controls_are_the_loops_actions(sc, spy, mode):
    cfg = xapp_config(sc, "weaver", 8, mode, bench.quota_cost(sc))
    run = bench.simulate(sc, 3, P, cfg, track_delay=False)
    assert len(spy) == run.tally.steps > P                  # ticks, plus the steps that take the ACKs
    assert (run.grants == grants_from(spy, sc)).all() and run.grants.sum() > 0
    sent = [a for _, acts in spy for a in acts if isinstance(a, SendControl)]
    assert len(sent) == run.controls == run.tally.acks > 0  # every control went to a node and was acked
    kinds = {a.kind for a in sent}
    assert kinds == ({"quota"} if mode == "quota" else {"envelope"})
    if mode == "auto":   # the model ran under the envelopes the loop sent
        assert run.envelopes[1:].max() > 0 and set(run.envelopes[-1]) <= {a.envelope_sms for a in sent}


@pytest.mark.parametrize("policy,knob", [("static", 48), ("reactive", 16), ("oracle", None)])
def test_unshaped_arm_grants_are_the_loops_actions(sc, spy, policy, knob):
    rec = bench.simulate(sc, 3, P, None, track_delay=False, record_trace=True)
    assert len(spy) == 0                                     # recording the trace decides nothing
    grants, tally = replay_trace(xapp_config(sc, policy, knob), sc, rec.trace, 0.015,
                                 oracle_peaks=rec.period_max if policy == "oracle" else None)
    assert len(spy) == tally.steps >= P                     # ticks, plus the steps that take the releases
    assert (grants == grants_from(spy, sc)).all() and grants.sum() > 0
    assert tally.controls == 0                               # the baselines do not shape


def test_a_loop_that_decides_nothing_leaves_every_arm_with_nothing(sc, monkeypatch):
    real = xloop.step
    monkeypatch.setattr(xloop, "step", lambda state, now, inputs: (real(state, now, inputs)[0], []))
    run = bench.simulate(sc, 3, P, xapp_config(sc, "weaver", 8, "auto", bench.quota_cost(sc)), track_delay=False)
    assert run.grants.sum() == 0 and run.controls == 0 and run.envelopes.sum() == 0
    rec = bench.simulate(sc, 3, P, None, track_delay=False, record_trace=True)
    for policy, knob in (("static", 48), ("reactive", 16)):
        grants, _ = replay_trace(xapp_config(sc, policy, knob), sc, rec.trace, 0.015)
        assert grants.sum() == 0


def test_the_bench_subscribes_as_the_xapp_does_kpm_version_override_included(sc):
    # The bench's nodes are subscribed by xapp.app.kpm_request, as XappApp._spec subscribes live nodes: a
    # node pinned to KPM v2.03 by e2.kpm_version_override is asked (and decoded) in v2.03, not in its OID's.
    from xapp.app import kpm_request
    from xapp.config import XappConfig

    base = xapp_config(sc, "weaver", 8, "auto", bench.quota_cost(sc))
    meid = base.sites[0].nodes[0]
    c = dict(base.controls)
    c["e2"] = dict(c["e2"], kpm_version_override={meid: "v2.03"})
    cfg = XappConfig.from_controls(c)
    live = LiveLoop(cfg, sc, RanModel(sc, 3, track_delay=False))
    versions = {s.meid: s.version for s in live.ingest.subs.values()}
    assert versions[meid] == KpmVersion.V2_03 and set(versions.values()) == {KpmVersion.V2_03, KpmVersion.V3_00}
    node = next(n for n in live.nodes if n.config.inventory_name == meid)
    info = NodeInfo(meid=meid, connected=True, functions=tuple(
        RanFunction(ran_function_id=f.ran_function_id, oid=f.oid, definition=f.definition)
        for f in decode_e2ap(node.setup_request().payload).ran_functions))
    assert kpm_request(cfg, info)[0] == KpmVersion.V2_03
    # The testbed node speaks its OID's v3.00, so the pin is wrong for it: the loop decodes its frames as
    # v2.03 and refuses every one (version mismatch), as weaver-xapp with this config would; its site gets
    # no grant, the others decide as usual (from the third period: a node's first sample is only its
    # delay baseline, the second brings the envelope, its ACK the grant).
    run = bench.simulate(sc, 3, 10, cfg, track_delay=False)
    assert run.tally.kpm_refused == 10
    assert run.grants[:, 0].sum() == 0 and run.grants[3:, 1:].min() > 0
