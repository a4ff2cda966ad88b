"""Seeded per-site compute-budget traces for the training bench: bursty within a site, complementary
across sites (compute-and-training-facts.md §1 row 1, §3.2).

The testbed's RAN model lives in the other venv, so the bench draws its own traces with the same
shape: budget_i(t) = diurnal_i(t) × burst_i(t), where
  - diurnal_i is a raised cosine whose phase is spread evenly over the sites (site i peaks when the
    others are busy: the "day" is compressed to `period_s`);
  - burst_i is a Markov chain over {RAN surge: 0, busy: 0.3, quiet: 1.0} with exponential dwell
    times (mean `dwell_s`), like the low/normal/busy/surge chain of the traffic model.
Values are the share of the site GPU the lease grants, per slot of `slot_s`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LEVELS = (0.0, 0.3, 1.0)
# Row = current level; the chain leaves a level after an exponential dwell, to these odds.
TRANSITIONS = ((0.0, 0.6, 0.4), (0.35, 0.0, 0.65), (0.3, 0.7, 0.0))


@dataclass(frozen=True)
class TraceSpec:
    sites: int = 3
    duration_s: float = 60.0
    slot_s: float = 0.05
    period_s: float = 30.0        # one compressed "day"
    dwell_s: float = 0.8
    floor: float = 0.1            # diurnal trough / peak
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sites < 1 or self.duration_s <= 0 or self.slot_s <= 0 or self.period_s <= 0 or self.dwell_s <= 0:
            raise ValueError(f"TraceSpec needs positive sizes, got {self}")
        if not 0.0 <= self.floor <= 1.0:
            raise ValueError(f"TraceSpec.floor must be in [0, 1], got {self.floor}")


def budget_traces(spec: TraceSpec) -> torch.Tensor:
    """(sites, slots) float64 tensor of budget shares in [0, 1]."""
    g = torch.Generator().manual_seed(spec.seed)
    n = math.ceil(spec.duration_s / spec.slot_s)
    t = torch.arange(n, dtype=torch.float64) * spec.slot_s
    out = torch.empty(spec.sites, n, dtype=torch.float64)
    for i in range(spec.sites):
        phase = 2 * math.pi * i / spec.sites
        diurnal = spec.floor + (1 - spec.floor) * 0.5 * (1 + torch.cos(2 * math.pi * t / spec.period_s - phase))
        burst = torch.empty(n, dtype=torch.float64)
        state = int(torch.randint(len(LEVELS), (1,), generator=g))
        k = 0
        while k < n:
            dwell = -spec.dwell_s * math.log(1.0 - float(torch.rand(1, generator=g)))
            m = max(1, round(dwell / spec.slot_s))
            burst[k:k + m] = LEVELS[state]
            k += m
            state = int(torch.multinomial(torch.tensor(TRANSITIONS[state]), 1, generator=g))
        out[i] = diurnal * burst
    return out


class Capacity:
    """Integrals of a budget trace: how much full-GPU time a site gets between two instants."""

    def __init__(self, traces: torch.Tensor, slot_s: float):
        self.slot_s = slot_s
        self.traces = traces
        zero = torch.zeros(traces.shape[0], 1, dtype=torch.float64)
        self.cum = torch.cat([zero, torch.cumsum(traces, dim=1) * slot_s], dim=1)   # cum[i, k] = ∫_0^{k·slot}
        self.end_s = traces.shape[1] * slot_s

    def integral(self, site: int, t: float) -> float:
        """∫_0^t budget_i."""
        t = min(max(t, 0.0), self.end_s)
        k = min(int(t / self.slot_s), self.traces.shape[1] - 1)
        return float(self.cum[site, k]) + float(self.traces[site, k]) * (t - k * self.slot_s)

    def work(self, site: int, t0: float, t1: float) -> float:
        return self.integral(site, t1) - self.integral(site, t0)

    def finish(self, site: int, t0: float, work: float) -> float:
        """Earliest t with ∫_{t0}^t budget_i = work (inf when the trace ends first)."""
        target = self.integral(site, t0) + work
        row = self.cum[site]
        if target > float(row[-1]) + 1e-12:
            return math.inf
        k = int(torch.searchsorted(row, torch.tensor([target], dtype=torch.float64))) - 1
        k = max(k, int(t0 / self.slot_s))
        while k < self.traces.shape[1]:
            rate = float(self.traces[site, k])
            start = max(t0, k * self.slot_s)
            have = self.integral(site, start)
            end = (k + 1) * self.slot_s
            if rate > 0 and have + rate * (end - start) >= target - 1e-12:
                return start + (target - have) / rate
            k += 1
        return math.inf
