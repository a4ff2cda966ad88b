"""`weaver bench policies` in a reduced quick mode: runs through the CLI, writes JSON and plots, every
arm ran the live loop (`xapp.loop.step`) with the stated ACK delay, and its accounting holds (no timing
asserts)."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from testbed import scenarios
from testbed.bench import policies as bench
from testbed.model.training import StepCostModel


@pytest.fixture(scope="module")
def result(tmp_path_factory, xapp_python, repo_root):
    out = tmp_path_factory.mktemp("bench")
    cmd = [str(xapp_python), "-m", "testbed.cli", "bench", "policies", "--quick", "--periods", "40",
           "--scenarios", "heavy-small-gpu", "slow-partition", "--ack-delay-ms", "12", "--json", str(out / "p.json"), "--plots", str(out / "plots")]
    proc = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "p.json").read_text()), proc.stdout, out


def test_json_has_the_self_describing_keys_for_every_scenario_and_arm(result):
    data, stdout, out = result
    assert data["target_miss_rate"] == 1e-5 and data["quick"] is True
    assert data["driver"] == "xapp.loop.step" and data["ack_delay_ms"] == pytest.approx(12.0)
    for name in ("heavy-small-gpu", "slow-partition"):
        sc = data["scenarios"][name]
        assert set(sc["arms"]) == set(bench.ARMS)
        for arm in sc["arms"].values():
            for key in ("usable_spare_sm_s", "deadline_miss_rate", "granted_sm_s", "used_sm_s", "utilization",
                        "best_effort_delay_p99_ms", "protected_delay_p99_ms", "knob", "calibration_miss_rate"):
                assert key in arm
            assert arm["used_sm_s"] <= arm["granted_sm_s"] + 1e-9
            # every arm, baselines included, was decided by the live loop and paid the same round trip
            assert arm["driver"] == "xapp.loop.step" and arm["ack_delay_ms"] == pytest.approx(12.0)
            assert arm["loop"]["steps"] > 0 and arm["loop"]["rc_controls_failed"] == 0
        for mode in ("weaver-envelope", "weaver-quota"):   # the shaped arms' controls went to the nodes, acked
            loop = sc["arms"][mode]["loop"]
            assert loop["controls"] > 0 and loop["rc_controls_acked"] == loop["controls"]
        for key in ("weaver_vs_reactive_usable_ratio", "weaver_vs_oracle_usable_ratio", "load", "partition"):
            assert key in sc
        assert sc["load"]["cells_per_gpu"] > 0
        # Conservation: shaping moved work in time, dropped nothing.
        for mode in ("envelope", "quota"):
            assert sc["conservation"][mode]["served_bytes_rel_error"] < 1e-6
            assert sc["conservation"][mode]["ran_work_rel_error"] < 1e-6
    assert data["scenarios"]["slow-partition"]["reconfig_s"] == pytest.approx(0.3)
    assert "weaver/reactive" in stdout and "driven by xapp.loop.step" in stdout and "12 ms" in stdout
    assert sorted(p.name for p in (out / "plots").iterdir()) == sorted(
        [f"{n}_{k}.png" for n in ("heavy-small-gpu", "slow-partition") for k in ("demand_envelope_lease", "delay_cdf")]
        + ["usable_spare_utilisation.png"])


def test_accounting_counts_misses_usable_and_reconfiguration_exactly():
    sc = scenarios.get("heavy-small-gpu")
    sc1 = type(sc)(**{**sc.__dict__, "sites": sc.sites[:1], "reconfig_s": 0.0})
    P, T = 4, sc1.period_slots
    demand = np.full((P, T, 1), 20, dtype=np.uint8)
    demand[2, 5, 0] = 40  # one slot at 40 SMs in period 2
    run = bench.RunRecord(demand=demand, period_max=demand.max(axis=1).astype(float),
                          envelopes=np.zeros((P, 1)), delay_hist=np.zeros((2, 2, 1)), served_bytes=np.zeros(1),
                          demand_sum=0.0, controls=0, plot=np.zeros((0, 1)))
    grants = np.array([[0], [24], [24], [16]])
    step = StepCostModel()
    res = bench.account(grants, run, sc1, step)
    assert res.deadline_misses == 1  # 40 > 48 - 24 in exactly one slot
    assert res.granted_sm_s == pytest.approx((24 + 24 + 16) * 0.1)
    # Usable: period 2 only has 48 - 40 = 8 SMs above its peak.
    assert res.usable_spare_sm_s == pytest.approx((24 + 8 + 16) * 0.1)
    assert res.used_sm_s == pytest.approx((24 + 24 + 16) * step.busy_s(0.1))
    slow = type(sc1)(**{**sc1.__dict__, "reconfig_s": 0.15})
    res = bench.account(grants, run, slow, step)
    # Runs: 24 SMs for 0.2 s (>= q + L: usable after its first 0.15 s, when the period-2 peak leaves 8 SMs);
    # 16 SMs for 0.1 s (< q + L = 0.177 s: never usable).
    assert res.usable_spare_sm_s == pytest.approx(8 * 0.05)
    assert res.used_sm_s == pytest.approx(24 * step.busy_s(0.05))
