"""Traffic traces: a seeded synthetic generator with site archetypes, and CSV replay.

Generator (compute-and-training-facts.md section 3.2, tag D): the load multiplier of site s at time t is
    lambda_s(t) = scale_s * [rho + (1 - rho) * shape_k(h(t) + phi_s)] * M_s(t)
- shape_k: a 0..1 daily curve per archetype built from the 24/12/8/6 h harmonics (about four
  frequency components per tower, Xu et al. IMC 2016) of peak bumps placed as in the facts' table;
- M_s: a Markov chain over {low, normal, busy, surge} = {0.6, 1.0, 1.4, 2.0} (Trinh et al.), one
  step per period, mean dwell of minutes;
- per slot: a slice is idle with a probability that rises as the load falls, otherwise it brings a
  heavy-tailed (lognormal) burst of bytes; MCS (256-QAM table) and layers are drawn per block of 20
  slots so that link quality is correlated over tens of slots.
The per-cell `load` of `CellConfig` is the mean PRB utilisation at lambda = 1.

Every site owns a generator spawned from the run's root `SeedSequence`, so two runs with one seed and
the same period sizes give identical arrays, and adding a site does not change the others' traces.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .config import SLOT_S, Scenario
from .f32math import cos_2pi_row, exp_row, log_row
from .jit import njit
from .phy import N_RE, SPECTRAL_EFFICIENCY

RHO = 0.25  # trough / peak (swept 0.1-0.4 in the facts; no sourced value exists)
MARKOV_LEVELS = np.array([0.6, 1.0, 1.4, 2.0])
# Row i: transition probabilities out of state i when a transition happens (reflecting chain biased to normal).
MARKOV_MOVES = np.array([
    [0.0, 1.0, 0.0, 0.0],
    [0.45, 0.0, 0.45, 0.10],
    [0.0, 0.8, 0.0, 0.2],
    [0.0, 0.3, 0.7, 0.0],
])
_MOVES_CDF = np.cumsum(MARKOV_MOVES, axis=1)
MCS_BLOCK = 20  # slots over which MCS and layers stay put
BATCH_SLOTS = 2000  # shorter periods are generated this many slots at a time
PROTECTED_ACTIVE = 0.6  # share of slots in which the protected slice has something to send
BURST_SIGMA = 1.0  # lognormal sigma of best-effort bursts

# (centre hour, width h, weight) of the daily peaks per archetype (facts section 3.2 table).
_BUMPS = {
    "residential": ((21.0, 2.0, 1.0), (8.0, 1.0, 0.45), (13.0, 3.0, 0.35)),
    "business": ((10.5, 1.5, 1.0), (15.5, 1.5, 1.0)),
    "transport": ((8.0, 0.9, 1.0), (18.0, 0.9, 1.0), (13.0, 2.0, 0.3)),
    "entertainment": ((21.5, 2.5, 1.0), (16.0, 2.0, 0.4)),
}


def _harmonic_shape(bumps) -> np.ndarray:
    """Fourier coefficients (a0, a1, b1, ..., a4, b4) of the bump curve, keeping 24/12/8/6 h terms."""
    h = np.arange(0, 24, 1 / 60)
    y = np.zeros_like(h)
    for centre, width, weight in bumps:
        d = (h - centre + 12) % 24 - 12
        y += weight * np.exp(-0.5 * (d / width) ** 2)
    coef = [y.mean()]
    for k in range(1, 5):
        w = 2 * np.pi * k * h / 24
        coef += [2 * np.mean(y * np.cos(w)), 2 * np.mean(y * np.sin(w))]
    return np.array(coef)


def _eval(coef: np.ndarray, hour) -> np.ndarray:
    hour = np.asarray(hour, dtype=float)
    y = np.full_like(hour, coef[0])
    for k in range(1, 5):
        w = 2 * np.pi * k * hour / 24
        y = y + coef[2 * k - 1] * np.cos(w) + coef[2 * k] * np.sin(w)
    return y


def _normalised(coef: np.ndarray) -> tuple[np.ndarray, float, float]:
    grid = _eval(coef, np.arange(0, 24, 1 / 60))
    return coef, float(grid.min()), float(grid.max())


_SHAPES = {k: _normalised(_harmonic_shape(b)) for k, b in _BUMPS.items()}
_SHAPES["mixed"] = _normalised(np.mean([_SHAPES[k][0] for k in _BUMPS], axis=0))


def archetype_shape(archetype: str, hour) -> np.ndarray:
    """The 0..1 daily curve of an archetype at local `hour` (any real, wraps at 24)."""
    coef, lo, hi = _SHAPES[archetype]
    return (_eval(coef, np.asarray(hour) % 24) - lo) / (hi - lo)


def diurnal_level(archetype: str, hour, rho: float = RHO) -> np.ndarray:
    return rho + (1 - rho) * archetype_shape(archetype, hour)


@dataclass(frozen=True)
class Arrivals:
    """Bytes arriving per slot per (slice, site, cell) for each direction, and the bytes one PRB carries
    in each slot at the drawn MCS and layers. Shapes: dl/ul (L=2, T, S, C) slice-first (each slice's
    array contiguous, which is how the MAC reads them), bpp_* (T, S, C)."""

    dl: np.ndarray
    ul: np.ndarray
    bpp_dl: np.ndarray
    bpp_ul: np.ndarray
    level: np.ndarray  # (S,) load multiplier lambda during the period


class TraceSource(Protocol):
    def arrivals(self, start_slot: int, n_slots: int) -> Arrivals: ...


def _tdd_fractions(tdd: str) -> tuple[float, float]:
    """Share of slots carrying DL (S slots count 10/14) and UL."""
    n = len(tdd)
    return (tdd.count("D") + tdd.count("S") * 10 / 14) / n, tdd.count("U") / n


class SyntheticTrace:
    """The seeded archetype generator for a scenario (see module doc)."""

    def __init__(self, scenario: Scenario, seed: int):
        self.scenario = scenario
        self.seed = seed
        root = np.random.SeedSequence(seed)
        self.rngs = [np.random.default_rng(s) for s in root.spawn(scenario.n_sites)]
        self.markov = np.ones(scenario.n_sites, dtype=int)  # start in `normal`
        self._batch: _Batch | None = None
        # The draws of a batch, kept for the next batch of the same shape: nothing handed out points into
        # them, and fresh ones cost the kernel's page faults, about a third of a batch's time at a hundred sites.
        self._scratch: dict[tuple, np.ndarray] = {}
        # Per-site dwell (s) and per-cell mean bytes per slot at lambda = 1 (all slices), per direction.
        self.dwell_s = np.array([rng.uniform(60, 180) for rng in self.rngs])
        self.mean_dl = np.zeros((scenario.n_sites, scenario.n_cells))
        self.mean_ul = np.zeros_like(self.mean_dl)
        for s, site in enumerate(scenario.sites):
            f_dl, f_ul = _tdd_fractions(site.tdd)
            for c, cell in enumerate(site.cells):
                bpp_dl = N_RE * SPECTRAL_EFFICIENCY[int(round(cell.mcs_mean))] * _mean_layers(cell.dl_layers, DL_LAYERS) / 8
                bpp_ul = N_RE * SPECTRAL_EFFICIENCY[int(round(max(cell.mcs_mean - 3, 0)))] * _mean_layers(
                    cell.ul_layers, UL_LAYERS) / 8
                self.mean_dl[s, c] = cell.load * cell.prbs * bpp_dl * f_dl
                self.mean_ul[s, c] = cell.load * cell.ul_load_ratio * cell.prbs * bpp_ul * f_ul
        self.shares = np.array([[sl.load_share for sl in site.slices] for site in scenario.sites])  # (S, L)
        loads = np.array([[c.load for c in site.cells] for site in scenario.sites])
        self.p_slope = 0.45 * loads / 0.25  # best-effort busy-slot probability = 0.1 + slope * lambda, (S, C)
        self.mcs_mean = np.array([[[c.mcs_mean for c in site.cells], [max(c.mcs_mean - 3, 0) for c in site.cells]]
                                  for site in scenario.sites])  # (S, 2, C): UL 3 MCS steps lower
        self.max_layers = np.array([[[c.dl_layers for c in site.cells], [c.ul_layers for c in site.cells]]
                                    for site in scenario.sites])
        self.layer_cdf = [np.cumsum(DL_LAYERS[1])[:-1], np.cumsum(UL_LAYERS[1])[:-1]]
        shapes = [_SHAPES[site.archetype] for site in scenario.sites]
        self.coef = np.array([c for c, _, _ in shapes]).T  # (9, S) harmonics of each site's archetype
        self.shape_lo = np.array([lo for _, lo, _ in shapes])
        self.shape_span = np.array([hi - lo for _, lo, hi in shapes])
        self.phase_h = np.array([site.phase_h for site in scenario.sites])
        self.scale = np.array([site.scale for site in scenario.sites])

    def level(self, start_slot: int) -> np.ndarray:
        """lambda_s at a slot (diurnal x scale x current Markov state), shape (S,)."""
        return self._level(start_slot, self.markov)

    def _level(self, start_slot, markov: np.ndarray) -> np.ndarray:
        """`level` at `start_slot` (an int, or (P, 1) slots for P periods) in Markov states `markov` ((S,) or (P, S))."""
        sc = self.scenario
        hour = sc.start_hour + start_slot * SLOT_S * sc.day_speedup / 3600
        # All sites at once through the archetype curves' own evaluation (`_eval` broadcasts over sites):
        # a per-site `diurnal_level` call costs more than the rest of a period.
        shape = (_eval(self.coef, (hour + self.phase_h) % 24) - self.shape_lo) / self.shape_span
        return self.scale * (RHO + (1 - RHO) * shape) * MARKOV_LEVELS[markov]

    def arrivals(self, start_slot: int, n_slots: int) -> Arrivals:
        """The next period's arrivals. Short periods are generated BATCH_SLOTS at a time (numpy's
        per-call cost dominates below that) and handed out in order; a call that does not continue
        the batch (another start or length) drops the rest of it, so the arrays are a function of the
        seed and the sequence of calls. `markov` and `level()` always describe the next period."""
        b = self._batch
        if b is None or b.n_slots != n_slots or b.next_start != start_slot or b.next >= len(b.level):
            b = self._batch = self._generate(start_slot, n_slots, max(1, BATCH_SLOTS // n_slots))
        p = b.next
        b.next += 1
        b.next_start += n_slots
        self.markov = b.markov[p + 1]
        return Arrivals(dl=b.dl[p], ul=b.ul[p], bpp_dl=b.bpp_dl[p], bpp_ul=b.bpp_ul[p], level=b.level[p])

    def _generate(self, start_slot: int, n_slots: int, n_periods: int) -> _Batch:
        sc = self.scenario
        S, C, T, P = sc.n_sites, sc.n_cells, n_slots, n_periods
        n_blocks = -(-T // MCS_BLOCK)
        # Each site draws from its own generator; the arithmetic then runs once for all sites. Only
        # float32 uniforms are drawn (numpy's float32 normals cost ~8x a uniform here): given that a slot
        # is active (u < p), (p - u) / p is again uniform on (0, 1], so the activity draw also yields the
        # protected slice's exponential amount (-ln) and the radius of a Box-Muller normal for the
        # best-effort lognormal burst, whose angle takes one more uniform.
        # The arithmetic on them is one compiled pass (`_bursts_kernel`).
        if (S, P, C, T) not in self._scratch:
            self._scratch = {(S, P, C, T): np.empty((S, 6, P, C, T), dtype=np.float32)}
        # u: activity (prot dl, ul, be dl, ul) and angle (be dl, ul) draws
        u = self._scratch[S, P, C, T]
        mcs_noise = np.empty((S, 2, P, n_blocks, C))
        layer_u = np.empty((S, 2, P, n_blocks, C))
        moves = np.empty((S, P, 2))
        for s, rng in enumerate(self.rngs):
            rng.random(dtype=np.float32, out=u[s])
            rng.standard_normal(out=mcs_noise[s])
            rng.random(out=layer_u[s])
            rng.random(out=moves[s])
        # The Markov path: one step per period, leaving the state with probability T / dwell.
        p_leave = np.minimum(1.0, T * SLOT_S * sc.day_speedup / self.dwell_s)
        markov = np.empty((P + 1, S), dtype=int)
        markov[0] = self.markov
        for p in range(P):
            leave = moves[:, p, 0] < p_leave
            nxt = (_MOVES_CDF[markov[p]] <= moves[:, p, 1:]).sum(axis=1)  # searchsorted(cdf, v, "right")
            markov[p + 1] = np.where(leave, nxt, markov[p])
        lam = self._level(start_slot + T * np.arange(P)[:, None], markov[:P])  # (P, S): every period at once
        # Period-dependent scales (S, P, C): the load, the best-effort busy probability, each slice's mean burst.
        lam_spc = lam.T[:, :, None]
        p_act = np.clip(0.1 + self.p_slope[:, None, :] * lam_spc, 0.05, 0.9)  # (S, P, C)
        means = np.stack([mean[:, None, :] * lam_spc for mean in (self.mean_dl, self.mean_ul)])  # (2, S, P, C)
        mp = means * self.shares[None, :, None, :1] / PROTECTED_ACTIVE
        mb = means * self.shares[None, :, None, 1:] / p_act[None]
        a_dl, a_ul = np.empty((P, 2, T, S, C)), np.empty((P, 2, T, S, C))
        _bursts_kernel(u, p_act.astype(np.float32), mp, mb, a_dl, a_ul)
        out = []
        for d, a in enumerate((a_dl, a_ul)):
            mcs = np.clip(np.rint(self.mcs_mean[:, d, None, None, :] + 3.0 * mcs_noise[:, d]), 0, 27).astype(np.intp)
            pool = (DL_LAYERS if d == 0 else UL_LAYERS)[0]
            layers = np.minimum(pool[np.searchsorted(self.layer_cdf[d], layer_u[:, d])],
                                self.max_layers[:, d, None, None, :])
            bpp = (N_RE / 8) * SPECTRAL_EFFICIENCY[mcs] * layers  # (S, P, blocks, C)
            out.append((a, np.repeat(bpp.transpose(1, 2, 0, 3), MCS_BLOCK, axis=1)[:, :T]))  # (P, T, S, C)
        return _Batch(n_slots=T, next_start=start_slot, next=0, level=lam, markov=markov,
                      dl=out[0][0], ul=out[1][0], bpp_dl=out[0][1], bpp_ul=out[1][1])


_PA32, _INV_PA32 = np.float32(PROTECTED_ACTIVE), np.float32(1 / PROTECTED_ACTIVE)
_ONE32, _MINUS_TWO32 = np.float32(1.0), np.float32(-2.0)
_SIGMA32, _HALF_VAR32 = np.float32(BURST_SIGMA), np.float32(BURST_SIGMA ** 2 / 2)
# Slots per row of work: a block of slots is computed for every (site, cell) into a staging array, then
# written into the (T, S, C)-major output in address order (written in place at a stride of S x C, the
# output cost more than the arithmetic at a hundred sites).
_ROW = 32


@njit(cache=True, nogil=True)
def _bursts_kernel(u, p_act, mp, mb, a_dl, a_ul):
    """Bytes per slot from the float32 draws u (S, 6, P, C, T) into a_dl / a_ul (P, L=2, T, S, C).

    Protected slice of direction d: active while u[d] < PROTECTED_ACTIVE, then mp x Exp(1) with Exp(1) =
    -ln((PA - u) / PA). Best-effort: active while u[2 + d] < p_act, then mb x a mean-1 lognormal whose
    normal is Box-Muller from the radius -2 ln((p - u) / p) and the angle u[4 + d]. mp, mb (2, S, P, C) and
    p_act (S, P, C, float32) per direction, site, period and cell. The arithmetic runs in float32 over rows
    of a (site, period, cell)'s slots with `f32math`'s vector loops, idle slots included (ln 1 = 0) and
    zeroed at the end; a branch per slot, or libm's scalar calls, cost several times more."""
    S, _, P, C, T = u.shape
    y, ln = np.empty(_ROW, dtype=np.float32), np.empty(_ROW, dtype=np.float32)
    w, scratch = np.empty(_ROW, dtype=np.float32), np.empty(_ROW, dtype=np.float32)
    stage = np.empty((2, S * C, _ROW))
    for d in range(2):
        a = a_dl if d == 0 else a_ul
        for p in range(P):
            for t0 in range(0, T, _ROW):
                n = min(_ROW, T - t0)
                y_, ln_, w_, sc_ = y[:n], ln[:n], w[:n], scratch[:n]
                for s in range(S):
                    for c in range(C):
                        row = s * C + c
                        up = u[s, d, p, c, t0:t0 + n]
                        for t in range(n):
                            y_[t] = (_PA32 - up[t]) * _INV_PA32 if up[t] < _PA32 else _ONE32
                        log_row(y_, ln_, sc_)
                        m0 = mp[d, s, p, c]
                        for t in range(n):
                            stage[0, row, t] = -ln_[t] * m0
                        ub, pa = u[s, 2 + d, p, c, t0:t0 + n], p_act[s, p, c]
                        for t in range(n):
                            y_[t] = (pa - ub[t]) / pa if ub[t] < pa else _ONE32
                        log_row(y_, ln_, sc_)
                        cos_2pi_row(u[s, 4 + d, p, c, t0:t0 + n], w_)
                        for t in range(n):
                            ln_[t] = np.sqrt(_MINUS_TWO32 * ln_[t]) * w_[t] * _SIGMA32 - _HALF_VAR32
                        exp_row(ln_, y_, sc_)
                        m1 = mb[d, s, p, c]
                        for t in range(n):
                            stage[1, row, t] = y_[t] * m1 if ub[t] < pa else 0.0
                for sl in range(2):  # (site, cell)-major rows -> the output's slot-major rows, written in order
                    out = a[p, sl].reshape(T, S * C)
                    for t in range(n):
                        for row in range(S * C):
                            out[t0 + t, row] = stage[sl, row, t]


@dataclass
class _Batch:
    """Arrivals generated ahead for consecutive periods of one length; `next` is the next to hand out."""

    n_slots: int
    next_start: int
    next: int
    level: np.ndarray  # (P, S)
    markov: np.ndarray  # (P + 1, S): the state during each period, then after the last
    dl: np.ndarray  # (P, L, T, S, C)
    ul: np.ndarray
    bpp_dl: np.ndarray  # (P, T, S, C)
    bpp_ul: np.ndarray


DL_LAYERS = (np.array([2, 3, 4]), np.array([0.2, 0.3, 0.5]))
UL_LAYERS = (np.array([1, 2]), np.array([0.4, 0.6]))


def _mean_layers(max_layers: int, pool) -> float:
    values, p = pool
    return float(np.sum(np.minimum(values, max_layers) * p))


MAX_TRACE_S = 7 * 24 * 3600.0  # a week


class TraceFormatError(ValueError):
    """A recorded trace file the loader refuses; the message names the line and the problem."""


class CsvTrace:
    """Replay of a recorded trace: CSV rows `time_s,cell,prb` or `time_s,cell,bytes` (optional columns
    `dir` = dl|ul, default dl). `cell` is `site/cell` or a global index site * n_cells + cell. Values
    are offered load arriving in the slot containing `time_s`, split over slices by their load share;
    PRB values are turned into bytes at each slot's drawn MCS. The trace repeats after its last slot.
    MCS and layers still come from the seeded generator (the CSV carries load only)."""

    def __init__(self, scenario: Scenario, path: str | Path, seed: int = 0):
        self.scenario = scenario
        self._mcs = SyntheticTrace(scenario, seed)
        S, C = scenario.n_sites, scenario.n_cells
        try:
            with open(path, newline="", encoding="utf-8") as f:
                rows, unit = self._parse(csv.DictReader(f), path, S, C)
        except (UnicodeDecodeError, csv.Error) as exc:
            raise TraceFormatError(f"{path}: not a CSV text file ({exc})") from None
        if not rows:
            raise TraceFormatError(f"{path}: no rows")
        self.unit = unit
        rows.sort()
        self.n_slots = rows[-1][0] + 1
        # Sparse rows (a long quiet trace costs nothing): slot, flat cell, direction, value.
        self._slot = np.array([r[0] for r in rows], dtype=np.int64)
        self._cell = np.array([r[1] for r in rows], dtype=np.int64)
        self._dir = np.array([r[2] for r in rows], dtype=np.int64)
        self._value = np.array([r[3] for r in rows])

    @staticmethod
    def _parse(reader, path, S: int, C: int) -> tuple[list, str]:
        rows: list[tuple[int, int, int, float]] = []
        fields = set(reader.fieldnames or ())
        if not {"time_s", "cell"} <= fields or not ({"prb", "bytes"} & fields):
            raise TraceFormatError(f"{path}: header must have time_s, cell and prb or bytes, got {sorted(fields)}")
        unit = "prb" if "prb" in fields else "bytes"
        for n, row in enumerate(reader, start=2):
            try:
                t = float(row["time_s"])
                cell_s = row["cell"].strip()
                if "/" in cell_s:
                    site, cell = (int(x) for x in cell_s.split("/"))
                else:
                    site, cell = divmod(int(cell_s), C)
                value = float(row[unit])
                direction = (row.get("dir") or "dl").strip().lower()
            except (TypeError, ValueError) as exc:
                raise TraceFormatError(f"{path}:{n}: {exc}") from None
            if not (0 <= t <= MAX_TRACE_S and value >= 0 and np.isfinite(value)):
                raise TraceFormatError(f"{path}:{n}: time_s must be in 0..{MAX_TRACE_S} and {unit} finite >= 0")
            if not (0 <= site < S and 0 <= cell < C):
                raise TraceFormatError(f"{path}:{n}: cell {cell_s} outside {S} sites x {C} cells")
            if direction not in ("dl", "ul"):
                raise TraceFormatError(f"{path}:{n}: dir {direction!r} is not dl or ul")
            rows.append((int(t / SLOT_S), site * C + cell, 0 if direction == "dl" else 1, value))
        return rows, unit

    def arrivals(self, start_slot: int, n_slots: int) -> Arrivals:
        sc = self.scenario
        S, C = sc.n_sites, sc.n_cells
        drawn = self._mcs.arrivals(start_slot, n_slots)  # for MCS/layers (keeps their correlation model)
        load = np.zeros((2, n_slots, S * C))
        t = start_slot
        while t < start_slot + n_slots:  # walk the (repeating) trace in pieces that do not wrap
            a = t % self.n_slots
            span = min(self.n_slots - a, start_slot + n_slots - t)
            lo, hi = np.searchsorted(self._slot, [a, a + span])
            np.add.at(load, (self._dir[lo:hi], self._slot[lo:hi] - a + (t - start_slot), self._cell[lo:hi]),
                      self._value[lo:hi])
            t += span
        out = []
        for d, bpp in ((0, drawn.bpp_dl), (1, drawn.bpp_ul)):
            x = load[d].reshape(n_slots, S, C)
            if self.unit == "prb":
                x = x * bpp
            out.append(x[None] * self._mcs.shares.T[:, None, :, None])
        return Arrivals(dl=out[0], ul=out[1], bpp_dl=drawn.bpp_dl, bpp_ul=drawn.bpp_ul, level=drawn.level)
