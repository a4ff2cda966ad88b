"""`weaver bench agent` and the GPU check script, smoke-run small on CPU: they run, report the
self-describing keys, and the baseline behaves like a baseline (the numbers themselves are benched)."""
from __future__ import annotations

import json

import torch

from agent import bench, gpu_check


def test_bench_agent_reports_both_arms_and_ratios(tmp_path, capsys):
    out = tmp_path / "agent.json"
    rc = bench.main(["--windows", "12", "--preset", "tiny", "--periods", "20", "--duties", "0.5",
                     "--fixed-batch", "64", "--json", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "fitted" in table and "fixed(B=64)" in table and "fitted/fixed" in table and "target" in table
    res = json.loads(out.read_text())
    fitted, fixed = res["arms"]["fitted"], res["arms"]["fixed"]
    for arm in (fitted, fixed):
        assert {"utilisation", "overrun_p50_ms", "overrun_p90_ms", "overrun_p99_ms", "overrun_max_ms",
                "overrun_p99_pct_of_period", "tokens_per_s", "unused_granted_ms", "cut_micro_batches",
                "launch_slowdown_p50", "launch_slowdown_p99"} <= set(arm)
        assert 0 <= arm["unused_granted_ms"] <= arm["granted_ms"]
        assert arm["windows"] >= 10
    # 64 samples never fit a 10 ms budget: the baseline overruns (nearly) every window; the fitted arm
    # overruns only where the host preempts it
    assert fixed["utilisation"] > 1.0 and fixed["windows_overrun_frac"] >= 0.9, fixed
    assert fitted["utilisation"] < fixed["utilisation"], (fitted, fixed)
    assert res["ratios_fitted_over_fixed"]["utilisation"] < 1.0
    assert res["targets"]["utilisation_min"] == 0.95
    assert res["meter"] == "cpu"            # what the agent charges on a CPU device, unless --meter says


def test_bench_agent_meter_follows_the_flag(tmp_path):
    out = tmp_path / "agent.json"
    assert bench.main(["--windows", "4", "--preset", "tiny", "--periods", "20", "--duties", "0.5",
                       "--meter", "wall", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["meter"] == "wall"


def test_bench_refuses_bad_arguments(capsys):
    assert bench.main(["--windows", "1", "--duties", "1.5"]) == 2


def test_gpu_check_script_runs_its_cpu_smoke_path(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        assert gpu_check.main([]) == 2                                  # no CUDA here: refuses by default
        capsys.readouterr()
        out = tmp_path / "gpu.json"
        assert gpu_check.main(["--allow-cpu", "--seconds", "2", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads(out.read_text())
    assert res["env"]["cuda_available"] is False and res["env"]["green_contexts"] is False
    assert "error" not in res["step_fit"] and res["step_fit"]["fit_b_ms_per_sample"] > 0
    adh = res["adherence_duty_cycle"]
    assert "error" not in adh and adh["windows"] >= 10 and adh["utilisation"] > 0
