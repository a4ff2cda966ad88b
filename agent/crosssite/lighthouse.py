"""Start and stop a torchft Lighthouse (the quorum service of the cross-site tier).

The Lighthouse runs as its own process (torchft's `torchft_lighthouse` binary) so that killing a
site never takes the quorum service with it, and so that it is stopped by pid, never by name.
Run standalone: `python -m agent.crosssite.lighthouse --port 29510 --round-ms 1000` (timeouts derived
from the round length) or with explicit `--heartbeat-timeout-ms` / `--join-timeout-ms`.

With `--secret-env NAME` (the variable holding the broker secret) it is gated (agent.crosssite.gate): the
torchft binary binds a loopback port and `--port` on `--bind-host` is a gate that lets through only hellos
with a site's pass signed by the epoch's CA key, which it derives from that secret as the broker does
(`schemas.tierpass.ca_seed`), of the newest epoch it has seen or a newer one (a restarted xApp's sites move
on; a pass of an older epoch stops working; with `--live-epochs R`, R sharded replicas' epochs: `EpochKeys`), and
of the Lighthouse only its gRPC: the /status page and /replica/<id>/kill are not served through it. (An xApp
that keeps its epoch in SDL only moves forward; one without SDL starts again at epoch 1 after a restart, whose key
this gate then refuses: restart the Lighthouse with it.) It prints
`lighthouse gate://HOST:PORT inner http://127.0.0.1:INNER`.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from schemas.announce import announce

log = logging.getLogger("weaver.lighthouse")

# A region's Lighthouse: each site heartbeats it at a third of its heartbeat timeout (half a round) and holds one
# gRPC connection through its gate; the region's round grows so that it gets at most this many heartbeats a
# second (as the broker's heartbeat grows with its sessions: testbed.up.heartbeat_ms_for).
REGION_HEARTBEATS_PER_S = 200


def region_round_ms(sites: int, round_ms: int) -> int:
    """The round of a region of `sites`: `round_ms`, or longer where its heartbeats would pass the limit."""
    return max(round_ms, math.ceil(sites * 6 * 1000 / REGION_HEARTBEATS_PER_S))


def gate_connections_for(sites: int) -> int:
    """The gate's open connections at most: every site's, twice over (a reconnect overlaps the old one's close)."""
    return max(256, 2 * sites)


@dataclass(frozen=True)
class LighthouseConfig:
    port: int = 0                    # 0 = pick a free port
    min_replicas: int = 1
    # How long a quorum waits for heartbeating stragglers, from the first request. Must exceed one
    # round: a site left out of a quorum stays queued, and a shorter timeout would let it and the
    # first member to arrive form a quorum without the others. Dead sites are not waited for:
    # they stop heartbeating and are dropped after heartbeat_timeout_ms.
    join_timeout_ms: int = 1500
    heartbeat_timeout_ms: int = 400  # keep below the round length: a dead site costs < 1 round
    quorum_tick_ms: int = 20

    def __post_init__(self) -> None:
        for name in ("min_replicas", "join_timeout_ms", "heartbeat_timeout_ms", "quorum_tick_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"LighthouseConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"LighthouseConfig.port out of range: {self.port}")

    @classmethod
    def for_rounds(cls, round_ms: int, port: int = 0, min_replicas: int = 1) -> LighthouseConfig:
        """Timeouts that fit the round protocol: a dead site costs less than a round (heartbeat R/2),
        a left-out site rejoins at the next boundary (join timeout 1.5 R)."""
        if round_ms < 50:
            raise ValueError(f"round_ms must be >= 50, got {round_ms}")
        return cls(port=port, min_replicas=min_replicas, join_timeout_ms=round_ms * 3 // 2,
                   heartbeat_timeout_ms=max(10, round_ms // 2))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary() -> str:
    here = Path(sys.executable).parent / "torchft_lighthouse"
    found = str(here) if here.exists() else shutil.which("torchft_lighthouse")
    if found is None:
        raise FileNotFoundError("torchft_lighthouse not found: install torchft in the agent venv")
    return found


def _die_with_parent() -> None:
    """In the child, before exec: the binary holds nothing worth a goodbye, so it ends with whoever started
    it, however that one ends (a SIGKILLed wrapper would otherwise leave it serving a quorum for good)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


class EpochKeys:
    """The CA public key of an epoch, for the gate: the `live_epochs` newest epochs seen in a good hello, or a
    newer one.

    One xApp has one broker epoch at a time: a restart takes the next, and the passes of the last are refused
    from the first hello of the new one on. Sharded replicas (`controls.replicas`) each take an epoch of their
    own from SDL, all of them live at once, and a restarted replica takes the newest; so the live epochs are
    always among the `live_epochs` = replica-count newest, and the gate takes those (with one replica: only the
    newest, as before). Refusing an older live one cut the sites of the lower-epoch replica out of the tier as
    soon as a site of the other replica had passed."""

    def __init__(self, secret: str, live_epochs: int = 1):
        from schemas.tierpass import ca_seed, public_key

        if not secret:
            raise ValueError("a gated Lighthouse needs the broker secret")
        if live_epochs < 1:
            raise ValueError("live_epochs must be at least 1")
        self._key = lambda epoch: public_key(ca_seed(secret, epoch))
        self.live_epochs = live_epochs
        self.newest = 0
        self._lock = threading.Lock()

    def __call__(self, epoch: int) -> bytes | None:
        with self._lock:
            if epoch <= self.newest - self.live_epochs:
                return None
            # the pass is checked after this: the ratchet moves only on a hello that passes (see `passed`)
            return self._key(epoch)

    def passed(self, epoch: int) -> None:
        with self._lock:
            self.newest = max(self.newest, epoch)


class Lighthouse:
    """A Lighthouse child process; use as a context manager so it is always stopped."""

    def __init__(self, config: LighthouseConfig = LighthouseConfig()):
        self.config = config
        self.port = config.port or _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def addr(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> Lighthouse:
        c = self.config
        self.proc = subprocess.Popen(
            [_binary(), "--bind", f"127.0.0.1:{self.port}", "--min_replicas", str(c.min_replicas),
             "--join_timeout_ms", str(c.join_timeout_ms), "--heartbeat_timeout_ms", str(c.heartbeat_timeout_ms),
             "--quorum_tick_ms", str(c.quorum_tick_ms)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"torchft_lighthouse exited with {self.proc.returncode} (port {self.port} taken?)")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"torchft_lighthouse did not listen on {self.port} within {timeout_s}s")

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(3)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(3)

    def __enter__(self) -> Lighthouse:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _room_for(descriptors: int) -> None:
    """Raise this process's open-file limit to `descriptors` where the hard limit allows (many hosts start
    processes at a soft 1,024, which a region's gate passes at 500 sites)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = descriptors if hard == resource.RLIM_INFINITY else min(descriptors, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        if want < descriptors:
            log.warning("lighthouse gate: %d open files at most (hard limit), %d wanted", want, descriptors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent.crosssite.lighthouse")
    ap.add_argument("--port", type=int, default=29510)
    ap.add_argument("--bind-host", default="127.0.0.1", help="the gate's interface (gated only)")
    ap.add_argument("--secret-env", default="", help="gate the Lighthouse with the broker secret in this variable")
    ap.add_argument("--min-replicas", type=int, default=1)
    ap.add_argument("--round-ms", type=int, default=0, help="derive both timeouts from the round length")
    ap.add_argument("--join-timeout-ms", type=int, default=1500)
    ap.add_argument("--heartbeat-timeout-ms", type=int, default=400)
    ap.add_argument("--live-epochs", type=int, default=1,
                    help="broker epochs live at once: the xApp's replica count (each replica has an epoch of its own)")
    ap.add_argument("--max-connections", type=int, default=256,
                    help="the gate's open connections at most (each site's Lighthouse client holds one)")
    args = ap.parse_args(argv)
    if args.max_connections < 1 or args.live_epochs < 1:
        ap.error("--max-connections and --live-epochs must be at least 1")
    if args.round_ms:
        cfg = LighthouseConfig.for_rounds(args.round_ms, port=args.port, min_replicas=args.min_replicas)
    else:
        cfg = LighthouseConfig(port=args.port, min_replicas=args.min_replicas, join_timeout_ms=args.join_timeout_ms,
                               heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    gate_server = None
    if args.secret_env:
        from agent.crosssite.gate import GateServer

        _room_for(2 * args.max_connections + 64)    # each connection is two descriptors (site, inner Lighthouse)
        keys = EpochKeys(os.environ.get(args.secret_env, ""), args.live_epochs)
        lh = Lighthouse(replace(cfg, port=0)).start()
        gate_server = GateServer(args.bind_host, args.port, keys, {"lighthouse": lh.port}, grpc_only=("lighthouse",),
                                 max_connections=args.max_connections, name="lighthouse-gate", on_hello=lambda h: keys.passed(h.epoch))
        gate_server.start()
        announce(f"lighthouse gate://{args.bind_host}:{gate_server.port} inner {lh.addr}")
    else:
        lh = Lighthouse(cfg).start()
        announce(f"lighthouse {lh.addr}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while lh.proc is not None and lh.proc.poll() is None:
            time.sleep(0.5)
    finally:
        if gate_server is not None:
            gate_server.stop()
        lh.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
