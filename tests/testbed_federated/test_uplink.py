"""UE updates through the testbed MAC: every byte submitted is carried, an outage holds a UE back, a UE
with a better channel is not slower, and the radio is a function of the seed."""
from __future__ import annotations

import numpy as np

from testbed import scenarios
from testbed.federated.population import Population, PopulationConfig
from testbed.federated.uplink import Uplink

SC = scenarios.get("demo")


def test_uploads_are_carried_and_outages_delay_them():
    cell = np.zeros(4, dtype=int)
    up = Uplink(SC, cell, mcs_offset=np.array([0, 0, 6, -6]), seed=3)
    up.submit(0, 0.01, 200_000)
    up.submit(1, 0.01, 200_000, outage_s=(0.0, 0.5))
    up.submit(2, 0.01, 200_000)
    up.submit(3, 0.01, 200_000)
    up.advance_to(2.0)
    f = [up.finish_s(i) for i in range(4)]
    assert all(np.isfinite(f)) and up.carried_bytes == 800_000
    assert f[1] > 0.5 > f[0]                  # nothing carried during the outage
    assert f[2] <= f[0] <= f[3]               # a better MCS carries more bytes per PRB
    assert not any(up.busy(i) for i in range(4))


def test_radio_is_deterministic_and_shares_a_cell_fairly():
    pop = Population.build(PopulationConfig(ues_per_cell=8), seed=1)
    runs = []
    for _ in range(2):
        up = Uplink(SC, pop.cell, np.zeros(len(pop.cell), dtype=int), seed=1)
        for i in range(len(pop.cell)):
            up.submit(i, 0.0, 50_000)
        up.advance_to(1.0)
        runs.append(np.array([up.finish_s(i) for i in range(len(pop.cell))]))
    assert np.array_equal(runs[0], runs[1])
    # equal channels and sizes: the UEs of one cell finish in the same slot (equal PRB shares)
    for c in range(SC.n_sites * SC.n_cells):
        assert len(set(runs[0][pop.cell == c])) == 1
