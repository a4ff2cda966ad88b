"""Earliest-deadline-first service of a site's deferred best-effort work, slot by slot, with per-cell limits.

The compute-aware stage holds every cell's deferred best-effort work in one site-wide order of arrival
(equal delay budgets make that earliest-deadline-first). In each slot it has `capacity` work units of
compute room, and each cell can carry at most `limit[t, c]` (its PRBs): the slot serves the oldest
work of any cell that can still carry, so a saturated cell never blocks the others (work-conserving;
the earlier interpolated FIFO pushed a blocked cell's excess back to the head and stalled the site).

The greedy is sequential by nature (what a cell carries now changes what waits later), so it is one
compiled loop: numba when installed, the same function in plain Python otherwise (identical results,
about a hundred times slower). Each step drains a chunk, exhausts a cell's limit or the slot's room,
so a period costs O((backlog + slots) x cells).
"""
from __future__ import annotations

import numpy as np

try:  # numba is in the testbed extra; the model still runs (slowly) without it
    from numba import njit
except ImportError:  # pragma: no cover - exercised only where numba is missing
    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda f: f)


@njit(cache=True, nogil=True)
def edf_serve_kernel(rows_slot, amt, n_backlog, start_slot, capacity, limit, per_cell, oldest, age_hist, crumb):
    """Serve in place.

    rows_slot (N,) arrival slot of each chunk, oldest first; amt (N, C) work per cell per chunk, its
    first `n_backlog` rows the backlog and then one row per slot of the period (drained in place);
    capacity (T,); limit (T, C); per_cell (T, C) zeros -> work served; oldest (T,) -> age in slots of
    the oldest work served in each slot; age_hist (B,) += work served by age (last bin: that or older);
    a chunk's remainder up to `crumb` (float noise) leaves with it rather than queueing on its own.
    Returns the index of the first chunk that may still hold work."""
    n_rows, n_cells = amt.shape
    n_slots = capacity.shape[0]
    last_bin = age_hist.shape[0] - 1
    head = np.zeros(n_cells, dtype=np.int64)  # per cell: first chunk that may hold its work
    lim = np.empty(n_cells)
    for t in range(n_slots):
        visible = n_backlog + t + 1
        rem = capacity[t]
        for c in range(n_cells):
            lim[c] = limit[t, c]
        now = start_slot + t
        while rem > 0.0:
            best, best_row = -1, visible
            for c in range(n_cells):
                if lim[c] <= 0.0:
                    continue
                h = head[c]
                while h < visible and amt[h, c] <= 0.0:
                    h += 1
                head[c] = h
                if h < best_row:
                    best, best_row = c, h
            if best < 0:
                break
            left = amt[best_row, best]
            x = min(rem, lim[best], left)
            if left - x <= crumb:
                x = left
            amt[best_row, best] = 0.0 if x == left else left - x
            rem = max(rem - x, 0.0)
            lim[best] = max(lim[best] - x, 0.0)
            per_cell[t, best] += x
            age = now - rows_slot[best_row]
            if age > oldest[t]:
                oldest[t] = age
            age_hist[min(age, last_bin)] += x
    first = n_rows
    for c in range(n_cells):
        h = head[c]
        while h < n_rows and amt[h, c] <= 0.0:
            h += 1
        if h < first:
            first = h
    return first
