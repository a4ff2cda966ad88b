"""MAC scheduling over a whole period at once: per-cell slice queues with RC PRB quotas, and the
site's compute-aware stage that keeps PHY demand inside an SM envelope.

Queues follow Lindley's recursion q_t = max(q_{t-1} + a_t - c_t, 0), slot by slot for every cell in one
compiled pass (`mac_kernel`; numba, see `jit`): the protected slice first, then best-effort in what
the protected slice left in the same slot. (A closed form over numpy cumulative sums did the same at
a third of the speed, and could not express the compute-aware stage's cross-cell service at all.)

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
from testbed.model.jit import njit


@njit(cache=True, nogil=True)
def mac_delay_kernel(a, served, q0, hist):
    """FIFO ages of the bytes that left independent queues, into `hist` (L, B) by slice (last bin: that
    age or older). a, served (L, T, N) arrivals and departures per slice, slot and queue; q0 (L, N) the
    backlog at the start, taken as arrived the slot before. Each byte counts at its own age: what left
    slot t from the chunk that arrived in slot k waited t - k slots."""
    L, T, N = a.shape
    last = hist.shape[1] - 1
    for sl in range(L):
        for n in range(N):
            old = q0[sl, n]
            k = 0
            left = a[sl, 0, n] if T > 0 else 0.0
            for t in range(T):
                x = served[sl, t, n]
                if old > 0.0 and x > 0.0:
                    y = min(old, x)
                    hist[sl, min(t + 1, last)] += y
                    old -= y
                    x -= y
                while x > 0.0 and k <= t:
                    y = min(left, x)
                    if y > 0.0:
                        hist[sl, min(t - k, last)] += y
                        left -= y
                        x -= y
                    if left <= 0.0:
                        k += 1
                        left = a[sl, k, n] if k < T else 0.0
                if x > 0.0:  # float noise of the queue's cumulative sums: it left now
                    hist[sl, 0] += x


@dataclass(frozen=True)
class SliceSchedule:
    """One direction's MAC result for a period. Shapes (L=2, T, S, C) except where noted."""

    served: np.ndarray  # bytes
    queue: np.ndarray  # bytes left after each slot
    capacity: np.ndarray  # bytes the slice could have been served in each slot
    be_headroom: np.ndarray  # (T, S, C) bytes the best-effort slice could still have been served
    served_limited: np.ndarray | None = None  # (2, T, S, C) of `served`: the grant-limited UE's (see `UeLimits`)


@dataclass
class UeLimits:
    """One UE per (site, cell, slice) whose grants are capped (srsRAN's per-UE grant-size limits, which its DU
    sets from an RC slice-quota control: testbed.e2node.dialects). `share` (S, C, 2): the UE's share of its
    slice's traffic in the cell (0 = no limited UE there); `cap` (S, C, 2): its largest grant, as a fraction of
    the cell's PRBs; `queue` (2, S, C): its own backlog, part of the slice's. Inside the slice the UE and the
    slice's other UEs share the slice's capacity in proportion to what each can take in the slot."""

    share: np.ndarray
    cap: np.ndarray
    queue: np.ndarray
    tag: np.ndarray     # (S, C, 2) who the limited UE is, for the caller's reports (its UE ID); -1 = none

    @classmethod
    def none(cls, S: int, C: int) -> UeLimits:
        return cls(np.zeros((S, C, 2)), np.ones((S, C, 2)), np.zeros((2, S, C)), np.full((S, C, 2), -1))


def schedule_cells(a: np.ndarray, cap_prb: np.ndarray, bpp: np.ndarray, quota: np.ndarray,
                   q0: np.ndarray, limits: UeLimits | None = None) -> SliceSchedule:
    """Serve slice queues by priority (slice 0 protected, slice 1 best-effort) under quotas.

    a (2,T,S,C) arriving bytes per slice (slice-first: each slice's array is contiguous); cap_prb (T,S,C)
    PRBs of this direction in each slot (0 when the TDD slot is of the other direction); bpp (T,S,C) bytes
    per PRB; quota (S,C,2,3) = (min, max, dedicated) fractions; q0 (2,S,C) queues at period start.
    Works in bytes (PRB shares x bytes per PRB); one compiled pass over the slots (`mac_kernel`).
    `limits`: grant-limited UEs (`UeLimits`); their backlog is part of q0 and is updated in place."""
    L, T, S, C = a.shape
    N = S * C
    served, queue, capacity = (np.empty_like(a) for _ in range(3))
    head = np.empty((T, S, C))
    args = (np.ascontiguousarray(a).reshape(L, T, N), np.ascontiguousarray(cap_prb).reshape(T, N),
            np.ascontiguousarray(bpp).reshape(T, N), np.ascontiguousarray(quota).reshape(N, 2, 3),
            np.ascontiguousarray(q0, dtype=np.float64).reshape(L, N),
            served.reshape(L, T, N), queue.reshape(L, T, N), capacity.reshape(L, T, N), head.reshape(T, N))
    if limits is None or not limits.share.any():
        mac_kernel(*args)
        return SliceSchedule(served=served, queue=queue, capacity=capacity, be_headroom=head)
    q_lim = np.ascontiguousarray(limits.queue, dtype=np.float64).reshape(L, N).copy()
    served_lim = np.zeros((L, T, S, C))
    mac_kernel_limited(*args, np.ascontiguousarray(limits.share, dtype=np.float64).reshape(N, 2),
                       np.ascontiguousarray(limits.cap, dtype=np.float64).reshape(N, 2), q_lim,
                       served_lim.reshape(L, T, N))
    limits.queue = q_lim.reshape(L, S, C)
    return SliceSchedule(served=served, queue=queue, capacity=capacity, be_headroom=head, served_limited=served_lim)


@njit(cache=True, nogil=True)
def _slice_slot(x_all, c, share, ucap_bytes, q_lim, a_t):
    """One slice in one slot: (served, queue left, the limited UE's served, its queue left). `x_all` = the
    slice's backlog + arrivals, `c` its capacity; with a limited UE, its part of the arrivals (`share`) joins
    its own backlog `q_lim`, it takes at most `ucap_bytes`, and the capacity is split in proportion."""
    if share <= 0.0:
        q = max(x_all - c, 0.0)
        return max(x_all - q, 0.0), q, 0.0, 0.0
    xu = q_lim + share * a_t
    xo = max(x_all - xu, 0.0)
    du = min(xu, ucap_bytes)
    tot = du + xo
    if tot <= c:
        su, so = du, xo
    else:
        f = c / tot if tot > 0.0 else 0.0
        su, so = du * f, xo * f
    return su + so, (xu - su) + (xo - so), su, xu - su


@njit(cache=True, nogil=True)
def _protected_capacity(cap, quota_n):
    """The protected slice's bytes in a slot: up to its max, never into best-effort's dedicated or min share."""
    return cap * min(quota_n[0, 1], 1.0 - max(quota_n[1, 2], quota_n[1, 0]))


@njit(cache=True, nogil=True)
def _best_effort_capacity(cap, s0, quota_n):
    """Best-effort's bytes in a slot: what the protected slice left (its dedicated PRBs out of reach), under its max."""
    cb = cap - max(s0, cap * quota_n[0, 2])
    return max(min(cb, cap * quota_n[1, 1]), 0.0)


@njit(cache=True, nogil=True)
def mac_kernel(a, cap_prb, bpp, quota, q0, served, queue, capacity, head):
    """Slot by slot, for every cell n: Lindley's recursion for the protected slice under its share, then
    for best-effort in what the protected slice left (its dedicated PRBs stay out of reach) under its
    max. a, served, queue, capacity (2, T, N); cap_prb, bpp, head (T, N); quota (N, 2, 3); q0 (2, N)."""
    T, N = cap_prb.shape
    q_p = q0[0].copy()
    q_b = q0[1].copy()
    for t in range(T):
        for n in range(N):
            cap = cap_prb[t, n] * bpp[t, n]
            c0 = _protected_capacity(cap, quota[n])
            x = q_p[n] + a[0, t, n]
            q = max(x - c0, 0.0)
            s0 = max(x - q, 0.0)
            q_p[n] = q
            served[0, t, n], queue[0, t, n], capacity[0, t, n] = s0, q, c0
            cb = _best_effort_capacity(cap, s0, quota[n])
            x = q_b[n] + a[1, t, n]
            q = max(x - cb, 0.0)
            s1 = max(x - q, 0.0)
            q_b[n] = q
            served[1, t, n], queue[1, t, n], capacity[1, t, n] = s1, q, cb
            head[t, n] = max(cb - s1, 0.0)


@njit(cache=True, nogil=True)
def mac_kernel_limited(a, cap_prb, bpp, quota, q0, served, queue, capacity, head, share, ucap, q_lim, served_lim):
    """`mac_kernel` with grant-limited UEs (`UeLimits`): share, ucap (N, 2), q_lim (2, N) in place, served_lim
    (2, T, N). A kernel of its own so that the common case, no UE limited, runs the plain recursion at its
    speed (one kernel with the branch cost `weaver bench sim` a third of its rate)."""
    T, N = cap_prb.shape
    q_p = q0[0].copy()
    q_b = q0[1].copy()
    for t in range(T):
        for n in range(N):
            cap = cap_prb[t, n] * bpp[t, n]
            c0 = _protected_capacity(cap, quota[n])
            s0, q, su, qu = _slice_slot(q_p[n] + a[0, t, n], c0, share[n, 0], ucap[n, 0] * cap, q_lim[0, n],
                                        a[0, t, n])
            q_p[n], q_lim[0, n], served_lim[0, t, n] = q, qu, su
            served[0, t, n], queue[0, t, n], capacity[0, t, n] = s0, q, c0
            cb = _best_effort_capacity(cap, s0, quota[n])
            s1, q, su, qu = _slice_slot(q_b[n] + a[1, t, n], cb, share[n, 1], ucap[n, 1] * cap, q_lim[1, n],
                                        a[1, t, n])
            q_b[n], q_lim[1, n], served_lim[1, t, n] = q, qu, su
            served[1, t, n], queue[1, t, n], capacity[1, t, n] = s1, q, cb
            head[t, n] = max(cb - s1, 0.0)


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
class SiteBacklogs:
    """Every site's `FifoBacklog` of one direction, packed for `edf.stage_sites_kernel`: site s's chunks are
    rows `offsets[s]:offsets[s + 1]`, oldest first; `work` (S,) is what each site's chunks hold."""

    slots: np.ndarray  # (K,) absolute arrival slot
    amounts: np.ndarray  # (K, C) work units per cell
    offsets: np.ndarray  # (S + 1,)
    work: np.ndarray  # (S,)

    @classmethod
    def empty(cls, n_sites: int, n_cells: int) -> SiteBacklogs:
        return cls(np.zeros(0, dtype=np.int64), np.zeros((0, n_cells)), np.zeros(n_sites + 1, dtype=np.int64),
                   np.zeros(n_sites))

    def has_work(self) -> np.ndarray:
        """(S,) whether a site holds any chunk (a chunk is kept only while it holds work)."""
        return np.diff(self.offsets) > 0

    def site(self, s: int) -> FifoBacklog:
        lo, hi = self.offsets[s], self.offsets[s + 1]
        return FifoBacklog(self.slots[lo:hi].copy(), self.amounts[lo:hi].copy())


@dataclass(frozen=True)
class FifoResult:
    per_cell: np.ndarray  # (T, C) work served per cell per slot
    delay_slots: np.ndarray  # (T,) age (slots) of the oldest work leaving in each slot
    backlog: FifoBacklog


@dataclass
class EdfInput:
    """One direction's work for `edf` kernels: the backlog's chunks, then one chunk per slot of the period
    (drained in place), and the per-cell service the kernel writes."""

    rows: np.ndarray  # (K + T,) arrival slot
    amounts: np.ndarray  # (K + T, C)
    n_backlog: int
    served: np.ndarray  # (T, C)

    @classmethod
    def build(cls, backlog: FifoBacklog, start_slot: int, arrivals: np.ndarray) -> EdfInput:
        T, C = arrivals.shape
        K = len(backlog.slots)
        rows = np.empty(K + T, dtype=np.int64)
        rows[:K] = backlog.slots
        rows[K:] = np.arange(start_slot, start_slot + T)
        amt = np.empty((K + T, C))
        amt[:K] = backlog.amounts
        amt[K:] = arrivals
        return cls(rows, amt, K, np.zeros((T, C)))

    def left(self, first: int) -> FifoBacklog:
        """The backlog after the kernel ran (`first`: its first chunk that may still hold work)."""
        rest = self.amounts[first:]
        keep = rest @ np.ones(rest.shape[1]) > 0.0
        return FifoBacklog(self.rows[first:][keep], rest[keep])


def fifo_serve(backlog: FifoBacklog, start_slot: int, arrivals: np.ndarray, capacity: np.ndarray,
               limit: np.ndarray | None = None, age_hist: np.ndarray | None = None) -> FifoResult:
    """Serve the site's deferred work slot by slot, oldest first across cells (see `edf`).

    arrivals (T, C) work entering the stage; capacity (T,) the most work the site's compute room lets
    leave in each slot; `limit` (T, C) the most a cell can carry in a slot (its PRBs; none: unlimited).
    A cell at its limit does not hold the others back: the slot's room goes to the oldest work that
    can leave. `age_hist`, if given, accumulates the work served by its age in slots."""
    T, C = arrivals.shape
    x = EdfInput.build(backlog, start_slot, arrivals)
    cap = np.ascontiguousarray(capacity, dtype=np.float64)
    lim = np.full((T, C), np.inf) if limit is None else np.ascontiguousarray(limit, dtype=np.float64)
    oldest = np.zeros(T, dtype=np.int64)
    hist = age_hist if age_hist is not None else np.zeros(1)
    first = edf_serve_kernel(x.rows, x.amounts, x.n_backlog, int(start_slot), cap, lim, x.served, oldest, hist)
    return FifoResult(per_cell=x.served, delay_slots=oldest, backlog=x.left(first))
