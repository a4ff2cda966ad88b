"""`weaver bench safety`: the analysis on a hand-made run summary, and (slow) a --quick run end to end."""
from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest

from testbed.bench.safety import ORDER, analyse, fault_spec, table
from testbed.faults import parse_fault


def _row(t, sms, lease, lid="", end_ms=0, valid_ms=300, misses=0):
    return [t, 0, sms, lease, lid, end_ms, 0.1, valid_ms, misses]


def _summary(rows, views, probe_end=10.0, p90=2.0, trace=None, lease_seq=None):
    """`views`: the decisions (t_unix, grant_sms) of one xApp instance, epoch 1, the lease it holds out then
    `lease_seq` (None: none, and its first grant issued seq 1); `trace`: (t_unix, cpu_s) samples."""
    totals = {"deadline_misses": 3, "deadline_misses_attributable_to_training": 3,
              "deadline_misses_attributable_to_reported_lease": 0, "leases_granted": 4, "tokens_trained": 99,
              "sm_seconds_executed": 1.0, "sm_seconds_held_by_agent": 1.0}
    out = {"idle_probe_end_unix": probe_end, "totals": totals,
           "sites": {"site-0": {"ground_truth": {"idle_baseline_sms_p90": p90, "cores": 1}}},
           "series": {"rows": rows},
           "xapp_views": {"instances": [{"epoch": 1, "sites": {"site-0": {"views": views, "lease_seq": lease_seq}}}]}}
    if trace is not None:
        out["cpu_trace"] = {"sites": {"site-0": trace},
                            "overhead": {"interval_ms": 2.0, "sample_gap_ms_p99": 2.5}}
    return out


def _trace(busy, t0=10.0, t1=11.0, step=0.002):
    """A CPU clock sampled every `step`: one core busy within each (start, end) of `busy`, idle otherwise."""
    t = np.arange(t0, t1, step)
    on = np.zeros(len(t))
    for a, b in busy:
        on[(t >= a) & (t < b)] = 1.0
    cpu = np.concatenate(([0.0], np.cumsum(on[:-1] * step)))
    return [[float(x), float(c)] for x, c in zip(t, cpu, strict=True)]


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
    # the xApp grants s.1.1 at 10.05 and s.1.2 at 10.15, revokes at 10.25, grants s.1.3 at 10.55, then decides
    # nothing more (stalled); the agent's CPU: busy until 12 ms after the revoke, and 8 ms after s.1.3's end,
    # and, idle, 2 ms of host work every 100 ms (its polls), in the idle probe (from 9.0) as after it
    polls = [(9.0 + k / 10, 9.0 + k / 10 + 0.002) for k in range(23)]
    views = [[10.05, 80], [10.15, 80], [10.25, 0], [10.35, 0], [10.45, 0], [10.55, 80]]
    trace = _trace([(10.0, 10.262), (10.56, 10.858), *polls], t0=9.0, t1=11.2)
    a = analyse(_summary(rows, views, trace=trace), {"site-0": 100.0})
    assert a["deadline_misses_attributable_to_training_in_probe"] == 2
    assert a["deadline_misses_attributable_to_training_after_probe"] == 1
    # 90 over 80 at 10.2 (10 SMs x 100 ms), 20 over nothing at 10.4 (10.3 still counts the lease reported
    # at its start), and the idle host work over no lease at 10.5, 10.9 and 11.0: nothing is subtracted
    assert a["sm_ms_beyond_lease_max"] == pytest.approx(2000.0)
    assert a["sm_ms_beyond_lease_total"] == pytest.approx(1000.0 + 2000.0 + 250.0 + 100.0 + 100.0)
    assert a["sm_ms_beyond_lease_above_idle_total"] == pytest.approx(800.0 + 1800.0 + 50.0)
    ev = a["sites"]["site-0"]["events"]
    assert [e["kind"] for e in ev] == ["revoke", "expiry"]
    # revoke at 10.25, first period at or below 2 + 1 SMs ends at 10.5; expiry of s.1.3 (the xApp's third
    # decision with a grant, at 10.55, valid 300 ms) at 10.85, idle in the period ending 10.9
    assert [e["t_unix"] for e in ev] == pytest.approx([10.25, 10.85])
    assert all(e["instant"].startswith("xapp decision") for e in ev)
    assert a["sites"]["site-0"]["revoke_or_expiry_to_idle_ms"] == pytest.approx([250.0, 50.0])
    assert a["revoke_or_expiry_to_idle_ms_max"] == pytest.approx(250.0)
    assert a["revoke_or_expiry_never_idle"] == 0
    # the 2 ms trace resolves what the 100 ms periods cannot: 12 ms and 8 ms, each to a sample
    f = a["revoke_or_expiry_to_idle_traced"]
    assert [e["to_idle_ms_traced"] for e in ev] == pytest.approx([12.0, 8.0], abs=2.1)
    assert f["max_ms"] == pytest.approx(12.0, abs=2.1) and f["measured"] == 2 and f["never_idle"] == 0
    assert f["resolution_ms"] == pytest.approx(3.5) and f["window_ms"] == 10.0
    # working at both instants (its last busy window ends after them): it had to stop, it was not idle already
    assert all(e["agent_last_worked_ms_before_event"] < 0 for e in ev) and f["events_agent_already_idle"] == 0
    # a 10 ms window holding one poll reads 0.2 core: the probe's p99, + 0.1 core
    assert a["sites"]["site-0"]["idle_probe_window_rate_cores_p99"] == pytest.approx(0.2, abs=0.01)
    assert a["sites"]["site-0"]["idle_threshold_cores"] == pytest.approx(0.3, abs=0.01)
    assert "| fault |" in table([{"fault": "x", "applied": True, "note": "", **a}])


def test_an_agent_that_never_goes_idle_is_censored():
    rows = [_row(10.1, 80.0, 80.0, "s.1.1"), _row(10.2, 80.0, 0.0), _row(10.3, 80.0, 0.0)]
    a = analyse(_summary(rows, [[10.0, 80], [10.15, 0]], trace=_trace([(10.0, 10.4)], t1=10.3)), {"site-0": 100.0})
    assert a["revoke_or_expiry_never_idle"] == 1 and math.isnan(a["revoke_or_expiry_to_idle_ms_max"])
    f = a["revoke_or_expiry_to_idle_traced"]
    assert f["never_idle"] == 1 and math.isnan(f["max_ms"])


@pytest.mark.slow
@pytest.mark.timeout(560)
def test_bench_safety_quick_end_to_end(repo_root, tmp_path):
    # ~80 s here; the headroom is for a cold host (a CI row once took 135 s to start). ack-loss is driven on the
    # wire in test_faults_wire.py; the two rows here are the ones whose analysis needs a live run
    out_json = tmp_path / "safety.json"
    # 12 s rows, not --quick's 8: revoke-mid-period needs the agent seen working on a steady period grid
    # first, and a loaded host once gave it none in an 8 s row's 5.6 s window
    proc = subprocess.run([str(repo_root / ".venv-xapp" / "bin" / "weaver"), "bench", "safety", "--quick",
                           "--duration", "12", "--faults", "xapp-stall,revoke-mid-period", "--json", str(out_json)],
                          cwd=repo_root, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| fault | applied | training misses by ground truth" in proc.stdout
    assert "2 ms CPU trace" in proc.stdout and "| resolution ms |" in proc.stdout
    assert "revoke while busy -> work stopped" in proc.stdout
    doc = json.loads(out_json.read_text())
    assert [r["fault"] for r in doc["rows"]] == ["none", "xapp-stall", "revoke-mid-period"]
    for r in doc["rows"]:
        for key in ("deadline_misses_attributable_to_training_after_probe", "sm_ms_beyond_lease_max",
                    "sm_ms_beyond_lease_total", "revoke_or_expiry_to_idle_ms_p50", "revoke_or_expiry_to_idle_ms_p99",
                    "revoke_or_expiry_to_idle_ms_max", "leases_granted", "tokens_trained", "timeline", "series"):
            assert key in r, key
        assert r["applied"], r["note"]
        # where a slow start went: recorded, not required (a fresh-clone run had an agent the xApp registered but
        # that did not see its Welcome for two minutes; the row still ran, and the record says so)
        up = r["startup"]
        assert up["world_s"] <= up["xapp_ready_s"] <= up["agents_up_s"] <= up["agents_connected_s"], up
        assert isinstance(up["agents_not_connected"], list), up
        f = r["revoke_or_expiry_to_idle_traced"]
        for key in ("p50_ms", "p99_ms", "max_ms", "measured", "regranted_before_idle", "never_idle", "events",
                    "resolution_ms", "trace_sample_gap_ms_p99", "window_ms", "hold_ms", "idle",
                    "trace_thread_cpu_fraction_of_one_core", "trace_cpu_us_per_sample"):
            assert key in f, key
        assert r["cpu_trace"]["sites"]["site-0"] and r["cpu_trace"]["overhead"]["samples"] > 0
        assert r["xapp_views"]["instances"] and not r["xapp_views"]["failures"]
        b = r["revoke_while_busy_to_stopped"]
        for key in ("p50_ms", "p99_ms", "max_ms", "measured", "revokes", "busy_at_instant", "busy_at_instant_stale_kpm",
                    "busy_at_instant_xapp_shutdown", "regranted_before_idle", "never_idle", "resolution_ms", "target_ms"):
            assert key in b, key
        # every run ends with the xApp's SIGTERM, sent while the agent works, and traced past it
        end = r["summary"]["end_revoke"]
        assert end["sigterm_unix"] and end["traced_after_s"] > 0
        assert r["cpu_trace"]["sites"]["site-0"][-1][0] >= end["sigterm_unix"] + 0.3
    stall = doc["rows"][1]["timeline"][0]
    assert stall["kind"] == "xapp-stall" and stall["end_s"] > stall["start_s"]
    assert doc["rows"][0]["tokens_trained"] > 0
    # several stale-KPM revokes timed into the agent's work, each logged by the xApp. Whether the agent is busy
    # in the 3 ms before an instant is the host's to decide: under a short-period CFS quota the worker runs in
    # slices with throttled gaps between them, and a loaded CI host caught none of a run's stale-KPM revokes
    # inside a slice (busy_at_instant_stale_kpm 0, the run's end measured). Every instant is classified, and at
    # least one revoke of the row is measured while busy
    mid = doc["rows"][2]
    assert len(mid["timeline"][0]["events"]) >= 2, mid["timeline"]
    b = mid["revoke_while_busy_to_stopped"]
    assert b["revokes"] - b["not_traced_at_instant"] >= 3, b      # stale-KPM revokes and the end, classified
    assert b["busy_at_instant"] >= 1 and b["never_idle"] == 0, b
    assert b["measured"] + b["regranted_before_idle"] == b["busy_at_instant"], b


def test_a_new_lease_before_idle_is_counted_apart():
    rows = [_row(10.1, 80.0, 80.0, "s.1.1"), _row(10.2, 80.0, 0.0), _row(10.3, 80.0, 80.0, "s.1.2"),
            _row(10.4, 80.0, 80.0, "s.1.3"), _row(10.5, 1.0, 0.0)]
    views = [[10.0, 80], [10.15, 0], [10.25, 80], [10.35, 80]]
    a = analyse(_summary(rows, views, trace=_trace([(10.0, 10.45)], t1=10.6)), {"site-0": 100.0})
    assert a["revoke_or_expiry_regranted_before_idle"] == 1 and a["revoke_or_expiry_never_idle"] == 0
    f = a["revoke_or_expiry_to_idle_traced"]
    assert f["regranted_before_idle"] == 1 and f["never_idle"] == 0


def test_a_restarted_xapp_continues_the_lease_seqs():
    """A restarted xApp may go on from the seqs its predecessor issued: seq k is mapped through the lease it
    holds out when its record is read (here seq 7, its 2nd grant), not by counting from 1."""
    rows = [_row(10.1, 80.0, 80.0, "s.1.6"), _row(10.2, 80.0, 80.0, "s.1.7"), _row(10.3, 80.0, 0.0),
            _row(10.4, 1.0, 0.0), _row(10.5, 1.0, 0.0), _row(10.6, 1.0, 0.0)]
    a = analyse(_summary(rows, [[10.05, 80], [10.12, 80]], lease_seq=7), {"site-0": 100.0})
    [ev] = a["sites"]["site-0"]["events"]
    assert ev["kind"] == "expiry" and ev["t_unix"] == pytest.approx(10.42)
    assert ev["instant"].startswith("xapp decision")


def test_revokes_while_busy_are_measured_apart():
    """A stale-KPM revoke the xApp logged mid-work (busy until 7 ms after it), a tick revoke while idle, and
    the end-of-run SIGTERM mid-work (busy until 13 ms after it): only the busy ones are timed (the trace's
    samples at odd ms: the busy stretches end on them)."""
    rows = [_row(10.1, 50.0, 50.0, "s.1.1"), _row(10.2, 50.0, 50.0, "s.1.2"), _row(10.3, 20.0, 0.0),
            _row(10.4, 1.0, 0.0), _row(10.5, 1.0, 0.0), _row(10.6, 50.0, 50.0, "s.1.3"), _row(10.7, 50.0, 0.0),
            _row(10.8, 1.0, 0.0), _row(10.9, 50.0, 50.0, "s.1.4"), _row(11.0, 50.0, 50.0, "s.1.4")]
    views = [[10.05, 50], [10.15, 50], [10.25, 0], [10.55, 50], [10.65, 0], [10.85, 50]]
    trace = _trace([(10.05, 10.10), (10.15, 10.237), (10.55, 10.60), (10.85, 10.90), (10.95, 11.013)],
                   t0=10.001, t1=11.3)
    s = _summary(rows, views, trace=trace)
    s["xapp_revokes"] = {"rows": [[10.23, "site-0", "stale-kpm"], [10.65, "site-0", "grant-zero"],
                                  [10.66, "site-1", "stale-kpm"], [9.5, "site-0", "stale-kpm"]]}
    s["end_revoke"] = {"sigterm_unix": 11.0}
    a = analyse(s, {"site-0": 100.0})
    b = a["revoke_while_busy_to_stopped"]
    assert b["revokes"] == 3 and b["busy_at_instant"] == 2       # site-1's and the idle probe's are not counted
    assert b["busy_at_instant_stale_kpm"] == 1 and b["busy_at_instant_xapp_shutdown"] == 1
    ev = a["sites"]["site-0"]["revokes_off_the_decision_grid"]
    assert [e["busy"] for e in ev] == [True, False, True]
    assert ev[0]["to_stopped_ms"] == pytest.approx(7.0, abs=0.1) and ev[1]["to_stopped_ms"] is None
    assert ev[2]["to_stopped_ms"] == pytest.approx(13.0, abs=0.1)
    assert ev[0]["until_unix"] == pytest.approx(10.55)   # the xApp granted again (s.1.3) at 10.55
    assert b["max_ms"] == pytest.approx(13.0, abs=0.1) and b["measured"] == 2 and b["target_ms"] == 20.0
    assert b["resolution_ms"] == pytest.approx(3.5)
    assert "revoke while busy" in table([{"fault": "x", "applied": True, "note": "", **a}])
