"""`weaver bench rmr` runs end to end (tiny counts) and writes self-describing JSON; no timing asserts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_rmr_quick(tmp_path):
    out = tmp_path / "rmr.json"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "bench", "rmr", "--quick", "--sizes", "300,30000",
                        "--json", str(out)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ratio" in r.stdout and "targets" in r.stdout
    res = json.loads(out.read_text())
    for arm in ("weaver", "baseline"):
        for size in ("300", "30000"):
            row = res["arms"][arm][size]
            assert row["one_way_received"] == row["one_way_msgs"]  # nothing lost on either arm
            assert row["rtt_samples"] == 200 and row["rtt_p99_ms"] >= row["rtt_p50_ms"] > 0
    assert set(res["ratio_weaver_over_baseline"]["300"]) == {"one_way_rate_x", "rtt_p50_x", "rtt_p99_x",
                                                              "one_core_capacity_x"}
    assert row["receiver_cpu_us_per_msg"] > 0 and row["sender_cpu_us_per_msg"] > 0
