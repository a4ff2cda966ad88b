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
The window's last launch, whose excess is the overrun, is kept short (`edge_batch_fraction` of the
period), and the launch before it is sized to leave that one room; a launch after idle time is
planned as cold (see StepTimeFit).
Past expiry, after a revocation, or without a lease, nothing is launched.

A caller may also set `deadline` (agent clock; None: none), a hard end of its own such as a cross-site
round's work deadline: no launch or step is planned to end after it, and once nothing fits before it
the decision is Idle(until=deadline, "round-deadline"). It bounds the work, not the lease: work that
ends after it is no overrun (only the window's end, the budget and the lease's expiry make one).

Host CPU (CPU execution only). Where the leased device is the host's own cores, what the lease grants
is the whole process's CPU time, not only the training loop's: gRPC and lease-client threads,
checkpoints and cross-site host work run on the same clock the platform meters. A caller in that mode
passes readings of the process CPU clock (all threads) with `note_process_cpu(now, cpu_s, threads)`;
the CPU beyond what the recorded work itself used (at most its wall time x `threads`) is host
overhead, charged to the window it ran in. The window's busy budget is then the lease's less the
larger of the host CPU charged to it so far and the host CPU expected of a whole period (a peak
tracker over past periods: a burst raises it at once, it decays slowly), and less the previous
period's excess (busy + host over the grant), all divided by `threads`, never below 0. Without
readings (a GPU, where host CPU is no GPU SM, or a caller that passes none) nothing changes.

Meter. What a window is charged for its work is what the platform meters for the leased device:
busy wall time on a GPU (`meter=WALL`), the work's CPU time on a CPU stand-in (`meter=CPU_TIME`, at
most its wall time x threads, over threads). On a shared host a micro-batch preempted by other
processes takes longer than the CPU it uses; charged by wall time, the CPU it did not get was lost
to the lease (3-5 % of the grant per site in `weaver up` on two cores). Charged by CPU time the fit
predicts CPU too, whose residuals are free of preemption, and wall time is bounded separately: every
prediction that must end by a wall-clock time (the window's end, the lease's expiry, the caller's
deadline) is stretched by the upper quantile of the launches' measured wall / charged ratio. When
the wall time left, not the budget, is what stops the window's work, the idle budget is host
starvation. The platform meters a CPU stand-in over period-long intervals on its own clock, not on the
lease's grid: a window whose work ran late (an exchange held its start) followed by one whose work ran
early put 1.4 x the budget into one metered period (34 training-caused misses in a 60 s `weaver up`).
So on the CPU meter a window's work is planned to end inside its slot: SLOT_MARGIN x the budget x the
launches' median wall / CPU from where its work may start (its phase). A period-long interval holds the
tail of one window's work and the head of the next; what it can hold beyond one budget is how late the
first window's work started, which the slot bounds to (SLOT_MARGIN - 1) x the budget (at 1.25, up to
25 % of the lease beyond it, 36 SMs with host CPU on top; at 1.1, at most 15 in five runs). What a late
window cannot fit is the enforcer's own choice (nothing fits), or host starvation. Announced host
work is not planned either, so it can run past the slot (a cross-site exchange completes when the last
site joins, late in the first sites' windows): what ran there while it was announced is taken from the
next window's budget, as debt, or it and the next window's early work share a metered period (90-108 SMs
of an 80-SM lease at every round boundary).

Kernel-bound (`EnforcerConfig.kernel_bound`, a worker the supervisor confines: agent.supervisor). The kernel
now holds the worker's whole process tree to the lease's cores over 5 ms CFS periods and freezes it when
the lease ends, so what only kept cooperative work inside the platform's metered periods is dropped: the
phase stagger, the CPU meter's slot, the edge and probe rules, and the host reserve for announced work
(`SiteAgent._apply_host_reserve`). What remains, and why: planning by CPU budget with the step-time fit
(a kernel throttle does not lose work, but a window's budget spent early leaves the rest of the period
frozen-by-quota for nothing else), the optimizer step when due and the budget covers it, the debt of a
window's excess carried into the next (it keeps the worker's own accounting at the rate the kernel
allows, so its reports and the fit stay true), the hard end of the lease (no launch planned past it: a
freeze mid-batch only delays the batch, but its time past the lease is no lease's), and the caller's
round deadline. Overrun is then only work past the lease's hard end.

Idle accounting (the utilisation waterfall, xapp.waterfall). Every closed window says why the part of
its grant that no recorded work used stayed idle, in lease seconds (wall seconds on the lease's units):
granted = busy + host (its host CPU / threads) + the `idle_s` causes, exactly. The time between two calls
is attributed to what the enforcer last said: an Idle(round-deadline), or anything after a caller's
deadline, is a round wait (the cross-site tier's blocking phases run after it, with no decision asked);
an Idle(budget-spent) with busy budget left is the enforcer's own choice (nothing fits); the time after
recorded work until the next decision is the caller's loop (event handling, reports, checkpoint writes).
What is left once those are counted (capped at the idle grant, in time order) is the budget held back
for host CPU or a previous period's excess (host reserve), and the closing term `other`; or, when the
window's work and host CPU ran beyond its grant, that excess as a negative `beyond-grant`.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from agent.config import EnforcerConfig

# Why a window ended (also LeaseRecord.end in the inspection contract).
PERIOD, EXPIRED, REVOKED, REPLACED = "period", "expired", "revoked", "replaced"
PROBE_EVERY = 10          # windows between re-measurements when the fit says nothing fits
WARM_POINTS = 8           # micro-batches measured before the fit's residual tail replaces `safety`
MIN_FRACTION = 1 / 16     # shortest sequence share a tail-filling micro-batch may use
EDGE_QUANTILE = 0.97      # residual quantile for a launch that ends at the window's edge (see decide)
COLD_GAP_S = 0.001        # a launch starting this long after the last work ended runs cold (see StepTimeFit)
MIN_POOL = 8              # residuals a cold/warm pool needs before its own quantiles replace the pooled ones
SLOWDOWN_MEMORY_S = 0.005  # a launch slower than the fit's edge quantile scales the plan made this soon after
SLOT_STRETCH = 1.25        # a staggered window's work starts no later than leaves this x its budget (see Meter)
SLOT_MARGIN = 1.1          # CPU meter: a window's work ends by its start + this x budget x median stretch
HOST_DECAY = 0.8          # per period: how fast the expected host CPU of a period forgets a burst
# Idle causes (WindowReport.idle_s); SPENT is time after the busy budget was used, no loss of its own.
# BEYOND (<= 0) is the work and host CPU beyond the grant: a negative idle, so the sum still holds.
NOTHING_FITS, ROUND_WAIT, LOOP, HOST_RESERVE, OTHER, BEYOND, SPENT, STARVED = (
    "nothing-fits", "round-wait", "loop", "host-reserve", "other", "beyond-grant", "spent", "host-starvation")
IDLE_CAUSES = (NOTHING_FITS, ROUND_WAIT, HOST_RESERVE, LOOP, STARVED, OTHER, BEYOND)
WALL, CPU_TIME = "wall", "cpu"     # BudgetEnforcer.meter (see the module doc)


@dataclass(frozen=True)
class LeaseTerms:
    """A lease as the agent holds it; `received_at` is the agent's monotonic clock at receipt.

    `not_after` is the lease's hard end mapped onto the same clock (the broker's `sent_unix_ms +
    valid_for_ms` less the causal clock-offset bound, see agent.lease_client.lease_hard_end), so
    that transit and queueing never extend a lease; None when it cannot be bounded (no offset
    sample yet, or an older broker that does not stamp leases): then receipt + valid_for alone."""
    lease_id: str
    sm_count: int
    period_s: float
    valid_for_s: float
    duty: float
    received_at: float
    epoch: int = 0
    seq: int = 0
    reason: str = ""
    not_after: float | None = None

    def __post_init__(self) -> None:
        if self.period_s <= 0 or self.valid_for_s < 0 or self.sm_count < 0:
            raise ValueError(f"lease {self.lease_id!r}: need period > 0, valid_for >= 0, sm_count >= 0")
        if not 0.0 <= self.duty <= 1.0 or math.isnan(self.duty):
            raise ValueError(f"lease {self.lease_id!r}: duty must be in [0, 1], got {self.duty}")
        if self.not_after is not None and math.isnan(self.not_after):
            raise ValueError(f"lease {self.lease_id!r}: not_after must be a time or None, got NaN")

    @property
    def expires_at(self) -> float:
        end = self.received_at + self.valid_for_s
        return end if self.not_after is None else min(end, self.not_after)

    @property
    def budget_s(self) -> float:
        """Busy time allowed per period."""
        return self.duty * self.period_s if self.sm_count > 0 else 0.0


@dataclass(frozen=True)
class Launch:
    """Run `size` samples, each cut to `fraction` of the full sequence length (1.0: whole samples).
    A fraction below 1 is only planned for the window's last launch, to fill the budget left after
    whole samples: a shorter causal-LM sample is still a real training sample (its prefix)."""
    size: int
    predicted_s: float
    fraction: float = 1.0


@dataclass(frozen=True)
class StepNow:
    predicted_s: float


@dataclass(frozen=True)
class Idle:
    until: float | None     # None: nothing to wait for but a new lease
    reason: str             # no-lease | expired | revoked | zero-lease | budget-spent | round-deadline | stale


Decision = Launch | StepNow | Idle


@dataclass(frozen=True)
class WindowReport:
    """One control period (or the part of it a lease covered) and what was done in it."""
    lease_id: str
    sm_count: int
    start: float
    length_s: float
    granted_s: float        # busy time the lease allowed in this window
    busy_s: float           # charged busy time of micro-batches + optimizer steps (see Meter)
    cpu_s: float            # measured process CPU time (core-seconds)
    overrun_s: float        # busy time above the grant, or work past the window/lease end
    micro_batches: int
    samples: int
    steps: int
    end: str                # period | expired | revoked | replaced
    host_s: float = 0.0     # host CPU charged to the window, in lease seconds (core-seconds / threads)
    idle_s: tuple[tuple[str, float], ...] = ()   # (cause, lease seconds): granted - busy - host, by cause

    def idle(self, cause: str) -> float:
        return sum(s for c, s in self.idle_s if c == cause)


class StepTimeFit:
    """Online fit of micro-batch time t(B) = a + b*B over a sliding window, robust to stragglers.

    Least squares, then one trimming pass that drops points more than 3 MADs above the line (a
    preempted batch on a loaded host says nothing about the next one) and refits. The planning
    margin is the `tail_quantile` of the kept residuals, so it tracks the tail the way Concordia's
    quantile predictors do, instead of a standard deviation that one outlier inflates.
    """

    def __init__(self, window: int = 64, tail_quantile: float = 0.9):
        self.points: deque[tuple[float, float]] = deque(maxlen=window)
        self.cold: deque[bool] = deque(maxlen=window)     # per point: launched after an idle gap
        self.tail_quantile = tail_quantile
        self.a, self.b, self.margin = 0.0, math.nan, 0.0
        self.c = 0.0        # extra fixed time of a cold launch (see _refit)
        # (tail, edge) relative margins for warm (back-to-back) and cold (after idle) launches
        self.margins = {False: (0.0, 0.0), True: (0.0, 0.0)}

    def add(self, size: float, seconds: float, cold: bool = False) -> None:
        self.points.append((size, seconds))
        self.cold.append(cold)
        self._refit()

    def keep(self, pred) -> None:
        """Drop the points for which `pred(size, seconds)` is false (stale ones) and refit."""
        kept = [(pt, c) for pt, c in zip(self.points, self.cold, strict=True) if pred(*pt)]
        self.points.clear()
        self.cold.clear()
        for pt, c in kept:
            self.points.append(pt)
            self.cold.append(c)
        if self.points:
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

    @classmethod
    def _model(cls, points) -> tuple[float, float, float]:
        """Least squares t = a + b*B + c*cold over (B, t, cold) points: one slope, a warm and a cold
        intercept (c >= 0). Without at least 3 points of each kind, or when the cold ones are not slower,
        one line for all (c = 0)."""
        groups = [[(x, y) for x, y, k in points if k == flag] for flag in (False, True)]
        if all(len(g) >= 3 for g in groups):
            means = [(sum(x for x, _ in g) / len(g), sum(y for _, y in g) / len(g)) for g in groups]
            sxx = sum((x - m[0]) ** 2 for g, m in zip(groups, means, strict=True) for x, _ in g)
            if sxx > 0:
                b = sum((x - m[0]) * (y - m[1]) for g, m in zip(groups, means, strict=True) for x, y in g) / sxx
                a, a_cold = (m[1] - b * m[0] for m in means)
                if b > 0 and 0 <= a <= a_cold:
                    return a, b, a_cold - a
        a, b = cls._line([(x, y) for x, y, _ in points])
        return a, b, 0.0

    def _margins(self, ratios: list[float]) -> tuple[float, float]:
        """(tail, edge) relative margins from sorted relative residuals."""
        def quantile(q: float) -> float:
            return max(0.0, ratios[min(len(ratios) - 1, int(q * len(ratios)))]) if len(ratios) > 2 else 0.0
        tail = quantile(self.tail_quantile)
        return tail, max(tail, quantile(EDGE_QUANTILE))

    def _refit(self) -> None:
        pts = [(x, y, k) for (x, y), k in zip(self.points, self.cold, strict=True)]
        a, b, c = self._model(pts)
        resid = [y - (a + b * x + c * k) for x, y, k in pts]
        top = max(resid)        # the largest residual of the points the line is fitted to
        if len(pts) >= 5:
            ordered = sorted(resid)
            med = ordered[len(ordered) // 2]
            mad = sorted(abs(r - med) for r in ordered)[len(ordered) // 2]
            limit = med + 3 * 1.4826 * mad
            inside = [r <= limit for r in resid]
            kept = [p for p, ok in zip(pts, inside, strict=True) if ok]
            if len(kept) >= 3 and len(kept) < len(pts):
                a, b, c = self._model(kept)
                resid = [y - (a + b * x + c * k) for x, y, k in pts]
                top = max(r for r, ok in zip(resid, inside, strict=True) if ok)
        self.a, self.b, self.c = a, b, c
        # Margins are relative: on a contended host (shared caches, SMT siblings, clock changes) a
        # micro-batch runs a few per cent slower as a whole, so the error grows with its length. An
        # absolute margin, set by the largest launches' residuals, would idle small budgets.
        # One sorted pass of (relative residual, cold) over the points no slower than the fitted ones.
        ratios, sum_x = [], 0.0
        for (x, y, k), r in zip(pts, resid, strict=True):
            if a + b * x > 0 and r <= top:
                ratios.append((y / (a + b * x + c * k) - 1.0, k))
                sum_x += x
        ratios.sort()
        pooled = self._margins([q for q, _ in ratios])
        # A launch right after idle time runs cold (caches refilled, the core woken up): on a CPU host it
        # took ~1-2 ms more than a back-to-back one of the same size, and its tail was wider. The cold
        # intercept carries the first; each kind gets the quantiles of its own residuals once it has
        # MIN_POOL of them, so the window's last launches (warm) are not idled by the first one's (cold)
        # tail, nor the first one under-reserved.
        for flag in (False, True):
            own = [q for q, k in ratios if k == flag]
            self.margins[flag] = self._margins(own) if len(own) >= MIN_POOL else pooled
        mean_x = sum_x / len(ratios) if ratios else 0.0
        self.margin = pooled[0] * (a + b * mean_x)     # seconds, at the typical size (for reports)

    def predict(self, size: float, edge: bool = False, cold: bool = False) -> float:
        """Upper-quantile time of a micro-batch of `size` sample-equivalents (samples x fraction);
        `edge`: the higher EDGE_QUANTILE, for a launch whose excess would be an overrun; `cold`: the
        launch follows idle time."""
        return (self.a + self.b * size + self.c * cold) * (1.0 + self.margins[cold][edge])

    def work_within(self, seconds: float, edge: bool = False, cold: bool = False) -> float:
        """Sample-equivalents whose predicted (upper-quantile) time fits `seconds`; <= 0 if none."""
        if not self.ready:
            return 0.0
        return (seconds / (1.0 + self.margins[cold][edge]) - self.a - self.c * cold) / self.b

    def largest_within(self, seconds: float, lo: int, hi: int, edge: bool = False, cold: bool = False) -> int:
        """Largest B in [lo, hi] with predict(B, edge, cold) <= seconds, or 0 if none."""
        if not self.ready:
            return lo if seconds > 0 else 0
        b = math.floor(self.work_within(seconds, edge, cold))
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
    host_s: float = 0.0     # host CPU (core-seconds) beyond the recorded work, charged to this window
    debt_s: float = 0.0     # busy time the previous period's excess over its grant takes from this one
    preempted_s: float = 0.0   # CPU meter: wall time the work took beyond what it was charged (others ran)
    reserved_s: float = 0.0    # the largest host reserve the caller set while this window was current
    unplanned_s: float = 0.0   # busy budget left when the enforcer last found that nothing fits
    late_s: float = 0.0         # CPU meter: host CPU (lease seconds) that ran after the slot's end
    idle: list = field(default_factory=list)    # [cause, seconds] in time order (see the module doc)

    def note_idle(self, cause: str, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.idle and self.idle[-1][0] == cause:
            self.idle[-1][1] += seconds
        else:
            self.idle.append([cause, seconds])

    @property
    def end(self) -> float:
        return self.start + self.lease.period_s


@dataclass
class BudgetEnforcer:
    config: EnforcerConfig = field(default_factory=EnforcerConfig)
    meter: str = WALL

    def __post_init__(self) -> None:
        if self.meter not in (WALL, CPU_TIME):
            raise ValueError(f"BudgetEnforcer.meter must be {WALL!r} or {CPU_TIME!r}, got {self.meter!r}")
        self._stretch: deque[float] = deque(maxlen=self.config.fit_window)   # wall / charged, per launch
        self._stretch_sorted: list[float] = []     # the same, sorted once per launch (read several times a decision)
        self._slowdown: tuple[float, float, float] | None = None   # (ended, charged / edge prediction, window)
        self.fit = StepTimeFit(self.config.fit_window, self.config.tail_quantile)
        self.step_times: deque[float] = deque(maxlen=16)
        self.lease: LeaseTerms | None = None
        self.window: _Window | None = None
        self.epoch = 0
        self.seq = -1
        self.last_end_reason = ""
        self._closed: list[WindowReport] = []
        self._last_probe = -math.inf
        self._last_launch = -math.inf   # when the last micro-batch ended
        self._probing = False
        self._last_end = -math.inf      # when the last measured work ended (cold/warm launches)
        self.deadline: float | None = None  # the caller's own hard end (agent clock), e.g. a round's work deadline
        # Host CPU (see the module doc): the last process CPU reading and when it was taken, what the
        # recorded work used since (CPU, wall), the cores the work may use, and a period's expected host CPU.
        self._cpu_mark: tuple[float, float] | None = None
        self._work_cpu = self._work_wall = 0.0
        self.host_threads = 1
        self.host_expected_s = 0.0
        # Host CPU the caller is about to spend on work of its own (a checkpoint, a cross-site exchange),
        # set before it starts: kept out of the busy budget on top of the expected host CPU until the
        # window's measured host CPU covers it, so that the work lands inside the grant, not beyond it.
        self.host_reserve_s = 0.0
        # Idle accounting: since when, and why, nothing has been recorded: (since, cause, caller's deadline)
        self._mark: tuple[float, str, float | None] | None = None

    # --- lease events ----------------------------------------------------------------------------
    def _stale(self, terms: LeaseTerms) -> bool:
        return terms.epoch < self.epoch or (terms.epoch == self.epoch and terms.seq <= self.seq)

    def on_lease(self, terms: LeaseTerms) -> bool:
        """Adopt a lease. Returns False (and ignores it) when it is stale: older epoch or sequence."""
        if self._stale(terms):
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
        if self._mark is None:
            self._mark = (now, LOOP, self.deadline)
        return True

    def on_refused(self, terms: LeaseTerms, reason: str) -> bool:
        """A lease the agent will not use (its hard end passed in transit, or no partition fits it). As
        the newest lease it still supersedes every earlier one, so the current lease ends too and
        nothing runs until the next. False (nothing changes) when it is stale."""
        if self._stale(terms):
            return False
        now = terms.received_at
        self._advance(now)
        self.epoch, self.seq = terms.epoch, terms.seq
        if self.window is not None:
            self._close(now, REPLACED)
        self.lease, self.last_end_reason = None, reason
        return True

    def on_revoke(self, now: float, lease_id: str = "", reason: str = REVOKED,
                  in_flight_until: float = -math.inf) -> bool:
        """Drop the current lease (any lease when `lease_id` is empty). True when one was dropped.

        `now` is when the revocation arrived; `in_flight_until` when the work running at that moment
        ended (the caller handles events between launches, so it is known by then). Work past the
        revocation is an overrun of the window it ends, like work past the window's end."""
        if self.lease is None or (lease_id and lease_id != self.lease.lease_id):
            return False
        self._advance(now)
        if self.window is not None:
            self.window.overrun_s = max(self.window.overrun_s, in_flight_until - now)
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
                w, end = self.window, self.window.end
                self._close(end, PERIOD)
                self.window = _Window(lease, end, debt_s=max(self._excess(w), min(w.late_s, lease.budget_s)))
            else:
                break

    def _probe_due(self, w: _Window, last_done: float = -math.inf) -> bool:
        """None was probed for PROBE_EVERY periods, nor was the work in question (`last_done`) done."""
        horizon = PROBE_EVERY * w.lease.period_s - 1e-9
        return w.start - self._last_probe >= horizon and w.start - last_done >= horizon

    @property
    def warm(self) -> bool:
        """WARM_POINTS micro-batches were measured: the fit's residual quantiles are the guard."""
        return len(self.fit.points) >= WARM_POINTS

    def _cold(self, started: float) -> bool:
        """Work starting at `started` follows idle time (see StepTimeFit): it runs, and is planned, cold."""
        return started - self._last_end > COLD_GAP_S

    def safety(self) -> float:
        """Multiplicative planning safety. While the fit is young its residual quantile says little, so
        the configured `safety` applies; once WARM_POINTS micro-batches were measured the fit's upper
        residual quantile (its margin) is the guard, and scaling the budget down again would only
        leave granted time idle (that alone cost ~10 % of the grant)."""
        return 1.0 if self.warm else self.config.safety

    def step_estimate(self, q: float = 0.9) -> float:
        if self.step_times:
            times = sorted(self.step_times)
            return times[int(q * (len(times) - 1))]     # p90 (or the edge quantile) of recent optimizer steps
        return self.fit.a   # before any step was timed: the fixed per-launch cost

    def decide(self, now: float, pending_samples: int = 0, step_samples: int = 1) -> Decision:
        d = self._decide(now, pending_samples, step_samples)
        self._attribute(now)
        if isinstance(d, Idle):
            cause = ROUND_WAIT if d.reason == "round-deadline" else SPENT
            w = self.window
            left = self.busy_budget(w) - w.busy_s if w is not None else 0.0
            if d.reason == "budget-spent" and left > 1e-9:
                # budget left, but the enforcer planned nothing into it: because other processes took the
                # wall time that would have held it (host starvation), or its own choice
                cause = STARVED if self.meter == CPU_TIME and w.preempted_s >= left \
                    and (min(d.until, self.slot_end(w)) - now) / self.wall_stretch() < left else NOTHING_FITS
                w.unplanned_s = left
            self._mark = (now, cause, self.deadline)
        else:
            self._mark = None            # work follows; its recording sets the next mark
        return d

    def _attribute(self, until: float) -> None:
        """The time since the mark, inside the current window, to the mark's cause (after the caller's
        deadline: a round wait)."""
        w, m = self.window, self._mark
        if m is None:
            return
        if w is not None:
            t0, t1 = max(m[0], w.start), min(until, w.end)
            if t1 > t0:
                split = t1 if m[2] is None else min(max(m[2], t0), t1)
                w.note_idle(m[1], split - t0)
                w.note_idle(ROUND_WAIT, t1 - split)
        self._mark = (max(m[0], until), m[1], m[2])

    def _decide(self, now: float, pending_samples: int, step_samples: int) -> Decision:
        self._advance(now)
        if self.lease is None or self.window is None:
            return Idle(None, self.last_end_reason or "no-lease")
        w, lease = self.window, self.lease
        if lease.budget_s <= 0:
            return Idle(min(w.end, lease.expires_at), "zero-lease")
        lease_end = min(w.end, lease.expires_at)
        if self.config.kernel_bound:
            return self._decide_kernel_bound(now, w, lease, lease_end, pending_samples, step_samples)
        start_at = self.work_start()
        if self.config.phase_fraction and w.busy_s == 0 and now < start_at:
            return Idle(min(start_at, lease_end), "phase")
        if self.meter == CPU_TIME:
            # the platform meters a period on its own grid: the window's work stays in its slot (Meter)
            slot_end = self.slot_end(w)
            if now >= slot_end:
                return Idle(lease_end, "budget-spent")
            lease_end = min(lease_end, slot_end)
        hard_end = lease_end if self.deadline is None else min(lease_end, self.deadline)
        budget = self.busy_budget(w)
        stretch = self.wall_stretch()     # wall seconds per charged second (1 on the wall meter)
        remaining = min(budget - w.busy_s, (hard_end - now) / stretch)
        sd = self._slowdown
        if sd is not None and sd[2] == w.start and now - sd[0] <= SLOWDOWN_MEMORY_S:
            remaining /= sd[1]
        # Nothing fitting before the caller's deadline (when it, not the lease, is what binds) waits for it.
        idle = Idle(hard_end, "round-deadline") \
            if hard_end - now < min((budget - w.busy_s) * stretch, lease_end - now) else Idle(lease_end, "budget-spent")

        def before_deadline(seconds: float) -> bool:    # a planned overrun of the lease, never of the deadline
            return self.deadline is None or now + seconds * stretch <= self.deadline
        c = self.config
        cold = self._cold(now)
        if c.fixed_micro_batch:
            # Baseline ("naive greedy"): a fixed size, launched whenever any budget is left.
            if remaining > 0:
                return Launch(c.fixed_micro_batch, self.fit.predict(c.fixed_micro_batch) if self.fit.ready else 0.0)
            if pending_samples >= step_samples and now < hard_end:
                return StepNow(self.step_estimate())
            return idle
        # The optimizer step is taken as soon as enough samples are accumulated and the budget left
        # covers its (p90) time, at whatever point of the window that is; otherwise it waits for the
        # next window, whose budget it then opens. No window carries an unused reserve.
        # While a due step does not fit, micro-batches that still fit keep accumulating into it.
        step_time = self.step_estimate()
        step_due = pending_samples >= step_samples
        warm, s = self.warm, self.safety()
        # A launch planned against what is left of the budget (not capped by the yield bound) ends at the
        # window's edge, where any excess over the prediction is an overrun: plan it by a higher
        # residual quantile. Earlier launches keep the 0.9 margin: their excess only shrinks the next.
        edge = s * remaining <= c.max_batch_fraction * lease.period_s
        if step_due and s * remaining >= (self.step_estimate(EDGE_QUANTILE) if edge else step_time):
            return StepNow(step_time)
        if pending_samples >= 2 * step_samples and w.busy_s == 0 and remaining > 0 \
                and step_time > s * self.busy_budget(w) and before_deadline(step_time) and self._probe_due(w):
            # Even a whole window's budget looks too small for the step, and a second step's worth of
            # samples piled up behind it (no window took it): take it now and then (as a probe) rather
            # than never, or training would stall with its gradients pending forever. While other
            # (larger) windows take the steps, forcing one into a small budget is only an overrun
            # (9-12 ms steps in 6 ms budgets on the bench host).
            self._last_probe = w.start
            return StepNow(step_time)
        cap = c.max_batch_fraction * lease.period_s
        if warm:
            # A warm fit sizes a launch jointly with the window's last one (below); a young one plans each
            # launch alone, scaled by the configured safety.
            tail = self._tail()
            last = max(min(c.edge_batch_fraction, c.max_batch_fraction) * lease.period_s, tail)
        if warm and remaining > last:
            # Not the window's last launch: sized jointly with it, it leaves that one room between the
            # smallest launch (less is idle: a 12 ms budget under a 10 ms cap got one 8 ms launch and
            # 4 ms too short for any other) and `last` (the last launch's excess over its prediction is
            # the overrun, and a host's slowdowns scale with the launch: 1.3-1.6 x a 45 ms launch
            # overran by 15-25 ms). It must fit what is left at the edge quantile too.
            first = min(cap, remaining - (tail + last) / 2)
            size = self.fit.largest_within(first, c.min_micro_batch, c.max_micro_batch, False, cold)
            launch = Launch(size, self.fit.predict(size, False, cold)) if size else \
                self._fill(first, 0, cold, edge=False)
            if launch is not None and self.fit.predict(launch.size * launch.fraction, True, cold) <= remaining:
                return launch
            edge = True      # too little for two launches: this one is the last
        plan = min(s * remaining, cap)
        size = self.fit.largest_within(plan, c.min_micro_batch, c.max_micro_batch, edge, cold)
        if warm and edge and size < c.max_micro_batch:
            # What is left binds, so this is the window's last launch: fill it. Whole samples would leave up to
            # one sample's time (plus, when none fits, a whole launch's) idle; the same launch with one
            # sample more, each cut to the share of the sequence that fits, leaves almost none.
            fill = self._fill(plan, size, cold)
            if fill is not None:
                return fill
        probe = c.min_micro_batch * MIN_FRACTION
        if not size and w.busy_s == 0 and remaining > 0 and before_deadline(self.fit.predict(probe, edge, cold)) \
                and self._probe_due(
                w, -math.inf if self.fit.predict(probe, False, cold) <= remaining else self._last_launch):
            # The fit says not even the smallest batch fits an untouched budget. That may be stale
            # (slow outliers, a warm-up): re-measure with the smallest batch, at most once every
            # PROBE_EVERY windows, so a lease that is really too small costs at most that many overruns.
            # The probe is the cheapest launch there is (the smallest batch at the shortest prefix): what
            # is in doubt is whether the smallest launch fits, and a probe that does not fit overruns
            # by less. Old points far slower than the probe suggests are dropped as stale (see record).
            # Where even the ordinary (tail_quantile) margin says it does not fit, the probe is a
            # planned overrun, taken only when no micro-batch ran for PROBE_EVERY periods (then nothing
            # else re-measures the fit); while larger windows keep measuring, such a budget is too
            # small (on the bench host, 6 ms budgets: those probes were most windows over 10 %).
            self._last_probe = w.start
            self._probing = True
            return Launch(c.min_micro_batch, self.fit.predict(probe, edge, cold), MIN_FRACTION)
        if size:
            return Launch(size, self.fit.predict(size, edge, cold) if self.fit.ready else 0.0)
        return idle

    def _decide_kernel_bound(self, now: float, w: _Window, lease: LeaseTerms, lease_end: float,
                             pending_samples: int, step_samples: int) -> Decision:
        """The kernel is the bound (EnforcerConfig.kernel_bound): spend the window's CPU budget in launches
        of at most max_batch_fraction of the period, each ending before the lease's hard end (and the
        caller's deadline) at the launches' measured wall / CPU; the step as soon as it is due and the budget
        left covers it. No slot, phase, edge or probe rule: those kept cooperative work inside metered
        periods, which the kernel's 5 ms quota periods do now."""
        c = self.config
        hard_end = lease.expires_at if self.deadline is None else min(lease.expires_at, self.deadline)
        stretch = self.wall_stretch(0.5)
        left = self.busy_budget(w) - w.busy_s
        if left <= 0:
            return Idle(lease_end, "budget-spent")
        if self.deadline is not None and now >= self.deadline:
            return Idle(lease_end, "round-deadline")
        step_time = self.step_estimate()
        if pending_samples >= step_samples and now + step_time * stretch <= hard_end:
            return StepNow(step_time)
        plan = min(left, c.max_batch_fraction * lease.period_s, (hard_end - now) / stretch)
        # the smallest batch when none fits what is left: the kernel holds it to the quota, and its excess
        # over the window's budget is the next window's debt, so the budget's tail is not left idle
        size = max(c.min_micro_batch, self.fit.largest_within(plan, c.min_micro_batch, c.max_micro_batch, False,
                                                              self._cold(now))) if self.fit.ready else c.min_micro_batch
        if not self.fit.ready or now + self.fit.predict(size) * stretch <= hard_end:
            return Launch(size, self.fit.predict(size) if self.fit.ready else 0.0)
        return Idle(lease_end, "round-deadline" if self.deadline is not None and self.deadline < hard_end
                    else "budget-spent")

    def work_start(self, w: _Window | None = None) -> float:
        """When window `w`'s (the current one's) work may start: staggered, at its phase, no later than still
        leaves SLOT_STRETCH x the budget (see Meter); otherwise the window's start. Host work of the
        caller's that the window must hold (a cross-site exchange) starts no earlier either. inf without a
        window."""
        w = w or self.window
        if w is None:
            return math.inf
        lease = w.lease
        return w.start + max(0.0, min(self.config.phase_fraction * lease.period_s,
                                      lease.period_s - SLOT_STRETCH * lease.budget_s))

    def slot_end(self, w: _Window) -> float:
        """CPU meter: by when window `w`'s work ends (see Meter); inf on the wall meter or kernel-bound."""
        if self.meter == WALL or self.config.kernel_bound:
            return math.inf
        return self.work_start(w) + SLOT_MARGIN * self.wall_stretch(0.5) * w.lease.budget_s

    def wall_stretch(self, q: float = EDGE_QUANTILE) -> float:
        """Wall seconds a charged second of work may take: 1 on the wall meter; on the CPU meter the
        `q` quantile of recent launches' wall / CPU (a preempted launch takes longer than it uses)."""
        ratios = self._stretch_sorted
        if self.meter == WALL or len(ratios) < 3:
            return 1.0
        return max(1.0, ratios[min(len(ratios) - 1, int(q * len(ratios)))])

    def _charge(self, started: float, ended: float, cpu_s: float) -> float:
        """Lease seconds recorded work is charged (see Meter in the module doc)."""
        wall = ended - started
        if self.meter == WALL:
            return wall
        charged = min(cpu_s, wall * self.host_threads) / self.host_threads
        if charged > 0:
            self._stretch.append(wall / charged)
            self._stretch_sorted = sorted(self._stretch)
        return charged

    def _tail(self) -> float:
        """Upper-quantile time of the smallest launch, back to back with the one before it."""
        return self.fit.predict(self.config.min_micro_batch * MIN_FRACTION, edge=True)

    def _fill(self, plan: float, whole: int, cold: bool = False, edge: bool = True) -> Launch | None:
        """`whole` + 1 samples cut to a common fraction of the sequence so the launch's upper-quantile
        time fits `plan`; None when that fraction would be below MIN_FRACTION or is not needed."""
        c = self.config
        work = self.fit.work_within(plan, edge=edge, cold=cold)
        n = whole + 1
        if n > c.max_micro_batch or n < c.min_micro_batch or work <= whole:
            return None
        frac = math.floor(work / n * 64) / 64      # coarse steps: few distinct shapes on a device
        if frac < MIN_FRACTION or frac >= 1.0:
            return None
        return Launch(n, self.fit.predict(n * frac, edge=edge, cold=cold), frac)

    def busy_budget(self, w: _Window | None = None) -> float:
        """Busy time window `w` (the current one) may use: the lease's budget less its host CPU share
        (see the module doc); the lease's budget itself when no process CPU was noted."""
        w = w or self.window
        if w is None:
            return 0.0
        host = max(self.host_expected_s + self.host_reserve_s, w.host_s) / self.host_threads
        return max(0.0, w.lease.budget_s - host - w.debt_s)

    def _excess(self, w: _Window) -> float:
        """Busy time a full period's work plus host CPU took beyond its grant (0 without host readings)."""
        if self._cpu_mark is None:
            return 0.0
        # the peak tracker: a burst sets the expectation at once, a quiet period lowers it by HOST_DECAY.
        # Host work the caller announced (host_reserve_s: a checkpoint, an exchange) was reserved for when
        # it came; learning it too held its CPU back for ~10 periods after each one (5-7 % of the grant).
        if w.reserved_s > 0:
            self.host_expected_s = max(self.host_expected_s, w.host_s - w.reserved_s)
        else:
            self.host_expected_s = max(w.host_s, HOST_DECAY * self.host_expected_s + (1 - HOST_DECAY) * w.host_s)
        excess = w.busy_s + w.host_s / self.host_threads - w.lease.budget_s
        return min(max(0.0, excess), w.lease.budget_s)

    # --- measurements ----------------------------------------------------------------------------
    def note_process_cpu(self, now: float, cpu_s: float, threads: int = 1) -> None:
        """A reading `cpu_s` of the process CPU clock (all threads, e.g. time.process_time()) at `now`, in
        CPU execution mode only (see the module doc). The CPU since the last reading beyond what the work
        recorded since then used (its CPU, at most its wall time x `threads`) is host overhead, charged to
        the windows the interval since the last reading spans, pro rata (a window that ended meanwhile is
        closed with its share; none before the first window). Call it between launches: before `decide`
        and before `close_windows`."""
        self.host_threads = max(1, threads)
        mark, self._cpu_mark = self._cpu_mark, (now, cpu_s)
        own = min(self._work_cpu, self._work_wall * self.host_threads)
        self._work_cpu = self._work_wall = 0.0
        if mark is None or now <= mark[0]:
            return
        host = max(0.0, cpu_s - mark[1] - own)
        while self.window is not None:
            w = self.window
            t0, t1 = max(mark[0], w.start), min(now, w.end, w.lease.expires_at)
            if t1 > t0:
                self._charge_host(w, host * (t1 - t0) / (now - mark[0]), t0, t1)
            if t1 >= now:
                break
            self._advance(t1)          # the window ended before this reading: closed with its share
            if self.window is w:
                break

    def _charge_host(self, w: _Window, host: float, t0: float, t1: float) -> None:
        """Host CPU (core-seconds) that ran in [t0, t1] of window `w`."""
        w.host_s += host
        w.reserved_s = max(w.reserved_s, self.host_reserve_s)
        if host <= 0 or self.host_reserve_s <= 0:
            return
        slot_end = self.slot_end(w)
        if t1 > slot_end:
            # announced host work's share past the slot's end: the next window gives it back (see Meter).
            # Routine host CPU runs all period long and is the tracker's; counted here too, it cost the
            # next windows 2-4 ms each (15 % of the tokens).
            w.late_s += host * (t1 - max(t0, slot_end)) / (t1 - t0) / self.host_threads

    def record_micro_batch(self, size: int, started: float, ended: float, cpu_s: float = 0.0,
                           fraction: float = 1.0) -> None:
        """A micro-batch of `size` samples, each `fraction` of the full sequence, ran from `started` to `ended`."""
        work = size * fraction
        charged = self._charge(started, ended, cpu_s)
        if self.fit.ready and self.window is not None:
            # beyond even the edge quantile: the host is slower right now (the same interference slowed
            # two launches in a row 2.2x, the second one past the grant); the next plan is scaled by it
            slow = charged / max(self.fit.predict(work, True, self._cold(started)), 1e-9)
            self._slowdown = (ended, slow, self.window.start) if slow > 1.0 else None
        if self._probing:
            self._probing = False
            # per sample-equivalent plus one (the fixed cost): comparable across sizes, and for a whole
            # sample the same as per sample
            unit = charged / (work + 1.0)
            self.fit.keep(lambda b, t: t / (b + 1.0) <= 3 * unit)
        self.fit.add(work, charged, cold=self._cold(started))
        self._last_launch = max(self._last_launch, ended)
        self._account(started, ended, cpu_s, charged, samples=size)

    def record_step(self, started: float, ended: float, cpu_s: float = 0.0) -> None:
        charged = self._charge(started, ended, cpu_s)
        self.step_times.append(charged)
        self._account(started, ended, cpu_s, charged, step=True)

    def record_other(self, started: float, ended: float, cpu_s: float = 0.0) -> None:
        """Leased work that is neither a training micro-batch nor a step (validation chunks)."""
        self._account(started, ended, cpu_s, self._charge(started, ended, cpu_s))

    def _account(self, started: float, ended: float, cpu_s: float, charged: float, samples: int = 0,
                 step: bool = False) -> None:
        self._last_end = max(self._last_end, ended)
        self._mark = (ended, LOOP, self.deadline)
        self._work_cpu += cpu_s
        self._work_wall += ended - started
        w = self.window
        if w is None or started < w.start:
            return   # work of a window already closed (e.g. revoked mid-batch): its report is out
        w.busy_s += charged
        w.preempted_s += ended - started - charged
        w.cpu_s += cpu_s
        w.micro_batches += 1 if samples else 0
        w.samples += samples
        w.steps += 1 if step else 0
        if self.config.kernel_bound:   # past the window is the next window's; only past the lease overruns
            w.overrun_s = max(w.overrun_s, ended - w.lease.expires_at, 0.0)
            return
        over_budget = w.busy_s - w.lease.budget_s
        past_end = ended - min(w.end, w.lease.expires_at)
        w.overrun_s = max(w.overrun_s, over_budget, past_end, 0.0)

    def _close(self, at: float, end: str) -> None:
        self._attribute(at)
        w = self.window
        covered = max(0.0, min(at, w.end) - w.start)
        granted = min(w.lease.budget_s, covered)
        host = w.host_s / self.host_threads
        self._closed.append(WindowReport(w.lease.lease_id, w.lease.sm_count, w.start, covered, granted,
                                         w.busy_s, w.cpu_s, w.overrun_s, w.micro_batches, w.samples,
                                         w.steps, end, host, self._idle_causes(w, granted, host)))
        self.window = None

    def _idle_causes(self, w: _Window, granted: float, host: float) -> tuple[tuple[str, float], ...]:
        """granted - busy - host split by cause (module doc): the measured idle stretches in time order, up
        to what was idle; then, on the CPU meter, up to the wall time other processes took from the work
        (budget the window's wall time could not hold: host starvation); then the budget held back (host
        reserve, debt); then the closing term."""
        left = granted - w.busy_s - host
        out = dict.fromkeys(IDLE_CAUSES, 0.0)
        for cause, seconds in w.idle:
            if cause != SPENT and left > 0:
                # the enforcer's own choice is at most the busy budget it left unplanned; the rest of
                # that idle stretch is budget held back (below)
                take = min(seconds, left, w.unplanned_s - out[NOTHING_FITS]) if cause == NOTHING_FITS \
                    else min(seconds, left)
                out[cause] += take
                left -= take
        if left > 0 and self.meter == CPU_TIME:
            take = min(left, max(0.0, w.preempted_s))
            out[STARVED] += take
            left -= take
        expected = self.host_expected_s + self.host_reserve_s
        held_back = max(0.0, (max(expected, w.host_s) - w.host_s) / self.host_threads) + w.debt_s
        if left > 0:
            out[HOST_RESERVE] = min(left, held_back)
            left -= out[HOST_RESERVE]
        out[OTHER], out[BEYOND] = max(left, 0.0), min(left, 0.0)
        return tuple(out.items())

    def next_deadline(self) -> float | None:
        """When the enforcer next changes its mind without new input (period end or lease expiry)."""
        if self.window is None:
            return None
        return min(self.window.end, self.window.lease.expires_at)


def window_waterfall(r: WindowReport, units: int, used_ms: float, work_log=()) -> dict[str, float]:
    """A closed window's held -> used waterfall as UsageReport fields (lease.proto), in the units of
    `used_ms` (SM·ms, or core·ms on a CPU): granted = used + host + starved + the idle causes. `work_log`:
    (start, end, kind) of the leased work, for the warm-up and validation shares of `used_ms`."""
    ms = 1e3 * units
    busy_ms = r.busy_s * ms
    end = r.start + r.length_s
    wall = {"warm-up": 0.0, "eval": 0.0}
    for t0, t1, kind in work_log:
        if kind in wall and t0 >= r.start and t1 <= end + 1e-9:
            wall[kind] += t1 - t0
    share = used_ms / busy_ms if busy_ms > 0 else 0.0
    return {"host_sm_ms": r.host_s * ms, "starved_sm_ms": busy_ms - used_ms + r.idle(STARVED) * ms,
            "idle_nothing_fits_sm_ms": r.idle(NOTHING_FITS) * ms, "idle_round_wait_sm_ms": r.idle(ROUND_WAIT) * ms,
            "idle_host_reserve_sm_ms": r.idle(HOST_RESERVE) * ms, "idle_loop_sm_ms": r.idle(LOOP) * ms,
            "idle_other_sm_ms": r.idle(OTHER) * ms, "beyond_grant_sm_ms": -r.idle(BEYOND) * ms,
            "warm_up_sm_ms": wall["warm-up"] * ms * share, "eval_sm_ms": wall["eval"] * ms * share}
