"""`weaver bench safety`: the analysis on a hand-made run summary, and (slow) a --quick run end to end."""
from __future__ import annotations

import json
import math
import subprocess

import pytest

from testbed.bench.safety import ORDER, analyse, fault_spec, table
from testbed.faults import parse_fault


def _row(t, sms, lease, lid="", end_ms=0, valid_ms=300, misses=0):
    return [t, 0, sms, lease, lid, end_ms, 0.1, valid_ms, misses]


def _summary(rows, leases, probe_end=10.0, p90=2.0):
    totals = {"deadline_misses": 3, "deadline_misses_attributable_to_training": 3,
              "deadline_misses_attributable_to_reported_lease": 0, "leases_granted": 4, "tokens_trained": 99,
              "sm_seconds_executed": 1.0, "sm_seconds_held_by_agent": 1.0}
    return {"idle_probe_end_unix": probe_end, "totals": totals,
            "sites": {"site-0": {"ground_truth": {"idle_baseline_sms_p90": p90}}},
            "series": {"rows": rows}, "xapp_leases": {"rows": leases}}


def test_every_row_has_a_parseable_fault():
    for name in ORDER[1:]:
        assert parse_fault(fault_spec(name, 2.0)).kind == name
    assert fault_spec("none", 2.0) is None


def test_revoke_to_idle_beyond_lease_and_probe_misses():
    rows = [_row(9.9, 100.0, 0.0, misses=2),                          # start-up work in the idle probe
            _row(10.1, 80.0, 80.0, "s.1.1"), _row(10.2, 90.0, 80.0, "s.1.2"),
            _row(10.3, 70.0, 0.0), _row(10.4, 20.0, 0.0, misses=1), _row(10.5, 2.5, 0.0),
            _row(10.6, 80.0, 80.0, "s.1.3"), _row(10.7, 80.0, 80.0, "s.1.3"),  # then s.1.3 expires
            _row(10.8, 80.0, 0.0), _row(10.9, 1.0, 0.0), _row(11.0, 1.0, 0.0)]
    leases = [(10.05, "site-0", 80), (10.25, "site-0", 0), (10.55, "site-0", 80)]
    a = analyse(_summary(rows, leases), {"site-0": 100.0})
    assert a["deadline_misses_attributable_to_training_in_probe"] == 2
    assert a["deadline_misses_attributable_to_training_after_probe"] == 1
    # 90 over 80 at 10.2 (10 SMs x 100 ms), 20 over nothing at 10.4 (10.3 still counts the lease reported
    # at its start), and the idle host work over no lease at 10.5, 10.9 and 11.0: nothing is subtracted
    assert a["sm_ms_beyond_lease_max"] == pytest.approx(2000.0)
    assert a["sm_ms_beyond_lease_total"] == pytest.approx(1000.0 + 2000.0 + 250.0 + 100.0 + 100.0)
    assert a["sm_ms_beyond_lease_above_idle_total"] == pytest.approx(800.0 + 1800.0 + 50.0)
    ev = a["sites"]["site-0"]["events"]
    assert [e["kind"] for e in ev] == ["revoke", "expiry"]
    # revoke at 10.25, first period at or below 2 + 1 SMs ends at 10.5; expiry of s.1.3 (first seen in
    # the period ending 10.6, so received from 10.5, valid 300 ms) at 10.8, idle in the period ending 10.9
    assert a["sites"]["site-0"]["revoke_or_expiry_to_idle_ms"] == pytest.approx([250.0, 100.0])
    assert a["revoke_or_expiry_to_idle_ms_max"] == pytest.approx(250.0)
    assert a["revoke_or_expiry_never_idle"] == 0
    assert "| fault |" in table([{"fault": "x", "applied": True, "note": "", **a}])


def test_an_agent_that_never_goes_idle_is_censored():
    rows = [_row(10.1, 80.0, 80.0, "s.1.1"), _row(10.2, 80.0, 0.0), _row(10.3, 80.0, 0.0)]
    a = analyse(_summary(rows, [(10.0, "site-0", 80), (10.15, "site-0", 0)]), {"site-0": 100.0})
    assert a["revoke_or_expiry_never_idle"] == 1 and math.isnan(a["revoke_or_expiry_to_idle_ms_max"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_safety_quick_end_to_end(repo_root, tmp_path):
    out_json = tmp_path / "safety.json"
    proc = subprocess.run([str(repo_root / ".venv-xapp" / "bin" / "weaver"), "bench", "safety", "--quick",
                           "--faults", "xapp-stall,ack-loss", "--json", str(out_json)],
                          cwd=repo_root, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| fault | applied | training misses by ground truth" in proc.stdout
    doc = json.loads(out_json.read_text())
    assert [r["fault"] for r in doc["rows"]] == ["none", "xapp-stall", "ack-loss"]
    for r in doc["rows"]:
        for key in ("deadline_misses_attributable_to_training_after_probe", "sm_ms_beyond_lease_max",
                    "sm_ms_beyond_lease_total", "revoke_or_expiry_to_idle_ms_p50", "revoke_or_expiry_to_idle_ms_p99",
                    "revoke_or_expiry_to_idle_ms_max", "leases_granted", "tokens_trained", "timeline", "series"):
            assert key in r, key
        assert r["applied"], r["note"]
    stall = doc["rows"][1]["timeline"][0]
    assert stall["kind"] == "xapp-stall" and stall["end_s"] > stall["start_s"]
    assert doc["rows"][2]["timeline"][0]["counts"]["acks"] >= 0
    assert doc["rows"][0]["tokens_trained"] > 0


def test_a_new_lease_before_idle_is_counted_apart():
    rows = [_row(10.1, 80.0, 80.0, "s.1.1"), _row(10.2, 80.0, 0.0), _row(10.3, 80.0, 80.0, "s.1.2"),
            _row(10.4, 80.0, 80.0, "s.1.3"), _row(10.5, 1.0, 0.0)]
    leases = [(10.0, "site-0", 80), (10.15, "site-0", 0), (10.25, "site-0", 80)]
    a = analyse(_summary(rows, leases), {"site-0": 100.0})
    assert a["revoke_or_expiry_regranted_before_idle"] == 1 and a["revoke_or_expiry_never_idle"] == 0
