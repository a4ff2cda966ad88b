"""The model's fast paths against plain references: the sparse MAC delay histogram against a dense FIFO
search of every slot, and the uniform-only traffic draws against the laws the trace model states."""
from __future__ import annotations

import numpy as np

from testbed import scenarios
from testbed.model import RanModel
from testbed.model.mac import fifo_backlog_delays, fifo_delay_slots, lindley, schedule_cells
from testbed.model.ran import DELAY_BINS, tdd_layout
from testbed.model.traffic import MARKOV_LEVELS, SyntheticTrace


def test_mac_delay_histogram_matches_a_dense_search_of_every_slot():
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
    for _ in range(4):
        model.step_period()
        arr = trace.arrivals(model.slot - T, T)
        for name, a, cap, bpp in (("dl", arr.dl, dl_frac, arr.bpp_dl), ("ul", arr.ul, is_u, arr.bpp_ul)):
            sched = schedule_cells(a, cap[:, :, None] * prbs[None], bpp, quota, q[name])
            for sl in range(2):  # queue=None: every slot that served anything is searched
                d = fifo_delay_slots(a[sl], sched.served[sl], q[name][sl])
                ref[sl] += np.bincount(np.minimum(d, DELAY_BINS - 1).ravel(), sched.served[sl].ravel(), DELAY_BINS)
            q[name] = sched.queue[:, -1]
    assert ref[:, 1:].sum() > 0.05 * ref.sum()  # the heavy scenario queues: the check is not vacuous
    np.testing.assert_allclose(model.delay_hist[0], ref, rtol=1e-9, atol=1e-6 * ref.max())


def test_backlog_delays_of_a_batch_equal_one_queue_at_a_time():
    rng = np.random.default_rng(4)
    B, T, Q = 2, 120, 5
    a = rng.exponential(100, (B, T, Q)) * (rng.random((B, T, Q)) < 0.5)
    cap = rng.choice([0.0, 60.0, 250.0], (B, T, Q))
    q0 = rng.uniform(0, 300, (B, Q))
    queue = np.stack([lindley(a[b] - cap[b], q0[b]) for b in range(B)])
    served = np.maximum(np.concatenate([q0[:, None], queue[:, :-1]], axis=1) + a - queue, 0)
    d = fifo_backlog_delays(a, served, q0, queue)
    dense = np.zeros((B * Q, T), dtype=np.intp)  # queue index b * Q + j
    dense[d.queue, d.slot] = d.delay
    for b in range(B):
        for j in range(Q):
            one = fifo_delay_slots(a[b, :, j:j + 1], served[b, :, j:j + 1], q0[b, j:j + 1], queue[b, :, j:j + 1])
            np.testing.assert_array_equal(dense[b * Q + j], one[:, 0])
    assert d.delay.max() > 0


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
