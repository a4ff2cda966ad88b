"""Proof of sameness (issue 14 item 3): a short `weaver up --record` (the real xApp process over RMR/E2AP,
SubMgr, gRPC leases, real agents) writes every control-loop step; replayed through the bench's path
(`testbed.bench.liveloop.drive`, the call every arm of `weaver bench policies` decides by) it reproduces
every decision -- envelope, grant, RC control bytes -- per site and period. A replay with one KPM value
changed does not, so the comparison is not vacuous; and the replay goes through `xapp.loop.step`."""
from __future__ import annotations

import json
import subprocess

import pytest

from testbed.bench import replay as rp

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recording(tmp_path_factory, repo_root):
    tmp = tmp_path_factory.mktemp("rec")
    rec, summary = tmp / "loop.jsonl", tmp / "s.json"
    weaver = repo_root / ".venv-xapp" / "bin" / "weaver"
    proc = subprocess.run([str(weaver), "up", "--duration", "10", "--no-cross-site", "--record", str(rec),
                           "--json", str(summary), "--run-dir", str(tmp / "run")],
                          cwd=repo_root, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return rec, json.loads(summary.read_text())


def test_replay_through_the_bench_path_reproduces_every_decision(recording):
    rec, summary = recording
    r = rp.replay_record(str(rec))
    assert r.mismatches == [] and r.identical, r.mismatches[:2]
    # the run decided something worth comparing: every site ticked, was granted and got an envelope
    assert r.ticks >= 50 and r.controls >= len(summary["sites"]) and r.grants > 0
    assert set(r.per_site) == {f"site-{i}" for i in range(len(summary["sites"]))}
    for site in r.per_site.values():
        assert site["decisions"] >= 50 and site["grants"] > 0 and site["envelopes"], site
    # and the live run granted what the recording says it did
    for name, site in summary["sites"].items():
        assert site["leases_granted"] > 0 and r.per_site[name]["grants"] > 0


def test_a_changed_kpm_value_changes_the_replayed_decisions(recording, tmp_path):
    rec, _ = recording
    lines = rec.read_text().splitlines()
    steps = [i for i, ln in enumerate(lines) if '"kind":"step"' in ln and '"GPU.SmUsed.Max"' in ln]
    i = steps[len(steps) // 2]
    for j in steps[steps.index(i):steps.index(i) + 30]:     # peaks the live loop never saw, for 3 s
        d = json.loads(lines[j])
        for s in d["inputs"]["samples"]:
            for k in [k for k in s.get("values", {}) if k.startswith("GPU.Sm") and k.endswith(".Max")]:
                s["values"][k] += 30
        lines[j] = json.dumps(d, separators=(",", ":"))
    bad = tmp_path / "changed.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    r = rp.replay_record(str(bad))
    assert not r.identical and r.mismatches and r.mismatches[0][0] >= i - 1   # step index = line - 1 (start line)


def test_the_replay_decides_through_xapp_loop_step(recording, monkeypatch):
    import xapp.loop as xloop

    rec, _ = recording
    calls = []
    real = xloop.step

    def counting(state, now, inputs):
        calls.append(now)
        return real(state, now, inputs)

    monkeypatch.setattr(xloop, "step", counting)
    r = rp.replay_record(str(rec))
    assert r.identical and len(calls) == r.steps > 0
