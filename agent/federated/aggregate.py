"""The gNB-side aggregator: buffered asynchronous, sample-weighted FedAvg of UE adapter deltas, one
bounded aggregate per round. Pure: no clock, no I/O; the shell decides when a round closes.

A round r is open until `close()`. Every update offered while it is open joins it with weight
samples x discount^staleness, where staleness = r - (the round whose global the UE trained from): an
update that misses its round's close is admitted into the next one (staleness 1), one older than
`max_staleness` is refused, and a (UE, round) pair is admitted at most once ever, so a late update is
counted exactly once. `close()` returns the weighted mean of the admitted deltas (the FedAvg step), with
the total weight so that the cloud can combine site aggregates into the FedAvg of all their updates
(`combine`), and its wire bytes, at most `max_bytes`: when the dense encoding is larger, the aggregator
ships the top entries that fit and carries the rest into its next aggregate (error feedback), so the
bound never costs the update, only delays part of it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from agent.federated import updates
from agent.federated.updates import Adapter, Compression


class Admission(enum.Enum):
    CURRENT = "current"      # joined the round it was trained for
    LATE = "late"            # missed its round, joined the open one with a discounted weight
    STALE = "stale"          # older than max_staleness: refused
    DUPLICATE = "duplicate"  # this (UE, round) was already admitted or refused: ignored


@dataclass(frozen=True)
class Update:
    ue_id: str
    round: int      # the round whose global adapter the UE started from
    samples: int    # local training samples (the FedAvg weight)
    delta: Adapter  # local adapter minus that global adapter

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"Update {self.ue_id}: samples must be >= 1, got {self.samples}")


@dataclass(frozen=True, kw_only=True)
class AggregatorConfig:
    staleness_discount: float = 0.5
    max_staleness: int = 1
    encoding: str = "fp32"           # of the aggregate (fp32 keeps it exact)
    max_bytes: int | None = None     # bound on the aggregate's wire bytes; None: its dense size

    def __post_init__(self) -> None:
        if not 0.0 < self.staleness_discount <= 1.0:
            raise ValueError(f"AggregatorConfig.staleness_discount must be in (0, 1], got {self.staleness_discount}")
        if self.max_staleness < 0:
            raise ValueError(f"AggregatorConfig.max_staleness must be >= 0, got {self.max_staleness}")
        if self.encoding not in ("fp32", "fp16"):
            raise ValueError(f"AggregatorConfig.encoding must be fp32 or fp16, got {self.encoding!r}")
        if self.max_bytes is not None and self.max_bytes < 1024:
            raise ValueError(f"AggregatorConfig.max_bytes must be >= 1024 (a header and a few entries), "
                             f"got {self.max_bytes}")


@dataclass(frozen=True)
class Aggregate:
    site: str
    round: int
    delta: Adapter                 # what the wire bytes decode to
    weight: float                  # sum of the admitted updates' weights
    samples: int
    included: tuple[tuple[str, int], ...]  # (UE, trained-for round) of every admitted update
    late: tuple[tuple[str, int], ...]      # the subset admitted from an earlier round
    wire: bytes

    @property
    def nbytes(self) -> int:
        return len(self.wire)


@dataclass
class RoundAggregator:
    site: str
    cfg: AggregatorConfig = field(default_factory=AggregatorConfig)
    open_round: int = 0
    _sum: Adapter | None = None
    _weight: float = 0.0
    _samples: int = 0
    _included: list = field(default_factory=list)
    _late: list = field(default_factory=list)
    _seen: set = field(default_factory=set)
    _residual: Adapter | None = None  # what a size-bounded aggregate left out, for the next one

    def offer(self, u: Update) -> Admission:
        key = (u.ue_id, u.round)
        if key in self._seen:
            return Admission.DUPLICATE
        staleness = self.open_round - u.round
        if staleness < 0:
            raise ValueError(f"update of {u.ue_id} for round {u.round} while round {self.open_round} is open")
        self._seen.add(key)
        if staleness > self.cfg.max_staleness:
            return Admission.STALE
        w = u.samples * self.cfg.staleness_discount ** staleness
        if self._sum is None:
            self._sum = {k: v.double() * w for k, v in u.delta.items()}
        else:
            if u.delta.keys() != self._sum.keys():
                raise ValueError(f"update of {u.ue_id}: adapter tensors differ from the round's")
            for k, v in u.delta.items():
                self._sum[k] += v.double() * w
        self._weight += w
        self._samples += u.samples
        self._included.append(key)
        if staleness:
            self._late.append(key)
            return Admission.LATE
        return Admission.CURRENT

    @property
    def pending(self) -> int:
        """Updates admitted into the open round so far."""
        return len(self._included)

    def close(self) -> Aggregate | None:
        """Close the open round: its aggregate (None when nothing was admitted), and open the next."""
        r = self.open_round
        self.open_round += 1
        if self._sum is None:
            return None
        mean = {k: (v / self._weight).float() for k, v in self._sum.items()}
        if self._residual is not None:
            mean = {k: v + self._residual[k] for k, v in mean.items()}
        wire = updates.encode(mean, Compression(self.cfg.encoding))
        if self.cfg.max_bytes is not None and len(wire) > self.cfg.max_bytes:
            wire = _fit(mean, self.cfg.max_bytes)
        sent = updates.decode(wire)
        self._residual = {k: mean[k] - sent[k] for k in mean} if self.cfg.max_bytes is not None else None
        agg = Aggregate(site=self.site, round=r, delta=sent, weight=self._weight, samples=self._samples,
                        included=tuple(self._included), late=tuple(self._late), wire=wire)
        self._sum, self._weight, self._samples = None, 0.0, 0
        self._included, self._late = [], []
        return agg


def _fit(mean: Adapter, max_bytes: int) -> bytes:
    """The largest top-k encoding of `mean` whose bytes fit in `max_bytes` (bisection on the real size)."""
    lo, hi = 0.0, 1.0
    best = updates.encode(mean, Compression("topk", 1e-9))  # one entry per tensor: the smallest form
    if len(best) > max_bytes:
        raise ValueError(f"an aggregate cannot fit in {max_bytes} bytes (smallest form {len(best)})")
    for _ in range(20):
        mid = (lo + hi) / 2
        wire = updates.encode(mean, Compression("topk", max(mid, 1e-9)))
        if len(wire) <= max_bytes:
            best, lo = wire, mid
        else:
            hi = mid
    return best


def combine(aggregates: list[Aggregate]) -> tuple[Adapter, float]:
    """The cloud's step from site aggregates: their weighted mean (weights = each site's total), which
    is the FedAvg of every update the sites admitted. Returns (delta, total weight)."""
    aggs = [a for a in aggregates if a is not None and a.weight > 0]
    if not aggs:
        raise ValueError("no aggregate to combine")
    total = sum(a.weight for a in aggs)
    keys = aggs[0].delta.keys()
    out = {k: sum(a.delta[k].double() * a.weight for a in aggs) / total for k in keys}
    return {k: v.float() for k, v in out.items()}, total
