"""Budget traces, their integrals, and a short `weaver bench training` run (virtual time: the result
is deterministic, so comparing modes here is not a timing assertion)."""
from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.crosssite import bench
from agent.crosssite.traces import Capacity, TraceSpec, budget_traces

pytestmark = pytest.mark.agent


def test_traces_are_seeded_bounded_and_bursty():
    a = budget_traces(TraceSpec(seed=3))
    assert torch.equal(a, budget_traces(TraceSpec(seed=3)))
    assert not torch.equal(a, budget_traces(TraceSpec(seed=4)))
    assert a.shape == (3, 1200) and float(a.min()) >= 0 and float(a.max()) <= 1
    assert all(0.05 < float((row == 0).double().mean()) < 0.8 for row in a)   # RAN surges take the GPU
    with pytest.raises(ValueError):
        TraceSpec(sites=0)


@settings(max_examples=50, deadline=None)
@given(st.floats(0, 50), st.floats(0.001, 5))
def test_finish_inverts_work(t0, work):
    cap = Capacity(budget_traces(TraceSpec(duration_s=60, seed=1)), 0.05)
    for site in range(3):
        t1 = cap.finish(site, t0, work)
        if math.isinf(t1):
            assert cap.work(site, t0, cap.end_s) < work + 1e-9
        else:
            assert t1 >= t0 and cap.work(site, t0, t1) == pytest.approx(work, abs=1e-9)


def test_loss_at_tokens_interpolates():
    curve = [(0, 0, 4.0), (1, 100, 3.0), (2, 300, 2.0)]
    assert bench.loss_at_tokens(curve, 50) == pytest.approx(3.5)
    assert bench.loss_at_tokens(curve, 200) == pytest.approx(2.5)
    assert math.isnan(bench.loss_at_tokens(curve, 400))


def test_bench_compares_the_four_modes_on_the_same_traces(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert bench.main(["--duration-s", "10", "--round-s", "1.0", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "lockstep" in table and "weaver" in table and "x" in table
    res = json.loads(out.read_text())
    modes = res["modes"]
    assert set(modes) == {"lockstep", "diloco", "weaver-blocking", "weaver"}
    for m in modes.values():
        assert {"committed_tokens_per_s", "final_val_loss", "val_loss_at_equal_tokens", "budget_utilisation"} <= set(m)
    # Same traces, same capacity: the time-boxed rounds never wait, lockstep waits for the worst site.
    assert res["weaver_vs_lockstep_tokens_ratio"] > 1.0
    assert modes["weaver"]["waiting_share_of_budget"] == 0.0 < modes["lockstep"]["waiting_share_of_budget"]
    assert modes["weaver"]["final_val_loss"] < res["curves"]["weaver"][0][2]   # it learned
    # Overlapped rounds train through the transfer windows the blocking rounds idle in.
    assert modes["weaver"]["budget_utilisation"] > 0.97 > modes["weaver-blocking"]["budget_utilisation"]
    assert modes["weaver"]["committed_tokens"] > modes["weaver-blocking"]["committed_tokens"]


def test_bench_refuses_a_partial_comparison(capsys):
    assert bench.main(["--modes", "weaver"]) == 2


def test_bench_reads_traces_from_a_file_and_refuses_bad_ones(tmp_path, capsys):
    good = tmp_path / "t.json"
    assert bench.main(["--duration-s", "4", "--round-s", "1.0", "--dump-traces", str(good)]) == 0
    doc = json.loads(good.read_text())
    assert doc["slot_s"] == 0.05 and len(doc["budget"]) == 3
    traces, slot = bench.load_traces(str(good), 3, 4.0)
    assert torch.equal(traces, budget_traces(TraceSpec(duration_s=4.0)))
    for bad in ({"slot_s": 0.05, "budget": [[0.5, 2.0]] * 3}, {"slot_s": 0.05}, {"slot_s": 0.05, "budget": [[0.5]] * 2},
                {"slot_s": "x", "budget": []}, {"slot_s": 0.05, "budget": [[0.5] * 10] * 3}):
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(bad))
        assert bench.main(["--duration-s", "4", "--traces", str(p)]) == 2
        assert "bench training:" in capsys.readouterr().err
