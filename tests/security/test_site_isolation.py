"""Issue 13 item 2: a failure confined to one site revokes that site only.

On c364296 any exception in the control step (one site's estimator, policy or ledger) reached the shell's
fail-safe, which revoked every site (`xapp-error`). Now each site's part of a step runs on its own: the
failing site is revoked (`site-error`) and held conservative for FAILSAFE_PERIODS, every other site is
decided as usual.

- a running xApp (in this process, against the testbed: two E2 nodes over the RAN model, mini-RIC, real
  Redis, one lease client per site) whose site-0 estimator raises: site-0 is revoked, site-1 keeps its
  leases; once the estimator works again site-0 is granted again;
- the pure loop: a policy that raises at one site, and a ledger that raises on one site's control ACK.

Run alone: `.venv-xapp/bin/python -m pytest tests/security/test_site_isolation.py -q -p no:cacheprovider`.
"""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "xapp"))
from xapp_harness import LeaseClient, SimBed, free_port, until, xapp_config  # noqa: E402

from e2sm.rc import encode_ran_function_definition, node_ran_function_definition  # noqa: E402
from xapp.actuate import node_control  # noqa: E402
from xapp.app import XappApp  # noqa: E402
from xapp.config import XappConfig, load_config  # noqa: E402
from xapp.ingest import KpmSample  # noqa: E402
from xapp.loop import ControlOutcome, GrantLease, Inputs, RevokeLease, SendControl, new_state, set_node, step  # noqa: E402
from xapp.rnib import RC_OID, E2Node, RanFunction  # noqa: E402


class Broken(RuntimeError):
    pass


def _raise(*a, **k):
    raise Broken("injected: this site's input makes its decision raise")


# ----------------------------------------------------------------------------- a running xApp


@pytest.mark.slow
def test_running_xapp_revokes_only_the_failing_site(tmp_path, redis_env):
    asyncio.run(_running(tmp_path))


async def _running(tmp):
    rmr_port = free_port()
    tb = await SimBed.start(tmp, rmr_port)
    x = None
    agents: list[LeaseClient] = []
    try:
        path = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0, mode="auto")
        x = XappApp(load_config(path))
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        agents = [LeaseClient(x.broker.port, s).start() for s in ("site-0", "site-1")]
        await until(lambda: all(a.leases() and a.leases()[-1][1].sm_count > 0 for a in agents), 25,
                    "leases at both sites")
        est = x.state.sites["site-0"].estimator
        t0 = time.monotonic()
        est.estimate = _raise                      # site-0's input now makes its decision raise
        await until(lambda: agents[0].revokes(after=t0), 3, "site-0's revoke")
        await asyncio.sleep(1.5)                   # 15 periods of site-0 failing every tick
        assert {rv.reason for _, rv in agents[0].revokes(after=t0)} == {"site-error"}
        assert not agents[1].revokes(after=t0), [rv.reason for _, rv in agents[1].revokes(after=t0)]
        assert [le for t, le in agents[1].leases() if t > t0 + 1.0 and le.sm_count > 0], "site-1 kept its leases"
        assert x.state.sites["site-0"].site_errors >= 10 and x.state.sites["site-1"].site_errors == 0
        assert x.counters.revocations.get("site-error", 0) >= 1
        assert any(kind == "site-error" and "injected" in detail for _, _, kind, detail in x.state.events)

        del est.estimate                           # the input is sane again: site-0 is granted again
        t1 = time.monotonic()
        await until(lambda: [le for t, le in agents[0].leases() if t > t1 and le.sm_count > 0], 10,
                    "site-0 granted again")
        assert not agents[1].revokes(after=t0)
    finally:
        for a in agents:
            await a.close()
        if x is not None:
            await x.stop()
        await tb.close()


# ----------------------------------------------------------------------------- the pure loop


def _cfg(policy: str) -> XappConfig:
    return XappConfig.from_controls({
        "period_ms": 100, "policy": {"name": policy, "guard_sms": 8, "hold_periods": 3},
        "actuation": {"mode": "auto", "control_timeout_ms": 300},
        "sites": [{"site_id": "s1", "nodes": ["n1"], "gpu_sms": 128}, {"site_id": "s2", "nodes": ["n2"],
                                                                         "gpu_sms": 128}]})


def _state(c: XappConfig):
    st = new_state(c, now=0.0)
    rc = encode_ran_function_definition(node_ran_function_definition(weaver=True))
    for m in ("n1", "n2"):
        set_node(st, node_control(E2Node(meid=m, connected=True, functions=(
            RanFunction(ran_function_id=2, oid="1.3.6.1.4.1.53148.1.3.2.2", definition=b""),
            RanFunction(ran_function_id=3, oid=RC_OID, definition=rc))), c.actuation))
    return st


def _kpm(meid: str, t: float) -> KpmSample:
    return KpmSample(meid=meid, received=t, collected=0, sn=int(t * 10),
                     values={"GPU.SmUsed.Mean": 30.0, "GPU.SmUsed.Max": 40.0, "RRU.PrbUsedDl": 120.0,
                             "RRU.PrbAvailDl": 273.0})


def _step(st, t, results=()):
    _, actions = step(st, t, Inputs(samples=(_kpm("n1", t), _kpm("n2", t)), results=tuple(results),
                                    agents=frozenset({"s1", "s2"})))
    return actions


def _of(actions, kind, site):
    return [a for a in actions if isinstance(a, kind) and a.site_id == site]


def test_a_policy_that_raises_at_one_site_revokes_that_site_only():
    st = _state(_cfg("reactive"))
    a = _step(st, 0.1)
    assert _of(a, GrantLease, "s1") and _of(a, GrantLease, "s2")
    st.sites["s1"].policy = type("P", (), {"name": "reactive", "decide": staticmethod(_raise)})()
    a = _step(st, 0.2)                                # c364296: Broken propagates out of step()
    assert [r.reason for r in _of(a, RevokeLease, "s1")] == ["site-error"] and not _of(a, GrantLease, "s1")
    assert _of(a, GrantLease, "s2") and not _of(a, RevokeLease, "s2")
    assert st.sites["s1"].grant_sms == 0 and st.sites["s2"].grant_sms > 0
    a = _step(st, 0.3)                                # still failing: still only s1
    assert _of(a, GrantLease, "s2") and not _of(a, GrantLease, "s1")


def test_a_ledger_that_raises_on_one_sites_ack_revokes_that_site_only():
    st = _state(_cfg("weaver"))
    a = _step(st, 0.1)
    sent = [x for x in a if isinstance(x, SendControl)]
    assert {c.site_id for c in sent} == {"s1", "s2"}
    st.sites["s1"].safety.control_acked = _raise
    a = _step(st, 0.2, [ControlOutcome(control_id=c.control_id, ok=True) for c in sent])
    assert [r.reason for r in _of(a, RevokeLease, "s1")] == ["site-error"]
    assert _of(a, GrantLease, "s2") and not _of(a, GrantLease, "s1")
    assert any(kind == "site-error" for _, site, kind, _ in st.events if site == "s1")
