"""Model agents in the cross-site tier (`agent.tiermodel`, issue 27 item 3): a real torchft Lighthouse puts every
site that its lease stream told to join into one quorum a round; a gated Lighthouse takes only sites whose pass
its gate checks, and a site told to leave drops out of the next quorums."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from agent.crosssite.lighthouse import Lighthouse, LighthouseConfig
from agent.tiermodel import Tiers
from schemas import tierpass
from schemas.credential import tier_key
from schemas.proto.weaver.v1 import lease_pb2
from tests.waiting import until

ROUND_MS = 600
SECRET = "a-broker-secret"
EPOCH = 5


def _config(addr: str, epoch_ms: int, identity: tierpass.TierIdentity | None = None) -> lease_pb2.CrossSiteConfig:
    msg = lease_pb2.CrossSiteConfig(lighthouse_addr=addr, round_ms=ROUND_MS, round_epoch_ms=epoch_ms,
                                    heartbeat_timeout_ms=ROUND_MS // 2)
    if identity is not None:          # what the broker puts in an admitted site's stream
        p = identity.tier_pass
        msg.tier_key, msg.tier_epoch, msg.tier_ca = tier_key(SECRET, p.epoch), p.epoch, identity.ca_public
        msg.tier_site_key, msg.tier_pass_expiry_unix, msg.tier_pass_signature = \
            identity.site_key, p.expiry_unix, p.ca_signature
    return msg


def _last_quorum(tiers: Tiers, site: str) -> int | None:
    members = tiers.members[site].figures.members
    return members[-1] if members else None


@pytest.mark.timeout(120)
def test_every_told_site_shares_one_quorum_a_round_and_a_site_told_to_leave_drops_out():
    lh = Lighthouse(LighthouseConfig.for_rounds(ROUND_MS)).start()
    tiers = Tiers()
    try:
        epoch_ms = int(time.time() * 1000)
        sites = [f"site-{i}" for i in range(6)]
        for s in sites:
            tiers.configure(s, _config(lh.addr, epoch_ms))
        until(lambda: all((_last_quorum(tiers, s) or 0) == 6 for s in sites), 30, "a quorum of all six sites")
        tiers.configure("site-0", lease_pb2.CrossSiteConfig())         # the coordinator turned its tier off
        assert "site-0" not in tiers.members
        asked = {s: tiers.members[s].figures.requests for s in sites[1:]}
        until(lambda: all(tiers.members[s].figures.requests >= asked[s] + 3 for s in sites[1:]), 30, "three rounds")
        assert all(_last_quorum(tiers, s) == 5 for s in sites[1:])
        f = tiers.figures()
        assert f["sites_in_a_quorum"] == 6 and f["sites_joined"] == 5 and f["quorum_sites_max"] == 6
        assert f["heartbeats"] > 0 and f["heartbeat_failures"] == 0
    finally:
        tiers.stop()
        lh.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_a_gated_lighthouse_quorums_only_the_sites_with_a_pass_of_its_epoch(repo_root):
    env = {**os.environ, "PYTHONPATH": str(repo_root), "WEAVER_TIER_SECRET": SECRET}
    lh = subprocess.Popen([sys.executable, "-m", "agent.crosssite.lighthouse", "--port", str(_free_port()),
                           "--round-ms", str(ROUND_MS), "--secret-env", "WEAVER_TIER_SECRET"],
                          cwd=repo_root, stdout=subprocess.PIPE, text=True, env=env)
    tiers = Tiers()
    try:
        head = lh.stdout.readline().split()
        assert head[0] == "lighthouse" and head[1].startswith("gate://"), head
        epoch_ms, now = int(time.time() * 1000), int(time.time())
        ca = tierpass.ca_seed(SECRET, EPOCH)
        for s in ("site-0", "site-1", "site-2"):
            tiers.configure(s, _config(head[1], epoch_ms, tierpass.issue(ca, EPOCH, s, now + 600)))
        # an outsider: a well-formed pass, but signed by a CA that is not the broker's
        tiers.configure("site-9", _config(head[1], epoch_ms, tierpass.issue(b"x" * 32, EPOCH, "site-9", now + 600)))
        until(lambda: all((_last_quorum(tiers, s) or 0) == 3 for s in ("site-0", "site-1", "site-2")), 40,
              "a quorum of the three admitted sites")
        until(lambda: tiers.members["site-9"].figures.failures >= 2, 40, "the outsider's refusals")
        out = tiers.members["site-9"].figures
        assert out.quorums == 0 and out.heartbeats == 0
        assert max(n for s in ("site-0", "site-1", "site-2") for n in tiers.members[s].figures.members) == 3
    finally:
        tiers.stop()
        lh.terminate()
        lh.wait(10)


def test_the_gate_takes_the_live_epochs_of_sharded_replicas_and_refuses_older_ones():
    from agent.crosssite.lighthouse import EpochKeys

    one, two = EpochKeys(SECRET), EpochKeys(SECRET, live_epochs=2)
    for keys in (one, two):
        keys.passed(6)
    assert one(6) is not None and one(5) is None                    # one xApp: only its newest epoch
    assert two(6) is not None and two(5) is not None and two(4) is None and two(7) is not None
    two.passed(7)                                                   # replica of epoch 5 restarted as 7
    assert two(5) is None and two(6) is not None
    with pytest.raises(ValueError):
        EpochKeys(SECRET, live_epochs=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("live_epochs", [2, 1])
def test_sites_of_two_replicas_epochs_share_the_quorum_when_the_gate_takes_both(repo_root, live_epochs):
    """Two sharded replicas, epochs 5 and 6: a site of the newer one passes the gate first, then the older one's
    sites join. With --live-epochs 2 (weaver up passes its replica count) all three share a quorum; with 1 (a
    single xApp's rule) the older epoch's sites are refused - the fault the 2 guards against."""
    env = {**os.environ, "PYTHONPATH": str(repo_root), "WEAVER_TIER_SECRET": SECRET}
    lh = subprocess.Popen([sys.executable, "-m", "agent.crosssite.lighthouse", "--port", str(_free_port()),
                           "--round-ms", str(ROUND_MS), "--secret-env", "WEAVER_TIER_SECRET",
                           "--live-epochs", str(live_epochs)],
                          cwd=repo_root, stdout=subprocess.PIPE, text=True, env=env)
    tiers = Tiers()
    try:
        head = lh.stdout.readline().split()
        epoch_ms, now = int(time.time() * 1000), int(time.time())
        newer = tierpass.issue(tierpass.ca_seed(SECRET, EPOCH + 1), EPOCH + 1, "site-b0", now + 600)
        tiers.configure("site-b0", _config(head[1], epoch_ms, newer))
        until(lambda: _last_quorum(tiers, "site-b0"), 40, "the newer epoch's site in a quorum")
        older = [f"site-a{i}" for i in range(2)]
        for s in older:
            tiers.configure(s, _config(head[1], epoch_ms, tierpass.issue(tierpass.ca_seed(SECRET, EPOCH), EPOCH, s,
                                                                          now + 600)))
        if live_epochs == 2:
            until(lambda: all((_last_quorum(tiers, s) or 0) == 3 for s in ["site-b0", *older]), 40,
                  "a quorum of both replicas' sites")
        else:
            until(lambda: all(tiers.members[s].figures.failures >= 2 for s in older), 40, "the older epoch refused")
            assert all(tiers.members[s].figures.quorums == 0 for s in older)
    finally:
        tiers.stop()
        lh.terminate()
        lh.wait(10)
