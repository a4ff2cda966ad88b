"""A region's sites in one gated Lighthouse, measured: `python -m agent.tierregion --sites N --rounds R`.

The deployed Lighthouse (`python -m agent.crosssite.lighthouse`, gated, its gate sized as `weaver up` sizes it)
and N model sites (`agent.tiermodel`, one process, each site through its own `gate.Egress` with a pass of the
epoch issued as the broker issues them), for R rounds of the length `weaver up --agents-model` uses for N
sites. Prints one JSON object: the tier's figures (sites in a quorum, quorum sizes, failures, heartbeats), and
the gate process's threads and CPU. `weaver bench scale` runs it for its tier rows (`--tier-sites`).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from agent.crosssite.lighthouse import gate_connections_for, region_round_ms
from agent.tiermodel import Tiers

SECRET = "tierregion-bench-secret"       # this run's broker secret (the bench's own, no real site holds it)
EPOCH = 1
ROUND_MS = 5000                          # weaver up's default round; a region's grows (region_round_ms)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _site_config(addr: str, round_ms: int, epoch_ms: int, site: str, expiry_unix: int):
    """What the broker's stream gives an admitted site (xapp.broker.LeaseBroker.cross_site)."""
    from schemas import tierpass
    from schemas.credential import tier_key
    from schemas.proto.weaver.v1 import lease_pb2

    ca = tierpass.ca_seed(SECRET, EPOCH)
    ident = tierpass.issue(ca, EPOCH, site, expiry_unix)
    return lease_pb2.CrossSiteConfig(
        lighthouse_addr=addr, round_ms=round_ms, round_epoch_ms=epoch_ms, heartbeat_timeout_ms=round_ms // 2,
        tier_key=tier_key(SECRET, EPOCH), tier_epoch=EPOCH, tier_ca=ident.ca_public, tier_site_key=ident.site_key,
        tier_pass_expiry_unix=ident.tier_pass.expiry_unix, tier_pass_signature=ident.tier_pass.ca_signature)


def _proc_stat(pid: int) -> tuple[int, float]:
    """(threads, CPU seconds) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[17]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(sites: int, rounds: int) -> dict:
    round_ms = region_round_ms(sites, ROUND_MS)
    env = {**os.environ, "WEAVER_TIER_SECRET": SECRET}
    lh = subprocess.Popen([sys.executable, "-m", "agent.crosssite.lighthouse", "--port", str(_free_port()),
                           "--round-ms", str(round_ms), "--secret-env", "WEAVER_TIER_SECRET",
                           "--max-connections", str(gate_connections_for(sites))],
                          stdout=subprocess.PIPE, text=True, env=env)
    tiers = Tiers()
    try:
        head = lh.stdout.readline().split()
        if len(head) < 2 or not head[1].startswith("gate://"):
            raise RuntimeError(f"the Lighthouse did not start gated: {head}")
        now = time.time()
        t0, cpu0 = time.monotonic(), time.process_time()
        for i in range(sites):
            tiers.configure(f"site-{i}", _site_config(head[1], round_ms, int(now * 1000), f"site-{i}", int(now) + 3600))
        joined_s = time.monotonic() - t0
        time.sleep(rounds * round_ms / 1000 + 1.0)
        figures = tiers.figures()
        gate_threads, gate_cpu = _proc_stat(lh.pid)
        return {"sites": sites, "rounds": rounds, "round_ms": round_ms, "configure_s": round(joined_s, 2),
                "seconds": round(time.monotonic() - t0, 1),
                "gate_max_connections": gate_connections_for(sites),
                "gate_process_threads": gate_threads, "gate_process_cpu_s": gate_cpu,
                "sites_process_threads": threading.active_count(),
                "sites_process_cpu_s": round(time.process_time() - cpu0, 2), **figures}
    finally:
        tiers.stop()
        lh.terminate()
        lh.wait(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent.tierregion")
    ap.add_argument("--sites", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    if args.sites < 1 or args.rounds < 1:
        ap.error("--sites and --rounds must be at least 1")
    print(json.dumps(measure(args.sites, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
