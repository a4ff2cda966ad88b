"""The deployed control loop (`xapp.loop.step`, weaver policy, real RC definitions and E2AP bytes) against
the same adversarial world as tests/xapp/test_invariant.py: controls land at the nodes late (in order per
node), ACKs are delayed, lost or duplicated, leases reach the agent late or never, releases are late or
lost, KPM demand jumps. After every step the physical rule must hold: the sum of the envelopes the nodes
apply (they share the site's GPU) + the SMs the agent acts on + guard <= GPU. This checks that the loop really routes every grant
and envelope through the invariant module, on one- and two-node sites."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_xapp_loop import cfg, kpm, setup

from xapp.loop import ControlOutcome, GrantLease, Inputs, LeaseRelease, RevokeLease, SendControl, step

GPU, GUARD = 128, 8


def _cfg(nodes: int):
    return cfg(sites=[{"site_id": "s1", "nodes": [f"n{i}" for i in range(nodes)], "gpu_sms": GPU, "granularity": 8}],
               estimate={"window_periods": 8})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 2), seed=st.randoms(use_true_random=False),
       demand=st.lists(st.tuples(st.floats(5, 60), st.floats(0, 50)), min_size=30, max_size=60))
def test_the_loop_keeps_the_rule_under_adversarial_delivery(nodes, seed, demand):
    c = _cfg(nodes)
    state = setup(c)
    meids = [f"n{i}" for i in range(nodes)]
    applied = dict.fromkeys(meids)              # what each node applies (None: unshaped, the whole GPU)
    to_node, to_xapp, to_agent = [], [], []      # (arrive, ...)
    acting, finishing, newest = None, None, 0    # agent: (seq, sm, hard_end); (until, seq, sm)
    t = 0.0
    for mean, extra in demand:
        for sub in range(4):                     # four steps per period: replies land between ticks
            t = round(t + 0.025, 6)
            samples = [kpm(m, t, mean=mean, peak=mean + extra) for m in meids] if sub == 0 else []
            due = [x for x in to_xapp if x[0] <= t]
            to_xapp[:] = [x for x in to_xapp if x[0] > t]
            seed.shuffle(due)
            results = tuple(x[2] for x in due if x[1] == "ack")
            releases = tuple(x[2] for x in due if x[1] == "release")
            _, actions = step(state, t, Inputs(samples=tuple(samples), results=results, releases=releases,
                                               agents=frozenset({"s1"})))
            for a in actions:
                if isinstance(a, SendControl):
                    arrive = max([t + seed.uniform(0, 0.08)] + [x[0] for x in to_node if x[1] == a.meid])
                    to_node.append((arrive, a.meid, a))
                elif isinstance(a, GrantLease) and seed.random() < 0.9:
                    to_agent.append((max([t + seed.uniform(0, 0.08)] + [x[0] for x in to_agent]), "lease",
                                     (a.seq, a.sm_count, a.decided_at + a.valid_for_s)))
                elif isinstance(a, RevokeLease):
                    to_agent.append((max([t + seed.uniform(0, 0.05)] + [x[0] for x in to_agent]), "revoke", None))
            for x in [x for x in to_node if x[0] <= t]:          # in order per node
                to_node.remove(x)
                _, meid, ctl = x
                if ctl.kind == "envelope":
                    applied[meid] = ctl.envelope_sms
                fate = seed.random()
                if fate > 0.1:
                    ok = ControlOutcome(control_id=ctl.control_id, ok=True, meid=meid)
                    to_xapp.append((t + seed.uniform(0, 0.1), "ack", ok))
                    if fate > 0.9:
                        to_xapp.append((t + seed.uniform(0, 0.1), "ack", ok))

            def release(seq, t=t):
                if seed.random() < 0.8:
                    to_xapp.append((t + seed.uniform(0, 0.05), "release", LeaseRelease(site_id="s1", seq=seq)))

            for x in [x for x in to_agent if x[0] <= t]:
                to_agent.remove(x)
                _, kind, body = x
                if kind == "lease":
                    seq, sm, hard_end = body
                    if seq <= newest:
                        continue
                    newest = seq
                    if hard_end <= t:
                        release(seq)
                        continue
                    if acting is not None and t < acting[2]:
                        finishing = (min(t + seed.uniform(0, 0.02), acting[2]), acting[0], acting[1])
                    acting = (seq, sm, hard_end)
                elif acting is not None:
                    finishing = (min(t + seed.uniform(0, 0.02), acting[2]), acting[0], acting[1])
                    acting = None
            if finishing is not None and t >= finishing[0]:
                release(finishing[1])
                finishing = None
            if acting is not None and t >= acting[2]:
                release(acting[0])
                acting = None
            held = max(acting[1] if acting else 0, finishing[2] if finishing and t < finishing[0] else 0)
            if held:
                ran = sum(GPU if v is None else v for v in applied.values())
                assert ran + held + GUARD <= GPU, (t, applied, acting, finishing)
