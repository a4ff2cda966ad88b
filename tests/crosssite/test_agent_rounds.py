"""Two real site agents (`weaver-agent run`, so `CrossSiteAgent`) join the cross-site tier from the lease
stream alone: a real gRPC broker stand-in publishes CrossSiteConfig in its Welcome and leases each site
on its own budget; a real torchft Lighthouse keeps the quorum. Site s0 holds a full core, s1 a third
of one and then a zero lease (it must stay in the quorum and stall nobody).

Runs once (module fixture, ~30 s); each test checks one property of what the agents logged and what
the broker received.
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
RUN_S = 24
S1_PAID_S = 12.0        # s1's lease has a budget for this long after it registers, then none


class RoundBroker(lease_pb2_grpc.LeaseBrokerServicer):
    """The xApp's broker seam, per site: Welcome with CrossSiteConfig, one lease per period with the
    site's duty (a function of the time since it registered), and whatever the agents send up."""

    def __init__(self, cross_site: lease_pb2.CrossSiteConfig, duty):
        self.cross_site, self.duty = cross_site, duty
        self.received: dict[str, list[lease_pb2.AgentMessage]] = {}
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
        t0, seq = time.monotonic(), 0
        while context.is_active() and gone.empty():
            seq += 1
            duty = self.duty(site, time.monotonic() - t0)
            yield lease_pb2.BrokerMessage(lease=lease_pb2.Lease(
                lease_id=f"{site}-L", site_id=site, sm_count=1 if duty > 0 else 0, period_ms=PERIOD_MS,
                valid_for_ms=3 * PERIOD_MS, epoch=1, seq=seq, duty=duty, reason="test"))
            time.sleep(PERIOD_MS / 1000)


def _duty(site: str, since_register_s: float) -> float:
    if site == "s0":
        return 1.0
    return 0.33 if since_register_s < S1_PAID_S else 0.0


def _rounds(log: Path) -> list[dict]:
    out = []
    for line in log.read_text().splitlines():
        if "weaver.agent.crosssite: round {" in line:
            out.append(json.loads(line.split(": round ", 1)[1]))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xs-agents")
    with Lighthouse(LighthouseConfig.for_rounds(ROUND_MS)) as lh:
        cs = lease_pb2.CrossSiteConfig(lighthouse_addr=lh.addr, round_ms=ROUND_MS,
                                       round_epoch_ms=int(time.time() * 1000), heartbeat_timeout_ms=600)
        broker = RoundBroker(cs, _duty)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        procs = {}
        for site in ("s0", "s1"):
            log = open(tmp / f"{site}.log", "w")
            procs[site] = (subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "run", "--preset", "tiny", "--mode", "gpu", "--device", "cpu",
                 "--cores", "1", "--broker", f"127.0.0.1:{broker.port}", "--site-id", site, "--agent-id", site,
                 "--checkpoint-dir", str(tmp / f"ckpt-{site}"), "--inspect-addr", "127.0.0.1:0",
                 "--metrics-addr", "", "--max-seconds", str(RUN_S)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log)
        try:
            for p, _ in procs.values():
                p.wait(RUN_S + 60)
        finally:
            for p, log in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    p.wait(10)
                log.close()
            broker.server.stop(grace=0).wait()
    logs = {s: (tmp / f"{s}.log") for s in procs}
    return {"broker": broker, "rounds": {s: _rounds(p) for s, p in logs.items()},
            "codes": {s: p.returncode for s, (p, _) in procs.items()}, "logs": logs}


def _tail(run) -> str:
    return "\n".join(f"--- {s}\n" + p.read_text()[-3000:] for s, p in run["logs"].items())


def test_agents_exit_cleanly(run):
    assert run["codes"] == {"s0": 0, "s1": 0}, _tail(run)


def test_rounds_commit_with_both_sites_and_identical_weights(run):
    for rs in run["rounds"].values():
        assert len({r["round"] for r in rs}) == len(rs), "a round index was used twice"
    by_round = {s: {r["round"]: r for r in rs} for s, rs in run["rounds"].items()}
    both = sorted(k for k in by_round["s0"].keys() & by_round["s1"].keys()
                  if by_round["s0"][k]["committed"] and by_round["s0"][k]["participants"] == 2)
    assert len(both) >= 4, _tail(run)
    for k in both:
        a, b = by_round["s0"][k], by_round["s1"][k]
        assert b["committed"] and b["participants"] == 2
        assert a["checksum"] == b["checksum"], (k, a, b)               # identical global weights
        assert a["committed_total"] == b["committed_total"]             # one ledger, the same everywhere
        assert a["round_tokens"] == b["round_tokens"] == a["tokens"] + b["tokens"]   # counted once


def test_tokens_follow_the_leases(run):
    s0, s1 = run["rounds"]["s0"], run["rounds"]["s1"]
    assert any(r["tokens"] > 0 for r in s0 if r["committed"])
    assert any(r["tokens"] > 0 for r in s1 if r["committed"]), "s1 trained nothing under its paid lease"
    # with a zero lease s1 does no local work, yet stays in the quorum and the round commits without waiting
    idle = [r for r in s1 if r["committed"] and r["tokens"] == 0 and r["participants"] == 2]
    assert idle, _tail(run)
    assert all(r["steps"] == 0 for r in idle)
    work_s0 = [r for r in s0 if r["committed"] and r["tokens"] > 0]
    assert sum(r["tokens"] for r in work_s0) > sum(r["tokens"] for r in s1)
    # nobody waits long at the end of a round for the other site (the budgets differ 3x, then entirely)
    waits = sorted(r["wait_ms"] / ROUND_MS for r in s0 + s1 if r["committed"])
    print(f"end-of-round wait, fraction of a round: median {waits[len(waits) // 2]:.3f}, max {waits[-1]:.3f}")
    assert waits[len(waits) // 2] < 0.2


def test_committed_tokens_grow_exactly_by_each_round(run):
    rs = [r for r in run["rounds"]["s0"] if r["committed"]]
    for prev, cur in zip(rs, rs[1:], strict=False):
        if cur["step"] == prev["step"] + 1:   # consecutive committed rounds, nothing healed in between
            assert cur["committed_total"] == prev["committed_total"] + cur["round_tokens"]


def test_transfer_plans_and_round_reports_reach_the_broker(run):
    b = run["broker"]
    for site in ("s0", "s1"):
        plans, reports = b.sent(site, "transfer"), b.sent(site, "round")
        logged = {r["round"]: r for r in run["rounds"][site]}
        assert len(plans) >= 4 and len(reports) >= 4, site
        assert {r.round for r in reports} <= set(logged)
        for rep in reports:
            rec = logged[rep.round]
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
