"""Budget enforcer: turns a lease into "may the next micro-batch start, and how big may it be?".

Pure and clock-free (no torch, no I/O): every entry point takes `now` (seconds on the agent's own
monotonic clock), so it is tested in virtual time. The trainer loop drives it:

    enforcer.on_lease(terms)               # a Lease arrived (terms.received_at = now)
    d = enforcer.decide(now, pending, step_samples)
    Launch(size)  -> run a micro-batch of `size`, then enforcer.record_micro_batch(size, t0, t1, cpu_s)
    StepNow       -> optimizer step, then enforcer.record_step(t0, t1, cpu_s)
    Idle(until)   -> launch nothing; wake at `until` (None: only when a lease arrives)
    enforcer.close_windows(now) -> WindowReport for every control period that has ended

Duty cycle (section 5.2-5.3 of compute-and-training-facts.md): the lease's period grid starts when
the first lease of an unbroken chain arrives; in each period the agent may be busy for
`duty x period` (busy time = leased share x period), at the front of the period. Each micro-batch is
sized from an online affine fit t(B) = a + b*B (plus a tail margin) so that it ends inside what is
left of the budget, the period and the lease's validity, with the optimizer step's time reserved.
Past expiry, after a revocation, or without a lease, nothing is launched.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from agent.config import EnforcerConfig

# Why a window ended (also LeaseRecord.end in the inspection contract).
PERIOD, EXPIRED, REVOKED, REPLACED = "period", "expired", "revoked", "replaced"
PROBE_EVERY = 10          # windows between re-measurements when the fit says nothing fits


@dataclass(frozen=True)
class LeaseTerms:
    """A lease as the agent holds it; `received_at` is the agent's monotonic clock at receipt."""
    lease_id: str
    sm_count: int
    period_s: float
    valid_for_s: float
    duty: float
    received_at: float
    epoch: int = 0
    seq: int = 0
    reason: str = ""

    def __post_init__(self) -> None:
        if self.period_s <= 0 or self.valid_for_s < 0 or self.sm_count < 0:
            raise ValueError(f"lease {self.lease_id!r}: need period > 0, valid_for >= 0, sm_count >= 0")
        if not 0.0 <= self.duty <= 1.0 or math.isnan(self.duty):
            raise ValueError(f"lease {self.lease_id!r}: duty must be in [0, 1], got {self.duty}")

    @property
    def expires_at(self) -> float:
        return self.received_at + self.valid_for_s

    @property
    def budget_s(self) -> float:
        """Busy time allowed per period."""
        return self.duty * self.period_s if self.sm_count > 0 else 0.0


@dataclass(frozen=True)
class Launch:
    size: int
    predicted_s: float


@dataclass(frozen=True)
class StepNow:
    predicted_s: float


@dataclass(frozen=True)
class Idle:
    until: float | None     # None: nothing to wait for but a new lease
    reason: str             # no-lease | expired | revoked | zero-lease | budget-spent | stale


Decision = Launch | StepNow | Idle


@dataclass(frozen=True)
class WindowReport:
    """One control period (or the part of it a lease covered) and what was done in it."""
    lease_id: str
    sm_count: int
    start: float
    length_s: float
    granted_s: float        # busy time the lease allowed in this window
    busy_s: float           # measured busy time (micro-batches + optimizer steps)
    cpu_s: float            # measured process CPU time (core-seconds)
    overrun_s: float        # busy time above the grant, or work past the window/lease end
    micro_batches: int
    samples: int
    steps: int
    end: str                # period | expired | revoked | replaced


class StepTimeFit:
    """Online fit of micro-batch time t(B) = a + b*B over a sliding window, robust to stragglers.

    Least squares, then one trimming pass that drops points more than 3 MADs above the line (a
    preempted batch on a loaded host says nothing about the next one) and refits. The planning
    margin is the `tail_quantile` of the kept residuals, so it tracks the tail the way Concordia's
    quantile predictors do, instead of a standard deviation that one outlier inflates.
    """

    def __init__(self, window: int = 64, tail_quantile: float = 0.9):
        self.points: deque[tuple[int, float]] = deque(maxlen=window)
        self.tail_quantile = tail_quantile
        self.a, self.b, self.margin = 0.0, math.nan, 0.0

    def add(self, size: int, seconds: float) -> None:
        self.points.append((size, seconds))
        self._refit()

    @property
    def ready(self) -> bool:
        return bool(self.points)

    @staticmethod
    def _line(points) -> tuple[float, float]:
        n = len(points)
        mx = sum(x for x, _ in points) / n
        my = sum(y for _, y in points) / n
        sxx = sum((x - mx) ** 2 for x, _ in points)
        if sxx > 0:
            b = sum((x - mx) * (y - my) for x, y in points) / sxx
            a = my - b * mx
            if b > 0 and a >= 0:
                return a, b
        # One size only, or noise made the line nonsensical: proportional through the origin, which
        # over-predicts every size above the ones seen (t = a + bB <= (a+b)B).
        return 0.0, sum(y / x for x, y in points) / n

    def _refit(self) -> None:
        pts = list(self.points)
        a, b = self._line(pts)
        resid = sorted(y - (a + b * x) for x, y in pts)
        if len(pts) >= 5:
            med = resid[len(resid) // 2]
            mad = sorted(abs(r - med) for r in resid)[len(resid) // 2]
            limit = med + 3 * 1.4826 * mad
            kept = [(x, y) for x, y in pts if y - (a + b * x) <= limit]
            if len(kept) >= 3 and len(kept) < len(pts):
                a, b = self._line(kept)
                resid = sorted(y - (a + b * x) for x, y in kept)
        self.a, self.b = a, b
        q = resid[min(len(resid) - 1, int(self.tail_quantile * len(resid)))] if len(resid) > 2 else 0.0
        self.margin = max(0.0, q)

    def predict(self, size: int) -> float:
        return self.a + self.b * size + self.margin

    def largest_within(self, seconds: float, lo: int, hi: int) -> int:
        """Largest B in [lo, hi] with predict(B) <= seconds, or 0 if none."""
        if not self.ready:
            return lo if seconds > 0 else 0
        b = math.floor((seconds - self.a - self.margin) / self.b)
        return min(hi, b) if b >= lo else 0


@dataclass
class _Window:
    lease: LeaseTerms
    start: float
    busy_s: float = 0.0
    cpu_s: float = 0.0
    overrun_s: float = 0.0
    micro_batches: int = 0
    samples: int = 0
    steps: int = 0

    @property
    def end(self) -> float:
        return self.start + self.lease.period_s


@dataclass
class BudgetEnforcer:
    config: EnforcerConfig = field(default_factory=EnforcerConfig)

    def __post_init__(self) -> None:
        self.fit = StepTimeFit(self.config.fit_window, self.config.tail_quantile)
        self.step_times: deque[float] = deque(maxlen=16)
        self.lease: LeaseTerms | None = None
        self.window: _Window | None = None
        self.epoch = 0
        self.seq = -1
        self.last_end_reason = ""
        self._closed: list[WindowReport] = []
        self._last_probe = -math.inf
        self._probing = False

    # --- lease events ----------------------------------------------------------------------------
    def on_lease(self, terms: LeaseTerms) -> bool:
        """Adopt a lease. Returns False (and ignores it) when it is stale: older epoch or sequence."""
        if terms.epoch < self.epoch or (terms.epoch == self.epoch and terms.seq <= self.seq):
            return False
        now = terms.received_at
        self._advance(now)
        self.epoch, self.seq = terms.epoch, terms.seq
        if self.window is not None and self.window.lease.period_s == terms.period_s:
            # A renewal on the same grid: keep the current window and what it has used.
            self.window.lease = terms
        else:
            if self.window is not None:
                self._close(now, REPLACED)
            self.window = _Window(terms, now)
        self.lease = terms
        return True

    def on_revoke(self, now: float, lease_id: str = "", reason: str = REVOKED) -> bool:
        """Drop the current lease (any lease when `lease_id` is empty). True when one was dropped."""
        if self.lease is None or (lease_id and lease_id != self.lease.lease_id):
            return False
        self._advance(now)
        if self.window is not None:
            self._close(now, REVOKED)
        self.lease, self.last_end_reason = None, reason
        return True

    # --- decisions -------------------------------------------------------------------------------
    def close_windows(self, now: float) -> list[WindowReport]:
        """Close every window that ended by `now` (period boundary or lease expiry); return all closed
        since the last call, including those closed by lease events."""
        self._advance(now)
        out, self._closed = self._closed, []
        return out

    def _advance(self, now: float) -> None:
        while self.window is not None:
            lease = self.window.lease
            if lease.expires_at <= min(now, self.window.end):
                self._close(lease.expires_at, EXPIRED)
                self.lease, self.last_end_reason = None, EXPIRED
            elif self.window.end <= now:
                end = self.window.end
                self._close(end, PERIOD)
                self.window = _Window(lease, end)
            else:
                break

    def _probe_due(self, w: _Window) -> bool:
        return w.start - self._last_probe >= PROBE_EVERY * w.lease.period_s - 1e-9

    def step_estimate(self) -> float:
        if self.step_times:
            times = sorted(self.step_times)
            return times[int(0.9 * (len(times) - 1))]   # p90 of recent optimizer steps
        return self.fit.a   # before any step was timed: the fixed per-launch cost

    def decide(self, now: float, pending_samples: int = 0, step_samples: int = 1) -> Decision:
        self._advance(now)
        if self.lease is None or self.window is None:
            return Idle(None, self.last_end_reason or "no-lease")
        w, lease = self.window, self.lease
        if lease.budget_s <= 0:
            return Idle(min(w.end, lease.expires_at), "zero-lease")
        hard_end = min(w.end, lease.expires_at)
        remaining = min(lease.budget_s - w.busy_s, hard_end - now)
        c = self.config
        if c.fixed_micro_batch:
            # Baseline ("naive greedy"): a fixed size, launched whenever any budget is left.
            if remaining > 0:
                return Launch(c.fixed_micro_batch, self.fit.predict(c.fixed_micro_batch) if self.fit.ready else 0.0)
            if pending_samples >= step_samples and now < hard_end:
                return StepNow(self.step_estimate())
            return Idle(w.end if w.end < lease.expires_at else lease.expires_at, "budget-spent")
        # The optimizer step is taken as soon as enough samples are accumulated and the budget left
        # covers its (p90) time, at whatever point of the window that is; otherwise it waits for the
        # next window, whose budget it then opens. No window carries an unused reserve.
        # While a due step does not fit, micro-batches that still fit keep accumulating into it.
        step_time = self.step_estimate()
        step_due = pending_samples >= step_samples
        if step_due and c.safety * remaining >= step_time:
            return StepNow(step_time)
        if step_due and w.busy_s == 0 and remaining > 0 and step_time > c.safety * lease.budget_s \
                and self._probe_due(w):
            # Even a whole window's budget looks too small for the step: take it now and then (as a
            # probe) rather than never, or training would stall with its gradients pending forever.
            self._last_probe = w.start
            return StepNow(step_time)
        plan = min(c.safety * remaining, c.max_batch_fraction * lease.period_s)
        size = self.fit.largest_within(plan, c.min_micro_batch, c.max_micro_batch)
        if not size and w.busy_s == 0 and remaining > 0 and self._probe_due(w):
            # The fit says not even the smallest batch fits an untouched budget. That may be stale
            # (slow outliers, a warm-up): re-measure with the smallest batch, at most once every
            # PROBE_EVERY windows, so a lease that is really too small costs at most that many overruns.
            # Old points far slower per sample than the probe are dropped as stale (see record).
            self._last_probe = w.start
            self._probing = True
            size = c.min_micro_batch
        if size:
            return Launch(size, self.fit.predict(size) if self.fit.ready else 0.0)
        return Idle(w.end if w.end < lease.expires_at else lease.expires_at, "budget-spent")

    # --- measurements ----------------------------------------------------------------------------
    def record_micro_batch(self, size: int, started: float, ended: float, cpu_s: float = 0.0) -> None:
        if self._probing:
            self._probing = False
            per_sample = (ended - started) / size
            kept = [(b, t) for b, t in self.fit.points if t / b <= 3 * per_sample]
            self.fit.points.clear()
            self.fit.points.extend(kept)
        self.fit.add(size, ended - started)
        self._account(started, ended, cpu_s, samples=size)

    def record_step(self, started: float, ended: float, cpu_s: float = 0.0) -> None:
        self.step_times.append(ended - started)
        self._account(started, ended, cpu_s, step=True)

    def record_other(self, started: float, ended: float, cpu_s: float = 0.0) -> None:
        """Leased work that is neither a training micro-batch nor a step (validation chunks)."""
        self._account(started, ended, cpu_s)

    def _account(self, started: float, ended: float, cpu_s: float, samples: int = 0, step: bool = False) -> None:
        w = self.window
        if w is None or started < w.start:
            return   # work of a window already closed (e.g. revoked mid-batch): its report is out
        w.busy_s += ended - started
        w.cpu_s += cpu_s
        w.micro_batches += 1 if samples else 0
        w.samples += samples
        w.steps += 1 if step else 0
        over_budget = w.busy_s - w.lease.budget_s
        past_end = ended - min(w.end, w.lease.expires_at)
        w.overrun_s = max(w.overrun_s, over_budget, past_end, 0.0)

    def _close(self, at: float, end: str) -> None:
        w = self.window
        covered = max(0.0, min(at, w.end) - w.start)
        granted = min(w.lease.budget_s, covered)
        self._closed.append(WindowReport(w.lease.lease_id, w.lease.sm_count, w.start, covered, granted,
                                         w.busy_s, w.cpu_s, w.overrun_s, w.micro_batches, w.samples,
                                         w.steps, end))
        self.window = None

    def next_deadline(self) -> float | None:
        """When the enforcer next changes its mind without new input (period end or lease expiry)."""
        if self.window is None:
            return None
        return min(self.window.end, self.window.lease.expires_at)
