"""UE updates over the air: each upload is best-effort uplink traffic served by the testbed's MAC model,
so its arrival time at the gNB comes from the same radio model Weaver shapes everywhere else.

Per period the cells' own uplink traffic (`SyntheticTrace`) goes through `mac.schedule_cells` with the
default slice quotas; what the best-effort slice could still have been served in each U slot
(`be_headroom`, bytes at the cell's drawn MCS and layers) is the room the uploads share, as a
delay-tolerant class below the cell's other best-effort traffic. Inside a cell the room is split in
PRBs, equally among the UEs that are uploading (round robin, water-filled: a UE that needs less than its
share frees the rest in the same slot); a UE carries `bytes_per_prb` of its own MCS (the cell's mean
plus its offset, on the cell's drawn layers), and none while a mobility outage cuts its link. The PRBs
they took, slot by slot and cell by cell (`carried_prbs`), are what `testbed.federated.rancost` puts into
the RAN model's uplink, so that their PRBs, decode work and the leases they displace are measured there.
"""
from __future__ import annotations

import numpy as np

from testbed.model import SLOT_S, Scenario, SyntheticTrace, spectral_efficiency, tdd_layout
from testbed.model.jit import njit
from testbed.model.mac import schedule_cells


@njit(cache=True, nogil=True)
def serve_uploads(head, bpp, slot0, offs, members, gain, start, out0, out1, remaining, finish, carried):
    """Slot by slot, per cell n: split the cell's spare PRBs (head[t, n] / bpp[t, n]) equally among its
    uploading UEs (members[offs[n]:offs[n+1]]) by water-filling; `remaining` (bytes) drains in place and
    `finish` gets the slot after the one that carried a UE's last byte; `carried[t, n]` gets the PRBs the
    uploads took in that slot and cell. start/out0/out1 are absolute slots (an outage [out0, out1)
    carries nothing; NaN: none)."""
    T, N = head.shape
    width = 0
    for n in range(N):
        width = max(width, offs[n + 1] - offs[n])
    need = np.empty(width)
    idx = np.empty(width, dtype=np.int64)
    for t in range(T):
        s = slot0 + t
        for n in range(N):
            if head[t, n] <= 0.0:
                continue
            k = 0
            for j in range(offs[n], offs[n + 1]):
                i = members[j]
                if remaining[i] > 0.0 and start[i] <= s and not (out0[i] <= s < out1[i]):
                    idx[k] = i
                    need[k] = remaining[i] / (bpp[t, n] * gain[i])
                    k += 1
            if k == 0:
                continue
            order = np.argsort(need[:k])
            left = head[t, n] / bpp[t, n]
            m = k
            for q in range(k):
                share = left / m
                i = idx[order[q]]
                if need[order[q]] <= share:
                    remaining[i] = 0.0
                    finish[i] = s + 1
                    left -= need[order[q]]
                    carried[t, n] += need[order[q]]
                    m -= 1
                else:  # everyone still here needs more than an equal share: each gets it
                    for q2 in range(q, k):
                        i2 = idx[order[q2]]
                        remaining[i2] -= share * bpp[t, n] * gain[i2]
                    carried[t, n] += share * (k - q)
                    break


class Uplink:
    """The uplink of a scenario's cells, advanced a period at a time; uploads are submitted with their
    start time and finish when the MAC has carried their last byte (`finish_s`)."""

    def __init__(self, scenario: Scenario, cell_of_ue: np.ndarray, mcs_offset: np.ndarray, seed: int):
        S, C = scenario.n_sites, scenario.n_cells
        if cell_of_ue.max(initial=0) >= S * C:
            raise ValueError(f"UEs name cells beyond the scenario's {S} x {C}")
        self.scenario = scenario
        self.trace = SyntheticTrace(scenario, seed)
        self.slot = 0
        self.T = scenario.period_slots
        self.q_ul = np.zeros((2, S, C))
        self.quota = np.zeros((S, C, 2, 3))
        self.quota[..., 1] = 1.0  # the defaults: min 0, max 100 %, dedicated 0
        prbs = np.array([[c.prbs for c in s.cells] for s in scenario.sites], dtype=float)
        is_u = np.stack([np.tile(tdd_layout(s.tdd)[1], self.T // len(s.tdd)) for s in scenario.sites], 1)
        self.cap_ul = is_u[:, :, None] * prbs[None]  # (T, S, C) PRBs of the uplink per slot
        # A UE's bytes per PRB against the cell's: the ratio of spectral efficiencies at its MCS.
        mcs_cell = np.array([[max(c.mcs_mean - 3, 0) for c in s.cells] for s in scenario.sites]).reshape(-1)
        m = mcs_cell[cell_of_ue]
        ue_mcs = np.clip(np.rint(m) + mcs_offset, 0, 27).astype(int)
        self.gain = spectral_efficiency(ue_mcs) / spectral_efficiency(np.rint(m).astype(int))
        order = np.argsort(cell_of_ue, kind="stable")
        self.members = order.astype(np.int64)
        self.offs = np.searchsorted(cell_of_ue[order], np.arange(S * C + 1)).astype(np.int64)
        M = len(cell_of_ue)
        self.remaining = np.zeros(M)
        self.start = np.zeros(M)
        self.out0 = np.full(M, np.nan)
        self.out1 = np.full(M, np.nan)
        self.finish = np.full(M, np.nan)
        self.carried_bytes = 0.0
        # PRBs the uploads took, per slot and cell (T_total, S, C), a period at a time: what the RAN model
        # schedules as their uplink (testbed.federated.rancost)
        self.carried_prbs: list[np.ndarray] = []

    @property
    def now_s(self) -> float:
        return self.slot * SLOT_S

    def busy(self, ue: int) -> bool:
        return self.remaining[ue] > 0.0

    def submit(self, ue: int, start_s: float, nbytes: int, outage_s: tuple[float, float] | None = None) -> None:
        if self.busy(ue):
            raise ValueError(f"UE {ue} is still uploading")
        if start_s < self.now_s:
            raise ValueError(f"upload start {start_s} s is before the radio's now {self.now_s} s")
        self.remaining[ue] = float(nbytes)
        self.start[ue] = np.ceil(start_s / SLOT_S)
        self.finish[ue] = np.nan
        o0, o1 = outage_s if outage_s is not None else (np.nan, np.nan)
        self.out0[ue], self.out1[ue] = o0 / SLOT_S, o1 / SLOT_S

    def finish_s(self, ue: int) -> float:
        """When the UE's last upload reached the gNB (NaN: not yet)."""
        return float(self.finish[ue] * SLOT_S)

    def advance_to(self, t_s: float) -> None:
        """Run whole periods until the radio's clock is at or past `t_s`."""
        while self.now_s < t_s - 1e-12:
            self._period()

    def _period(self) -> None:
        T = self.T
        arr = self.trace.arrivals(self.slot, T)
        ul = schedule_cells(arr.ul, self.cap_ul, arr.bpp_ul, self.quota, self.q_ul)
        self.q_ul = ul.queue[:, -1].copy()
        N = self.cap_ul.shape[1] * self.cap_ul.shape[2]
        prbs = np.zeros((T, N))
        if (self.remaining > 0).any():
            before = self.remaining.sum()
            serve_uploads(np.ascontiguousarray(ul.be_headroom).reshape(T, N),
                          np.ascontiguousarray(arr.bpp_ul).reshape(T, N), self.slot, self.offs, self.members,
                          self.gain, self.start, self.out0, self.out1, self.remaining, self.finish, prbs)
            self.carried_bytes += before - self.remaining.sum()
        self.carried_prbs.append(prbs.reshape(T, *self.cap_ul.shape[1:]))
        self.slot += T
