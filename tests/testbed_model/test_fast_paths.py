"""The model's fast paths against plain references: the compiled MAC delay histogram against a byte-by-
byte FIFO, and the uniform-only traffic draws against the laws the trace model states."""
from __future__ import annotations

import numpy as np

from testbed import scenarios
from testbed.model import RanModel
from testbed.model.mac import mac_delay_kernel, schedule_cells
from testbed.model.ran import DELAY_BINS, tdd_layout
from testbed.model.traffic import MARKOV_LEVELS, SyntheticTrace


def scalar_fifo_ages(a, served, q0, bins):
    """Reference: one FIFO of (arrival slot, amount) per queue, drained byte by byte in order."""
    L, T, N = a.shape
    hist = np.zeros((L, bins))
    for sl in range(L):
        for n in range(N):
            fifo = [[-1, q0[sl, n]]] if q0[sl, n] > 0 else []
            for t in range(T):
                if a[sl, t, n] > 0:
                    fifo.append([t, a[sl, t, n]])
                left = served[sl, t, n]
                while left > 1e-12 and fifo:
                    take = min(left, fifo[0][1])
                    hist[sl, min(t - fifo[0][0], bins - 1)] += take
                    fifo[0][1] -= take
                    left -= take
                    if fifo[0][1] <= 1e-12:
                        fifo.pop(0)
    return hist


def test_mac_delay_kernel_counts_each_byte_at_its_own_age():
    rng = np.random.default_rng(8)
    L, T, N = 2, 60, 5
    a = rng.exponential(100, (L, T, N)) * (rng.random((L, T, N)) < 0.5)
    cap = rng.choice([0.0, 80.0, 200.0], (L, T, N))
    q0 = rng.uniform(0, 150, (L, N))
    q = np.empty_like(a)  # Lindley's recursion, slot by slot
    prev = q0.copy()
    for t in range(T):
        prev = q[:, t] = np.maximum(prev + a[:, t] - cap[:, t], 0.0)
    served = np.maximum(np.concatenate([q0[:, None], q[:, :-1]], axis=1) + a - q, 0)
    hist = np.zeros((L, 12))  # few bins: the last one collects the long waits
    mac_delay_kernel(a, served, q0, hist)
    ref = scalar_fifo_ages(a, served, q0, 12)
    np.testing.assert_allclose(hist, ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(hist.sum(axis=1), served.sum(axis=(1, 2)), rtol=1e-12)
    assert hist[:, 1:].sum() > 0.1 * hist.sum()
    plain = np.zeros_like(hist)
    getattr(mac_delay_kernel, "py_func", mac_delay_kernel)(a, served, q0, plain)
    np.testing.assert_array_equal(hist, plain)


def test_model_mac_delay_histogram_matches_a_byte_by_byte_fifo():
    sc = scenarios.get("heavy-small-gpu", period_slots=200)
    model = RanModel(sc, seed=3)
    trace = SyntheticTrace(sc, 3)  # same seed, same calls: the same arrivals as the model's
    T, S, C = sc.period_slots, sc.n_sites, sc.n_cells
    layouts = [tdd_layout(site.tdd) for site in sc.sites]
    dl_frac = np.stack([np.tile(d, T // len(d)) for d, _ in layouts], 1)
    is_u = np.stack([np.tile(u, T // len(u)) for _, u in layouts], 1)
    prbs = np.array([[c.prbs for c in s.cells] for s in sc.sites], dtype=float)
    quota = np.zeros((S, C, 2, 3))
    quota[..., 1] = 1.0
    q = {"dl": np.zeros((2, S, C)), "ul": np.zeros((2, S, C))}
    ref = np.zeros((2, DELAY_BINS))
    for _ in range(3):
        model.step_period()
        arr = trace.arrivals(model.slot - T, T)
        for name, a, cap, bpp in (("dl", arr.dl, dl_frac, arr.bpp_dl), ("ul", arr.ul, is_u, arr.bpp_ul)):
            sched = schedule_cells(a, cap[:, :, None] * prbs[None], bpp, quota, q[name])
            ref += scalar_fifo_ages(a.reshape(2, T, -1), sched.served.reshape(2, T, -1), q[name].reshape(2, -1), DELAY_BINS)
            q[name] = sched.queue[:, -1]
    assert ref[:, 1:].sum() > 0.05 * ref.sum()  # the heavy scenario queues: the check is not vacuous
    np.testing.assert_allclose(model.delay_hist[0], ref, rtol=1e-9, atol=1e-6 * ref.max())


def test_uniform_only_draws_keep_the_trace_models_laws():
    sc = scenarios.get("demo", period_slots=2000)
    trace = SyntheticTrace(sc, 11)
    prot, be, expect_p, expect_b = [], [], 0.0, 0.0
    for k in range(12):
        lam = trace.level(k * 2000)
        arr = trace.arrivals(k * 2000, 2000)
        np.testing.assert_allclose(arr.level, lam)
        assert np.all(np.isfinite(arr.dl)) and np.all(arr.dl >= 0) and np.all(arr.ul >= 0)
        m = trace.mean_dl * lam[:, None]
        expect_p += (m * trace.shares[:, :1]).sum() * 2000
        expect_b += (m * trace.shares[:, 1:]).sum() * 2000
        prot.append(arr.dl[0].ravel())
        be.append(arr.dl[1].ravel())
    prot, be = np.concatenate(prot), np.concatenate(be)
    # Protected: active in 60 % of slots, exponential amounts (CV 1); best-effort: lognormal, sigma 1.
    assert abs((prot > 0).mean() - 0.6) < 0.01
    p_on = prot[prot > 0]
    assert abs(p_on.std() / p_on.mean() - 1.0) < 0.05
    b_on = be[be > 0]
    per_cell = b_on / np.median(b_on)
    assert abs(np.log(per_cell).std() - 1.0) < 0.1  # sigma of the log (cell means differ only by scale)
    # Means as configured: the generator's load calibration is unchanged.
    assert abs(prot.sum() / expect_p - 1) < 0.03
    assert abs(be.sum() / expect_b - 1) < 0.05
    assert set(np.unique(trace.markov)) <= set(range(len(MARKOV_LEVELS)))


def test_batched_arrivals_are_a_function_of_seed_and_call_sequence():
    sc = scenarios.get("demo", period_slots=200)
    runs = []
    for _ in range(2):
        m = RanModel(sc, seed=9)
        m.set_envelope(1, 30.0)
        reports = []
        for n in (200, 200, 400, 200, 200, 1000, 200):  # a change of length drops the rest of a batch
            expect = m.trace.level(m.slot)  # level() describes the period about to be generated
            reports.append(m.step_period(n))
            np.testing.assert_array_equal(reports[-1].level, expect)
        runs.append(reports)
    for ra, rb in zip(*runs, strict=True):
        for f in ("demand", "slice_bytes_dl", "slice_bytes_ul", "slice_queue_bytes", "level"):
            np.testing.assert_array_equal(getattr(ra, f), getattr(rb, f))
    # Handed-out periods are independent arrays: a later period does not overwrite an earlier one.
    trace = SyntheticTrace(sc, 2)
    first = trace.arrivals(0, 200)
    kept = first.dl.copy()
    for k in range(1, 25):
        trace.arrivals(200 * k, 200)
    np.testing.assert_array_equal(first.dl, kept)
