"""What the weaver policy's inputs rest on, per site and period: measured KPM, or an estimate.

A compute-aware node (the testbed's, or any DU whose MAC defers best-effort work under a GPU envelope)
offers, beside the 3GPP counters, the vendor measurements in `POLICY_INPUTS`: the demand it would have
run without the envelope (`GPU.SmOffered.Mean` / `.Max`), the part it cannot defer
(`GPU.SmNonDeferrable.Max`), the delay deferral added to best-effort (`GPU.BeAddedDelay.Max`) and the
best-effort bytes still deferred (`GPU.BeDeferredBytes`). The xApp asks for them only when the node's
RAN function definition lists them (xapp.app kpm_measurements). A stock srsRAN/OAI gNB offers none, and
the inputs fall back to an estimate from standard counters (docs/contracts.md, "Policy inputs"):

- offered mean / max = the site's demand estimate (GPU.SmUsed.* when reported, else the PRB cost model
  xapp.estimate learns): without a compute-aware stage nothing is deferred, so what ran is what was offered;
- non-deferrable max = the cost model's peak for the protected slices' PRBs (their RRU.PrbUsedDl S-NSSAI
  counters; UL PRBs taken in the protected share of DL), at most the estimated peak, when the site's
  nodes bound best-effort (envelope or quota) and the model has `min_samples` periods; otherwise the
  estimated peak itself (nothing can be deferred, so everything counts as non-deferrable: RAN first);
- best-effort delay and backlog: no standard counter carries them, so they stay None and the policy's
  backlog guard does not run (nothing deferred them).

A field is `measured` when every node of the site reported it this period (several nodes on one site add
up; delays take the max). Pure: no I/O.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from xapp.estimate import PRB_DL, PRB_UL, CostModel, DemandEstimate
from xapp.ingest import KpmSample

OFFERED_MEAN, OFFERED_MAX = "GPU.SmOffered.Mean", "GPU.SmOffered.Max"
NONDEFERRABLE_MAX = "GPU.SmNonDeferrable.Max"
BE_DELAY, BE_DEFERRED = "GPU.BeAddedDelay.Max", "GPU.BeDeferredBytes"
POLICY_INPUTS = (OFFERED_MEAN, OFFERED_MAX, NONDEFERRABLE_MAX, BE_DELAY, BE_DEFERRED)

# SiteObservation field <- KPM name, and how several nodes of one site combine
_FIELDS = (("offered_mean", OFFERED_MEAN, sum), ("offered_max", OFFERED_MAX, sum),
           ("nondeferrable_max", NONDEFERRABLE_MAX, sum), ("be_delay_ms", BE_DELAY, max),
           ("be_deferred_bytes", BE_DEFERRED, sum))
FIELDS = tuple(f for f, _, _ in _FIELDS)

MEASURED, ESTIMATED, ABSENT = "measured", "estimated", "absent"


@dataclass(frozen=True)
class PolicyInputs:
    """The SiteObservation fields beyond demand, and where each came from.

    `basis`: `measured` (offered and non-deferrable demand from the node's KPM), `estimated` (from
    standard counters through the demand estimate / cost model), `none` (no estimate: no decision)."""

    offered_mean: float | None = None
    offered_max: float | None = None
    nondeferrable_max: float | None = None
    be_delay_ms: float | None = None
    be_deferred_bytes: float | None = None
    sources: tuple[tuple[str, str], ...] = ()      # (field, measured | estimated | absent)
    basis: str = "none"
    demand_source: str = "none"                    # the estimate's: gpu | model | none

    def source(self, name: str) -> str:
        return dict(self.sources).get(name, ABSENT)

    def as_dict(self) -> dict:
        return {"basis": self.basis, "demand": self.demand_source, "inputs": dict(self.sources),
                "values": {f: getattr(self, f) for f in FIELDS}}


NO_INPUTS = PolicyInputs(sources=tuple((f, ABSENT) for f in FIELDS))


def policy_inputs(samples: Sequence[KpmSample], est: DemandEstimate, model: CostModel | None, *,
                  protected_keys: Iterable[str] = (), defers: bool = False, quantile: float = 0.999,
                  min_samples: int = 20) -> PolicyInputs:
    """The inputs of one site's period from its nodes' latest samples (module doc)."""
    if est.mean is None or not samples:
        return PolicyInputs(sources=NO_INPUTS.sources, demand_source=est.source)
    values: dict[str, float | None] = {}
    sources: dict[str, str] = {}
    for name, key, combine in _FIELDS:
        got = [s.values[key] for s in samples if key in s.values]
        if len(got) == len(samples):
            values[name], sources[name] = float(combine(got)), MEASURED
    if "offered_mean" not in values:
        values["offered_mean"], sources["offered_mean"] = est.mean, ESTIMATED
    if "offered_max" not in values and est.peak is not None:
        values["offered_max"], sources["offered_max"] = est.peak, ESTIMATED
    if "nondeferrable_max" not in values and est.peak is not None:
        values["nondeferrable_max"] = _nondeferrable(samples, est, model, tuple(protected_keys), defers,
                                                     quantile, min_samples)
        sources["nondeferrable_max"] = ESTIMATED
    for name in FIELDS:
        sources.setdefault(name, ABSENT)
    core = (sources["offered_mean"], sources["offered_max"], sources["nondeferrable_max"])
    basis = MEASURED if all(s == MEASURED for s in core) else ESTIMATED
    return PolicyInputs(**{f: values.get(f) for f in FIELDS}, sources=tuple(sources.items()), basis=basis,
                        demand_source=est.source)


def _nondeferrable(samples: Sequence[KpmSample], est: DemandEstimate, model: CostModel | None,
                   protected_keys: tuple[str, ...], defers: bool, quantile: float, min_samples: int) -> float:
    peak = float(est.peak)
    if not defers or not protected_keys or model is None or model.n < min_samples:
        return peak
    dl = sum(s.values.get(PRB_DL, 0.0) for s in samples)
    ul = sum(s.values.get(PRB_UL, 0.0) for s in samples)
    prot = sum(s.values.get(k, 0.0) for s in samples for k in protected_keys)
    if dl <= 0:
        return peak
    share = min(1.0, prot / dl)
    _, prot_peak = model.predict(prot, ul * share, quantile)
    return min(peak, prot_peak)
