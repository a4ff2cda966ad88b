"""MAC queues and quotas (vectorised vs a scalar reference), PHY cost calibration and monotonicity."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.model.mac import FifoBacklog, fifo_serve, mac_kernel, schedule_cells
from testbed.model.phy import PEAK_DL, PEAK_UL, PhyCost, bytes_per_prb, spectral_efficiency, ul_spill


def scalar_queue(a, c, q0):
    q, out = q0, []
    for x, cap in zip(a, c, strict=True):
        q = max(q + x - cap, 0.0)
        out.append(q)
    return np.array(out)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 40))
def test_mac_queues_follow_the_slot_by_slot_recursion_and_compiled_equals_plain(seed, T):
    rng = np.random.default_rng(seed)
    S, C = 2, 3
    a = rng.exponential(3000, (2, T, S, C)) * (rng.random((2, T, S, C)) < 0.6)
    cap = rng.choice([0.0, 100.0, 273.0], (T, S, C))
    bpp = rng.uniform(10, 60, (T, S, C))
    q0 = rng.uniform(0, 5000, (2, S, C))
    r = schedule_cells(a, cap, bpp, _quota(S, C), q0)
    for s in range(S):
        for c in range(C):  # default quotas: protected gets every PRB, best-effort what it left
            np.testing.assert_allclose(r.queue[0, :, s, c], scalar_queue(a[0, :, s, c], cap[:, s, c] * bpp[:, s, c], q0[0, s, c]))
            left = cap[:, s, c] * bpp[:, s, c] - r.served[0, :, s, c]
            np.testing.assert_allclose(r.queue[1, :, s, c], scalar_queue(a[1, :, s, c], left, q0[1, s, c]), atol=1e-9)
    outs = [np.empty((2, T, S * C)) for _ in range(3)] + [np.empty((T, S * C))]
    getattr(mac_kernel, "py_func", mac_kernel)(a.reshape(2, T, -1), cap.reshape(T, -1), bpp.reshape(T, -1),
                                               _quota(S, C).reshape(-1, 2, 3), q0.reshape(2, -1), *outs)
    for got, want in zip(outs, (r.served, r.queue, r.capacity, r.be_headroom), strict=True):
        np.testing.assert_array_equal(got, want.reshape(got.shape))


def _quota(S, C, pmin=0, pmax=1, pded=0, bmin=0, bmax=1, bded=0):
    q = np.zeros((S, C, 2, 3))
    q[..., 0, :] = (pmin, pmax, pded)
    q[..., 1, :] = (bmin, bmax, bded)
    return q


def _setup(rng, T=400, S=2, C=3, be_scale=60000.0, p_scale=5000.0):
    a = np.stack([rng.exponential(p_scale, (T, S, C)), rng.exponential(be_scale, (T, S, C))])  # slice-first
    cap = np.where(np.arange(T)[:, None, None] % 5 == 1, 0.0, 273.0) * np.ones((T, S, C))
    bpp = rng.uniform(100, 500, (T, S, C))
    return a, cap, bpp


@pytest.mark.parametrize("quota", [(0, 1, 0, 0, 0.3, 0), (0.1, 0.5, 0.1, 0.2, 0.6, 0.2), (0, 1, 0, 0, 1, 0)])
def test_quotas_are_honoured_in_every_slot(quota):
    rng = np.random.default_rng(3)
    a, cap, bpp = _setup(rng)
    q = _quota(2, 3, *quota)
    r = schedule_cells(a, cap, bpp, q, np.zeros((2, 2, 3)))
    prb = r.served / bpp[None]
    pmin, pmax, pded, bmin, bmax, bded = quota
    eps = 1e-6
    assert np.all(prb[1] <= cap * bmax + eps)
    assert np.all(prb[0] <= cap * pmax + eps)
    assert np.all(prb[1] <= cap * (1 - pded) + eps)  # protected's dedicated PRBs stay out of reach
    assert np.all(prb[0] <= cap * (1 - max(bded, bmin)) + eps)
    assert np.all(prb.sum(0) <= cap + eps)


def test_protected_slice_is_never_starved_by_best_effort():
    rng = np.random.default_rng(4)
    a, cap, bpp = _setup(rng, be_scale=1e7)  # best-effort floods the cell
    r = schedule_cells(a, cap, bpp, _quota(2, 3), np.zeros((2, 2, 3)))
    fits = a[0] <= cap * bpp  # protected alone fits this slot
    # When its arrivals fit, the protected queue is empty after every slot with capacity.
    assert np.all(r.queue[0][(cap > 0) & fits & (np.roll(cap, 1, axis=0) > 0)] < 1e-6)
    assert r.queue[1][-1].min() > 0  # best-effort really was overloaded


def test_queues_drain_and_every_byte_is_served():
    rng = np.random.default_rng(5)
    a, cap, bpp = _setup(rng, T=2000, be_scale=60000.0)
    a[:, 400:] = 0.0
    r = schedule_cells(a, cap, bpp, _quota(2, 3, bmax=0.5), np.zeros((2, 2, 3)))
    assert np.all(r.queue[:, -1] < 1e-6)
    np.testing.assert_allclose(r.served.sum(1), a.sum(1), rtol=1e-9)


def test_fifo_split_serves_cells_in_arrival_order_and_keeps_the_rest():
    arrivals = np.array([[10.0, 0.0], [0.0, 5.0], [3.0, 3.0], [0.0, 0.0]])
    served = np.array([4.0, 8.0, 0.0, 2.0])
    r = fifo_serve(FifoBacklog.empty(2), 100, arrivals, served)
    np.testing.assert_allclose(r.per_cell.sum(1), served)
    np.testing.assert_allclose(r.per_cell[:2, 1], [0, 2])  # cell 1's bytes wait behind cell 0's older ones
    assert r.backlog.total == pytest.approx(arrivals.sum() - served.sum())
    assert list(r.delay_slots) == [0, 1, 0, 2]
    nxt = fifo_serve(r.backlog, 104, np.zeros((2, 2)), np.array([r.backlog.total, 0.0]))
    assert nxt.backlog.total == pytest.approx(0.0, abs=1e-9)
    assert nxt.delay_slots[0] >= 2


def test_peak_cell_reproduces_the_aerial_anchors():
    dl, ul = PhyCost.calibrated().peak_cell_sms()
    assert dl == pytest.approx(106 / 15) and ul == pytest.approx(114 / 15)
    # 15 peak cells exactly fill Aerial's GH200 PDSCH / PUSCH SM ranges (facts section 1 row 25).
    assert 15 * dl == pytest.approx(106) and 15 * ul == pytest.approx(114)


def test_average_cell_costs_about_half_a_peak_cell():
    cost = PhyCost.calibrated()
    dl_ratio = cost.dl.work(270, PEAK_DL.layers, PEAK_DL.se * 0.36) / cost.dl.work(270, PEAK_DL.layers, PEAK_DL.se)
    ul_ratio = cost.ul.work(270, PEAK_UL.layers, PEAK_UL.se * 0.41) / cost.ul.work(270, PEAK_UL.layers, PEAK_UL.se)
    assert 0.45 <= dl_ratio <= 0.55 and 0.45 <= ul_ratio <= 0.55  # A100: 4 peak / 8 average cells


def test_cost_is_monotonic_in_prbs_layers_and_mcs():
    cost = PhyCost.calibrated()
    prbs = np.arange(0, 274)
    for d in (cost.dl, cost.ul):
        assert np.all(np.diff(d.work(prbs, 2, 5.0)) > 0)
        assert np.all(np.diff(d.work(100, np.arange(1, 5), 5.0)) > 0)
        assert np.all(np.diff(d.work(100, 2, spectral_efficiency(np.arange(28)))) > 0)
        assert d.work(0, 1, 1.0) == pytest.approx(d.a)  # the fixed per-slot cost
        # Work per byte does not depend on MCS: what lets the MAC shape work with queue algebra.
        w = (d.work(100, 2, spectral_efficiency(10)) - d.a) / (100 * bytes_per_prb(10, 2))
        assert w == pytest.approx(d.work_per_byte)
    with pytest.raises(ValueError):
        spectral_efficiency(28)


def test_ul_decode_spills_over_the_next_three_slots():
    x = np.zeros(10)
    x[1] = 4.0
    np.testing.assert_allclose(ul_spill(x), [0, 0, 4, 4, 2, 0, 0, 0, 0, 0])
