"""The compute-aware stage's service: earliest-deadline-first across cells with per-cell limits.

Properties checked on random periods: no cell above its limit and no slot above its room; work
conservation (a slot that leaves room unused has no cell that could still carry waiting work); order
(within a cell, older work leaves first); nothing lost; and the compiled kernel equals the same
function run as plain Python (its reference and the fallback without numba)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.model import edf
from testbed.model.mac import FifoBacklog, fifo_serve


def _period(seed: int, T: int, C: int, K: int):
    rng = np.random.default_rng(seed)
    sparse = lambda shape, p: rng.exponential(10.0, shape) * (rng.random(shape) < p)  # noqa: E731
    backlog = FifoBacklog(np.sort(rng.integers(-50, 0, K)), sparse((K, C), 0.6)) if K else FifoBacklog.empty(C)
    arrivals = sparse((T, C), 0.5)
    capacity = rng.choice([0.0, 5.0, 20.0, np.inf], T)
    limit = rng.choice([0.0, 3.0, 12.0, np.inf], (T, C))
    return backlog, arrivals, capacity, limit


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 30), st.integers(1, 6), st.integers(0, 8))
def test_edf_service_is_bounded_work_conserving_ordered_and_lossless(seed, T, C, K):
    backlog, arrivals, capacity, limit = _period(seed, T, C, K)
    hist = np.zeros(200)
    r = fifo_serve(backlog, 0, arrivals, capacity, limit=limit, age_hist=hist)
    eps = 1e-9
    assert np.all(r.per_cell <= limit + eps)
    assert np.all(r.per_cell.sum(axis=1) <= capacity + eps)
    # Nothing lost: served + still waiting == waiting before + arrived; the histogram counts what left.
    total_in = backlog.total + arrivals.sum()
    assert abs(r.per_cell.sum() + r.backlog.total - total_in) <= 1e-9 * max(1.0, total_in)
    assert abs(hist.sum() - r.per_cell.sum()) <= 1e-9 * max(1.0, total_in)
    # Replay per cell: cumulative work available vs served. A slot with room to spare must have left
    # every cell either at its limit or with nothing of its own waiting (work-conserving).
    avail = backlog.amounts.sum(axis=0).copy()
    for t in range(T):
        avail += arrivals[t]
        spare = capacity[t] - r.per_cell[t].sum()
        if spare > eps:
            stuck = (avail - r.per_cell[t] > eps) & (limit[t] - r.per_cell[t] > eps)
            assert not stuck.any(), f"slot {t}: room {spare} unused while cells {np.flatnonzero(stuck)} wait"
        avail -= r.per_cell[t]
    # Order: what is left of each cell is its newest work: the suffix of its chunks (oldest first)
    # holding exactly what was not served, only the first of them partly served.
    src_slots = np.concatenate([backlog.slots, np.arange(T)])
    for c in range(C):
        src = np.concatenate([backlog.amounts[:, c], arrivals[:, c]])
        left, expect = src.sum() - r.per_cell[:, c].sum(), np.zeros_like(src)
        for k in range(len(src) - 1, -1, -1):
            expect[k] = min(src[k], max(left, 0.0))
            left -= expect[k]
        got = r.backlog.amounts[:, c]
        keep = expect > 1e-7
        np.testing.assert_array_equal(r.backlog.slots[got > 1e-7], src_slots[keep])
        np.testing.assert_allclose(got[got > 1e-7], expect[keep], rtol=1e-9, atol=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 25), st.integers(1, 5), st.integers(0, 6))
def test_compiled_kernel_equals_plain_python(seed, T, C, K):
    backlog, arrivals, capacity, limit = _period(seed, T, C, K)
    rows = np.concatenate([backlog.slots, np.arange(T)]).astype(np.int64)
    outs = []
    for fn in (edf.edf_serve_kernel, getattr(edf.edf_serve_kernel, "py_func", edf.edf_serve_kernel)):
        amt = np.concatenate([backlog.amounts, arrivals]).astype(float)
        per_cell, oldest, hist = np.zeros((T, C)), np.zeros(T, dtype=np.int64), np.zeros(64)
        first = fn(rows, amt, K, 0, capacity.astype(float), limit.astype(float), per_cell, oldest, hist)
        outs.append((first, amt, per_cell, oldest, hist))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_oldest_work_leaves_first_and_its_age_is_reported():
    backlog = FifoBacklog(np.array([-3]), np.array([[4.0, 6.0]]))
    arrivals = np.array([[5.0, 5.0], [0.0, 0.0]])
    hist = np.zeros(10)
    r = fifo_serve(backlog, 0, arrivals, np.array([12.0, 100.0]), limit=np.array([[100.0, 7.0], [100.0, 100.0]]), age_hist=hist)
    # Slot 0: the backlog (age 3) first: cell 0's 4 and cell 1's 6, then 2 of the new work: cell 0
    # (cell 1 has 1 unit of limit left; ties between cells go to the lower index).
    np.testing.assert_allclose(r.per_cell[0], [6.0, 6.0])
    np.testing.assert_allclose(r.per_cell[1], [3.0, 5.0])
    assert list(r.delay_slots) == [3, 1]
    np.testing.assert_allclose(hist[[0, 1, 3]], [2.0, 8.0, 10.0])
    assert r.backlog.total == 0


def test_compiled_stage_equals_plain_python_over_a_busy_run(monkeypatch):
    from testbed import scenarios
    from testbed.model import ran

    def run(plain):
        # plain: the per-site stage and its EDF service as plain Python too (the outer kernel's py_func reads them
        # from edf's module globals at call time)
        for name in ("stage_sites_kernel", "stage_kernel", "edf_serve_kernel"):
            compiled = getattr(edf, name)
            monkeypatch.setattr(edf, name, getattr(compiled, "py_func", compiled) if plain else compiled)
        monkeypatch.setattr(ran, "stage_sites_kernel", edf.stage_sites_kernel)
        sc = scenarios.get("heavy-small-gpu")
        m = ran.RanModel(sc, seed=3, track_delay=False)
        for s in range(sc.n_sites):
            m.set_envelope(s, 0.55 * sc.sites[s].gpu_sms)
        reps = [m.step_period() for _ in range(6)]
        monkeypatch.undo()
        return np.concatenate([r.demand for r in reps]), m.delay_hist.copy(), sum(b.total for b in m.backlog_dl + m.backlog_ul)

    compiled = run(False)
    plain = run(True)
    assert compiled[2] > 0, "the envelope never bound: the comparison would prove little"
    np.testing.assert_allclose(compiled[0], plain[0], rtol=1e-12)
    np.testing.assert_allclose(compiled[1], plain[1], rtol=1e-12)
    assert compiled[2] == pytest.approx(plain[2], rel=1e-12)


def test_compile_kernels_covers_every_signature_a_live_simulation_uses(tmp_path):
    # In a fresh interpreter (nothing compiled yet): after compile_kernels, the E2 node simulator's own
    # model (histograms off, envelopes switching, a backlog draining) compiles nothing more.
    import subprocess
    import sys
    code = """
import numpy as np
from testbed import scenarios
from testbed.model import RanModel, compile_kernels, edf, mac, phy
# (stage_kernel and edf_serve_kernel are reached only inside stage_sites_kernel, compiled with it)
kernels = [edf.stage_sites_kernel, mac.mac_kernel, mac.mac_delay_kernel, phy.ul_spill]
if not all(hasattr(k, "signatures") for k in kernels):
    print("no numba"); raise SystemExit(0)
sc = scenarios.get("demo")
compile_kernels(sc)
before = [len(k.signatures) for k in kernels]
assert all(before), before
m = RanModel(sc, seed=1, track_delay=False)
for s in range(sc.n_sites):
    m.set_envelope(s, 20.0 + 5 * s)
for _ in range(3):
    m.step_period()
for s in range(sc.n_sites):
    m.set_envelope(s, None)
for _ in range(3):
    m.step_period()
after = [len(k.signatures) for k in kernels]
assert after == before, (before, after)
print("ok", before)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(("ok", "no numba"))
