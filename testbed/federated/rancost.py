"""What the federated uplink costs the RAN: the UE updates' PRBs put into the cells' uplink of the RAN model,
with the xApp's own control loop shaping it, against the same run without them (issue 28 item 3).

`testbed.federated.uplink` decides when each update reaches its gNB: it shares out, slot by slot, the
best-effort uplink PRBs the cells' own traffic left (`Uplink.carried_prbs`). Here those PRBs become best-effort
uplink arrivals of the same cells in the same slots (`UploadOverlay`, bytes = PRBs x the cell's bytes per PRB
in that slot, so the MAC schedules the same PRBs); from there the RAN model treats them as any uplink: they
count in the cell's `RRU.PrbUsedUl` and the best-effort slice's bytes, the PHY model charges their decode
(PUSCH work per byte, spread over its 1250 us budget), the compute-aware stage may defer them under an
envelope, and the xApp's loop (`testbed.bench.policies.simulate`, the deployed `xapp.loop.step` through real
KPM and RC bytes) sizes its envelope and leases on KPM that includes them.

Charged at the cell's bytes per PRB, not the UE's own MCS: the PRB counts are the ones the uploads took, and
the decode work is that of a PRB at the cell's MCS (it grows with the bits a PRB carries), more than a UE
below the cell's mean costs and less than one above it. Both byte counts are reported: what the RAN model was
offered (`updates_bytes_offered_to_the_ran`) and the updates' own (`updates_bytes_carried`, the bench adds it).

`ran_cost` runs both (with and without the uploads) on the same seed and returns, from the platform's side:
the PRBs the updates took (and their share of the cells' uplink PRBs), the RAN GPU they cost (SM-s of the
model's demand, and the same from bytes x PUSCH work per byte), the training lease they displaced (SM-s
granted without minus with), and the deadline misses by cause in both runs (slots over the GPU less the
lease: training-caused; over the whole GPU: the RAN alone).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.model import Scenario, SyntheticTrace
from testbed.model.phy import PhyCost
from testbed.model.ran import tdd_layout
from testbed.model.traffic import Arrivals

BEST_EFFORT = 1   # slice index of the model's arrays: (protected, best-effort)


@dataclass
class UploadOverlay:
    """A TraceSource: the scenario's synthetic traffic plus the uploads' PRBs as best-effort uplink arrivals.
    `prbs` (T_total, S, C): PRBs per slot and cell from slot 0 on (`Uplink.carried_prbs`, concatenated);
    beyond it, the base traffic alone."""

    base: SyntheticTrace
    prbs: np.ndarray
    offered_bytes: float = 0.0

    def arrivals(self, start_slot: int, n_slots: int) -> Arrivals:
        arr = self.base.arrivals(start_slot, n_slots)
        add = self.prbs[start_slot:start_slot + n_slots]
        if not add.size or not add.any():
            return arr
        ul = arr.ul.copy()      # the base's arrays are views into its batch: never write into them
        extra = add * arr.bpp_ul[:len(add)]
        ul[BEST_EFFORT, :len(add)] += extra
        self.offered_bytes += float(extra.sum())
        return Arrivals(dl=arr.dl, ul=ul, bpp_dl=arr.bpp_dl, bpp_ul=arr.bpp_ul, level=arr.level)


def ran_cost(scenario: Scenario, seed: int, carried_prbs: list[np.ndarray], step) -> dict:
    """Both runs of the xApp's loop over the RAN model, with and without the uploads; see the module doc."""
    from testbed.bench.liveloop import xapp_config
    from testbed.bench.policies import account, simulate

    prbs = np.concatenate(carried_prbs) if carried_prbs else np.zeros((0, scenario.n_sites, scenario.n_cells))
    T = scenario.period_slots
    n_periods = max(1, -(-len(prbs) // T))
    cfg = xapp_config(scenario, "weaver")
    overlay = UploadOverlay(SyntheticTrace(scenario, seed), prbs)
    runs = {"without updates": simulate(scenario, seed, n_periods, cfg, plot_periods=0, track_delay=False),
            "with updates": simulate(scenario, seed, n_periods, cfg, plot_periods=0, track_delay=False,
                                     trace=overlay)}
    cu = PhyCost.calibrated().ul
    out: dict = {"scenario": scenario.name, "periods": n_periods, "period_s": scenario.period_s,
                 "driver": "xapp.loop.step over testbed.model.RanModel (testbed.bench.policies.simulate)",
                 "updates_bytes_offered_to_the_ran": overlay.offered_bytes,
                 "updates_prb_slots": float(prbs.sum()),     # PRBs x U slots, all cells
                 "updates_prbs_per_u_slot_max": float(prbs.max(initial=0.0)),
                 "updates_decode_sm_s_from_bytes": overlay.offered_bytes * cu.work_per_byte / 1e6,
                 "runs": {}}
    for name, r in runs.items():
        a = account(r.grants, r, scenario, step)       # the policies bench's accounting: misses by cause
        ran_alone = round(a.ran_overload_rate * r.demand.size)
        out["runs"][name] = {
            "ran_sm_s": r.demand_sum * 0.0005,
            "prb_used_ul_per_u_slot_mean": float(r.prb_used_ul.mean()),   # the cells' KPM RRU.PrbUsedUl
            "lease_sm_s_granted": float(r.grants.sum() * scenario.period_s),
            "deadline_misses": a.deadline_misses,
            "deadline_misses_attributable_to_training": a.deadline_misses - ran_alone,
            "deadline_misses_ran_alone": ran_alone,
            "envelope_sms_mean": float(r.envelopes[r.envelopes > 0].mean()) if (r.envelopes > 0).any() else None,
            "bytes_still_queued_at_end": r.in_flight_bytes, "periods": r.demand.shape[0]}
    w, wo = out["runs"]["with updates"], out["runs"]["without updates"]
    out["updates_ran_gpu_sm_s"] = w["ran_sm_s"] - wo["ran_sm_s"]
    out["training_lease_displaced_sm_s"] = wo["lease_sm_s_granted"] - w["lease_sm_s_granted"]
    u_slots = sum(T * float(tdd_layout(s.tdd)[1].mean()) * n_periods * scenario.n_cells for s in scenario.sites)
    out["updates_prbs_per_u_slot_mean"] = float(prbs.sum()) / u_slots if u_slots else 0.0
    ul = w["prb_used_ul_per_u_slot_mean"]
    out["updates_share_of_ul_prbs"] = out["updates_prbs_per_u_slot_mean"] / ul if ul else 0.0
    return out
