"""What the simulated DU measures each reporting period, and how KPM measurement names map onto it.

`SiteMeasurements` is the node's view of one site for one period (taken from the RAN model's
PeriodReport by `from_period_report`); `measure(...)` answers one (name, label, cell) request.
Units follow TS 28.552 where it fixes them; the vendor GPU measurements are Weaver's own.

| name | scope | unit / kind |
|---|---|---|
| RRU.PrbUsedDl / RRU.PrbUsedUl (+ `.SNSSAI`) | cell, or the node (sum of cells); per slice with a sliceID label | mean PRBs per slot of that direction, integer |
| RRU.PrbAvailDl / RRU.PrbAvailUl | cell / node | PRBs available per slot, integer |
| RRU.PrbTotDl / RRU.PrbTotUl | cell / node | used ÷ available, percent, integer |
| DRB.UEThpDl / DRB.UEThpUl (+ `.SNSSAI`) | cell / node, per slice | kbit/s over the period, REAL |
| DRB.RlcSduDelayDl (+ `.SNSSAI`) | cell / node, per slice | mean queueing delay, ms, REAL |
| GPU.SmUsed.Mean / GPU.SmUsed.Max | site (the DU GPU; same for every cell) | SMs the RAN's PHY needed per slot: mean REAL / max integer (rounded up) |
| GPU.SmAvail | site | SMs left to the RAN after the training lease, integer |
| GPU.DeadlineMiss | site | slots in the period whose demand exceeded the SMs left to the RAN, integer |
| GPU.SmOffered.Mean / .Max | site | what the demand would have been without the compute-aware envelope: REAL / integer (up) |
| GPU.SmNonDeferrable.Max | site | peak of fixed + protected-slice demand (the floor any envelope must cover), integer (up) |
| GPU.BeAddedDelay.Max | site | oldest best-effort work the envelope deferred and served this period, ms, REAL |
| GPU.BeDeferredBytes | site | best-effort bytes still waiting in the compute-aware stage at period end, integer |
| GPU.SmEnvelope | site | the envelope in force (SMs, integer); noValue when none is set |

What a node offers depends on its `NodeConfig.kpm_profile` (`measurements_for`): `compute-aware` (default)
offers all of the above; `gpu` the standard counters plus GPU.SmUsed.*, GPU.SmAvail and GPU.DeadlineMiss
(a GPU-reporting node without the compute-aware stage); `standard` only the 3GPP counters, as a stock
srsRAN or OAI gNB does. The node refuses a subscription to a name its profile does not offer.

A per-slice name (`.SNSSAI` suffix, or the base name with a sliceID label) for a slice the node does
not serve yields `noValue`.

UE level (KPM report styles 2-5, `measure_ue`): `UE_LEVEL` names for one UE of the node's
`testbed.model.ues.UePopulation`: its share of its slice's PRBs and throughput in its cell (PRB counts
apportioned so that a cell's UEs add up to the cell's integer `RRU.PrbUsedDl/Ul`), its slice's delay. A UE
whose grants the DU caps (srsRAN's per-UE grant limits) reports what the model served it; the other UEs of its
slice share the rest. A
sliceID label of another slice than the UE's yields `noValue`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config import SliceId

PER_SLICE = ("RRU.PrbUsedDl", "RRU.PrbUsedUl", "DRB.UEThpDl", "DRB.UEThpUl", "DRB.RlcSduDelayDl")
UE_LEVEL = PER_SLICE  # what styles 2-5 report per UE (measure_ue)
PER_CELL = ("RRU.PrbAvailDl", "RRU.PrbAvailUl", "RRU.PrbTotDl", "RRU.PrbTotUl")
GPU_USED = ("GPU.SmUsed.Mean", "GPU.SmUsed.Max", "GPU.SmAvail", "GPU.DeadlineMiss")
# What the compute-aware stage knows and the weaver policy reads (xapp.inputs POLICY_INPUTS).
COMPUTE_AWARE = ("GPU.SmOffered.Mean", "GPU.SmOffered.Max", "GPU.SmNonDeferrable.Max", "GPU.BeAddedDelay.Max",
                 "GPU.BeDeferredBytes", "GPU.SmEnvelope")
SITE = (*GPU_USED, *COMPUTE_AWARE)
_CEILED = ("GPU.SmUsed.Max", "GPU.SmOffered.Max", "GPU.SmNonDeferrable.Max")
STANDARD = (*PER_SLICE, *(f"{n}.SNSSAI" for n in PER_SLICE), *PER_CELL)
MEASUREMENTS = (*STANDARD, *SITE)
PROFILES = {"compute-aware": MEASUREMENTS, "gpu": (*STANDARD, *GPU_USED), "standard": STANDARD}


def measurements_for(profile: str) -> tuple[str, ...]:
    """The measurement names a node of this KPM profile lists in its RAN function definition."""
    return PROFILES[profile]


@dataclass(frozen=True)
class SliceMeasurements:
    prb_used_dl: float
    prb_used_ul: float
    thp_dl_kbps: float
    delay_dl_ms: float
    thp_ul_kbps: float = 0.0
    # a UE of the slice whose grants the DU caps (srsRAN's per-UE grant limits): its ID and its own values
    limited_ue: int | None = None
    limited: SliceMeasurements | None = None


@dataclass(frozen=True)
class CellMeasurements:
    prb_avail_dl: int
    prb_avail_ul: int
    slices: tuple[SliceMeasurements, ...]  # in the node config's slice order

    @property
    def prb_used_dl(self) -> float:
        return sum(s.prb_used_dl for s in self.slices)

    @property
    def prb_used_ul(self) -> float:
        return sum(s.prb_used_ul for s in self.slices)


@dataclass(frozen=True)
class SiteMeasurements:
    """One site, one reporting period."""

    cells: tuple[CellMeasurements, ...]
    sm_mean: float
    sm_max: float
    sm_avail: int
    deadline_misses: int
    offered_mean: float = 0.0
    offered_max: float = 0.0
    nondeferrable_max: float = 0.0
    added_delay_max_ms: float = 0.0
    envelope: float | None = None
    deferred_bytes: float = 0.0


def _slice_value(name: str, s: SliceMeasurements) -> float:
    return {"RRU.PrbUsedDl": s.prb_used_dl, "RRU.PrbUsedUl": s.prb_used_ul, "DRB.UEThpDl": s.thp_dl_kbps,
            "DRB.UEThpUl": s.thp_ul_kbps, "DRB.RlcSduDelayDl": s.delay_dl_ms}[name]


def _as_kind(name: str, value: float) -> int | float:
    # PRB counts and percentages are integers in TS 28.552; throughput, delay, SM means are REAL.
    # A peak SM count is rounded up: that many SMs were needed to cover it.
    if name in _CEILED:
        return max(0, math.ceil(value - 1e-9))
    if name.startswith("RRU.") or name in ("GPU.SmAvail", "GPU.DeadlineMiss", "GPU.SmEnvelope", "GPU.BeDeferredBytes"):
        return max(0, int(round(value)))
    return float(value)


def measure(m: SiteMeasurements, slices: tuple[SliceId, ...], name: str, snssai: tuple[int, int | None] | None,
            cell: int | None) -> int | float | None:
    """Value of `name` for `cell` (None: the whole node) and slice `snssai` ((sst, sd) or None)."""
    cells = m.cells if cell is None else (m.cells[cell],)
    if name in SITE:
        if name == "GPU.SmEnvelope" and m.envelope is None:
            return None
        value = {"GPU.SmUsed.Mean": m.sm_mean, "GPU.SmUsed.Max": m.sm_max, "GPU.SmAvail": m.sm_avail,
                 "GPU.DeadlineMiss": m.deadline_misses, "GPU.SmOffered.Mean": m.offered_mean,
                 "GPU.SmOffered.Max": m.offered_max, "GPU.SmNonDeferrable.Max": m.nondeferrable_max,
                 "GPU.BeAddedDelay.Max": m.added_delay_max_ms, "GPU.SmEnvelope": m.envelope,
                 "GPU.BeDeferredBytes": m.deferred_bytes}[name]
        return _as_kind(name, value)
    base = name.removesuffix(".SNSSAI")
    if base in PER_SLICE:
        if snssai is None and name.endswith(".SNSSAI"):
            return None
        if snssai is None:
            idx = range(len(slices))
        else:
            idx = [i for i, s in enumerate(slices) if (s.sst, s.sd) == snssai or (s.sst == snssai[0] and snssai[1] is None)]
            if not idx:
                return None
        if base == "DRB.RlcSduDelayDl":  # a mean, weighted by served volume
            num = sum(c.slices[i].delay_dl_ms * max(c.slices[i].thp_dl_kbps, 1e-9) for c in cells for i in idx)
            den = sum(max(c.slices[i].thp_dl_kbps, 1e-9) for c in cells for i in idx)
            return _as_kind(base, num / den if den else 0.0)
        return _as_kind(base, sum(_slice_value(base, c.slices[i]) for c in cells for i in idx))
    if name in ("RRU.PrbAvailDl", "RRU.PrbAvailUl"):
        return _as_kind(name, sum(c.prb_avail_dl if name.endswith("Dl") else c.prb_avail_ul for c in cells))
    if name in ("RRU.PrbTotDl", "RRU.PrbTotUl"):
        dl = name.endswith("Dl")
        used = sum(c.prb_used_dl if dl else c.prb_used_ul for c in cells)
        avail = sum(c.prb_avail_dl if dl else c.prb_avail_ul for c in cells)
        return _as_kind(name, 100.0 * used / avail if avail else 0.0)
    return None


def measure_ue(m: SiteMeasurements, slices: tuple[SliceId, ...], ues, ue, name: str,
               snssai: tuple[int, int | None] | None) -> int | float | None:
    """Value of UE-level `name` (`UE_LEVEL`, optionally `.SNSSAI`) for `ue` of population `ues`."""
    base = name.removesuffix(".SNSSAI")
    if base not in UE_LEVEL or ue.cell >= len(m.cells):
        return None
    own = slices[ue.slice]
    if snssai is not None and not (snssai == (own.sst, own.sd) or (snssai[0] == own.sst and snssai[1] is None)):
        return None
    if name.endswith(".SNSSAI") and snssai is None:
        return None
    cell = m.cells[ue.cell]
    if base == "DRB.RlcSduDelayDl":
        return _as_kind(base, cell.slices[ue.slice].delay_dl_ms)
    exact = {u.f1ap_id: _ue_value(base, cell.slices[u.slice], u, ues) for u in ues.in_cell(ue.cell)}
    if base.startswith("RRU."):  # integer counters: the cell's UEs add up to the cell's integer value
        from testbed.model.ues import apportion

        return apportion(exact, _as_kind(base, sum(exact.values())))[ue.f1ap_id]
    return _as_kind(base, exact[ue.f1ap_id])


def _ue_value(base: str, s: SliceMeasurements, u, ues) -> float:
    """A UE's additive value: its share of its slice's, or, where a UE of the slice is grant-limited, that UE's
    own value, and the rest of the slice's split among the others by their shares."""
    if s.limited is None or s.limited_ue is None or ues.get(s.limited_ue) is None:
        return u.share * _slice_value(base, s)
    own = _slice_value(base, s.limited)
    if u.f1ap_id == s.limited_ue:
        return own
    rest = max(_slice_value(base, s) - own, 0.0)
    return rest * u.share / max(1.0 - ues.get(s.limited_ue).share, 1e-12)


def from_period_report(report, site: int, gpu_sms: float) -> SiteMeasurements:
    """The node's measurements of `site` from the RAN model's `PeriodReport` (testbed.model)."""
    s = site
    kbps = 8.0 / max(report.period_s, 1e-12) / 1000.0
    cells = []
    for c in range(report.prb_used_dl.shape[1]):
        slices = tuple(SliceMeasurements(
            prb_used_dl=float(report.slice_prb_used_dl[s, c, i]), prb_used_ul=float(report.slice_prb_used_ul[s, c, i]),
            thp_dl_kbps=float(report.slice_bytes_dl[s, c, i]) * kbps, delay_dl_ms=float(report.slice_delay_ms[s, c, i]),
            thp_ul_kbps=float(report.slice_bytes_ul[s, c, i]) * kbps, **_limited_of(report, s, c, i, kbps))
            for i in range(report.slice_prb_used_dl.shape[2]))
        cells.append(CellMeasurements(int(round(float(report.prb_avail_dl[s, c]))),
                                      int(round(float(report.prb_avail_ul[s, c]))), slices))
    return SiteMeasurements(cells=tuple(cells), sm_mean=float(report.sm_mean[s]), sm_max=float(report.sm_max[s]),
                            sm_avail=int(max(0.0, gpu_sms - float(report.training_sms[s]))),
                            deadline_misses=int(report.misses[s]), offered_mean=float(report.offered_mean[s]),
                            offered_max=float(report.offered_max[s]),
                            nondeferrable_max=float(report.nondeferrable_max[s]),
                            added_delay_max_ms=float(report.added_delay_max_ms[s]),
                            deferred_bytes=float(report.deferred_bytes[s]),
                            envelope=None if not math.isfinite(float(report.envelope[s])) else float(report.envelope[s]))


def _limited_of(report, s: int, c: int, i: int, kbps: float) -> dict:
    """The grant-limited UE of (cell c, slice i) in the report, if any (`RanModel.set_ue_grant_limit`)."""
    tags = getattr(report, "limited_ue", None)
    if tags is None or tags[s, c, i] < 0:
        return {}

    def pick(a) -> float:
        return float(a[s, c, i]) if a is not None else 0.0
    own = SliceMeasurements(prb_used_dl=pick(report.limited_prb_used_dl), prb_used_ul=pick(report.limited_prb_used_ul),
                            thp_dl_kbps=pick(report.limited_bytes_dl) * kbps, delay_dl_ms=0.0,
                            thp_ul_kbps=pick(report.limited_bytes_ul) * kbps)
    return {"limited_ue": int(tags[s, c, i]), "limited": own}
