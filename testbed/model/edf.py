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

from testbed.model.jit import njit
from testbed.model.phy import UL_SPREAD, ul_spill


@njit(cache=True, nogil=True)
def edf_serve_kernel(rows_slot, amt, n_backlog, start_slot, capacity, limit, per_cell, oldest, age_hist):
    """Serve in place.

    rows_slot (N,) arrival slot of each chunk, oldest first; amt (N, C) work per cell per chunk, its
    first `n_backlog` rows the backlog and then one row per slot of the period (drained in place);
    capacity (T,); limit (T, C); per_cell (T, C) zeros -> work served; oldest (T,) -> age in slots of
    the oldest work served in each slot; age_hist (B,) += work served by age (last bin: that or older).
    Returns the index of the first chunk that may still hold work.

    Float noise (below 1e-9 of the period's mean work per slot) is not queued: the MAC's cumulative
    sums leave such crumbs in slots without capacity, and limits that are sums of the very amounts they
    bound leave them of a chunk. Crumbs leave where they are: nothing is lost and no crumb waits."""
    n_rows, n_cells = amt.shape
    n_slots = capacity.shape[0]
    crumb = 1e-9 * amt.sum() / max(n_slots, 1)
    for t in range(n_slots):
        for c in range(n_cells):
            x = amt[n_backlog + t, c]
            if 0.0 < x <= crumb:
                per_cell[t, c] += x
                amt[n_backlog + t, c] = 0.0
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


@njit(cache=True, nogil=True)
def stage_kernel(E, nondef, is_u, is_dl, ul_weight, ul_budget, dl_budget, start_slot,
                 ul_rows, ul_amt, ul_k, ul_limit, dl_rows, dl_amt, dl_k, dl_limit,
                 ul_served, dl_served, ul_oldest, dl_oldest, ul_hist, dl_hist, demand, firsts):
    """A site's compute-aware stage for a period (see `ran`): UL best-effort admitted in U slots as far
    as its decode spill (`phy.ul_spill` of work / `ul_budget` SMs) fits under E next to
    `nondef`, a U slot's share of room in proportion to its weight where decode windows overlap; then
    DL fills what is left under E in D/S slots. Both directions served by `edf_serve_kernel`; writes
    the per-cell service, ages, histograms (work units), `demand` (SMs), and the first live chunk of
    each direction's backlog into `firsts`."""
    T = nondef.shape[0]
    n_spread = len(UL_SPREAD)  # the slots a U slot's decode spills into
    room = np.empty(T)
    for t in range(T):
        room[t] = max(E - nondef[t], 0.0) if E < np.inf else np.inf
    ul_cap = np.zeros(T)
    for t in range(T):
        if is_u[t]:
            cap = np.inf
            for k in range(1, n_spread + 1):
                if t + k < T and ul_weight[t + k] > 0:
                    cap = min(cap, room[t + k] / ul_weight[t + k])
            ul_cap[t] = ul_budget * cap
    firsts[0] = edf_serve_kernel(ul_rows, ul_amt, ul_k, start_slot, ul_cap, ul_limit, ul_served, ul_oldest,
                                 ul_hist)
    spill = ul_spill(ul_served.sum(axis=1) / ul_budget)
    dl_cap = np.zeros(T)
    for t in range(T):
        if is_dl[t]:
            dl_cap[t] = dl_budget * max(room[t] - spill[t], 0.0)
    firsts[1] = edf_serve_kernel(dl_rows, dl_amt, dl_k, start_slot, dl_cap, dl_limit, dl_served, dl_oldest,
                                 dl_hist)
    demand[:] = nondef + spill + dl_served.sum(axis=1) / dl_budget


@njit(cache=True, nogil=True)
def stage_sites_kernel(active, E, nondef, is_u, is_dl, ul_weight, ul_budget, dl_budget, ul_wpb, dl_wpb, start_slot,
                       ul_bl_slots, ul_bl_amt, ul_bl_off, dl_bl_slots, dl_bl_amt, dl_bl_off,
                       be_ul, be_dl, head_ul, head_dl, demand, added_slots,
                       out_ul_slots, out_ul_amt, out_ul_off, out_dl_slots, out_dl_amt, out_dl_off, left, stage_hist):
    """`stage_kernel` for every `active` site of a period in one call (a per-site call from Python cost more
    than the stage itself at a hundred sites and up).

    Per site s: its backlog is rows `*_bl_off[s]:*_bl_off[s + 1]` of the packed `*_bl_slots` / `*_bl_amt`;
    be_* / head_* (T, S, C) are the MAC's best-effort bytes served and the PRB headroom left, in bytes
    (work = bytes x `*_wpb`); be_* are rewritten in place with the bytes the stage lets leave, `demand`
    (T, S) and `added_slots` (S,) (oldest work served, slots) are written for active sites, the packed
    backlog left is written to `out_*` (offsets (S + 1,)), `left` (2, S) is the work it holds (UL, DL),
    and the served work's ages go into `stage_hist` (B,) in bytes."""
    T, S, C = be_ul.shape
    B = stage_hist.shape[0]
    n_ul = 0
    n_dl = 0
    for s in range(S):
        out_ul_off[s] = n_ul
        out_dl_off[s] = n_dl
        if not active[s]:
            continue
        k_ul, o_ul = ul_bl_off[s + 1] - ul_bl_off[s], ul_bl_off[s]
        k_dl, o_dl = dl_bl_off[s + 1] - dl_bl_off[s], dl_bl_off[s]
        ul_rows = np.empty(k_ul + T, dtype=np.int64)
        dl_rows = np.empty(k_dl + T, dtype=np.int64)
        ul_amt = np.empty((k_ul + T, C))
        dl_amt = np.empty((k_dl + T, C))
        for r in range(k_ul):
            ul_rows[r] = ul_bl_slots[o_ul + r]
            ul_amt[r] = ul_bl_amt[o_ul + r]
        for r in range(k_dl):
            dl_rows[r] = dl_bl_slots[o_dl + r]
            dl_amt[r] = dl_bl_amt[o_dl + r]
        ul_limit = np.empty((T, C))
        dl_limit = np.empty((T, C))
        for t in range(T):
            ul_rows[k_ul + t] = start_slot + t
            dl_rows[k_dl + t] = start_slot + t
            for c in range(C):
                wu = ul_wpb * be_ul[t, s, c]
                wd = dl_wpb * be_dl[t, s, c]
                ul_amt[k_ul + t, c] = wu
                dl_amt[k_dl + t, c] = wd
                # each cell carries at most its own PRB-MAC output plus its PRB headroom in a slot
                ul_limit[t, c] = wu + ul_wpb * head_ul[t, s, c]
                dl_limit[t, c] = wd + dl_wpb * head_dl[t, s, c]
        nd = np.ascontiguousarray(nondef[:, s])
        ul_served = np.zeros((T, C))
        dl_served = np.zeros((T, C))
        oldest = np.zeros((2, T), dtype=np.int64)
        hist = np.zeros((2, B))
        dem = np.empty(T)
        firsts = np.zeros(2, dtype=np.int64)
        stage_kernel(E[s], nd, np.ascontiguousarray(is_u[:, s]), np.ascontiguousarray(is_dl[:, s]),
                     np.ascontiguousarray(ul_weight[:, s]), ul_budget, dl_budget, start_slot,
                     ul_rows, ul_amt, k_ul, ul_limit, dl_rows, dl_amt, k_dl, dl_limit,
                     ul_served, dl_served, oldest[0], oldest[1], hist[0], hist[1], dem, firsts)
        for t in range(T):
            demand[t, s] = dem[t]
            for c in range(C):
                be_ul[t, s, c] = ul_served[t, c] / ul_wpb
                be_dl[t, s, c] = dl_served[t, c] / dl_wpb
        added_slots[s] = oldest.max()
        for b in range(B):
            stage_hist[b] += hist[0, b] / ul_wpb + hist[1, b] / dl_wpb
        for r in range(firsts[0], k_ul + T):
            tot = ul_amt[r].sum()
            if tot > 0.0:
                out_ul_slots[n_ul] = ul_rows[r]
                out_ul_amt[n_ul] = ul_amt[r]
                n_ul += 1
                left[0, s] += tot
        for r in range(firsts[1], k_dl + T):
            tot = dl_amt[r].sum()
            if tot > 0.0:
                out_dl_slots[n_dl] = dl_rows[r]
                out_dl_amt[n_dl] = dl_amt[r]
                n_dl += 1
                left[1, s] += tot
    out_ul_off[S] = n_ul
    out_dl_off[S] = n_dl
