"""A policy can only defer work that the node's compute-aware stage can drain later (issue 8's
heavy-small-gpu best-effort p99). The stage once served its site-wide FIFO with a per-cell PRB limit
and pushed work above a saturated cell's limit back to the head of the FIFO, so one busy cell stopped
the whole site from draining (measured then: seed 2, period 464, a 1.4 MB backlog grew to 112 MB in 3 s
even at E = inf). It is now earliest-deadline-first over the cells that can still carry: these tests
pin that down at the unit and at the model level."""
from __future__ import annotations

import numpy as np
import pytest

from testbed import scenarios
from testbed.model.mac import FifoBacklog, fifo_serve
from testbed.model.ran import RanModel


def test_a_saturated_cell_does_not_stop_other_cells_from_draining():
    # Cell 0 has 100 units waiting and no PRB headroom; cell 1 gets 10 units a slot and has room for 50.
    backlog = FifoBacklog(np.array([0]), np.array([[100.0, 0.0]]))
    T = 4
    arrivals = np.tile([0.0, 10.0], (T, 1))
    limit = np.tile([0.0, 50.0], (T, 1))
    out = fifo_serve(backlog, 1, arrivals, np.full(T, 20.0), limit=limit)  # the site's room: 20 a slot
    # Work-conserving: cell 1 carries its arrivals in the slot they come; only cell 0's backlog waits.
    assert out.per_cell[:, 1] == pytest.approx(np.full(T, 10.0))
    assert out.backlog.total == pytest.approx(100.0)


def test_heavy_small_gpu_backlog_drains_once_the_envelope_is_lifted():
    sc = scenarios.get("heavy-small-gpu")
    capped, free = RanModel(sc, seed=2, track_delay=False), RanModel(sc, seed=2, track_delay=False)
    for s, site in enumerate(sc.sites):
        capped.set_envelope(s, 0.6 * site.gpu_sms)
    for _ in range(40):
        capped.step_period()
        free.step_period()
    assert sum(b.total for b in capped.backlog_dl + capped.backlog_ul) > 0, "envelope never bound"
    for s in range(sc.n_sites):
        capped.set_envelope(s, None)
    for _ in range(40):
        capped.step_period()
        free.step_period()
    assert sum(b.total for b in capped.backlog_dl + capped.backlog_ul) == 0
    np.testing.assert_allclose(capped.served_bytes, free.served_bytes, rtol=1e-9)
