"""Grant policies: how much of a site's GPU to lease to training each period, and how to shape the RAN.

Pure and deterministic: numpy only, no I/O, no clock (time arrives in `SiteObservation.now`). The same
objects run in the xApp's control loop and in `weaver bench policies`.

    decision = policy.decide(obs, history)   # SiteObservation, SiteHistory -> SiteDecision
    history.record(obs, decision)            # the caller keeps one SiteHistory per site

Policies (architecture.md, Policy; compute-and-training-facts.md section 4.2):
- `static`   reserve a fixed RAN share (tuned on a calibration trace to the miss target); grant the rest.
- `reactive` no shaping; grant what the last period left free (its max demand) minus a margin.
- `weaver`   shape, then grant. Choose the site envelope E (in partition steps down from the GPU's top)
             from the tail of the demand the RAN cannot defer (fixed costs + protected slice) and the
             best-effort work that must still drain inside its delay budget; never a sum of per-cell worst
             cases. Grant C - E - guard, rounded down to the granularity. E rises at once and, after its
             first WARMUP_PERIODS, falls only after `hold_periods` calm periods (hysteresis: fewer controls,
             fewer repartitions).
             Actuation `envelope`: the node's compute-aware MAC keeps demand <= E slot by slot.
             Actuation `quota`: per-cell best-effort PRB caps (RC Style 2 Action 6) sized so that the site
             demand stays <= E even when every cell fills its cap in the same slot.
- `oracle`   (benchmarks) knows the next lease's peak demand, no shaping: grant C - peak.
The knob each baseline is tuned with is a constructor argument: `reserve_sms`, `margin_sms`, `guard_sms`.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

CAP_HYSTERESIS_PCT = 5  # loosen PRB caps only by at least this many points (fewer RC controls)
SLOT_S = 0.0005         # one NR slot at 30 kHz SCS: the unit the reliability target counts in
WARMUP_PERIODS = 10     # per-period maxima needed before their spread is trusted (warmup_margin)


class PolicyError(ValueError):
    """A policy was misconfigured or fed an observation it cannot use."""


@dataclass(frozen=True)
class SiteObservation:
    """What the xApp knows about one site at the end of a period (from KPM; None = not reported).

    Demand figures are SMs per slot over the period: `demand_*` is what the GPU ran (GPU.SmUsed.Mean/Max),
    `offered_*` what the RAN would have run without the envelope, `nondeferrable_max` the fixed + protected
    part (a compute-aware node reports these two; otherwise they are None). `be_delay_ms` is the delay the
    envelope added to best-effort traffic (oldest deferred work served), `be_deferred_bytes` what is still
    waiting in the node's compute-aware stage at period end. `be_prb_per_cell` is the
    best-effort slice's mean PRBs per slot per cell, for quota sizing. `oracle_next_max` is only filled by
    benchmarks for the oracle."""

    site_id: int | str
    now: float
    gpu_sms: int
    granularity: int
    period_s: float
    demand_mean: float | None
    demand_max: float | None
    prb_util: tuple[float, ...] = ()
    fresh: bool = True
    offered_mean: float | None = None
    offered_max: float | None = None
    nondeferrable_max: float | None = None
    be_delay_ms: float | None = None
    be_delay_budget_ms: float = 30.0
    be_deferred_bytes: float | None = None
    be_prb_per_cell: tuple[float, ...] = ()
    n_cells: int = 1
    oracle_next_max: float | None = None


@dataclass(frozen=True)
class CellCap:
    """Best-effort PRB quota for one cell (percent of its PRBs; RC max ratio); protected slice untouched."""

    cell: int
    be_max_ratio: int


@dataclass(frozen=True)
class SiteDecision:
    """`envelope_sms` None = no envelope control; `caps` empty = no quota control (uncapped).
    `sized_for_sms` is the site demand bound the decision was sized for (E in both weaver modes; the
    reservation for static), for logs and dashboards."""

    envelope_sms: int | None
    grant_sms: int
    caps: tuple[CellCap, ...] = ()
    reason: str = ""
    sized_for_sms: int | None = None
    wanted_sms: int | None = None  # what E would be without hysteresis (weaver), for the hold count


_SERIES = ("demand_mean", "demand_max", "offered_mean", "offered_max", "nondeferrable_max", "be_delay_ms")


@dataclass
class SiteHistory:
    """The policy's memory for one site: recent observations and decisions (bounded), plus the numeric
    fields policies read as ready-made float series (None kept as NaN) so that a decision costs O(window)
    in C, not in Python."""

    maxlen: int = 600
    observations: deque = field(default_factory=deque)
    decisions: deque = field(default_factory=deque)
    _series: dict = field(default_factory=dict, repr=False)

    def record(self, obs: SiteObservation, decision: SiteDecision) -> None:
        self.observations.append(obs)
        self.decisions.append(decision)
        for name in _SERIES:
            q = self._series.setdefault(name, deque(maxlen=self.maxlen))
            v = getattr(obs, name)
            q.append(np.nan if v is None else float(v))
        while len(self.observations) > self.maxlen:
            self.observations.popleft()
            self.decisions.popleft()

    @property
    def last(self) -> SiteDecision | None:
        return self.decisions[-1] if self.decisions else None

    def series(self, name: str, n: int | None = None) -> np.ndarray:
        """Recent values of one observation field (None dropped), oldest first."""
        if name in _SERIES:
            q = self._series.get(name, ())
            x = np.fromiter(q, dtype=float, count=len(q))
            if n:
                x = x[-n:]
            return x[~np.isnan(x)]
        obs = list(self.observations)[-n:] if n else self.observations
        return np.array([v for o in obs if (v := getattr(o, name)) is not None], dtype=float)


def _quantile(x, q: float) -> float:
    """Nearest-rank-above quantile of a small sample (np.quantile's overhead dominates at this size)."""
    s = sorted(x)
    return float(s[min(len(s) - 1, int(math.ceil(q * (len(s) - 1))))])


class Policy(Protocol):
    name: str

    def decide(self, obs: SiteObservation, history: SiteHistory) -> SiteDecision: ...


def floor_to(x: float, step: int) -> int:
    return int(step * math.floor(max(x, 0.0) / step + 1e-9))


def ceil_to(x: float, step: int) -> int:
    return int(step * math.ceil(max(x, 0.0) / step - 1e-9))


def envelope_grid(x: float, gpu_sms: int, step: int) -> int:
    """The smallest envelope >= x that leaves the grant a whole number of partition steps: E = GPU - k steps.
    Leases are cut in steps from the top of the GPU (C - E - guard, floored to the step), so an E on the
    multiples of the step from 0 wastes C mod step SMs in every period (4 of 132 on a GH200 with 8-SM
    steps: measured in every site-period of `weaver bench policies` scale)."""
    if x >= gpu_sms:
        return gpu_sms
    return gpu_sms - floor_to(gpu_sms - x, step)


def warmup_margin(tail: np.ndarray, slots_seen: float, target: float, step: int) -> float:
    """SMs between the max of a window of per-period maxima and the (1 - target) per-slot quantile, while
    the window holds fewer than 1/target slots (0 once it holds enough; one whole step while it holds
    fewer than WARMUP_PERIODS periods, too few to tell their spread).

    Block maxima: a period's max M over N slots has a Gumbel tail, P(M > x) ~ exp(-(x - mu) / beta), and a
    slot exceeds x with probability ~ P(M > x) / N; the target asks P(M > x) <= target * N, i.e.
    x = mu + beta ln(1 / (target N)), while the max of n periods lies near mu + beta ln(n). The gap is
    beta ln(1 / (target n N)), with beta = std(M) sqrt(6) / pi (the moment estimate). Capped at one step,
    the margin the policy used before it estimated any: a stable non-deferrable load (0.3 SMs of spread in
    `scale`) no longer pays a whole step for a short window, an erratic one still does."""
    if slots_seen * target >= 1:
        return 0.0
    if len(tail) < WARMUP_PERIODS:
        return float(step)
    beta = float(np.std(tail, ddof=1)) * math.sqrt(6.0) / math.pi
    return min(float(step), beta * math.log(1.0 / (slots_seen * target)))


def _no_info(obs: SiteObservation, envelope: int | None = None) -> SiteDecision:
    # RAN first: a grant never outlives the information it was based on.
    return SiteDecision(envelope_sms=envelope, grant_sms=0, reason="no fresh measurement: grant revoked")


@dataclass(frozen=True)
class StaticPolicy:
    """Reserve `reserve_sms` for the RAN for ever (sized from a calibration trace); grant the rest."""

    reserve_sms: int
    name: str = "static"

    def decide(self, obs: SiteObservation, history: SiteHistory) -> SiteDecision:
        reserve = ceil_to(self.reserve_sms, obs.granularity)
        return SiteDecision(None, floor_to(obs.gpu_sms - reserve, obs.granularity),
                            reason=f"static reservation {reserve} SMs", sized_for_sms=reserve)

    @staticmethod
    def reservation_for(demand: np.ndarray, granularity: int, target: float) -> int:
        """Smallest reservation (a multiple of the granularity) whose per-slot exceedance on a calibration
        trace of per-slot demand is <= target."""
        d = np.sort(np.asarray(demand, dtype=float).ravel())
        allowed = int(math.floor(target * len(d)))
        level = d[len(d) - 1 - allowed] if allowed < len(d) else 0.0
        return ceil_to(level, granularity)


@dataclass(frozen=True)
class ReactivePolicy:
    """Grant what the last period left free above its peak, minus `margin_sms`; no shaping."""

    margin_sms: int = 16
    name: str = "reactive"

    def decide(self, obs: SiteObservation, history: SiteHistory) -> SiteDecision:
        if not obs.fresh or obs.demand_max is None:
            return _no_info(obs)
        grant = floor_to(obs.gpu_sms - obs.demand_max - self.margin_sms, obs.granularity)
        return SiteDecision(None, grant, reason=f"last peak {obs.demand_max:.1f} + margin {self.margin_sms}")


@dataclass(frozen=True)
class OraclePolicy:
    """Knows the next lease's peak (benchmarks fill `oracle_next_max`); grants everything above it."""

    name: str = "oracle"

    def decide(self, obs: SiteObservation, history: SiteHistory) -> SiteDecision:
        if obs.oracle_next_max is None:
            raise PolicyError("oracle needs obs.oracle_next_max (benchmarks only)")
        return SiteDecision(None, floor_to(obs.gpu_sms - obs.oracle_next_max, obs.granularity),
                            reason=f"next peak {obs.oracle_next_max:.1f}")


@dataclass(frozen=True)
class QuotaCost:
    """What quota sizing needs from the PHY cost model: SMs one best-effort PRB adds at worst (highest
    MCS and layers) in a DL slot and, through UL decode spill, in the slots after a U slot."""

    dl_sms_per_prb: float = 0.0
    ul_sms_per_prb: float = 0.0
    cell_prbs: int = 273


@dataclass(frozen=True)
class WeaverPolicy:
    """Shape, then grant (module doc). `target` is the per-slot miss probability the envelope must meet.

    E = max(E_tail, E_drain), rounded up onto the grid of the grant (`envelope_grid`):
    - E_tail covers the non-deferrable demand: the highest per-period `nondeferrable_max` over the
      window (a window of >= 1/target slots makes "the max" the empirical (1 - target) quantile of
      per-slot demand), plus, while the window is shorter than that, the gap between its max and that
      quantile (`warmup_margin`: extrapolated from the spread of the per-period maxima, at most one step);
    - E_drain lets best-effort drain: the window's high quantile of per-period mean offered demand over
      `drain_utilisation`, raised by a step at once when the added best-effort delay passes half its
      budget.
    Without the node's offered/non-deferrable measurements (a plain node) it falls back to the
    measured `demand_max`, i.e. it degrades to sizing on observed peaks."""

    mode: str = "envelope"
    guard_sms: int = 8
    target: float = 1e-5
    window_periods: int = 600
    hold_periods: int = 50
    # E_drain's share of E that mean offered demand may fill. 0.8 measured worse in `weaver bench policies`
    # heavy-small-gpu (mean offered 24-25.6 of 32 SMs): a load surge there blew the best-effort budget
    # within one period, and each blow-up cost ~100 periods of no grant while E stepped back down.
    drain_utilisation: float = 0.75
    cost: QuotaCost = QuotaCost()
    name: str = "weaver"

    def __post_init__(self) -> None:
        if self.mode not in ("envelope", "quota"):
            raise PolicyError(f"weaver mode must be envelope or quota, got {self.mode!r}")
        if self.mode == "quota" and self.cost.dl_sms_per_prb + self.cost.ul_sms_per_prb <= 0:
            raise PolicyError("weaver quota mode needs a QuotaCost (SMs per best-effort PRB)")
        if self.guard_sms < 0 or not 0 < self.target < 1:
            raise PolicyError("guard_sms must be >= 0 and target in (0, 1)")

    def envelope_for(self, obs: SiteObservation, history: SiteHistory) -> tuple[int, int, str]:
        """(E to use, E wanted before hysteresis, why)."""
        g = obs.granularity
        tail = history.series("nondeferrable_max", self.window_periods)
        if obs.nondeferrable_max is not None:
            tail = np.append(tail, obs.nondeferrable_max)
        if not len(tail):
            tail = np.append(history.series("demand_max", self.window_periods), obs.demand_max)
        slots_seen = len(tail) * obs.period_s / SLOT_S
        e_tail = float(tail.max()) + warmup_margin(tail, slots_seen, self.target, g)
        mean = history.series("offered_mean", self.window_periods)
        if obs.offered_mean is not None:
            mean = np.append(mean, obs.offered_mean)
        if not len(mean):
            mean = np.append(history.series("demand_mean", self.window_periods), obs.demand_mean or 0.0)
        recent = mean[-max(1, int(round(1.0 / obs.period_s))):]  # last second: follows Markov surges
        e_drain = _quantile(recent, 0.99) / self.drain_utilisation
        want = envelope_grid(max(e_tail, e_drain), obs.gpu_sms, g)
        why = f"tail {e_tail:.1f} drain {e_drain:.1f}"
        last = history.last
        prev = last.sized_for_sms if last is not None else None
        if prev is not None:
            want, why = self._backlog_guard(obs, history, prev, want, why)
        # While a growing window is too short to estimate its spread the envelope is a placeholder (a
        # whole step of margin): hysteresis, which keeps E from chasing load swings, starts after it.
        warming = len(tail) <= WARMUP_PERIODS < self.window_periods
        if prev is not None and want < prev and not warming:
            calm = 1  # this period, plus the trailing run of periods that also wanted less than prev
            for d in reversed(history.decisions):
                if d.sized_for_sms != prev or d.wanted_sms is None or d.wanted_sms >= prev:
                    break
                calm += 1
            if calm < self.hold_periods:
                return prev, want, why + f"; hold {prev} ({calm}/{self.hold_periods} calm)"
            return prev - g, want, why + "; one step down"  # one partition step at a time
        return min(want, obs.gpu_sms), want, why

    def _backlog_guard(self, obs: SiteObservation, history: SiteHistory, prev: int, want: int,
                       why: str) -> tuple[int, str]:
        """Defer best-effort work only while its queue drains inside the delay budget.

        The added delay past half the budget raises E one step a period. And while the deferred bytes are
        still growing with the delay past a quarter of the budget, E is not lowered even if the offered
        load looks calm: a lower E would defer more work into a backlog that is not draining (the reported
        delay, the age of the oldest deferred work *served*, lags that backlog by up to its own value).
        Not done (measured worse in `weaver bench policies`, gh200-multicell -2 to -7 % usable spare, no
        gain elsewhere): stopping deferral at once on a projected or blown budget, since E then comes
        down one step per `hold_periods`."""
        d = obs.be_delay_ms
        if d is None:
            return want, why
        budget = obs.be_delay_budget_ms
        if d > 0.5 * budget:
            return max(want, prev + obs.granularity), why + f"; BE delay {d:.1f} ms > half budget"
        queued = history.observations[-1].be_deferred_bytes if history.observations else None
        growing = obs.be_deferred_bytes is not None and queued is not None and obs.be_deferred_bytes > queued > 0
        if growing and d > 0.25 * budget:
            return max(want, prev), why + f"; BE backlog growing ({d:.1f} ms): hold"
        return want, why

    def decide(self, obs: SiteObservation, history: SiteHistory) -> SiteDecision:
        if not obs.fresh or obs.demand_max is None:
            return _no_info(obs, envelope=None)
        env, wanted, why = self.envelope_for(obs, history)
        if self.mode == "quota":
            caps, env = self._caps(obs, history, env)
            last = history.last
            if (last is not None and last.caps and last.sized_for_sms == env and len(last.caps) == len(caps)
                    and all(0 <= new.be_max_ratio - old.be_max_ratio < CAP_HYSTERESIS_PCT
                            for old, new in zip(last.caps, caps, strict=True))):
                caps = last.caps  # the old caps are a little tighter, hence still safe: send nothing
            grant = floor_to(obs.gpu_sms - env - self.guard_sms, obs.granularity)
            return SiteDecision(None, grant, caps, reason=f"quota for E={env}: {why}", sized_for_sms=env,
                                wanted_sms=wanted)
        grant = floor_to(obs.gpu_sms - env - self.guard_sms, obs.granularity)
        return SiteDecision(env, grant, reason=f"E={env}: {why}", sized_for_sms=env, wanted_sms=wanted)

    def _caps(self, obs: SiteObservation, history: SiteHistory, env: int) -> tuple[tuple[CellCap, ...], int]:
        """Per-cell best-effort caps k (PRBs) with nondeferrable + n_cells * k * (dl + ul) <= E: a sum of
        per-cell caps is the most a PRB quota can promise, since every cell may fill its cap in one slot.
        If that leaves best-effort less than its observed load (it would not drain), E grows."""
        c = self.cost
        per_prb = c.dl_sms_per_prb + c.ul_sms_per_prb
        # The window's tail (not this period's value) so that caps stay put while E does: fewer controls.
        tail = np.append(history.series("nondeferrable_max", self.window_periods), obs.nondeferrable_max or 0.0)
        base = float(tail.max())
        recent = [o.be_prb_per_cell for o in list(history.observations)[-max(1, int(round(1.0 / obs.period_s))):]]
        loads = [max(x, default=0.0) for x in recent + [obs.be_prb_per_cell]]
        need = _quantile(loads, 0.9) / self.drain_utilisation
        k = (env - base) / (obs.n_cells * per_prb)
        if k < need:
            env = envelope_grid(base + obs.n_cells * need * per_prb, obs.gpu_sms, obs.granularity)
            if env >= obs.gpu_sms:
                # Caps that let best-effort drain do not fit the GPU: lift them (RAN first) and grant nothing.
                return tuple(CellCap(cell, 100) for cell in range(obs.n_cells)), obs.gpu_sms
            k = (env - base) / (obs.n_cells * per_prb)
        ratio = int(np.clip(math.floor(100 * k / c.cell_prbs), 1, 100))
        return tuple(CellCap(cell, ratio) for cell in range(obs.n_cells)), env


POLICIES = {
    "static": StaticPolicy,
    "reactive": ReactivePolicy,
    "weaver": WeaverPolicy,
    "oracle": OraclePolicy,
}


def make_policy(name: str, **knobs) -> Policy:
    """A policy by registry name with its knobs (e.g. make_policy("weaver", mode="quota", guard_sms=8))."""
    if name not in POLICIES:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    if name == "static" and "reserve_sms" not in knobs:
        raise PolicyError("static needs reserve_sms (tune it on a calibration trace)")
    return POLICIES[name](**knobs)
