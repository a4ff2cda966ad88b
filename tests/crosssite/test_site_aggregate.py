"""A site with two worker processes and a one-worker site, live on torchft: the two-worker site
reduces locally (int8 on the local hop) and its leader alone puts one vector per round on the WAN."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections import defaultdict

import pytest

from agent.crosssite.lighthouse import Lighthouse, LighthouseConfig

pytestmark = [pytest.mark.agent, pytest.mark.slow]

ROUND_MS = 800
ROUNDS = 12   # startup skew under load eats a few; at least 4 must overlap


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def logs(agent_python, repo_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aggregate")
    local_port = _free_port()
    cfg = LighthouseConfig(heartbeat_timeout_ms=400, join_timeout_ms=int(1.5 * ROUND_MS))
    epoch = int(time.time() * 1000)
    # (site, workers, rank, duty, data seed)
    plan = [("A", 2, 0, "1.0", 0), ("A", 2, 1, "0.5", 0), ("B", 1, 0, "0.3", 1)]
    procs, paths = [], {}
    with Lighthouse(cfg) as lh:
        try:
            for site, workers, rank, duty, seed in plan:
                path = tmp / f"{site}{rank}.jsonl"
                paths[(site, rank)] = path
                procs.append(subprocess.Popen(
                    [str(agent_python), "-m", "agent.crosssite.site", "--site-id", site, "--lighthouse", lh.addr,
                     "--round-ms", str(ROUND_MS), "--round-epoch-ms", str(epoch), "--duty", duty,
                     "--rounds", str(ROUNDS), "--data-seed", str(seed), "--workers", str(workers),
                     "--worker-rank", str(rank), "--site-port", str(local_port), "--local-compression", "int8",
                     "--timeout-s", "5", "--log", str(path)],
                    cwd=repo_root, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{site}{rank}.err", "w"),
                    env={**os.environ, "OMP_NUM_THREADS": "1"}))
            for p in procs:
                p.wait(120)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(5)
    out = {}
    for key, path in paths.items():
        out[key] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


def _rounds(logs, key):
    return [r for r in logs[key] if r["kind"] == "round"]


def test_one_aggregate_per_site_per_round(logs):
    numel_bytes = None
    for key in (("A", 0), ("B", 0)):
        sent = {r["bytes_sent"] for r in _rounds(logs, key)}
        assert len(sent) == 1
        numel_bytes = numel_bytes or sent.pop()
    assert {r["bytes_sent"] for r in _rounds(logs, ("A", 1))} == {0}   # the second worker never touches the WAN
    plans = [r for r in logs[("A", 0)] if r["kind"] == "transfer"]
    assert plans and all(p["workers"] == 2 and p["bytes"] == numel_bytes for p in plans)
    assert all(p["window_start_unix_ms"] < p["deadline_unix_ms"] for p in plans)
    assert not [r for r in logs[("A", 1)] if r["kind"] == "transfer"]


def test_all_workers_of_all_sites_hold_the_same_weights(logs):
    by_round = defaultdict(dict)
    for key in logs:
        for r in _rounds(logs, key):
            if r["committed"]:
                by_round[r["round"]][key] = r["checksum"]
    full = [v for v in by_round.values() if len(v) == 3]
    assert len(full) >= 4
    assert all(len(set(v.values())) == 1 for v in full), full


def test_site_tokens_are_the_sum_of_its_workers(logs):
    a0 = {r["round"]: r for r in _rounds(logs, ("A", 0))}
    a1 = {r["round"]: r for r in _rounds(logs, ("A", 1))}
    b0 = {r["round"]: r for r in _rounds(logs, ("B", 0))}
    checked = 0
    for k, lead in a0.items():
        if lead["committed"] and k in a1 and k in b0 and lead["participants"] == 2:
            assert lead["tokens"] > a1[k]["tokens"] > 0
            assert lead["round_tokens"] == lead["tokens"] + b0[k]["tokens"]
            checked += 1
    assert checked >= 4
