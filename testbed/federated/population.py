"""The UEs taking part in federated fine-tuning: per cell a fixed set, each with a device class (how
long one local training step takes on it), a channel offset (its uplink MCS against the cell's mean) and,
per round, draws of whether it is available, its compute time and whether a mobility event (handover
or a radio link failure and re-establishment) interrupts its uplink for a while.

Device classes and their step times are assumptions of this testbed (no public per-phone figures for a
LoRA step of this model exist): a flagship NPU, a mid-range SoC and a low-end one, about 1 : 2.5 : 5.
Everything is drawn from the run's seed (one generator per round, spawned from a root SeedSequence).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEVICE_CLASSES = ("flagship", "midrange", "low-end")


@dataclass(frozen=True, kw_only=True)
class PopulationConfig:
    n_sites: int = 3
    n_cells: int = 4
    ues_per_cell: int = 32
    class_mix: tuple[float, float, float] = (0.3, 0.5, 0.2)
    step_s: tuple[float, float, float] = (0.3, 0.75, 1.5)   # one local step per class (seconds)
    compute_sigma: float = 0.25       # lognormal jitter of a round's compute time (thermal, other apps)
    mcs_offset_sd: float = 4.0        # UE uplink MCS around the cell's mean (cell edge vs cell centre)
    availability: float = 0.9         # chance that an idle UE takes part in a round (charging, on Wi-Fi...)
    mobility_share: float = 0.15      # chance that a mobility event interrupts a UE's uplink in a round
    outage_s: tuple[float, float] = (0.5, 4.0)  # how long such an interruption lasts (uniform)

    def __post_init__(self) -> None:
        if min(self.n_sites, self.n_cells, self.ues_per_cell) < 1:
            raise ValueError("PopulationConfig: n_sites, n_cells and ues_per_cell must be >= 1")
        if abs(sum(self.class_mix) - 1) > 1e-9 or min(self.class_mix) < 0:
            raise ValueError(f"PopulationConfig.class_mix must be shares summing to 1, got {self.class_mix}")
        if min(self.step_s) <= 0:
            raise ValueError(f"PopulationConfig.step_s must be > 0, got {self.step_s}")
        for name in ("availability", "mobility_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"PopulationConfig.{name} must be in [0, 1]")
        if not 0 <= self.outage_s[0] <= self.outage_s[1]:
            raise ValueError(f"PopulationConfig.outage_s must be (lo, hi) with 0 <= lo <= hi, got {self.outage_s}")

    @property
    def n_ues(self) -> int:
        return self.n_sites * self.n_cells * self.ues_per_cell


@dataclass(frozen=True)
class Population:
    """Arrays over UEs (M,), UE i in cell `cell[i]` (flat: site * n_cells + c) of site `site[i]`."""

    cfg: PopulationConfig
    site: np.ndarray
    cell: np.ndarray
    device: np.ndarray      # index into DEVICE_CLASSES
    mcs_offset: np.ndarray  # MCS steps against the cell's mean

    @classmethod
    def build(cls, cfg: PopulationConfig, seed: int) -> Population:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 18]))
        M = cfg.n_ues
        cell = np.repeat(np.arange(cfg.n_sites * cfg.n_cells), cfg.ues_per_cell)
        return cls(cfg=cfg, site=cell // cfg.n_cells, cell=cell,
                   device=rng.choice(len(DEVICE_CLASSES), size=M, p=np.asarray(cfg.class_mix)),
                   mcs_offset=np.rint(rng.normal(0.0, cfg.mcs_offset_sd, size=M)).astype(int))

    def ue_id(self, i: int) -> str:
        c = self.cfg
        return f"s{self.site[i]}c{self.cell[i] % c.n_cells}u{i % c.ues_per_cell:02d}"

    def round_draws(self, seed: int, rnd: int, local_steps: int, round_s: float) -> RoundDraws:
        """What round `rnd` brings each UE: availability, compute time, a mobility outage (start, end)
        relative to the round's start (NaN where none)."""
        c = self.cfg
        rng = np.random.default_rng(np.random.SeedSequence([seed, 18, rnd]))
        M = len(self.site)
        available = rng.random(M) < c.availability
        jitter = np.exp(rng.normal(-c.compute_sigma ** 2 / 2, c.compute_sigma, size=M))
        compute = local_steps * np.asarray(c.step_s)[self.device] * jitter
        moving = rng.random(M) < c.mobility_share
        start = rng.uniform(0.0, round_s, size=M)
        length = rng.uniform(*c.outage_s, size=M)
        out0 = np.where(moving, start, np.nan)
        return RoundDraws(available=available, compute_s=compute, outage_start_s=out0,
                          outage_end_s=np.where(moving, start + length, np.nan))


@dataclass(frozen=True)
class RoundDraws:
    available: np.ndarray
    compute_s: np.ndarray
    outage_start_s: np.ndarray
    outage_end_s: np.ndarray
