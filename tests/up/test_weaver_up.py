"""`weaver up` end to end: the real processes (testbed + mini-RIC, the xApp, one agent per site, the
cross-site tier's Lighthouse) over the real interfaces (RMR/E2AP, SubMgr REST, gRPC leases, torchft),
with real training, for 30 seconds."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

pytestmark = pytest.mark.slow


def _processes_mentioning(text: str) -> set[int]:
    """Processes whose command line names `text` (this run's directory: the xApp's config file and the
    agents' checkpoint dirs live there), so that unrelated processes on the machine never count."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if text in cmd:
            pids.add(int(entry))
    return pids


def test_weaver_up_30s(tmp_path, repo_root):
    summary_path = tmp_path / "s.json"
    weaver = repo_root / ".venv-xapp" / "bin" / "weaver"
    proc = subprocess.Popen([str(weaver), "up", "--duration", "30", "--json", str(summary_path),
                             "--run-dir", str(tmp_path / "run")],
                            cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail("weaver up did not finish:\n" + out[-4000:])
    assert proc.returncode == 0, out[-4000:]
    assert "dashboard" in out and "http://" in out, out[:2000]
    s = json.loads(summary_path.read_text())
    sites = s["sites"]
    assert len(sites) == 3
    for site in sites.values():
        assert site["kpm_indications"] > 0, site
        assert site["rc_controls_acked"] > 0, site
        assert site["leases_granted"] > 0, site
        assert site["sm_seconds_granted"] > 0, site
        assert site["sm_seconds_used"] > 0, site
        # By the lease the agent held, none. By ground truth (the CPU time it executed, 1 core standing in
        # for the whole 132-SM GPU, three agents + xApp + world on 2 cores) a preempted micro-batch can
        # overrun past the guard: seen up to 16 of 60,000 slots in a fresh-clone CI run. Bounded here (an
        # agent training outside its leases would miss in most slots); `weaver bench safety` reports it.
        assert site["deadline_misses_attributable_to_reported_lease"] == 0, site
        # Apart from those, the misses in overruns the kernel repaid (a long stretch in the kernel runs past the
        # CFS quota on Linux 6.18 and the cgroup then sits throttled: testbed.groundtruth.AgentTruth.settle)
        assert (site["deadline_misses_attributable_to_training"] - site["deadline_misses_in_repaid_overruns"]
                <= 1e-3 * site["slots"]), \
            ("the periods around the worst one beyond the lease", site["ground_truth"]["worst_periods"], site)
        assert site["sm_seconds_executed"] > 0 and site["ground_truth"]["source"], site
        # what ran beyond the held lease is part of what ran
        assert site["sm_ms_beyond_lease_total"] <= site["sm_seconds_executed"] * 1000.0 + 1e-6, site
        # which policy inputs the site's decisions had and used (issue 14): the testbed's compute-aware
        # nodes measure every one, and most periods were decided on them
        pi = site["policy_inputs"]
        assert pi["basis"] == "measured" and pi["estimated"] == [], pi
        assert set(pi["available"]) == set(pi["used"]) == {"offered_mean", "offered_max", "nondeferrable_max",
                                                           "be_delay_ms", "be_deferred_bytes"}, pi
        assert pi["periods"].get("measured", 0) > pi["periods"].get("estimated", 0), pi
    assert s["faults"] == []
    t = s["totals"]
    for key in ("kpm_indications", "rc_controls_sent", "rc_controls_acked", "leases_granted", "sm_seconds_granted",
                "sm_seconds_used", "usable_spare_sm_s", "utilization", "deadline_misses", "tokens_trained",
                "val_loss_start", "val_loss_end"):
        assert key in t, key
    assert t["tokens_trained"] > 0
    assert t["val_loss_end"] < t["val_loss_start"], t
    # the cross-site tier: the xApp published the Lighthouse, every site planned transfer windows and
    # reported rounds, read back from GET /api/v1/transfers and /api/v1/rounds during the run
    xs = s["cross_site"]
    assert xs["enabled"] and xs["round_ms"] > 0, xs
    assert xs["rounds_committed"] >= 1, xs
    assert 0 < xs["committed_tokens"] <= t["tokens_trained"], (xs, t)
    for name, site in sites.items():
        c = site["cross_site"]
        assert c["transfer_windows"] > 0 and c["transfer_bytes_planned"] > 0, (name, c)
        assert c["rounds_reported"] > 0 and c["bytes_sent"] > 0, (name, c)
    # the tier is gated (issue 26 item 1): the agents reach the Lighthouse through its gate only
    m = re.search(r"weaver up: lighthouse gate://127\.0\.0\.1:(\d+) \(its gate; the Lighthouse itself on "
                  r"http://127\.0\.0\.1:(\d+)\)", out)
    assert m, out[:3000]
    assert xs["lighthouse"] == f"gate://127.0.0.1:{m.group(1)}", xs
    time.sleep(1.0)
    leftover = _processes_mentioning(str(tmp_path))
    # the Lighthouse (wrapper and torchft binary) names its ports, not the run directory
    leftover |= _processes_mentioning(f"--port {m.group(1)} ") | _processes_mentioning(f"127.0.0.1:{m.group(2)} ")
    assert not leftover, f"processes left running: {leftover}"
