"""MAC scheduling over a whole period at once: per-cell slice queues with RC PRB quotas, and the
site's compute-aware stage that keeps PHY demand inside an SM envelope.

Queues follow Lindley's recursion q_t = max(q_{t-1} + a_t - c_t, 0). When the per-slot capacity c_t is
known in advance it has the closed form q_t = S_t - min(-q_0, min_{k<=t} S_k) with S = cumsum(a - c),
so a period of slots for every cell is a few cumulative numpy calls instead of a Python loop. Priority
makes that possible: the protected slice's capacity does not depend on best-effort, and best-effort
gets what the protected slice left in the same slot.

Quota semantics (O-RAN RRM policy ratios, E2SM-RC Style 2 Action 6), as fractions of the cell's PRBs:
- max: a slice never gets more than max x PRBs in a slot;
- dedicated: PRBs that no other slice may use, even when idle;
- min: PRBs kept for the slice; the model keeps them out of the other slice's reach (a conservative
  reading: the real scheduler may lend them when the slice is idle).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from testbed.model.edf import edf_serve_kernel


def lindley(x: np.ndarray, q0: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Queue after each slot of q_t = max(q_{t-1} + x_t, 0) along axis 0, starting from q0. `out` may be x."""
    s = np.cumsum(x, axis=0, out=out)
    m = np.fmin.accumulate(s, axis=0)  # fmin: no NaN bookkeeping, ~1.5x faster than minimum here
    np.fmin(m, -np.asarray(q0), out=m)
    s -= m
    return s


def served_from(q: np.ndarray, q0: np.ndarray, a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """What left the queue in each slot: q_{t-1} + a_t - q_t (clipped at float noise)."""
    out = np.subtract(a, q, out=out)
    out[0] += q0
    out[1:] += q[:-1]
    np.maximum(out, 0.0, out=out)
    return out


def fifo_delay_slots(a: np.ndarray, served: np.ndarray, q0: np.ndarray, queue: np.ndarray | None = None) -> np.ndarray:
    """Per-slot FIFO queueing delay (slots) of the work leaving each queue, for many queues at once.

    a, served (T, ...) arrivals and departures of independent FIFO queues; q0 (...) work already queued
    at the start (taken as arrived in the slot before). The delay of slot t is that of the work in the
    middle of what left in t: t - (slot in which the cumulative arrivals reached that point). With
    `queue` (the queue after each slot) only slots that started with a backlog are searched: the others
    served only fresh work (delay 0). Dense form of `fifo_backlog_delays`."""
    T = a.shape[0]
    shape = (1, T, -1)
    d = fifo_backlog_delays(a.reshape(shape), served.reshape(shape), np.asarray(q0, dtype=float).reshape(1, -1),
                            None if queue is None else queue.reshape(shape))
    delay = np.zeros((T, d.n_queues), dtype=np.intp)
    delay[d.slot, d.queue] = d.delay
    return delay.reshape(served.shape)


@dataclass(frozen=True)
class BacklogDelays:
    """Delays of the slots that served work while their queue had a backlog (every other slot served only
    fresh work: delay 0). Entries are sorted by queue, then slot; `queue` indexes the flattened (B, Q)."""

    n_queues: int
    queue: np.ndarray
    slot: np.ndarray
    delay: np.ndarray  # slots
    served: np.ndarray  # work left in that slot (the delay's weight)


def fifo_backlog_delays(a: np.ndarray, served: np.ndarray, q0: np.ndarray, queue: np.ndarray | None) -> BacklogDelays:
    """FIFO delays of B x Q independent queues; a, served, queue (B, T, Q), q0 (B, Q).

    One searchsorted for all queues: each queue's cumulative arrival curve is shifted by a per-queue
    offset larger than any total, which keeps the concatenated curves sorted; the curves are laid out
    queue by queue (contiguous along time), so the search keys come out ascending too, which numpy's
    searchsorted exploits. Cumulative departures need no second scan: by conservation, served through
    slot t = q0 + arrivals through t - queue after t. Without `queue` every slot that served is searched."""
    B, T, Q = a.shape
    n = B * Q
    cum = np.empty((B, Q, T + 1))
    cum[..., 0] = q0
    np.cumsum(a.transpose(0, 2, 1), axis=-1, out=cum[..., 1:])
    cum[..., 1:] += q0[..., None]
    if queue is None:
        queue = cum[..., 1:].transpose(0, 2, 1) - np.cumsum(served, axis=1)
        backlog = None
    else:
        backlog = np.empty((B, Q, T), dtype=bool)
        np.greater(q0, 1e-6, out=backlog[..., 0])
        np.greater(queue.transpose(0, 2, 1)[..., :-1], 1e-6, out=backlog[..., 1:])
    cum = cum.reshape(n, T + 1)
    step = float(cum[:, -1].max()) * 2 + 1.0
    offs = np.arange(n) * step
    cum += offs[:, None]
    # Float dust (~1e-9 bytes) left by the queue algebra is neither a departure nor a backlog.
    mask = np.greater(served.transpose(0, 2, 1), 1e-6)
    if backlog is not None:
        mask &= backlog
    f = np.flatnonzero(mask)  # queue-major: index j * T + t
    j, t = np.divmod(f, T)
    b, q = np.divmod(j, Q)
    at = (b * T + t) * Q + q  # the same entries in the (B, T, Q) arrays
    w = served.reshape(-1)[at]
    mid = cum.ravel()[f + j + 1] - queue.reshape(-1)[at] - 0.5 * w  # middle of the work leaving in slot t
    pos = np.searchsorted(cum.ravel(), mid, side="left") - j * (T + 1)
    # index k of a queue's curve means the work arrived in slot k - 1
    delay = np.maximum(t - np.clip(pos, 0, T) + 1, 0)
    return BacklogDelays(n_queues=n, queue=j, slot=t, delay=delay, served=w)


@dataclass(frozen=True)
class SliceSchedule:
    """One direction's MAC result for a period. Shapes (L=2, T, S, C) except where noted."""

    served: np.ndarray  # bytes
    queue: np.ndarray  # bytes left after each slot
    capacity: np.ndarray  # bytes the slice could have been served in each slot
    be_headroom: np.ndarray  # (T, S, C) bytes the best-effort slice could still have been served


def schedule_cells(a: np.ndarray, cap_prb: np.ndarray, bpp: np.ndarray, quota: np.ndarray,
                   q0: np.ndarray) -> SliceSchedule:
    """Serve slice queues by priority (slice 0 protected, slice 1 best-effort) under quotas.

    a (2,T,S,C) arriving bytes per slice (slice-first: each slice's array is contiguous); cap_prb (T,S,C)
    PRBs of this direction in each slot (0 when the TDD slot is of the other direction); bpp (T,S,C) bytes
    per PRB; quota (S,C,2,3) = (min, max, dedicated) fractions; q0 (2,S,C) queues at period start.
    Works in bytes (PRB shares x bytes per PRB) with every period-sized array written in place; the
    quota terms that are no-ops (no dedicated share, max 100 %) are skipped."""
    qmin, qmax, qded = quota[..., 0], quota[..., 1], quota[..., 2]
    served = np.empty_like(a)
    queue = np.empty_like(a)
    capacity = np.empty_like(a)
    cap_bytes = np.multiply(cap_prb, bpp)
    # Protected: up to its max, never into best-effort's dedicated or min share.
    np.multiply(cap_bytes, np.minimum(qmax[..., 0], 1.0 - np.maximum(qded[..., 1], qmin[..., 1])), out=capacity[0])
    np.subtract(a[0], capacity[0], out=queue[0])
    lindley(queue[0], q0[0], out=queue[0])
    served_from(queue[0], q0[0], a[0], out=served[0])
    # Best-effort: up to its max, in what the protected slice left (its dedicated PRBs stay out of reach).
    cb = capacity[1]
    if np.any(qded[..., 0] > 0):
        np.maximum(served[0], cap_bytes * qded[..., 0], out=cb)
        np.subtract(cap_bytes, cb, out=cb)
    else:
        np.subtract(cap_bytes, served[0], out=cb)
    if np.any(qmax[..., 1] < 1):
        np.minimum(cb, cap_bytes * qmax[..., 1], out=cb)
    np.maximum(cb, 0.0, out=cb)
    np.subtract(a[1], cb, out=queue[1])
    lindley(queue[1], q0[1], out=queue[1])
    served_from(queue[1], q0[1], a[1], out=served[1])
    head = np.subtract(cb, served[1], out=cap_bytes)
    np.maximum(head, 0.0, out=head)
    return SliceSchedule(served=served, queue=queue, capacity=capacity, be_headroom=head)


@dataclass
class FifoBacklog:
    """Best-effort work waiting in a site's compute-aware stage, oldest first: arrival slot and the
    amount per cell of each chunk. Served earliest-deadline-first (every best-effort byte has the same
    delay budget, so that is the order of arrival) by `fifo_serve`."""

    slots: np.ndarray  # (K,) absolute arrival slot
    amounts: np.ndarray  # (K, C) work units per cell

    @classmethod
    def empty(cls, n_cells: int) -> FifoBacklog:
        return cls(np.zeros(0, dtype=np.int64), np.zeros((0, n_cells)))

    @cached_property
    def total(self) -> float:
        """All waiting work (a backlog is never changed in place: the stage replaces it)."""
        return float(self.amounts.sum())


@dataclass(frozen=True)
class FifoResult:
    per_cell: np.ndarray  # (T, C) work served per cell per slot
    delay_slots: np.ndarray  # (T,) age (slots) of the oldest work leaving in each slot
    backlog: FifoBacklog


def fifo_serve(backlog: FifoBacklog, start_slot: int, arrivals: np.ndarray, capacity: np.ndarray,
               limit: np.ndarray | None = None, age_hist: np.ndarray | None = None) -> FifoResult:
    """Serve the site's deferred work slot by slot, oldest first across cells (see `edf`).

    arrivals (T, C) work entering the stage; capacity (T,) the most work the site's compute room lets
    leave in each slot; `limit` (T, C) the most a cell can carry in a slot (its PRBs; none: unlimited).
    A cell at its limit does not hold the others back: the slot's room goes to the oldest work that
    can leave. `age_hist`, if given, accumulates the work served by its age in slots."""
    T, C = arrivals.shape
    K = len(backlog.slots)
    rows_slot = np.concatenate([backlog.slots.astype(np.int64), start_slot + np.arange(T, dtype=np.int64)])
    amt = np.concatenate([backlog.amounts, arrivals], axis=0).astype(np.float64)  # a copy: drained in place
    cap = np.ascontiguousarray(capacity, dtype=np.float64)
    lim = np.full((T, C), np.inf) if limit is None else np.ascontiguousarray(limit, dtype=np.float64)
    per_cell = np.zeros((T, C))
    oldest = np.zeros(T, dtype=np.int64)
    hist = age_hist if age_hist is not None else np.zeros(1)
    # Float noise (below 1e-9 of the period's mean work per slot) is not queued: the MAC's cumulative sums
    # leave such crumbs in slots without capacity, and limits that are sums of the very amounts they bound
    # leave them of a chunk. Crumbs leave where they are, so nothing is lost and no crumb waits a period.
    crumb = 1e-9 * float(amt.sum()) / max(T, 1)
    noise = amt[K:] <= crumb
    per_cell[noise] = amt[K:][noise]
    amt[K:][noise] = 0.0
    first = edf_serve_kernel(rows_slot, amt, K, int(start_slot), cap, lim, per_cell, oldest, hist, crumb)
    rest = amt[first:]
    keep = rest @ np.ones(C) > 0.0
    return FifoResult(per_cell=per_cell, delay_slots=oldest,
                      backlog=FifoBacklog(rows_slot[first:][keep], rest[keep]))
