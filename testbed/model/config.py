"""Configuration of the simulated world: slices, cells, sites, scenarios (frozen dataclasses).

Units: PRBs, SMs, milliseconds, seconds as named in each field. Slot = 0.5 ms (30 kHz SCS,
TS 38.211), 273 PRBs in 100 MHz (TS 38.101-1).
"""
from __future__ import annotations

from dataclasses import dataclass, field

SLOT_S = 0.0005
TDD_PATTERNS = ("DDDSU", "DDDSUUDDDD", "DDDDDDDSUU")
ARCHETYPES = ("residential", "business", "transport", "entertainment", "mixed")


class ModelConfigError(ValueError):
    """A configuration the model refuses; the message names the field."""


@dataclass(frozen=True)
class SliceConfig:
    """One network slice of every cell of a site. `protected` slices are never deferred or capped
    below their demand; `load_share` is this slice's share of the cell's offered bytes."""

    name: str
    sst: int
    sd: int | None
    protected: bool
    load_share: float
    delay_budget_ms: float

    def __post_init__(self) -> None:
        if not 0 <= self.sst <= 255:
            raise ModelConfigError(f"slice {self.name}: sst {self.sst} not in 0..255")
        if self.sd is not None and not 0 <= self.sd < 1 << 24:
            raise ModelConfigError(f"slice {self.name}: sd {self.sd} not a 24-bit value")
        if not 0 < self.load_share <= 1:
            raise ModelConfigError(f"slice {self.name}: load_share {self.load_share} not in (0, 1]")
        if self.delay_budget_ms <= 0:
            raise ModelConfigError(f"slice {self.name}: delay_budget_ms must be > 0")


PROTECTED = SliceConfig("urllc", sst=2, sd=1, protected=True, load_share=0.15, delay_budget_ms=1.0)
BEST_EFFORT = SliceConfig("embb", sst=1, sd=2, protected=False, load_share=0.85, delay_budget_ms=30.0)


@dataclass(frozen=True)
class CellConfig:
    """A 100 MHz / 30 kHz NR cell. `load` is the mean DL PRB utilisation at the archetype's peak hour in
    the `normal` Markov state (the traffic generator scales it over the day); UL utilisation is
    `load * ul_load_ratio`. `mcs_mean` is the mean
    MCS index of the 256-QAM table (TS 38.214 Table 5.1.3.1-2)."""

    prbs: int = 273
    dl_layers: int = 4
    ul_layers: int = 2
    load: float = 0.25
    ul_load_ratio: float = 0.8
    mcs_mean: float = 20.0

    def __post_init__(self) -> None:
        if not 1 <= self.prbs <= 275:
            raise ModelConfigError(f"cell prbs {self.prbs} not in 1..275")
        if not 1 <= self.dl_layers <= 4 or not 1 <= self.ul_layers <= 4:
            raise ModelConfigError("cell layers must be 1..4")
        if not 0 <= self.load <= 4:
            raise ModelConfigError(f"cell load {self.load} not in 0..4")
        if not 0 <= self.ul_load_ratio <= 4:
            raise ModelConfigError(f"cell ul_load_ratio {self.ul_load_ratio} not in 0..4")
        if not 0 <= self.mcs_mean <= 27:
            raise ModelConfigError(f"cell mcs_mean {self.mcs_mean} not in 0..27")


@dataclass(frozen=True)
class SiteConfig:
    """A cell site: one DU GPU (`gpu_sms`, partition step `granularity`) hosting `cells`."""

    site_id: int
    archetype: str = "mixed"
    cells: tuple[CellConfig, ...] = (CellConfig(),) * 4
    slices: tuple[SliceConfig, ...] = (PROTECTED, BEST_EFFORT)
    gpu_sms: int = 132
    granularity: int = 8
    tdd: str = "DDDSU"
    phase_h: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.archetype not in ARCHETYPES:
            raise ModelConfigError(f"site {self.site_id}: archetype {self.archetype!r} not in {ARCHETYPES}")
        if self.tdd not in TDD_PATTERNS:
            raise ModelConfigError(f"site {self.site_id}: tdd {self.tdd!r} not in {TDD_PATTERNS}")
        if not self.cells:
            raise ModelConfigError(f"site {self.site_id}: no cells")
        if self.gpu_sms <= 0 or not 0 < self.granularity <= self.gpu_sms:
            raise ModelConfigError(f"site {self.site_id}: need gpu_sms > 0 and 0 < granularity <= gpu_sms")
        if len(self.slices) != 2 or not self.slices[0].protected or self.slices[1].protected:
            raise ModelConfigError(f"site {self.site_id}: slices must be (protected, best-effort)")
        if abs(sum(s.load_share for s in self.slices) - 1) > 1e-9:
            raise ModelConfigError(f"site {self.site_id}: slice load shares must sum to 1")


@dataclass(frozen=True)
class Scenario:
    """A named load regime. `period_slots` is the report/control period (200 slots = 100 ms);
    `reconfig_s` the partition mechanism's reconfiguration latency (green contexts ~0, MPS ~0.3 s);
    `start_hour` and `day_speedup` place the trace in the day (speedup > 1 compresses the day)."""

    name: str
    description: str
    sites: tuple[SiteConfig, ...]
    period_slots: int = 200
    partition: str = "green-context"
    reconfig_s: float = 0.0
    start_hour: float = 20.0
    day_speedup: float = 1.0
    notes: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.sites:
            raise ModelConfigError(f"scenario {self.name}: no sites")
        n_cells = {len(s.cells) for s in self.sites}
        if len(n_cells) != 1:
            raise ModelConfigError(f"scenario {self.name}: every site must have the same number of cells")
        for s in self.sites:
            if self.period_slots % len(s.tdd):
                raise ModelConfigError(
                    f"scenario {self.name}: period_slots {self.period_slots} not a multiple of TDD {s.tdd}")
        if [s.site_id for s in self.sites] != list(range(len(self.sites))):
            raise ModelConfigError(f"scenario {self.name}: site ids must be 0..n-1 in order")

    @property
    def n_sites(self) -> int:
        return len(self.sites)

    @property
    def n_cells(self) -> int:
        return len(self.sites[0].cells)

    @property
    def period_s(self) -> float:
        return self.period_slots * SLOT_S


def parse_slices(spec: str) -> tuple[SliceConfig, SliceConfig]:
    """`"2:1,1:1"` (SST:SD of the protected slice, then of the best-effort one; `SST` alone for no SD) ->
    the site's two slices, with the load shares and delay budgets of PROTECTED and BEST_EFFORT. The model
    serves exactly these two kinds per site; what is configurable is the S-NSSAI each carries."""
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) != 2:
        raise ModelConfigError(f"slices {spec!r}: expected PROTECTED_SST:SD,BEST_EFFORT_SST:SD")
    out = []
    for part, base in zip(parts, (PROTECTED, BEST_EFFORT), strict=True):
        sst, sep, sd = part.partition(":")
        try:
            out.append(SliceConfig(base.name, int(sst), int(sd, 0) if sep else None, base.protected,
                                   base.load_share, base.delay_budget_ms))
        except ValueError as exc:
            raise ModelConfigError(f"slices {spec!r}: {exc}") from exc
    if (out[0].sst, out[0].sd) == (out[1].sst, out[1].sd):
        raise ModelConfigError(f"slices {spec!r}: the two slices need different S-NSSAIs")
    return out[0], out[1]
