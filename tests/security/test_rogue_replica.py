"""Issue 26, done when: a live `weaver up` under a rogue replica keeps training on every real site with 0
training-caused misses and a global model within its bound.

The tier's gates bind 127.0.0.2 here (`--tier-host`), standing for the tier network; everything they guard
stays on 127.0.0.1. The rogue (tests/security/rogue_replica.py, torchft's own clients) finds every listener
on the tier interface while rounds run and, on each gate, tries to join the quorum with a step of 10^6, heal
from it, read the Lighthouse's status page, call the Lighthouse's and the Managers' kills, serve a pickle and
NaN / huge state and write the rendezvous store. It gets the gate's challenge line and nothing else."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.proc_net import listening
from tests.security.live_up import TAIL_GUARD, weaver_up

pytestmark = pytest.mark.slow
TIER_HOST = "127.0.0.2"


def test_a_rogue_replica_on_the_tier_network_gets_nothing_and_training_goes_on(tmp_path, repo_root):
    summary_path, marker = tmp_path / "s.json", tmp_path / "rogue-ran-code"
    with weaver_up(repo_root, tmp_path / "run", *TAIL_GUARD, "--duration", "45", "--round-ms", "2000", "--tier-host", TIER_HOST,
                   "--json", str(summary_path)) as up:
        assert up.poll_until(lambda: up.rounds() >= 2), "no rounds to attack:\n" + up.text[-3000:]
        ports = sorted(p for a, p in listening(up.pids()) if a == TIER_HOST)
        r = subprocess.run([str(repo_root / ".venv-agent" / "bin" / "python"), "tests/security/rogue_replica.py",
                            "--host", TIER_HOST, "--ports", ",".join(map(str, ports)), "--marker", str(marker)],
                           cwd=repo_root, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(repo_root)})
        assert r.returncode == 0, r.stderr[-3000:]
        rogue = json.loads(r.stdout)
        up.proc.wait(timeout=120)
    proc, out = up.proc, up.text
    # the Lighthouse's gate and each agent's: found, and each gave the rogue nothing
    assert len(rogue["gates"]) == 4, rogue
    for a in rogue["attacks"]:
        assert a["joined"] is None and a["heal_metadata"] is None and a["store_write"] is False, a
        assert all(v == "" for v in a["answers_beyond_challenge"].values()), a
    assert not marker.exists(), "the rogue's pickle ran"
    # and the real sites trained on, together, with no harm to the RAN
    assert proc.returncode == 0, out[-3000:]
    s = json.loads(summary_path.read_text())
    assert s["ended_by"] == "", s["ended_by"]
    for name, site in s["sites"].items():
        # trained, by the platform's meter and by the rounds it committed (the agent's own token count is read
        # from its last status, which a fresh-clone run once found at 0 for a site that had committed 21 rounds)
        assert site["sm_seconds_used_in_lease"] > 0, (name, site)
        assert site["cross_site"]["rounds_reported"] > 0 and site["cross_site"]["committed_tokens"] > 0, \
            (name, site["cross_site"])
        assert site["deadline_misses_attributable_to_training"] == 0, \
            (name, site["ground_truth"]["worst_periods"])
    t = s["totals"]
    assert t["tokens_trained"] > 0, t
    assert s["cross_site"]["rounds_committed"] >= 3, s["cross_site"]
    # the global model stayed in its bound: the loss it gives is finite and fell
    assert t["val_loss_end"] < t["val_loss_start"] < 1e3, t
