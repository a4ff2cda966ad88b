"""The federated uplink costs what it costs (issue 28 item 3): the UE updates' PRBs are the cells' uplink in the
RAN model, so they show in its KPM PRB counts, its PHY-GPU demand and, through the xApp's own loop, in the
envelope and the lease; RAN first holds with them."""
from __future__ import annotations

import numpy as np
import pytest

from testbed import scenarios
from testbed.federated.population import Population, PopulationConfig
from testbed.federated.rancost import UploadOverlay, ran_cost
from testbed.federated.uplink import Uplink
from testbed.model import PhyCost, RanModel, SyntheticTrace
from testbed.model.ran import tdd_layout
from testbed.model.training import StepCostModel

SC = scenarios.get("demo")


def _uploads(seconds: float = 3.0, nbytes: int = 400_000, seed: int = 0) -> Uplink:
    pop = Population.build(PopulationConfig(ues_per_cell=8), seed)
    up = Uplink(SC, pop.cell, pop.mcs_offset, seed)
    for i in range(len(pop.cell)):
        up.submit(i, 0.05 * (i % 10), nbytes)
    up.advance_to(seconds)
    return up


def test_the_uploads_prbs_are_the_cells_uplink_prbs_and_their_decode_is_ran_gpu_work():
    up = _uploads()
    prbs = np.concatenate(up.carried_prbs)
    assert prbs.sum() > 0 and not up.busy(0)
    base = RanModel(SC, 0, track_delay=False)                       # unshaped: no envelope, default quotas
    overlay = UploadOverlay(SyntheticTrace(SC, 0), prbs)
    withu = RanModel(SC, 0, trace=overlay, track_delay=False)
    T = SC.period_slots
    u_frac = float(tdd_layout(SC.sites[0].tdd)[1].mean())         # KPM's uplink PRBs are per U slot
    demand = [0.0, 0.0]
    for p in range(len(prbs) // T + 3):                              # + 3: the last U slots' decode spill
        a, b = base.step_period(), withu.step_period()
        demand[0] += float(a.demand.sum())
        demand[1] += float(b.demand.sum())
        if p < len(prbs) // T:
            # KPM's RRU.PrbUsedUl: mean PRBs per U slot; the uploads took the headroom the cell's traffic left
            want = prbs[p * T:(p + 1) * T].sum(axis=0) / (T * u_frac)
            np.testing.assert_allclose(b.prb_used_ul - a.prb_used_ul, want, rtol=1e-6, atol=1e-6)
    # every uploaded byte decoded once: the extra RAN GPU is the bytes at PUSCH work per byte (SM-us -> SM-slots)
    cu = PhyCost.calibrated().ul
    extra_sm_slots = overlay.offered_bytes * cu.work_per_byte / 500.0
    assert demand[1] - demand[0] == pytest.approx(extra_sm_slots, rel=1e-6)


def test_the_xapp_sizes_for_the_uploads_and_ran_first_holds_with_them():
    up = _uploads(seconds=4.0, nbytes=600_000)
    rc = ran_cost(SC, 0, up.carried_prbs, StepCostModel())
    w, wo = rc["runs"]["with updates"], rc["runs"]["without updates"]
    assert rc["updates_prbs_per_u_slot_mean"] > 0 and 0 < rc["updates_share_of_ul_prbs"] < 1
    assert w["prb_used_ul_per_u_slot_mean"] > wo["prb_used_ul_per_u_slot_mean"]
    assert rc["updates_ran_gpu_sm_s"] == pytest.approx(rc["updates_decode_sm_s_from_bytes"], rel=1e-3)
    # the loop saw them in KPM: a larger envelope, a smaller lease; and no slot over the GPU less the lease
    assert w["envelope_sms_mean"] > wo["envelope_sms_mean"]
    assert rc["training_lease_displaced_sm_s"] > 0
    assert w["deadline_misses_attributable_to_training"] == 0 == wo["deadline_misses_attributable_to_training"]


def test_the_miss_count_sees_a_lease_the_uploads_do_not_leave_room_for():
    """The 0 above is a measurement that can fail: the run with the updates, charged against a lease one guard
    larger than the loop granted, has training-caused misses."""
    from testbed.bench.liveloop import xapp_config
    from testbed.bench.policies import account, simulate
    up = _uploads(seconds=4.0, nbytes=600_000)
    prbs = np.concatenate(up.carried_prbs)
    cfg = xapp_config(SC, "weaver")
    run = simulate(SC, 0, len(prbs) // SC.period_slots, cfg, plot_periods=0, track_delay=False,
                   trace=UploadOverlay(SyntheticTrace(SC, 0), prbs))
    ok = account(run.grants, run, SC, StepCostModel())
    over = account(np.where(run.grants > 0, run.grants + cfg.policy.guard_sms + 8, 0), run, SC, StepCostModel())
    assert ok.deadline_misses == 0 < over.deadline_misses
