"""Issue 27 item 1 in `weaver up`: three xApp replicas share the sites by shard; one of them is SIGKILLed
mid-run and never restarted. Its sites are served again by the others once its claims end, ground truth shows
0 training-caused misses, and the SDL ledger shows no lease of one replica issued while another replica's lease
for the same site could still be acted on. Real processes, real Redis, real agents."""
from __future__ import annotations

import json
import subprocess

import pytest
import redis

from tests.security.live_up import TAIL_GUARD

pytestmark = pytest.mark.slow


def test_a_killed_replicas_sites_are_served_again_with_ran_first_kept(tmp_path, repo_root):
    redis.Redis("127.0.0.1", 6379, socket_timeout=2).ping()     # make test starts it; replicas need it
    out = tmp_path / "s.json"
    proc = subprocess.run([str(repo_root / ".venv-xapp" / "bin" / "weaver"), "up", *TAIL_GUARD, "--duration", "30",
                           "--xapp-replicas", "3", "--fault", "replica-kill", "--fault-at", "12",
                           "--json", str(out), "--run-dir", str(tmp_path / "run")],
                          cwd=repo_root, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "weaver up: replicas   3 xApps" in proc.stdout
    s = json.loads(out.read_text())
    fault = s["faults"][0]
    assert fault["kind"] == "replica-kill" and fault["applicable"] and fault["sites"], fault
    rep = s["replicas"]
    assert rep["replicas"] == 3 and rep["ledger_leases"] > 0
    assert rep["lease_epoch_overlaps"] == [], rep["lease_epoch_overlaps"][:5]
    for site in fault["sites"]:             # granted again, by another replica (another broker epoch)
        assert len(rep["epochs_by_site"][site]) >= 2, rep["epochs_by_site"]
        # not before the dead replica's claims could end (renewed once a second with a 3 s lifetime: at least
        # 2 s after the kill), and well within the run
        assert 2.0 <= rep["served_again_s"][site] <= 15, rep["served_again_s"]
    t = s["totals"]   # none but those in overruns the kernel repaid (testbed.groundtruth.AgentTruth.settle)
    assert t["deadline_misses_attributable_to_training"] - t["deadline_misses_in_repaid_overruns"] == 0, t
    assert all(v["tokens_trained"] > 0 for v in s["sites"].values())


def test_replicas_with_a_proxy_fault_or_none_are_refused_in_one_line(repo_root):
    p = subprocess.run([str(repo_root / ".venv-xapp" / "bin" / "weaver"), "up", "--xapp-replicas", "2",
                        "--fault", "partition", "--duration", "1"], cwd=repo_root, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "not available with --xapp-replicas" in p.stderr, p.stderr
    p = subprocess.run([str(repo_root / ".venv-xapp" / "bin" / "weaver"), "up", "--xapp-replicas", "0",
                        "--duration", "1"], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--xapp-replicas 0" in p.stderr, p.stderr
