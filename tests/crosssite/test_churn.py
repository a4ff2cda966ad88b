"""Three sites on loopback (CPU, gloo, a real torchft Lighthouse): very different budgets, one site
SIGKILLed mid-run, restarted, healed and back in the quorum. Site s2 runs two worker processes that
reduce locally (int8 on the local hop), so its leader alone sends one aggregate per round; the
wide-area all-reduce runs in bf16 with error feedback.

The scenario runs once (module fixture, ~30-60 s); each test checks one property of its logs.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

from agent.crosssite.lighthouse import Lighthouse, LighthouseConfig
from tests.waiting import until

pytestmark = [pytest.mark.agent, pytest.mark.slow]

ROUND_MS = 800
HEARTBEAT_MS = 400          # below the round length: a dead site costs less than one round
# log name -> (site, duty per round, worker rank); s2 has no budget every other round
PROCS = {"s0": ("s0", "1.0", 0), "s1": ("s1", "0.25", 0), "s2": ("s2", "0.05,0", 0), "s2w": ("s2", "0.05,0", 1)}


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass   # a SIGKILL can cut the last line
    return out


def _rounds(path: Path) -> list[dict]:
    return [r for r in _read(path) if r["kind"] == "round"]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TIER_KEY = "77" * 32   # the tier's key, as a broker would hand it to admitted sites


class Sites:
    def __init__(self, python: Path, root: Path, tmp: Path, lighthouse: str, epoch_ms: int):
        self.python, self.root, self.tmp, self.lighthouse, self.epoch_ms = python, root, tmp, lighthouse, epoch_ms
        self.procs: dict[str, subprocess.Popen] = {}
        self.s2_port = _free_port()

    def start(self, name: str, log_name: str, seed: int) -> Path:
        site, duty, rank = PROCS[name]
        log = self.tmp / f"{log_name}.jsonl"
        workers = ["--workers", "2", "--worker-rank", str(rank), "--site-port", str(self.s2_port),
                   "--local-compression", "int8"] if site == "s2" else []
        self.procs[log_name] = subprocess.Popen(
            [str(self.python), "-m", "agent.crosssite.site", "--site-id", site, "--lighthouse", self.lighthouse,
             "--round-ms", str(ROUND_MS), "--round-epoch-ms", str(self.epoch_ms),
             "--heartbeat-timeout-ms", str(HEARTBEAT_MS), "--duty", duty, "--rounds", "0",
             "--data-seed", str(seed), "--timeout-s", "3", "--compression", "bf16", "--log", str(log), *workers],
            cwd=self.root, stdout=subprocess.DEVNULL, stderr=open(self.tmp / f"{log_name}.err", "w"),
            env={**os.environ, "OMP_NUM_THREADS": "1", "WEAVER_TIER_KEY": TIER_KEY})
        return log

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:   # a worker whose leader stopped first can sit in a collective: don't wait long
                p.wait(3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


@pytest.fixture(scope="module")
def scenario(agent_python, repo_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("churn")
    cfg = LighthouseConfig(heartbeat_timeout_ms=HEARTBEAT_MS, join_timeout_ms=int(1.5 * ROUND_MS))
    with Lighthouse(cfg) as lh:
        sites = Sites(agent_python, repo_root, tmp, lh.addr, epoch_ms=int(time.time() * 1000))
        try:
            logs = {name: sites.start(name, name, i) for i, name in enumerate(PROCS)}

            def full_rounds(name, n, participants, after=0.0):
                return lambda: sum(1 for r in _rounds(logs[name]) if r["committed"]
                                   and r["participants"] == participants and r["t"] > after) >= n
            t_start = time.time()
            until(full_rounds("s0", 5, 3), 60, "5 committed rounds with 3 sites")
            # Kill in the middle of a work phase, not at a boundary.
            time.sleep(0.4 * ROUND_MS / 1000)
            sites.procs["s1"].send_signal(signal.SIGKILL)
            sites.procs["s1"].wait(5)
            killed_at = time.time()
            until(full_rounds("s0", 3, 2, after=killed_at), 30, "3 committed rounds without s1")
            logs["s1b"] = sites.start("s1", "s1b", 1)
            until(full_rounds("s1b", 4, 3), 60, "restarted s1 back in a 3-site quorum")
            print(f"\nscenario: kill after {killed_at - t_start:.1f}s, done after {time.time() - t_start:.1f}s")
        finally:
            sites.stop_all()
    return {"killed_at": killed_at, "rounds": {k: _rounds(v) for k, v in logs.items()},
            "plans": {k: [r for r in _read(v) if r["kind"] == "transfer"] for k, v in logs.items()},
            "starts": {k: [r for r in _read(v) if r["kind"] == "start"] for k, v in logs.items()},
            "errors": {k: [r for r in _read(v) if r["kind"] == "error"] for k, v in logs.items()}}


def _by_round(scn, leaders_only: bool = True) -> dict[int, list[dict]]:
    """Records per round; by default one per site (its leader's, which carries the site's tokens)."""
    out = defaultdict(list)
    for recs in scn["rounds"].values():
        for r in recs:
            if r["worker_rank"] == 0 or not leaders_only:
                out[r["round"]].append(r)
    return out


def test_weights_identical_after_every_committed_round(scenario):
    checked = 0
    for rnd, recs in _by_round(scenario, leaders_only=False).items():
        committed = [r for r in recs if r["committed"]]
        assert len({r["checksum"] for r in committed}) <= 1, f"round {rnd}: sites disagree {committed}"
        checked += len(committed) > 1
    assert checked >= 8


def test_no_site_waits_more_than_a_small_fraction_of_the_round(scenario):
    waits = [r["wait_ms"] / ROUND_MS for recs in scenario["rounds"].values() for r in recs[1:]
             if r["committed"] and r["participants"] == 3]
    quorum = [r["quorum_ms"] / ROUND_MS for recs in scenario["rounds"].values() for r in recs[1:]
              if r["committed"] and r["participants"] == 3]
    print(f"\nend-of-round wait / round: median {statistics.median(waits):.3f} max {max(waits):.3f} (n={len(waits)});"
          f" quorum / round: median {statistics.median(quorum):.3f} max {max(quorum):.3f}")
    assert statistics.median(waits) < 0.05
    assert sorted(waits)[int(0.9 * len(waits))] < 0.15
    # Budgets differ 20x and more, yet the slow sites hold nobody up.
    per_round = {k: statistics.mean(r["tokens"] for r in recs if r["committed"])
                 for k, recs in scenario["rounds"].items() if k != "s2w"}
    print(f"mean tokens per round: {per_round}")
    assert per_round["s0"] > 3 * per_round["s1b"] and per_round["s1b"] > 2 * per_round["s2"]


def test_killed_site_dropped_within_timeout_and_training_continues(scenario):
    killed = scenario["killed_at"]
    after = [r for r in scenario["rounds"]["s0"] if r["t"] > killed]
    first_without = next(r for r in after if r["committed"] and r["participants"] == 2)
    print(f"\nkilled -> first committed round without it ended after {first_without['t'] - killed:.2f}s "
          f"(round {ROUND_MS} ms, heartbeat timeout {HEARTBEAT_MS} ms); rounds failed in between: "
          f"{sum(not r['committed'] for r in after if r['t'] <= first_without['t'])}")
    # the round s1 died in may fail; the one after is formed without it
    assert first_without["t"] - killed < 3 * ROUND_MS / 1000 + HEARTBEAT_MS / 1000
    assert all(r["quorum_ms"] < ROUND_MS for r in after), "a quorum waited longer than one round"
    assert sum(r["committed"] for r in after) >= 3


def test_restarted_site_heals_from_a_peer_and_rejoins(scenario):
    s1b = scenario["rounds"]["s1b"]
    assert s1b[0]["healed"] and s1b[0]["step"] > 0
    print(f"\nrestarted site: first round healed at torchft step {s1b[0]['step']}, "
          f"quorum {s1b[0]['quorum_ms']:.0f} ms, participants {s1b[0]['participants']}")
    s0 = {r["round"]: r for r in scenario["rounds"]["s0"]}
    joined = [r for r in s1b if r["committed"] and r["participants"] == 3]
    assert len(joined) >= 3
    for r in joined:
        assert s0[r["round"]]["checksum"] == r["checksum"]
        assert s0[r["round"]]["committed_total"] == r["committed_total"]   # the ledger healed too


def test_tokens_counted_exactly_once(scenario):
    by_round = _by_round(scenario)
    chain: dict[int, tuple[int, int]] = {}   # torchft step -> (round tokens, committed total after it)
    for rnd, recs in by_round.items():
        for r in recs:
            if not r["committed"]:
                assert r["round_tokens"] == 0, r
                continue
            got = (r["round_tokens"], r["committed_total"])
            assert chain.setdefault(r["step"], got) == got, f"round {rnd}: sites disagree on the ledger {recs}"
        committed = [r for r in recs if r["committed"]]
        if committed and len(committed) == committed[0]["participants"]:   # every participant's line survived
            assert committed[0]["round_tokens"] == sum(r["tokens"] for r in committed), recs
    steps = sorted(chain)
    assert len(steps) >= 10
    for a, b in zip(steps, steps[1:], strict=False):
        if b == a + 1:   # the global total grows by exactly each committed round's tokens
            assert chain[b][1] == chain[a][1] + chain[b][0], (a, chain[a], b, chain[b])
    # Work done in rounds that did not commit (the round s1 died in) is in no total.
    failed = [r for recs in scenario["rounds"].values() for r in recs if not r["committed"]]
    assert all(r["committed_total"] == chain.get(r["step"] - 1, (0, 0))[1] or r["step"] == 0 for r in failed)


def test_validation_loss_falls(scenario):
    # The validation set is fixed, but the model itself swings +-0.4 between rounds under churn, so one
    # round against another proves little (a CI run had round 1 at 2.63 and the second half's mean at 2.44).
    # Measured against the untrained model (logged at start, same seed and held-out samples) the
    # second half must have learned clearly, and must not have fallen back to the first rounds' level.
    untrained = scenario["starts"]["s0"][0]["val_loss"]
    vals = [r["val_loss"] for r in scenario["rounds"]["s0"] if r["committed"]]
    early, late = vals[:4], vals[len(vals) // 2:]
    assert statistics.mean(late) < untrained - 1.0, (untrained, vals)
    assert statistics.mean(late) < statistics.mean(early), (untrained, vals)


def test_two_worker_site_sends_one_aggregate_per_round(scenario):
    rounds = scenario["rounds"]
    wan = {r["bytes_sent"] for r in rounds["s0"]}
    assert len(wan) == 1 and wan.pop() > 0
    assert {r["bytes_sent"] for r in rounds["s2"]} == {r["bytes_sent"] for r in rounds["s0"]}
    assert {r["bytes_sent"] for r in rounds["s2w"]} == {0}   # the second worker never touches the WAN
    plans = scenario["plans"]["s2"]
    assert plans and all(p["workers"] == 2 and p["window_start_unix_ms"] < p["deadline_unix_ms"] for p in plans)
    assert not scenario["plans"]["s2w"]
    worker = {r["round"]: r for r in rounds["s2w"]}
    both = [(r, worker[r["round"]]) for r in rounds["s2"] if r["committed"] and r["round"] in worker]
    assert len(both) >= 5
    for lead, w in both:   # the leader reports the site's tokens: its own plus its worker's
        assert lead["tokens"] >= w["tokens"] and lead["checksum"] == w["checksum"]
    assert sum(w["tokens"] for _, w in both) > 0 and sum(lead["tokens"] - w["tokens"] for lead, w in both) > 0
