"""KPM carries what the policy needs (issue 14 item 1).

- A compute-aware node (the testbed's default) lists GPU.SmOffered.*, GPU.SmNonDeferrable.Max,
  GPU.BeAddedDelay.Max and GPU.BeDeferredBytes in its KPM RAN function definition: the xApp subscribes to
  them and the policy's SiteObservation carries the node's values (testbed + mini-RIC + the xApp in this
  process, real E2AP over RMR, real Redis).
- A node with only the 3GPP counters (a stock srsRAN/OAI gNB: `kpm_profile="standard"`) gets a
  subscription without them, and the policy inputs are the documented estimate through the PRB cost model
  the xApp learnt before (SDL `cost/<site>`); REST and `weaver up`'s summary say so.
- The weaver policy's best-effort backlog guard acts in the live loop: the same KPM bytes, once with a
  growing deferred backlog, hold the envelope that otherwise steps down (pure loop, real KPM E2AP bytes
  through ingest).

Before issue 14 the subscription asked for none of these, `_observation` passed none, REST had no
`policy_inputs`, and the two backlog runs decided alike."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from kpm_bytes import indication
from xapp_harness import LeaseClient, SimBed, free_port, until, xapp_config

from e2sm.kpm import KpmVersion
from testbed.sim import SimConfig, Simulation, ntp64
from testbed.up import policy_inputs_summary  # what `weaver up --json` writes per site
from xapp.actuate import node_control
from xapp.app import XappApp
from xapp.config import XappConfig, load_config
from xapp.estimate import CostModel
from xapp.ingest import Ingest, KpmSubscription
from xapp.inputs import POLICY_INPUTS
from xapp.loop import ControlOutcome, GrantLease, Inputs, SendControl, new_state, set_node, step
from xapp.rnib import RC_OID, E2Node, RanFunction
from xapp.state import open_store

pytestmark = pytest.mark.slow


async def _site_json(x: XappApp, site: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{x.rest_port}/api/v1/sites/{site}") as r:
        assert r.status == 200
        return await r.json()


async def _bed(tmp, rmr_port: int, overrides: dict | None = None) -> SimBed:
    from ricxappframe.xapp_sdl import SDLWrapper

    sim = await Simulation.start(SimConfig(n_sites=2, n_cells=2, xapps=(f"127.0.0.1:{rmr_port}",), route_dir=str(tmp),
                                           speed=1.0, node_overrides=overrides or {}), sdl=SDLWrapper())
    tb = SimBed(sim)
    tb._task = asyncio.ensure_future(tb._run())
    return tb


def test_compute_aware_node_inputs_reach_the_policy(tmp_path, redis_env):
    asyncio.run(_measured(tmp_path))


async def _measured(tmp):
    rmr_port = free_port()
    tb = await _bed(tmp, rmr_port)
    x = agent = None
    try:
        x = XappApp(load_config(xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0, mode="auto")))
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        agent = LeaseClient(x.broker.port, "site-0").start()
        meid = tb.meids[0]
        await until(lambda: x.subscriptions.get(meid) is not None, 20, "site-0's subscription")
        sub = x.ingest.subs[x.subscriptions[meid].e2_event_instance_id]
        assert set(POLICY_INPUTS) <= set(sub.meas), sub.meas        # asked for, since the node offers them
        rt = x.state.sites["site-0"]
        await until(lambda: len(rt.history.observations) >= 5, 20, "site-0's decisions")
        names = {"offered_mean": "GPU.SmOffered.Mean", "offered_max": "GPU.SmOffered.Max",
                 "nondeferrable_max": "GPU.SmNonDeferrable.Max", "be_delay_ms": "GPU.BeAddedDelay.Max",
                 "be_deferred_bytes": "GPU.BeDeferredBytes"}

        def carried() -> bool:
            # the latest observation was made from the latest sample (none arrived since the tick)
            obs, sample = rt.history.observations[-1], rt.last[meid]
            return all(getattr(obs, f) == sample.values[k] for f, k in names.items())
        await until(carried, 5, "an observation carrying the node's compute-aware values", every=0.005)
        view = (await _site_json(x, "site-0"))["policy_inputs"]
        assert view["basis"] == "measured" and view["demand"] == "gpu", view
        assert set(view["inputs"].values()) == {"measured"}, view
        assert view["periods"].get("measured", 0) >= 5, view
        await until(lambda: [le for _, le in agent.leases() if le.sm_count > 0], 20, "a lease on measured inputs")

        summary = policy_inputs_summary((await _site_json(x, "site-0"))["policy_inputs"])
        assert summary["basis"] == "measured"
        assert summary["available"] == sorted(["offered_mean", "offered_max", "nondeferrable_max", "be_delay_ms",
                                               "be_deferred_bytes"]) == summary["used"]
    finally:
        if agent is not None:
            await agent.close()
        if x is not None:
            await x.stop()
        await tb.close()


def test_standard_node_falls_back_to_the_cost_model_estimate(tmp_path, redis_env):
    asyncio.run(_estimated(tmp_path))


async def _estimated(tmp):
    rmr_port = free_port()
    tb = await _bed(tmp, rmr_port, overrides={0: {"kpm_profile": "standard"}})
    x = agent = None
    try:
        path = xapp_config(tb, tmp, rmr_port=rmr_port, broker_port=0, mode="auto")
        cfg = load_config(path)
        # a PRB -> SM model the xApp learnt on an earlier run (SDL cost/<site>): 12 SMs fixed, 0.25 per DL PRB
        model = CostModel(window=cfg.estimate.window_periods)
        for prb in range(0, 500, 10):
            model.update(float(prb), float(prb) / 4, 12.0 + 0.25 * prb + 0.05 * prb / 4, 1.6 * (12.0 + 0.3 * prb))
        open_store(cfg.sdl_namespace).put_cost_model("site-0", model.to_dict())
        x = XappApp(cfg)
        await x.start(rest_port=0, broker_listen="127.0.0.1:0")
        agent = LeaseClient(x.broker.port, "site-0").start()
        meid = tb.meids[0]
        await until(lambda: x.subscriptions.get(meid) is not None, 20, "site-0's subscription")
        sub = x.ingest.subs[x.subscriptions[meid].e2_event_instance_id]
        assert not any(k.startswith("GPU.") for k in sub.meas), sub.meas   # a stock node's counters only
        rt = x.state.sites["site-0"]
        await until(lambda: len(rt.history.observations) >= 5, 20, "site-0's decisions")
        obs, est = rt.history.observations[-1], rt.last_estimate
        assert est.source == "model"
        assert obs.offered_mean == est.mean and obs.offered_max == est.peak       # nothing deferred it
        assert obs.nondeferrable_max is not None and 0 < obs.nondeferrable_max <= est.peak
        assert obs.be_delay_ms is None and obs.be_deferred_bytes is None          # no standard counter
        view = (await _site_json(x, "site-0"))["policy_inputs"]
        assert view["basis"] == "estimated" and view["demand"] == "model", view
        assert view["inputs"] == {"offered_mean": "estimated", "offered_max": "estimated",
                                  "nondeferrable_max": "estimated", "be_delay_ms": "absent",
                                  "be_deferred_bytes": "absent"}, view
        other = (await _site_json(x, "site-1"))["policy_inputs"]     # the compute-aware node next door
        assert other["basis"] == "measured", other
        summary = policy_inputs_summary(view)
        assert summary["available"] == [] and summary["basis"] == "estimated"
        assert summary["estimated"] == ["nondeferrable_max", "offered_max", "offered_mean"]
        await until(lambda: [le for _, le in agent.leases() if le.sm_count > 0], 20, "a lease on estimated inputs")
    finally:
        if agent is not None:
            await agent.close()
        if x is not None:
            await x.stop()
        await tb.close()


# ---------------------------------------------------------------- the backlog guard in the live loop

KPM3 = "1.3.6.1.4.1.53148.1.3.2.2"


def _loop_cfg() -> XappConfig:
    return XappConfig.from_controls({
        "period_ms": 100, "policy": {"name": "weaver", "guard_sms": 8, "hold_periods": 3},
        "actuation": {"mode": "auto", "control_timeout_ms": 300, "hysteresis_sms": 8, "be_delay_budget_ms": 30},
        "sites": [{"site_id": "s1", "nodes": ["n1"], "gpu_sms": 128, "granularity": 8,
                   "protected_slices": [{"sst": 2, "sd": 1}], "best_effort_slices": [{"sst": 1, "sd": 2}]}]})


def _run_loop(backlog: bool) -> list[tuple[int | None, int]]:
    """40 periods of real KPM bytes: 10 busy ones (offered 80 SMs mean), then calm (offered 24). With
    `backlog` the node reports 10 ms of added best-effort delay (past a quarter of the 30 ms budget) and a
    deferred backlog that grows each period. Returns (envelope sent, grant) per period."""
    from e2sm.rc import encode_ran_function_definition, node_ran_function_definition

    c = _loop_cfg()
    st = new_state(c, now=0.0)
    rc = encode_ran_function_definition(node_ran_function_definition(weaver=True))
    set_node(st, node_control(E2Node(meid="n1", connected=True, functions=(
        RanFunction(ran_function_id=2, oid=KPM3, definition=b""),
        RanFunction(ran_function_id=3, oid=RC_OID, definition=rc))), c.actuation))
    ing = Ingest()
    ing.set_limits(c.sites)
    ing.add(KpmSubscription(sub_id=7, meid="n1", ran_function_id=2, version=KpmVersion.V3_00, meas=()))
    out, pending = [], []
    for p in range(40):
        t = 0.1 * (p + 1)
        busy = p < 10
        mean = 80.0 if busy else 24.0
        values = {"GPU.SmUsed.Mean": [mean], "GPU.SmUsed.Max": [int(mean * 1.2)], "GPU.SmOffered.Mean": [mean],
                  "GPU.SmOffered.Max": [int(mean * 1.2)], "GPU.SmNonDeferrable.Max": [20],
                  "GPU.BeAddedDelay.Max": [10.0 if backlog and not busy else 0.0],
                  "GPU.BeDeferredBytes": [(1e6 * (p - 9)) if backlog and not busy else 0],
                  "RRU.PrbUsedDl": [120], "RRU.PrbAvailDl": [273], "RRU.PrbUsedDl@1:2": [100],
                  "RRU.PrbUsedDl@2:1": [20]}
        payload = indication(values, sn=p + 1, request=(123, 7), t=ntp64(1.7e9 + t))
        sample = ing.indication(7, "n1", payload, t)
        _, actions = step(st, t, Inputs(samples=(sample,), results=tuple(pending), agents=frozenset({"s1"})))
        pending = [ControlOutcome(control_id=a.control_id, ok=True) for a in actions if isinstance(a, SendControl)]
        env = [a.envelope_sms for a in actions if isinstance(a, SendControl)]
        grant = [a.sm_count for a in actions if isinstance(a, GrantLease)]
        out.append((env[-1] if env else None, grant[-1] if grant else 0))
    return out


def test_backlog_guard_holds_the_envelope_in_the_live_loop():
    calm = _run_loop(backlog=False)
    guarded = _run_loop(backlog=True)
    assert calm[:10] == guarded[:10]            # the same busy periods decide alike
    sized_calm = [e for e, _ in calm if e is not None]
    sized_guarded = [e for e, _ in guarded if e is not None]
    peak = max(sized_calm[:3])
    # without a backlog the calm offered load lets E step down; a growing backlog past a quarter of the
    # delay budget holds it (xapp.policy WeaverPolicy._backlog_guard), so the grant stays smaller
    assert sized_calm[-1] < peak, calm
    assert sized_guarded[-1] == peak and min(sized_guarded) == peak, guarded
    assert guarded[-1][1] < calm[-1][1], (guarded[-1], calm[-1])


# ---------------------------------------------------------------- the new values are bounded at ingest

@pytest.mark.parametrize("values, reason", [
    ({"GPU.SmOffered.Mean": 2 * 132 + 1.0}, "above-gpu"),       # a unit error, not load
    ({"GPU.SmOffered.Max": 10 * 132}, "above-gpu"),
    ({"GPU.SmNonDeferrable.Max": 133}, "above-gpu"),           # the floor E must cover cannot pass the GPU
    ({"GPU.BeAddedDelay.Max": 3.6e6}, "be-delay"),              # an hour of delay: us sent as ms
    ({"GPU.BeAddedDelay.Max": -1.0}, "negative"),
    ({"GPU.BeDeferredBytes": 1e300}, "be-backlog"),
    ({"GPU.BeDeferredBytes": -5.0}, "negative"),       # a REAL: the integer form cannot be negative
])
def test_impossible_policy_inputs_are_refused(values, reason):
    from xapp.ingest import KpmValueError

    ing = Ingest()
    ing.set_limits(XappConfig.from_controls({
        "period_ms": 100, "policy": {"name": "weaver"},
        "sites": [{"site_id": "s", "nodes": ["n1"], "gpu_sms": 132, "granularity": 4}]}).sites)
    ing.add(KpmSubscription(sub_id=7, meid="n1", ran_function_id=2, version=KpmVersion.V3_00, meas=()))
    with pytest.raises(KpmValueError) as e:
        ing.indication(7, "n1", indication({"GPU.SmUsed.Mean": [20.0], **{k: [v] for k, v in values.items()}},
                                           request=(123, 7)), 0.0)
    assert e.value.refusal.reason == reason
    # an overloaded RAN may offer more than the GPU (that excess is what the envelope defers), a deep but
    # draining backlog and a delay past the budget are real: accepted
    ok = ing.indication(7, "n1", indication({"GPU.SmOffered.Max": [200], "GPU.BeAddedDelay.Max": [250.0],
                                             "GPU.BeDeferredBytes": [5e8]}, request=(123, 7), sn=2), 0.1)
    assert ok.values["GPU.SmOffered.Max"] == 200.0


def test_without_deferral_everything_counts_as_non_deferrable():
    """xapp.inputs' fallback: the cost-model estimate of the protected slices' peak only where something
    (an envelope or quotas) can defer best-effort; else the whole estimated peak (RAN first)."""
    from xapp.estimate import DemandEstimate
    from xapp.ingest import KpmSample
    from xapp.inputs import policy_inputs

    model = CostModel()
    for prb in range(0, 300, 10):
        model.update(float(prb), 0.0, 10.0 + 0.2 * prb, 1.5 * (10.0 + 0.2 * prb))
    s = KpmSample(meid="n1", received=0.0, collected=None,
                  values={"RRU.PrbUsedDl": 200.0, "RRU.PrbUsedDl@2:1": 40.0, "RRU.PrbAvailDl": 273.0})
    est = DemandEstimate(site_id="s", mean=50.0, peak=75.0, peak_q=75.0, source="model")
    shaped = policy_inputs([s], est, model, protected_keys=["RRU.PrbUsedDl@2:1"], defers=True, min_samples=20)
    plain = policy_inputs([s], est, model, protected_keys=["RRU.PrbUsedDl@2:1"], defers=False, min_samples=20)
    assert shaped.basis == plain.basis == "estimated"
    assert shaped.offered_mean == 50.0 and shaped.offered_max == 75.0
    assert abs(shaped.nondeferrable_max - 1.5 * (10.0 + 0.2 * 40)) < 0.5      # the protected 40 PRBs' peak
    assert plain.nondeferrable_max == 75.0
    assert shaped.be_delay_ms is None and shaped.source("be_deferred_bytes") == "absent"
    untrained = policy_inputs([s], est, CostModel(), protected_keys=["RRU.PrbUsedDl@2:1"], defers=True)
    assert untrained.nondeferrable_max == 75.0                               # too few periods to trust
