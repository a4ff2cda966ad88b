"""Two real site agents (`weaver-agent run`, so `CrossSiteAgent`) join the cross-site tier from the lease
stream alone: a real gRPC broker stand-in publishes CrossSiteConfig in its Welcome and leases each site
on its own budget; a real torchft Lighthouse keeps the quorum. Site s0 holds a full core all along; s1
a third of one. After a few shared rounds s1 is SIGKILLed and restarted (same checkpoint dir). The
restarted agent first gets a zero lease: its worker is frozen (the kernel bound: nothing the training
side does runs outside a lease, its tier included), so it takes no part and must stall nobody; then a
fifth of a core, with which it heals the global state and rejoins.

Runs once (module fixture, ~45 s); each test checks one property of what the agents logged and what
the broker received. Process logs: "s0", "s1" (killed), "s1b" (restarted).
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agent.crosssite.lighthouse import Lighthouse, LighthouseConfig
from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc

pytestmark = [pytest.mark.agent, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ROUND_MS = 1200
PERIOD_MS = 100
RUN_S = 34              # s0's whole run
SHARED_ROUNDS = 3       # committed rounds with both sites before s1 is killed


class RoundBroker(lease_pb2_grpc.LeaseBrokerServicer):
    """The xApp's broker seam, per site: Welcome with CrossSiteConfig, one lease per period with the
    site's duty (by site and session number), and whatever the agents send up."""

    def __init__(self, cross_site: lease_pb2.CrossSiteConfig, duty):
        self.cross_site, self.duty = cross_site, duty
        self.received: dict[str, list[lease_pb2.AgentMessage]] = {}
        self.sessions: dict[str, int] = {}
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        lease_pb2_grpc.add_LeaseBrokerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def sent(self, site: str, kind: str) -> list:
        with self.lock:
            return [getattr(m, kind) for m in self.received.get(site, []) if m.WhichOneof("body") == kind]

    def Session(self, request_iterator, context):
        first = next(request_iterator)
        site = first.register.site_id
        with self.lock:
            session = self.sessions[site] = self.sessions.get(site, 0) + 1
        gone: queue.Queue = queue.Queue()

        def read():
            try:
                for m in request_iterator:
                    with self.lock:
                        self.received.setdefault(site, []).append(m)
            except grpc.RpcError:
                pass
            gone.put(True)

        threading.Thread(target=read, daemon=True).start()
        yield lease_pb2.BrokerMessage(welcome=lease_pb2.Welcome(site_id=site, epoch=1, heartbeat_ms=200,
                                                                cross_site=self.cross_site))
        seq = 0
        since = time.monotonic()
        while context.is_active() and gone.empty():
            seq += 1
            duty = self.duty(site, session, time.monotonic() - since)
            yield lease_pb2.BrokerMessage(lease=lease_pb2.Lease(
                lease_id=f"{site}-{session}", site_id=site, sm_count=1 if duty > 0 else 0, period_ms=PERIOD_MS,
                valid_for_ms=3 * PERIOD_MS, epoch=1, seq=seq, duty=duty, reason="test"))
            time.sleep(PERIOD_MS / 1000)


ZERO_LEASE_S = 4.0       # the restarted s1's first seconds: no budget (frozen)


def _duty(site: str, session: int, held_s: float) -> float:
    if site == "s0":
        return 1.0
    if session == 1:
        return 0.33
    return 0.0 if held_s < ZERO_LEASE_S else 0.2


def _rounds(log: Path) -> list[dict]:
    out = []
    for line in log.read_text().splitlines() if log.exists() else ():
        if "weaver.agent.crosssite: round {" in line:
            out.append(json.loads(line.split(": round ", 1)[1]))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xs-agents")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs: dict[str, tuple[subprocess.Popen, object]] = {}

    def start(name: str, site: str, seconds: float) -> None:
        log = open(tmp / f"{name}.log", "w")
        procs[name] = (subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--preset", "tiny", "--mode", "gpu", "--device", "cpu",
             "--cores", "1", "--broker", f"127.0.0.1:{broker.port}", "--site-id", site, "--agent-id", name,
             "--checkpoint-dir", str(tmp / f"ckpt-{site}"), "--inspect-addr", "127.0.0.1:0",
             "--metrics-addr", "", "--max-seconds", str(seconds)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log)

    with Lighthouse(LighthouseConfig.for_rounds(ROUND_MS)) as lh:
        cs = lease_pb2.CrossSiteConfig(lighthouse_addr=lh.addr, round_ms=ROUND_MS,
                                       round_epoch_ms=int(time.time() * 1000), heartbeat_timeout_ms=600,
                                       tier_key=b"t" * 32)   # as the broker hands it to admitted sites
        broker = RoundBroker(cs, _duty)
        t0 = time.monotonic()
        start("s0", "s0", RUN_S)
        start("s1", "s1", RUN_S)
        killed_at = None
        try:
            deadline = t0 + RUN_S
            while time.monotonic() < deadline:
                shared = [r for r in _rounds(tmp / "s1.log") if r["committed"] and r["participants"] == 2]
                if len(shared) >= SHARED_ROUNDS:
                    break
                time.sleep(0.1)
            procs["s1"][0].send_signal(signal.SIGKILL)
            killed_at = time.time()
            procs["s1"][0].wait(10)
            start("s1b", "s1", max(5.0, RUN_S - (time.monotonic() - t0)))
            for p, _ in procs.values():
                p.wait(RUN_S + 60)
        finally:
            for p, log in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    p.wait(10)
                log.close()
            broker.server.stop(grace=0).wait()
    logs = {name: tmp / f"{name}.log" for name in procs}
    return {"broker": broker, "rounds": {n: _rounds(p) for n, p in logs.items()}, "killed_at": killed_at,
            "codes": {n: p.returncode for n, (p, _) in procs.items()}, "logs": logs}


def _tail(run) -> str:
    return "\n".join(f"--- {s}\n" + p.read_text()[-3000:] for s, p in run["logs"].items())


def _shared(run, a: str, b: str) -> list[tuple[dict, dict]]:
    """Rounds that `a` and `b` both committed together (same round index, two participants)."""
    rb = {r["round"]: r for r in run["rounds"][b]}
    return [(r, rb[r["round"]]) for r in run["rounds"][a]
            if r["committed"] and r["participants"] == 2 and r["round"] in rb]


def test_agents_exit_cleanly(run):
    assert run["codes"] == {"s0": 0, "s1": -signal.SIGKILL, "s1b": 0}, _tail(run)


def test_round_indices_are_never_reused(run):
    for name, rs in run["rounds"].items():
        assert len({r["round"] for r in rs}) == len(rs), name


def test_shared_rounds_have_identical_weights_and_one_ledger(run):
    for other, least in (("s1", SHARED_ROUNDS), ("s1b", 1)):
        pairs = _shared(run, "s0", other)
        assert len(pairs) >= least, (other, _tail(run))
        for a, b in pairs:
            assert b["committed"] and b["participants"] == 2
            assert a["checksum"] == b["checksum"], (a, b)                  # identical global weights
            assert a["committed_total"] == b["committed_total"]             # one ledger, the same everywhere
            assert a["round_tokens"] == b["round_tokens"] == a["tokens"] + b["tokens"]   # counted once


def test_killed_site_is_dropped_and_the_other_goes_on(run):
    after = [r for r in run["rounds"]["s0"] if r["committed"] and r["participants"] == 1
             and r["round"] > max(x["round"] for x in run["rounds"]["s1"])]
    assert after, _tail(run)
    # the first round s0 committed alone ended this long after the kill (a dead site costs < 1 round
    # of heartbeat timeout, plus the round it broke)
    first = min(after, key=lambda r: r["round"])
    end_of_first = run["broker"].cross_site.round_epoch_ms / 1000 + (first["round"] + 1) * ROUND_MS / 1000
    print(f"kill -> end of first round without s1: {end_of_first - run['killed_at']:.2f} s")
    assert end_of_first - run["killed_at"] < 4 * ROUND_MS / 1000


def test_restarted_site_heals_and_rejoins(run):
    s1b = run["rounds"]["s1b"]
    assert s1b and s1b[0]["healed"], _tail(run)
    assert _shared(run, "s0", "s1b"), _tail(run)


def test_a_zero_lease_site_is_frozen_and_stalls_nobody(run):
    s0, s1, s1b = (run["rounds"][n] for n in ("s0", "s1", "s1b"))
    # s1 trains under its third of a core in the rounds it shares with s0 (validation never starves it)
    assert any(b["tokens"] > 0 for _, b in _shared(run, "s0", "s1")), _tail(run)
    # while the restarted s1 has no lease its worker runs nothing, not even the tier: s0 commits alone
    start = run["killed_at"]
    frozen = [r for r in s0 if r["committed"] and r["participants"] == 1
              and start + ROUND_MS / 1000 < _round_end(run, r) <= start + ZERO_LEASE_S]
    assert frozen, _tail(run)
    assert all(_round_end(run, r) > start + ZERO_LEASE_S for r in s1b), "s1b ran a round with no lease"
    waits = sorted(r["wait_ms"] / ROUND_MS for r in s0 + s1 + s1b if r["committed"] and not r["healed"])
    print(f"end-of-round wait, fraction of a round: median {waits[len(waits) // 2]:.3f}, max {waits[-1]:.3f}")
    assert waits[len(waits) // 2] < 0.2


def _round_end(run, r) -> float:
    return run["broker"].cross_site.round_epoch_ms / 1000 + (r["round"] + 1) * ROUND_MS / 1000


def test_committed_tokens_grow_exactly_by_each_round(run):
    rs = [r for r in run["rounds"]["s0"] if r["committed"]]
    for prev, cur in zip(rs, rs[1:], strict=False):
        if cur["step"] == prev["step"] + 1:   # consecutive committed rounds
            assert cur["committed_total"] == prev["committed_total"] + cur["round_tokens"]


def test_transfer_plans_and_round_reports_reach_the_broker(run):
    b = run["broker"]
    for site, names in (("s0", ("s0",)), ("s1", ("s1", "s1b"))):
        plans, reports = b.sent(site, "transfer"), b.sent(site, "round")
        logged = [r for n in names for r in run["rounds"][n]]
        assert len(plans) >= 4 and len(reports) >= 4, site
        by_round = {r["round"]: r for r in logged}
        for rep in reports:
            rec = by_round[rep.round]
            assert (rep.committed, rep.participants, rep.tokens) == (rec["committed"], rec["participants"], rec["tokens"])
            assert rep.bytes_sent == rec["bytes_sent"] > 0
        for p in plans:
            assert p.bytes > 0 and p.workers == 1
            # the window closes at the round's boundary
            assert (p.deadline_unix_ms - b.cross_site.round_epoch_ms) == (p.round + 1) * ROUND_MS
    assert {p.bytes for p in b.sent("s0", "transfer")} == {p.bytes for p in b.sent("s1", "transfer")}


def test_validation_loss_of_the_global_model_falls(run):
    log = run["logs"]["s0"].read_text()
    vals = [float(line.rsplit("val loss ", 1)[1]) for line in log.splitlines() if ": val loss " in line]
    assert len(vals) >= 2, _tail(run)
    assert vals[-1] < vals[0], vals
