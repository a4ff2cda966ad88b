"""`RanModel`: sites x cells x slices advanced a period of slots at a time; the slot is the virtual time.

One period: traffic arrivals -> per-cell MAC with slice quotas (`mac.schedule_cells`) -> PHY cost
(`phy`) -> optional compute-aware stage per site that keeps demand inside the site SM envelope E by
deferring best-effort work (never protected) -> SM accounting against the training lease (a deadline
miss is a slot whose RAN demand exceeds the SMs the lease leaves to the RAN) -> `PeriodReport`.

Compute-aware stage (the Weaver paper's mechanism, as a DU vendor would implement it): non-deferrable
demand n_t (fixed per-slot costs + protected slice) always goes through. UL best-effort work granted
in a U slot is admitted only as far as its decode spill (1250 us over the next 3 slots) fits under E
next to n; DL best-effort work then fills what is left under E in D/S slots. Deferred work waits in
the site's order of arrival and is served in later slots earliest-deadline-first over the cells whose
PRB headroom can still carry it (`edf`: a saturated cell never holds the others back), so every byte
is served eventually and per-slot demand stays <= E in every slot where n_t <= E.
Design choice: E is hard (a slot over it is a PHY deadline at risk) and the best-effort delay budget is
soft: the stage never breaks E to meet the budget; it reports the delay it added (`added_delay_max_ms`,
and the compute-stage delay histogram) and the xApp raises E when that delay nears the budget.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import SLOT_S, ModelConfigError, Scenario
from .edf import stage_sites_kernel
from .mac import FifoBacklog, SiteBacklogs, UeLimits, mac_delay_kernel, schedule_cells
from .phy import PhyCost, ul_spill
from .traffic import SyntheticTrace, TraceSource

# OAI's default NVS slice (nvs_nr_dl_init: "we reserved 5% resource for RRC connection"), always there
NVS_DEFAULT_SHARE = 0.05
DELAY_BINS = 4001  # histogram bins of one slot (0.5 ms); the last bin collects everything longer
S_SLOT_DL = 10 / 14  # DL share of a special slot (format 10D:2G:2U)


def tdd_layout(tdd: str) -> tuple[np.ndarray, np.ndarray]:
    """(DL PRB fraction, is-U) per slot of one pattern, rotated to start at the S slot before the first
    U so that every U slot's 3-slot decode window ends inside the pattern (DDDSU -> SUDDD)."""
    first_u = tdd.index("U")
    start = tdd.rindex("S", 0, first_u) if "S" in tdd[:first_u] else first_u
    pat = tdd[start:] + tdd[:start]
    last_u = pat.rindex("U")
    if last_u + 3 >= len(pat):
        raise ModelConfigError(f"TDD {tdd}: the last U slot's decode window leaves the pattern")
    dl = np.array([1.0 if ch == "D" else S_SLOT_DL if ch == "S" else 0.0 for ch in pat])
    return dl, np.array([ch == "U" for ch in pat])


@dataclass(frozen=True)
class PeriodReport:
    """What one period produced. Per site (S,), per cell (S, C), per slice (S, C, L); L = (protected,
    best-effort). PRB figures are mean PRBs per slot of that direction; bytes are totals served in the
    period. Ground truth (`demand`, `offered`, `nondeferrable`) is per slot, shape (T, S), in SMs."""

    start_slot: int
    n_slots: int
    period_s: float
    # site: GPU (what a vendor KPM measurement GPU.SmUsed.Mean/Max would carry) and ground truth
    sm_mean: np.ndarray
    sm_max: np.ndarray
    offered_mean: np.ndarray  # demand had the envelope not deferred anything
    offered_max: np.ndarray
    nondeferrable_max: np.ndarray  # fixed + protected demand: the floor any envelope must cover
    misses: np.ndarray  # slots with demand > gpu_sms - training_sms
    training_sms: np.ndarray
    envelope: np.ndarray  # inf when no envelope is set
    deferred_bytes: np.ndarray  # best-effort bytes waiting in the compute-aware stage at period end
    added_delay_max_ms: np.ndarray  # oldest deferred work served this period (ms)
    level: np.ndarray  # traffic load multiplier lambda
    # cell
    prb_used_dl: np.ndarray
    prb_used_ul: np.ndarray
    prb_avail_dl: np.ndarray
    prb_avail_ul: np.ndarray
    # slice
    slice_prb_used_dl: np.ndarray
    slice_prb_used_ul: np.ndarray
    slice_bytes_dl: np.ndarray
    slice_bytes_ul: np.ndarray
    slice_queue_bytes: np.ndarray  # MAC queues (DL + UL) at period end
    slice_delay_ms: np.ndarray  # mean MAC queueing delay (Little's law) in the period
    demand: np.ndarray
    offered: np.ndarray
    nondeferrable: np.ndarray  # (T, S) fixed + protected SMs per slot
    # the grant-limited UE of a (site, cell, slice), where one is set (`RanModel.set_ue_grant_limit`): its mean
    # PRBs per slot of the direction and bytes, (S, C, L); None when no UE is limited
    limited_prb_used_dl: np.ndarray | None = None
    limited_prb_used_ul: np.ndarray | None = None
    limited_bytes_dl: np.ndarray | None = None
    limited_bytes_ul: np.ndarray | None = None
    limited_ue: np.ndarray | None = None     # (S, C, L) its tag (`set_ue_grant_limit`), -1 where none

    @property
    def prb_util_dl(self) -> np.ndarray:
        return self.prb_used_dl / np.maximum(self.prb_avail_dl, 1e-9)


@dataclass(frozen=True)
class PeriodLayout:
    """What depends only on the period length: TDD per slot and site (T, S), each direction's PRBs per
    slot and cell (T, S, C), the fixed PHY SMs per slot, slot counts per direction (S, 1)."""

    dl_frac: np.ndarray
    is_u: np.ndarray
    is_dl: np.ndarray
    cap_dl: np.ndarray
    cap_ul: np.ndarray
    fixed_dl: np.ndarray  # SMs of every cell's fixed PDSCH cost in D/S slots
    fixed_ul: np.ndarray  # SMs (before the decode spill) of every cell's fixed PUSCH cost in U slots
    n_dl: np.ndarray  # DL slot-equivalents
    n_ul: np.ndarray
    ones: np.ndarray  # (T,) for sums over time
    ul_weight: np.ndarray  # (T, S) how many U slots' decode windows cover each slot, weighted (1, 1, 0.5)

    @classmethod
    def build(cls, dl_frac: np.ndarray, is_u: np.ndarray, prbs: np.ndarray, cost: PhyCost) -> PeriodLayout:
        n_cells = prbs.shape[1]
        cd, cu = cost.dl, cost.ul
        return cls(dl_frac=dl_frac, is_u=is_u, is_dl=dl_frac > 0,
                   cap_dl=dl_frac[:, :, None] * prbs[None], cap_ul=is_u[:, :, None] * prbs[None],
                   fixed_dl=(dl_frac > 0) * (n_cells * cd.a / cd.budget_us),
                   fixed_ul=is_u * (n_cells * cu.a / cu.budget_us),
                   n_dl=dl_frac.sum(axis=0)[:, None], n_ul=np.maximum(is_u.sum(axis=0), 1)[:, None],
                   ones=np.ones(len(dl_frac)),
                   ul_weight=ul_spill(is_u.astype(float)))


def compile_kernels(scenario: Scenario) -> None:
    """Run two periods of a throwaway model of `scenario` through every compiled pass (MAC queues, delay
    histogram, compute stage with a backlog), so that numba compiles them for this scenario's array
    layouts, or loads them from its cache, now. A first compile takes seconds: inside a live E2 node's
    first period it reads as a node gone silent, so a live simulation calls this before it starts."""
    m = RanModel(scenario, seed=0)
    for s in range(scenario.n_sites):
        m.set_envelope(s, 0.0)  # everything best-effort deferred: the second period serves a backlog
    m.step_period()
    m.step_period()


class RanModel:
    """The simulated RAN of a scenario. Not thread-safe; one owner calls `step_period` in order."""

    def __init__(self, scenario: Scenario, seed: int = 0, trace: TraceSource | None = None,
                 cost: PhyCost | None = None, track_delay: bool = True):
        """`track_delay=False` skips the bytes-weighted MAC delay histograms (`delay_hist[0]`), a
        measurement that costs about a third of a period's time; everything else is unchanged."""
        self.track_delay = track_delay
        self.scenario = scenario
        self.seed = seed
        self.trace = trace if trace is not None else SyntheticTrace(scenario, seed)
        self.cost = cost or PhyCost.calibrated()
        S, C = scenario.n_sites, scenario.n_cells
        self.slot = 0
        self.gpu_sms = np.array([s.gpu_sms for s in scenario.sites], dtype=float)
        self.prbs = np.array([[c.prbs for c in s.cells] for s in scenario.sites], dtype=float)
        self.quota = np.zeros((S, C, 2, 3))
        self.quota[..., 1] = 1.0  # min 0, max 100 %, dedicated 0
        self.q_dl = np.zeros((2, S, C))  # MAC queues, slice-first like the MAC arrays
        self.q_ul = np.zeros((2, S, C))
        self.envelope = np.full(S, np.inf)
        self.limits_dl, self.limits_ul = UeLimits.none(S, C), UeLimits.none(S, C)   # per-UE grant caps
        # OAI's NVS downlink slicing (testbed.e2node.dialects.nvs_reserved), per site: each model slice's reserved
        # share (NaN: not configured, so in OAI's default slice); all NaN = no NVS, the quotas govern the DL.
        # nvs_unserved: per site, the slices OAI added that no UE here is on, by S-NSSAI -> reserved share
        self.nvs_reserved = np.full((S, 2), np.nan)
        self.nvs_unserved: list[dict] = [{} for _ in range(S)]
        # the tightest envelope in force since the last period: what the period is simulated under (see step_period)
        self._period_envelope = np.full(S, np.inf)
        self.be_delay_budget_ms = np.array([s.slices[1].delay_budget_ms for s in scenario.sites])
        self.training_sms = np.zeros(S)
        self.deferred_dl, self.deferred_ul = SiteBacklogs.empty(S, C), SiteBacklogs.empty(S, C)
        # Bytes-weighted delay histograms (slots): [stage mac|compute, slice]; conservation counters.
        self.delay_hist = np.zeros((2, 2, DELAY_BINS))
        self.offered_bytes = np.zeros((S, C, 2))
        self.served_bytes = np.zeros((S, C, 2))
        self._layout: dict[int, PeriodLayout] = {}

    # --- controls (what RC control and the agent's usage reports set) ---
    def set_slice_quota(self, site: int, cell: int, sst: int, sd: int | None, min_ratio: float,
                        max_ratio: float, dedicated_ratio: float) -> None:
        """RC Style 2 Action 6 for one cell: ratios in percent (0..100) of the cell's PRBs. Raises
        ModelConfigError (and changes nothing) for an unknown slice or inconsistent ratios."""
        sc = self.scenario
        self._check_site(site)
        if not (isinstance(cell, int | np.integer) and 0 <= cell < sc.n_cells):
            raise ModelConfigError(f"no cell {site}/{cell}")
        match = [i for i, sl in enumerate(sc.sites[site].slices) if sl.sst == sst and sl.sd == sd]
        if not match:
            raise ModelConfigError(f"site {site}: no slice sst={sst} sd={sd}")
        if not (0 <= min_ratio <= max_ratio <= 100 and 0 <= dedicated_ratio <= 100):  # NaN fails too
            raise ModelConfigError(f"ratios must satisfy 0 <= min <= max <= 100 and 0 <= dedicated <= 100, "
                                   f"got {min_ratio}/{max_ratio}/{dedicated_ratio}")
        new = self.quota[site, cell].copy()
        new[match[0]] = (min_ratio / 100, max_ratio / 100, dedicated_ratio / 100)
        if new[:, 2].sum() > 1 + 1e-9 or new[:, 0].sum() > 1 + 1e-9:
            raise ModelConfigError(f"cell {site}/{cell}: dedicated or min ratios sum over 100 %")
        self.quota[site, cell] = new

    def set_ue_grant_limit(self, site: int, cell: int, slice_index: int, share: float, max_fraction: float,
                           tag: int = 0) -> None:
        """One UE's grants capped at `max_fraction` of the cell's PRBs, in both directions (PDSCH and PUSCH grant
        size limits); `share`: that UE's share of its slice's traffic in the cell; `tag`: who it is (the caller's
        UE ID, back in the report). One limited UE per (site, cell, slice): a second replaces the first; a
        restart (`reset_controls`) lifts them all."""
        self._check_site(site)
        if not (0 <= cell < self.scenario.n_cells and slice_index in (0, 1)):
            raise ModelConfigError(f"no cell/slice {site}/{cell}/{slice_index}")
        if not (0.0 < share <= 1.0 and 0.0 <= max_fraction <= 1.0):
            raise ModelConfigError(f"UE share {share} / grant limit {max_fraction} outside (0, 1] / [0, 1]")
        for lim in (self.limits_dl, self.limits_ul):
            if lim.tag[site, cell, slice_index] != tag:     # another UE: the old one's backlog is the slice's
                lim.queue[slice_index, site, cell] = 0.0
            lim.share[site, cell, slice_index], lim.cap[site, cell, slice_index] = share, max_fraction
            lim.tag[site, cell, slice_index] = tag

    def set_nvs_reserved(self, site: int, reserved: tuple[float | None, float | None],
                         unserved: dict | None = None) -> None:
        """OAI's NVS capacity slicing of the downlink: the two slices' reserved shares (fractions; None: the
        slice is not configured and its UEs are in OAI's default slice). Every slot goes to one slice, each
        slice taking slots in proportion to its reservation whether or not it has data (`NVS_DEFAULT_SHARE`
        for the default slice), so over a period each gets that share of the DL PRBs and no more; the uplink
        is not sliced. `unserved`: the slices no UE here is on (S-NSSAI -> reserved share), whose slots go
        unused. Raises ModelConfigError past OAI's admission control (the reservations with the default slice's
        above 1)."""
        self._check_site(site)
        r = np.array([np.nan if x is None else float(x) for x in reserved])
        others = dict(unserved or {})
        if np.any(r[np.isfinite(r)] < 0) or any(not v >= 0 for v in others.values()) \
                or NVS_DEFAULT_SHARE + np.nansum(r) + sum(others.values()) > 1.0 + 1e-9:
            raise ModelConfigError(f"NVS reservations {reserved} (+ {others} on slices without UEs) with the "
                                   f"default slice's {NVS_DEFAULT_SHARE} over 1.0 (OAI's admission control)")
        self.nvs_reserved[site], self.nvs_unserved[site] = r, others

    def _dl_quota(self) -> np.ndarray:
        """The quota the DL is scheduled under: the RC quotas, with NVS sites' slices at their time shares
        (max = the slice's share, and the protected slice's dedicated ratio keeping best-effort to its own)."""
        on = ~np.all(np.isnan(self.nvs_reserved), axis=1)
        if not on.any():
            return self.quota
        q = self.quota.copy()
        for site in np.flatnonzero(on):
            r = self.nvs_reserved[site]
            total = NVS_DEFAULT_SHARE + np.nansum(r) + sum(self.nvs_unserved[site].values())
            default = NVS_DEFAULT_SHARE / total / max(1, int(np.isnan(r).sum()))   # the default slice's, split
            f = np.where(np.isnan(r), default, r / total)
            q[site, :, 0] = (0.0, f[0], 1.0 - f[1])       # protected: at most f0; best-effort kept to f1
            q[site, :, 1] = (0.0, f[1], 0.0)
        return q

    def set_envelope(self, site: int, sms: float | None, be_delay_budget_ms: float | None = None) -> None:
        """Site SM envelope for the compute-aware MAC (None switches it off; deferred work then drains)."""
        self._check_site(site)
        if sms is not None and not (np.isfinite(sms) and sms >= 0):
            raise ModelConfigError(f"envelope {sms} must be a finite number of SMs >= 0")
        self.envelope[site] = np.inf if sms is None else float(sms)
        self._period_envelope[site] = min(self._period_envelope[site], self.envelope[site])
        if be_delay_budget_ms is not None:
            self.be_delay_budget_ms[site] = be_delay_budget_ms

    def reset_controls(self, site: int) -> None:
        """A node restart that loses its RC state: no envelope (the whole GPU), PRB quotas back to the
        defaults (min 0, max 100 %, dedicated 0) and the slices' own delay budgets. Queues and backlogs
        stay: the DU keeps running, unshaped."""
        self._check_site(site)
        self.quota[site] = 0.0
        self.quota[site, ..., 1] = 1.0
        for lim in (self.limits_dl, self.limits_ul):
            lim.share[site], lim.cap[site], lim.queue[:, site], lim.tag[site] = 0.0, 1.0, 0.0, -1
        self.nvs_reserved[site], self.nvs_unserved[site] = np.nan, {}
        self.envelope[site] = np.inf
        self.be_delay_budget_ms[site] = self.scenario.sites[site].slices[1].delay_budget_ms

    def set_training_sms(self, site: int, sms: float) -> None:
        """SMs the site's agent really holds now (from its usage report)."""
        self._check_site(site)
        if not (np.isfinite(sms) and 0 <= sms <= self.gpu_sms[site]):
            raise ModelConfigError(f"training SMs {sms} outside 0..{self.gpu_sms[site]}")
        self.training_sms[site] = float(sms)

    def _check_site(self, site: int) -> None:
        if not (isinstance(site, int | np.integer) and 0 <= site < self.scenario.n_sites):
            raise ModelConfigError(f"no site {site!r} (0..{self.scenario.n_sites - 1})")

    # --- the period ---
    def _period_layout(self, n_slots: int) -> PeriodLayout:
        if n_slots not in self._layout:
            dl, u = [], []
            for site in self.scenario.sites:
                d, uu = tdd_layout(site.tdd)
                if n_slots % len(d):
                    raise ModelConfigError(f"n_slots {n_slots} not a multiple of the TDD pattern {site.tdd}")
                dl.append(np.tile(d, n_slots // len(d)))
                u.append(np.tile(uu, n_slots // len(d)))
            self._layout[n_slots] = PeriodLayout.build(np.stack(dl, 1), np.stack(u, 1), self.prbs, self.cost)
        return self._layout[n_slots]

    def step_period(self, n_slots: int | None = None) -> PeriodReport:
        sc = self.scenario
        T = n_slots or sc.period_slots
        S, C = sc.n_sites, sc.n_cells
        start = self.slot
        lay = self._period_layout(T)
        arr = self.trace.arrivals(start, T)
        dl = schedule_cells(arr.dl, lay.cap_dl, arr.bpp_dl, self._dl_quota(), self.q_dl, self.limits_dl)
        ul = schedule_cells(arr.ul, lay.cap_ul, arr.bpp_ul, self.quota, self.q_ul, self.limits_ul)
        q0_dl, q0_ul = self.q_dl, self.q_ul
        self.q_dl, self.q_ul = dl.queue[:, -1].copy(), ul.queue[:, -1].copy()
        cd, cu = self.cost.dl, self.cost.ul
        kd, ku = cd.work_per_byte, cu.work_per_byte
        # Sums over time or cells go through matmul with a ones vector: numpy's reductions over an
        # axis other than the last, with a short trailing one, are several times slower here.
        ones_c = np.ones(C)
        site_dl = (dl.served.reshape(2, T * S, C) @ ones_c).reshape(2, T, S)  # bytes per slice and site
        site_ul = (ul.served.reshape(2, T * S, C) @ ones_c).reshape(2, T, S)
        # Non-deferrable SMs: fixed per-slot costs of every cell + the protected slice.
        nondef = lay.fixed_dl + (kd / cd.budget_us) * site_dl[0] + ul_spill(lay.fixed_ul + (ku / cu.budget_us) * site_ul[0])
        offered = nondef + (kd / cd.budget_us) * site_dl[1] + ul_spill((ku / cu.budget_us) * site_ul[1])
        demand = offered.copy()
        # Best-effort bytes served per cell; the compute-aware stage rewrites its sites' rows in place.
        served_be_dl = dl.served[1]
        served_be_ul = ul.served[1]
        mac_be = (served_be_dl.sum(axis=0), served_be_ul.sum(axis=0)) \
            if dl.served_limited is not None or ul.served_limited is not None else None
        if self.track_delay:  # before the compute stage rewrites the best-effort rows
            self._add_mac_delays(arr, dl, ul, q0_dl, q0_ul)
        added_max = deferred = np.zeros(S)
        # A period is simulated under the tightest envelope in force during it. The training SMs it is charged
        # with were measured over the same wall period, and an envelope loosens only after the training it gave
        # way to has stopped (its release): charged together with the looser envelope, the two would overlap in
        # the model where they followed each other in time. The looser envelope governs from the next period on.
        period_envelope, self._period_envelope = self._period_envelope, self.envelope.copy()
        active = np.isfinite(period_envelope) | self.deferred_dl.has_work() | self.deferred_ul.has_work()
        if active.any():
            added_max, deferred = self._compute_stage(active, period_envelope, start, nondef, lay, demand,
                                                      served_be_dl, served_be_ul, dl.be_headroom, ul.be_headroom)
        ones_t = lay.ones
        misses = (ones_t @ (demand > (self.gpu_sms - self.training_sms)[None] + 1e-9)).astype(np.int64)

        def per_cell(x):  # (L, T, S, C) summed over time -> (S, C, L)
            return (ones_t @ x.reshape(2, T, S * C)).T.reshape(S, C, 2)

        off = per_cell(arr.dl) + per_cell(arr.ul)
        self.offered_bytes += off
        served_dl, served_ul = dl.served, ul.served  # best-effort rows already rewritten above
        bytes_dl, bytes_ul = per_cell(served_dl), per_cell(served_ul)
        self.served_bytes += bytes_dl + bytes_ul
        n_dl, n_ul = lay.n_dl, lay.n_ul
        prb_dl = np.einsum("ltsc,tsc->scl", served_dl, 1.0 / arr.bpp_dl)  # PRB-slots per slice
        prb_ul = np.einsum("ltsc,tsc->scl", served_ul, 1.0 / arr.bpp_ul)
        limited = self._limited(dl, ul, arr, mac_be, per_cell, n_dl, n_ul) if mac_be is not None else {}
        if limited:
            limited["limited_ue"] = self.limits_dl.tag.copy()
        arrivals_per_slot = off / T
        queue_mean = (per_cell(dl.queue) + per_cell(ul.queue)) / T
        self.slot += T
        per_site = np.ascontiguousarray(np.stack([demand, offered, nondef]).transpose(0, 2, 1))  # (3, S, T)
        mean, peak = per_site[:2] @ ones_t / T, per_site.max(axis=2)
        return PeriodReport(
            start_slot=start, n_slots=T, period_s=T * SLOT_S,
            sm_mean=mean[0], sm_max=peak[0], offered_mean=mean[1], offered_max=peak[1],
            nondeferrable_max=peak[2], misses=misses, training_sms=self.training_sms.copy(),
            envelope=self.envelope.copy(), deferred_bytes=deferred, added_delay_max_ms=added_max,
            level=arr.level,
            prb_used_dl=prb_dl.sum(axis=2) / n_dl, prb_used_ul=prb_ul.sum(axis=2) / n_ul,
            prb_avail_dl=self.prbs.copy(), prb_avail_ul=self.prbs.copy(),
            slice_prb_used_dl=prb_dl / n_dl[..., None], slice_prb_used_ul=prb_ul / n_ul[..., None],
            slice_bytes_dl=bytes_dl, slice_bytes_ul=bytes_ul,
            slice_queue_bytes=np.moveaxis(self.q_dl + self.q_ul, 0, -1),
            slice_delay_ms=np.where(arrivals_per_slot > 0, queue_mean / np.maximum(arrivals_per_slot, 1e-12), 0.0)
            * SLOT_S * 1e3,
            demand=demand, offered=offered, nondeferrable=nondef, **limited,
        )

    @staticmethod
    def _limited(dl, ul, arr, mac_be, per_cell, n_dl, n_ul) -> dict:
        """The grant-limited UEs' PRBs and bytes; on best-effort, scaled by what the compute-aware stage let
        leave of the cell's best-effort service (it defers the slice's work as a whole)."""
        out = {}
        for name, sched, bpp, n, before, after in (("dl", dl, arr.bpp_dl, n_dl, mac_be[0], dl.served[1].sum(axis=0)),
                                                   ("ul", ul, arr.bpp_ul, n_ul, mac_be[1], ul.served[1].sum(axis=0))):
            if sched.served_limited is None:
                continue
            lim = sched.served_limited.copy()
            lim[1] *= np.where(before > 0, after / np.maximum(before, 1e-30), 1.0)[None]
            out[f"limited_bytes_{name}"] = per_cell(lim)
            out[f"limited_prb_used_{name}"] = np.einsum("ltsc,tsc->scl", lim, 1.0 / bpp) / n[..., None]
        return out

    def _add_mac_delays(self, arr, dl, ul, q0_dl: np.ndarray, q0_ul: np.ndarray) -> None:
        """Bytes-weighted FIFO delay of what left the MAC queues, into `delay_hist[0]` (`mac_delay_kernel`:
        each byte at its own age; the queue at the period's start is taken as arrived the slot before)."""
        L, T = arr.dl.shape[:2]
        for x, srv, q0 in ((arr.dl, dl.served, q0_dl), (arr.ul, ul.served, q0_ul)):
            mac_delay_kernel(x.reshape(L, T, -1), srv.reshape(L, T, -1), np.ascontiguousarray(q0).reshape(L, -1),
                             self.delay_hist[0])

    @property
    def backlog_dl(self) -> list[FifoBacklog]:
        """Each site's deferred DL best-effort work in the compute-aware stage (a copy)."""
        return [self.deferred_dl.site(s) for s in range(self.scenario.n_sites)]

    @property
    def backlog_ul(self) -> list[FifoBacklog]:
        return [self.deferred_ul.site(s) for s in range(self.scenario.n_sites)]

    def _compute_stage(self, active, E, start, nondef, lay: PeriodLayout, demand, be_dl, be_ul, head_dl, head_ul):
        """Shape the `active` sites' best-effort work under their envelopes E (`edf.stage_sites_kernel`): writes
        their `demand` (T, S) and best-effort bytes served per cell `be_*` (T, S, C) in place, replaces the
        backlogs, and returns per site (oldest added delay in ms, bytes left deferred)."""
        cu, cd = self.cost.ul, self.cost.dl
        T, S = nondef.shape
        n_act = int(active.sum())
        bl_ul, bl_dl = self.deferred_ul, self.deferred_dl
        out = []
        for bl in (bl_ul, bl_dl):
            rows = len(bl.slots) + n_act * T
            out.append((np.empty(rows, dtype=np.int64), np.empty((rows, bl.amounts.shape[1])),
                        np.zeros(S + 1, dtype=np.int64)))
        added = np.zeros(S, dtype=np.int64)
        left = np.zeros((2, S))
        stage_sites_kernel(active, E, nondef, lay.is_u, lay.is_dl, lay.ul_weight, cu.budget_us, cd.budget_us,
                           cu.work_per_byte, cd.work_per_byte, start,
                           bl_ul.slots, bl_ul.amounts, bl_ul.offsets, bl_dl.slots, bl_dl.amounts, bl_dl.offsets,
                           be_ul, be_dl, head_ul, head_dl, demand, added, *out[0], *out[1], left, self.delay_hist[1, 1])
        (us, ua, uo), (ds, da, do) = out
        self.deferred_ul = SiteBacklogs(us[:uo[-1]].copy(), ua[:uo[-1]].copy(), uo, left[0])
        self.deferred_dl = SiteBacklogs(ds[:do[-1]].copy(), da[:do[-1]].copy(), do, left[1])
        return added * SLOT_S * 1e3, left[1] / cd.work_per_byte + left[0] / cu.work_per_byte
