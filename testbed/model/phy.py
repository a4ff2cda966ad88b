"""PHY cost model: scheduled PRBs x layers x MCS (+ LDPC code blocks) -> SMs the PHY needs per slot.

Model (compute-and-training-facts.md section 2.1, tag D):
    work w = a + b * PRB * layers * SE(MCS) + c * N_cb        [SM*us]
    N_cb  = TBS / (K_cb - 24), K_cb = 8448 (LDPC base graph 1, TS 38.212 5.2.2)
    TBS  ~= N_RE * SE * layers * PRB, N_RE = 144 data REs per PRB per slot (156 minus DMRS)
A task with work w and budget T needs w / T SMs for the span of its budget: PDSCH T = 200 us inside its
D slot; PUSCH T = 1250 us (2.5 slots) starting when the U slot's samples are in, i.e. spread over the
next three slots with weights (1, 1, 0.5) of w / 1250 (facts section 1 row 24).

Calibration (facts section 2.2), all from NVIDIA Aerial's published capacity figures (tag P):
- Row 25 + 24: 15 peak cells fit 114 SMs x 1250 us of PUSCH and 106 SMs x 200 us of PDSCH at 1 GHz, so
  a peak cell costs ~9.5k SM*us of PUSCH per U slot and ~1.4k SM*us of PDSCH per D slot.
- Row 20: the peak cell is 270 PRB, 4 DL / 2 UL layers, 1544 Mbps DL, 197 Mbps UL. At DDDSU the UL
  carries 197 Mbps x 2.5 ms = 492.5 kbit per U slot (SE 6.33); DL uses the top 256-QAM MCS (SE 7.41).
- Row 19-21: an average cell costs about half a peak one; with the fixed share a = 18 % of a peak
  cell's slot cost (inside the 15-22 % band of section 2.2), 0.18 + 0.82 x 0.36 (DL bit ratio) = 0.48
  and 0.18 + 0.82 x 0.41 (UL) = 0.52 reproduce the 2x capacity ratio (checked in tests).
- The variable part is split between the per-bit term b and the per-code-block term c: LDPC decode
  dominates PUSCH (c carries 80 %), encode is cheaper (c carries 40 % of PDSCH's).
Because TBS and N_cb are both proportional to bits, the variable cost of a byte does not depend on MCS:
`work_per_byte` is a constant per direction, which is what lets the MAC shape work with queue algebra.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.model.jit import njit

N_RE = 144  # data REs per PRB per slot after DMRS (TS 38.214 5.1.3.2 uses <= 156)
K_CB = 8448  # LDPC base graph 1 max code block size (TS 38.212 5.2.2)
DL_BUDGET_US = 200.0
UL_BUDGET_US = 1250.0
SLOT_US = 500.0
# UL decode of a U slot runs over the next 2.5 slots (1250 us): full, full, half a slot.
UL_SPREAD = np.array([1.0, 1.0, 0.5])

# TS 38.214 Table 5.1.3.1-2 (256-QAM MCS table): (Qm, R x 1024) for MCS 0..27.
MCS_TABLE_256QAM = (
    (2, 120), (2, 193), (2, 308), (2, 449), (2, 602), (4, 378), (4, 434), (4, 490), (4, 553), (4, 616),
    (4, 658), (6, 466), (6, 517), (6, 567), (6, 616), (6, 666), (6, 719), (6, 772), (6, 822), (6, 873),
    (8, 682.5), (8, 711), (8, 754), (8, 797), (8, 841), (8, 885), (8, 916.5), (8, 948),
)
SPECTRAL_EFFICIENCY = np.array([qm * r / 1024 for qm, r in MCS_TABLE_256QAM])


def spectral_efficiency(mcs) -> np.ndarray:
    """Qm x R in bits per RE for 256-QAM-table MCS indices (array or scalar)."""
    mcs = np.asarray(mcs)
    if np.any((mcs < 0) | (mcs > 27)):
        raise ValueError("MCS index outside 0..27 of the 256-QAM table")
    return SPECTRAL_EFFICIENCY[mcs]


def bytes_per_prb(mcs, layers) -> np.ndarray:
    """Transport bytes one PRB carries in one slot."""
    return N_RE * spectral_efficiency(mcs) * np.asarray(layers) / 8.0


@dataclass(frozen=True)
class Anchor:
    """A calibration point: a peak cell's PHY work per slot for one direction."""

    work_smus: float  # SM*us per slot of this direction
    prbs: int
    layers: int
    se: float  # bits per RE
    fixed_share: float
    cb_share: float  # share of the variable work carried by the code-block term


PEAK_DL = Anchor(work_smus=106 * DL_BUDGET_US / 15, prbs=270, layers=4, se=float(SPECTRAL_EFFICIENCY[27]),
                 fixed_share=0.18, cb_share=0.4)
PEAK_UL = Anchor(work_smus=114 * UL_BUDGET_US / 15, prbs=270, layers=2,
                 se=197e6 * 0.0025 / (270 * 2 * N_RE), fixed_share=0.18, cb_share=0.8)


@dataclass(frozen=True)
class DirectionCost:
    """w = a + b * PRB*layers*SE + c * N_cb for one direction; `budget_us` turns work into SMs."""

    a: float
    b: float
    c: float
    budget_us: float

    @classmethod
    def calibrated(cls, anchor: Anchor, budget_us: float) -> DirectionCost:
        a = anchor.fixed_share * anchor.work_smus
        var = anchor.work_smus - a
        rate = anchor.prbs * anchor.layers * anchor.se
        n_cb = rate * N_RE / (K_CB - 24)
        return cls(a=a, b=(1 - anchor.cb_share) * var / rate, c=anchor.cb_share * var / n_cb, budget_us=budget_us)

    def work(self, prbs, layers, se) -> np.ndarray:
        """SM*us for one slot with `prbs` scheduled (0 PRBs still pays the fixed per-slot cost)."""
        rate = np.asarray(prbs, dtype=float) * layers * se
        return self.a + self.b * rate + self.c * rate * N_RE / (K_CB - 24)

    @property
    def work_per_byte(self) -> float:
        """Variable SM*us per transport byte (independent of MCS and layers, see module doc)."""
        return 8.0 * (self.b / N_RE + self.c / (K_CB - 24))

    def sms(self, work) -> np.ndarray:
        """Peak SMs while the task runs inside its budget."""
        return np.asarray(work) / self.budget_us


@dataclass(frozen=True)
class PhyCost:
    dl: DirectionCost
    ul: DirectionCost

    @classmethod
    def calibrated(cls) -> PhyCost:
        return cls(dl=DirectionCost.calibrated(PEAK_DL, DL_BUDGET_US),
                   ul=DirectionCost.calibrated(PEAK_UL, UL_BUDGET_US))

    def peak_cell_sms(self) -> tuple[float, float]:
        """(DL, UL) SMs of one peak cell: 106/15 and 114/15 by construction."""
        dl = self.dl.sms(self.dl.work(PEAK_DL.prbs, PEAK_DL.layers, PEAK_DL.se))
        ul = self.ul.sms(self.ul.work(PEAK_UL.prbs, PEAK_UL.layers, PEAK_UL.se))
        return float(dl), float(ul)


@njit(cache=True, nogil=True)
def ul_spill(ul_sms_at_u: np.ndarray) -> np.ndarray:
    """Spread UL decode SMs of each U slot (axis 0) over the next three slots.

    The input is w / 1250 per slot (nonzero only in U slots); the output has the same shape, with the
    last three slots' spill dropped: callers keep periods aligned so that every U slot has its three
    decode slots inside the same period (see `tdd_layout`). Compiled (see `jit`): the compute-aware
    stage's kernel applies the same rule."""
    out = np.zeros_like(ul_sms_at_u)
    for k in range(1, len(UL_SPREAD) + 1):
        out[k:] += UL_SPREAD[k - 1] * ul_sms_at_u[:-k]
    return out
