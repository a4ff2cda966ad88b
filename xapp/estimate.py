"""RAN SM demand per site and period, from what the nodes report.

Preference (architecture.md, Estimate): the node's own GPU measurements (`GPU.SmUsed.Mean` / `.Max`)
when it reports them; otherwise PRB usage mapped through a PHY cost model the estimator learns online
from the periods where both were known. The model predicts the mean with a least-squares fit
SMs ~ a + b*PRB_dl + c*PRB_ul, and the peak as mean times a *high quantile* (not the mean) of the
observed max/mean ratios: one slot over the envelope is a deadline miss, so averages would lie.

Several nodes on one site share the GPU: their PRB counters add up; so do their GPU measurements (each
node reports the demand of its own PHY). Pure numpy, no I/O.

A valid but extreme sample (a peak of the whole GPU) is kept: the RAN really may peak, and the grant must
follow. It is forgotten by age, never by value: every window here holds the last `window` periods
(`QuantileWindow`), and the policy's history is as long (xapp.policy SiteHistory), so one such frame
lowers a site's grant for at most `window` periods plus the envelope's step-down (one partition step per
`hold_periods` calm periods); tests/security/test_kpm_validation.py checks the grant comes back.
"""
from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from xapp.ingest import KpmSample

GPU_MEAN, GPU_MAX, GPU_MISS = "GPU.SmUsed.Mean", "GPU.SmUsed.Max", "GPU.DeadlineMiss"
PRB_DL, PRB_UL, AVAIL_DL = "RRU.PrbUsedDl", "RRU.PrbUsedUl", "RRU.PrbAvailDl"


@dataclass(frozen=True, kw_only=True)
class DemandEstimate:
    site_id: str
    mean: float | None          # SMs per slot, this period (None = nothing known)
    peak: float | None          # highest per-slot SMs this period (measured or predicted)
    peak_q: float | None        # high quantile of recent per-period peaks (the estimator's forecast)
    source: str                 # "gpu" | "model" | "none"
    prb_dl: float = 0.0
    prb_util: float | None = None   # PRB used / available, DL
    misses: int = 0             # deadline misses the nodes reported this period


class QuantileWindow:
    """The last `maxlen` values and their high quantile in O(log n + n memmove) per update; np.quantile on
    a deque costs ~0.4 ms a call, which was most of the per-indication budget."""

    def __init__(self, maxlen: int) -> None:
        self.order: deque[float] = deque()
        self.sorted: list[float] = []
        self.maxlen = maxlen

    def append(self, v: float) -> None:
        # A NaN is unordered: bisect would file it anywhere and the later removal would delete the wrong
        # value (or none: IndexError). Ingest refuses non-finite KPM; this keeps the window whole anyway.
        if not math.isfinite(v):
            return
        self.order.append(v)
        bisect.insort(self.sorted, v)
        if len(self.order) > self.maxlen:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def extend(self, values: Iterable[float]) -> None:
        for v in values:
            self.append(v)

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self):
        return iter(self.order)

    def quantile(self, q: float) -> float:
        """Nearest-rank (rounded up, so never below the true quantile of the window)."""
        n = len(self.sorted)
        return self.sorted[min(n - 1, max(0, math.ceil(q * n) - 1))]


class CostModel:
    """Online ridge regression of the measured mean SMs on PRB usage, plus max/mean ratios."""

    def __init__(self, ridge: float = 1e-3, window: int = 600) -> None:
        self.xtx = np.eye(3) * ridge
        self.xty = np.zeros(3)
        self.n = 0
        self.ratios = QuantileWindow(window)

    def update(self, prb_dl: float, prb_ul: float, mean: float, peak: float | None) -> None:
        x = np.array([1.0, prb_dl, prb_ul])
        self.xtx += np.outer(x, x)
        self.xty += x * mean
        self.n += 1
        if peak is not None and mean > 0:
            self.ratios.append(peak / mean)

    def coef(self) -> np.ndarray:
        return np.linalg.solve(self.xtx, self.xty)

    def predict(self, prb_dl: float, prb_ul: float, quantile: float) -> tuple[float, float]:
        mean = max(0.0, float(self.coef() @ np.array([1.0, prb_dl, prb_ul])))
        ratio = self.ratios.quantile(quantile) if len(self.ratios) else 2.0
        return mean, mean * max(1.0, ratio)

    def to_dict(self) -> dict[str, Any]:
        return {"xtx": self.xtx.ravel().tolist(), "xty": self.xty.tolist(), "n": self.n,
                "ratios": list(self.ratios)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], window: int = 600) -> CostModel:
        m = cls(window=window)
        m.xtx = np.asarray(d["xtx"], float).reshape(3, 3)
        m.xty = np.asarray(d["xty"], float)
        m.n = int(d["n"])
        m.ratios.extend(float(r) for r in d.get("ratios", ()))
        return m


class SiteEstimator:
    """One per site. `estimate(samples)` takes the site's freshest sample per node for this period."""

    def __init__(self, site_id: str, quantile: float = 0.999, window: int = 600, min_samples: int = 20,
                 model: CostModel | None = None) -> None:
        self.site_id = site_id
        self.quantile = quantile
        self.min_samples = min_samples
        self.model = model or CostModel(window=window)
        self.peaks = QuantileWindow(window)

    def estimate(self, samples: Iterable[KpmSample]) -> DemandEstimate:
        samples = list(samples)
        if not samples:
            return DemandEstimate(site_id=self.site_id, mean=None, peak=None, peak_q=self._peak_q(), source="none")
        tot: dict[str, float] = {}
        gpu_nodes = 0
        for s in samples:
            for k, v in s.values.items():
                tot[k] = tot.get(k, 0.0) + v
            gpu_nodes += GPU_MEAN in s.values
        prb_dl, prb_ul = tot.get(PRB_DL, 0.0), tot.get(PRB_UL, 0.0)
        util = prb_dl / tot[AVAIL_DL] if tot.get(AVAIL_DL) else None
        misses = int(tot.get(GPU_MISS, 0))
        if gpu_nodes == len(samples):
            mean, peak = tot[GPU_MEAN], tot.get(GPU_MAX)
            if PRB_DL in tot:
                self.model.update(prb_dl, prb_ul, mean, peak)
            peak = peak if peak is not None else mean
            source = "gpu"
        elif self.model.n >= self.min_samples and PRB_DL in tot:
            mean, peak = self.model.predict(prb_dl, prb_ul, self.quantile)
            source = "model"
        else:
            return DemandEstimate(site_id=self.site_id, mean=None, peak=None, peak_q=self._peak_q(), source="none",
                                  prb_dl=prb_dl, prb_util=util, misses=misses)
        self.peaks.append(peak)
        return DemandEstimate(site_id=self.site_id, mean=mean, peak=peak, peak_q=self._peak_q(), source=source,
                              prb_dl=prb_dl, prb_util=util, misses=misses)

    def _peak_q(self) -> float | None:
        if not len(self.peaks):
            return None
        return self.peaks.quantile(self.quantile)
