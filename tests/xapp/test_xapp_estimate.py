"""Estimate: GPU measurements when reported; otherwise a cost model learned online whose peak is a high
quantile of the observed max/mean ratios."""
from __future__ import annotations

import numpy as np

from xapp.estimate import CostModel, SiteEstimator
from xapp.ingest import KpmSample


def sample(meid="n1", **values):
    names = {"mean": "GPU.SmUsed.Mean", "max": "GPU.SmUsed.Max", "dl": "RRU.PrbUsedDl", "ul": "RRU.PrbUsedUl",
             "avail": "RRU.PrbAvailDl", "miss": "GPU.DeadlineMiss"}
    return KpmSample(meid=meid, received=0.0, collected=0, values={names[k]: float(v) for k, v in values.items()})


def test_gpu_measurements_win_and_nodes_of_a_site_add_up():
    est = SiteEstimator("s")
    e = est.estimate([sample(mean=20, max=40, dl=100, ul=10, avail=273, miss=1),
                      sample("n2", mean=10, max=30, dl=50, ul=5, avail=273)])
    assert e.source == "gpu" and e.mean == 30 and e.peak == 70 and e.misses == 1
    assert abs(e.prb_util - 150 / 546) < 1e-12 and e.peak_q == 70


def test_no_data_no_estimate():
    e = SiteEstimator("s").estimate([])
    assert e.source == "none" and e.mean is None and e.peak is None


def test_cost_model_learns_and_takes_over_when_gpu_measurements_stop():
    rng = np.random.default_rng(1)
    est = SiteEstimator("s", quantile=0.99, min_samples=20)
    for _ in range(300):
        dl, ul = rng.uniform(0, 273), rng.uniform(0, 100)
        mean = 4 + 0.2 * dl + 0.1 * ul
        est.estimate([sample(mean=mean, max=mean * rng.uniform(1.2, 1.8), dl=dl, ul=ul)])
    a, b, c = est.model.coef()
    assert abs(a - 4) < 1e-2 and abs(b - 0.2) < 1e-3 and abs(c - 0.1) < 1e-3
    e = est.estimate([sample(dl=200, ul=50)])         # the node stopped sending GPU.*
    assert e.source == "model"
    assert abs(e.mean - 49) < 0.1
    assert 1.75 * 49 < e.peak < 1.81 * 49             # a high quantile of max/mean, not its mean (1.5)


def test_too_few_samples_gives_no_model_estimate():
    est = SiteEstimator("s", min_samples=20)
    for _ in range(5):
        est.estimate([sample(mean=10, max=20, dl=50, ul=0)])
    assert est.estimate([sample(dl=50)]).source == "none"


def test_cost_model_persists():
    m = CostModel()
    for i in range(30):
        m.update(i, 0, 2 + i, 3 + i)
    again = CostModel.from_dict(m.to_dict())
    assert np.allclose(again.coef(), m.coef()) and list(again.ratios) == list(m.ratios)
