"""A per-UE view of the RAN model's traffic, for the UE-level KPM report styles (2-5).

The model simulates cells and slices, not UEs. `UePopulation` gives every cell a fixed set of UEs, each in
one slice with a fixed share of that slice's traffic in its cell (drawn once from the seed; the shares of a
(cell, slice) sum to 1), and a fixed radio state for matching conditions (UL/DL RSRP and CQI). A UE's
additive measurement (PRBs used, throughput) is its share of its slice's value, so the UEs of a cell sum
to the cell's value; `apportion` keeps that exact for integer counters too (largest remainders). A mean
(delay) is its slice's. Nothing here feeds back into the model: the cell-level numbers are unchanged.

UE IDs are gNB-CU UE F1AP IDs, unique per node: cell c's UEs are c*n .. c*n+n-1 (n UEs per cell), so
UEs 0 and 1 exist, as the srsRAN example xApps assume (UE 0, and 1 as their style-5 filler).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import ModelConfigError


@dataclass(frozen=True)
class Ue:
    f1ap_id: int      # gNB-CU UE F1AP ID (the gNB-DU-UEID of KPM and RC)
    cell: int
    slice: int        # index into the site's slices
    share: float      # of its slice's traffic in its cell
    ul_rsrp: int      # RSRP report value, 0..127 (TS 38.133 10.1.6)
    dl_rsrp: int
    cqi: int          # 0..15


@dataclass(frozen=True)
class UePopulation:
    ues: tuple[Ue, ...]

    @classmethod
    def build(cls, n_cells: int, n_slices: int, ues_per_cell: int = 4, seed: int = 0) -> UePopulation:
        """`ues_per_cell` UEs in every cell, dealt round-robin over the slices (so every slice of every cell
        has at least one UE and the shares sum to the slice's traffic)."""
        if ues_per_cell < n_slices:
            raise ModelConfigError(f"ues_per_cell {ues_per_cell} < {n_slices} slices: a slice would have no UE")
        rng = np.random.default_rng([seed, 20])
        out = []
        for cell in range(n_cells):
            slices = [k % n_slices for k in range(ues_per_cell)]
            weights = rng.gamma(2.0, 1.0, ues_per_cell)
            for k in range(ues_per_cell):
                group = sum(w for w, s in zip(weights, slices, strict=True) if s == slices[k])
                out.append(Ue(f1ap_id=cell * ues_per_cell + k, cell=cell, slice=slices[k],
                              share=float(weights[k] / group), ul_rsrp=int(rng.integers(20, 110)),
                              dl_rsrp=int(rng.integers(20, 110)), cqi=int(rng.integers(3, 16))))
        return cls(tuple(out))

    def get(self, f1ap_id: int) -> Ue | None:
        return self._by_id.get(f1ap_id)

    def in_cell(self, cell: int | None) -> tuple[Ue, ...]:
        return self.ues if cell is None else tuple(u for u in self.ues if u.cell == cell)

    @property
    def _by_id(self) -> dict[int, Ue]:
        cached = self.__dict__.get("_index")
        if cached is None:
            cached = {u.f1ap_id: u for u in self.ues}
            object.__setattr__(self, "_index", cached)
        return cached


def apportion(exact: dict[int, float], total: int) -> dict[int, int]:
    """Integers per key that sum to `total`, each the floor of its exact share of `total` plus one for the
    largest remainders (Hamilton's method), so integer UE counters add up to the cell's integer counter."""
    s = sum(exact.values())
    if total <= 0 or s <= 0:
        return dict.fromkeys(exact, 0)
    scaled = {k: v * total / s for k, v in exact.items()}
    out = {k: math.floor(v) for k, v in scaled.items()}
    left = total - sum(out.values())
    for k in sorted(scaled, key=lambda k: scaled[k] - out[k], reverse=True)[:left]:
        out[k] += 1
    return out
