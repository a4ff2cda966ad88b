"""`weaver bench sim` smoke test: every row is measured and reported, by wall and CPU time (no timing asserts)."""
from __future__ import annotations

import argparse
import json

from testbed.bench import sim


def test_bench_sim_reports_every_row_with_wall_and_cpu_ratios(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    out = tmp_path / "sim.json"
    args = parser.parse_args(["--seconds", "0.2", "--periods", "200", "400", "--json", str(out)])
    assert sim.run(args) == 0
    table = capsys.readouterr().out
    assert "x (cpu time)" in table and "target >= 200x" in table
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert {(r["period_slots"], r["envelope_sms"], r["delay_histograms"]) for r in rows} == {
        (p, e, h) for p in (200, 400) for e in (None, 24.0) for h in (True, False)}
    for r in rows:
        assert r["slots"] == round(0.2 / 0.0005 / r["period_slots"]) * r["period_slots"]
        assert r["wall_s"] > 0 and r["cpu_s"] > 0
        assert r["realtime_factor"] == r["simulated_s"] / r["wall_s"]
        assert r["realtime_factor_cpu"] == r["simulated_s"] / r["cpu_s"]
        assert abs(r["ten_minutes_cpu_s"] * r["realtime_factor_cpu"] - 600) < 1e-6
    assert report["rows_meeting_target_cpu"] == sum(r["realtime_factor_cpu"] >= 200 for r in rows)
    assert report["best_realtime_factor_cpu"] == max(r["realtime_factor_cpu"] for r in rows)
