"""The training worker: the job, torch and everything they start, in the cgroup the supervisor made.

Started by agent.supervisor (`python -m agent.worker`), never by hand. It runs the one training loop
(agent.site_agent / agent.crosssite.agent) exactly as before, with one difference: the lease stream is
the link to its supervisor (`LinkClient`, the LeaseClient interface over agent.worker_link), not gRPC.
It holds no broker credential and listens on no port of the control plane; the supervisor owns those.

The worker says `hello` once its job is built (device, mode and why, job, parameters); from then on the
kernel decides when it runs: frozen with no lease, held to the lease's cores while one is held.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, replace

from agent import worker_link as wl
from agent.lease_client import Connected, CrossSiteChanged, Disconnected, LeaseGranted, LeaseRevoked, drain
from schemas.proto.weaver.v1 import lease_pb2

log = logging.getLogger("weaver.agent.worker")
# Both run inside the worker's quota, so they take from the lease: at an 8-SM lease on a 0.5-core stand-in
# of a 48-SM GPU (83 ms of CPU a second) a render of the exposition every second was a visible share of it.
SNAPSHOT_EVERY_S = 0.5       # status and lease history for the supervisor's inspection service
METRICS_EVERY_S = 5.0        # the /metrics exposition (Prometheus scrapes every 15-30 s)


class LinkClient:
    """agent.lease_client.LeaseClient's interface (events in, reports out) over the supervisor link."""

    def __init__(self, sock: socket.socket, config, device, mode: str = "cpu_preferred") -> None:
        self.config, self.device, self._mode = config, device, mode
        self.job = self.mode_evidence = ""
        self.agent_id = config.agent_id or f"{socket.gethostname()}-{os.getppid()}"
        self.connected = False
        self.epoch = 0
        self.cross_site = None
        self.dropped_reports = 0
        self.requests: queue.Queue[dict] = queue.Queue()   # checkpoint / stop, for the worker's own thread
        self._sock = sock
        self._events: queue.Queue = queue.Queue()
        self._wlock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="supervisor-link", daemon=True)
        self.closed = threading.Event()

    # --- LeaseClient's interface --------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        """A switch (SiteAgent._apply_switch): the supervisor registers it on the next (re)connect."""
        if value != self._mode:
            self._mode = value
            self.send({"t": "mode", "mode": value})

    def start(self) -> LinkClient:
        if not self._reader.is_alive() and not self.closed.is_set():
            self._reader.start()
        return self

    def stop(self, timeout: float = 5.0, drain_s: float = 1.0) -> None:
        pass   # the link outlives the loop: the final release and snapshot still go out

    @property
    def max_offset_ms(self):
        return None

    def poll(self, timeout: float = 0.0) -> list:
        return drain(self._events, timeout)

    def send_usage(self, report: lease_pb2.UsageReport) -> bool:
        return self.send({"t": "usage", "pb": wl.pb(report)}) and self.connected

    def send_transfer_plan(self, round: int, bytes: int, deadline_unix_ms: int, workers: int) -> bool:  # noqa: A002
        return self.send({"t": "transfer", "round": round, "bytes": bytes, "deadline_unix_ms": deadline_unix_ms,
                          "workers": workers}) and self.connected

    def send_round_report(self, round: int, committed: bool, participants: int, tokens: int,  # noqa: A002
                          bytes_sent: int, wall_ms: float, wait_ms: float) -> bool:
        return self.send({"t": "round", "round": round, "committed": committed, "participants": participants,
                          "tokens": tokens, "bytes_sent": bytes_sent, "wall_ms": wall_ms,
                          "wait_ms": wait_ms}) and self.connected

    def send_release(self, lease_id: str, reason: str, overrun_ms: float, held_sm_count: int) -> bool:
        return self.send({"t": "release", "lease_id": lease_id, "reason": reason, "overrun_ms": overrun_ms,
                          "held_sm_count": held_sm_count})

    # --- the link ------------------------------------------------------------------------------
    def send(self, msg: dict) -> bool:
        try:
            frame = wl.encode(msg)
            with self._wlock:
                self._sock.sendall(frame)
            return True
        except (OSError, wl.LinkError):
            self.dropped_reports += 1
            return False

    def _read(self) -> None:
        dec = wl.FrameDecoder(wl.TO_WORKER)
        try:
            wl.read_frames(self._sock, dec, self._on)
        except (OSError, wl.LinkError) as exc:
            log.error("supervisor link broken: %s", exc)
        finally:
            # no supervisor, no lease: what was held is revoked and the loop stops
            self.connected = False
            self._events.put(Disconnected(time.monotonic(), "supervisor gone"))
            self.closed.set()
            self.requests.put({"t": "stop"})

    def _on(self, m: dict) -> None:
        t = m["t"]
        if t == "lease":
            self._events.put(LeaseGranted(wl.terms_from_json(m["terms"])))
        elif t == "revoke":
            self._events.put(LeaseRevoked(float(m["at"]), str(m["lease_id"]), str(m["reason"])))
        elif t == "connected":
            cs = wl.unpb(lease_pb2.CrossSiteConfig, m["cross_site"]) if m.get("cross_site") else None
            self.connected, self.epoch, self.cross_site = True, int(m["epoch"]), cs
            self._events.put(Connected(float(m["at"]), str(m["site_id"]), int(m["epoch"]), int(m["heartbeat_ms"]), cs))
        elif t == "disconnected":
            self.connected = False
            self._events.put(Disconnected(float(m["at"]), str(m["reason"])))
        elif t == "cross_site":
            cfg = wl.unpb(lease_pb2.CrossSiteConfig, m["pb"])
            self.cross_site = cfg
            self._events.put(CrossSiteChanged(float(m["at"]), cfg))
        else:   # checkpoint, stop: served off the link's thread
            self.requests.put(m)


def _snapshots(agent, link: LinkClient, stop: threading.Event) -> None:
    from agent.metrics import render
    next_metrics = 0.0
    while not stop.wait(SNAPSHOT_EVERY_S):
        msg = {"t": "snapshot", "status": wl.pb(agent.status()),
               "leases": wl.pb(lease_pb2.LeaseHistory(leases=agent.leases(64)))}
        if time.monotonic() >= next_metrics:
            next_metrics = time.monotonic() + METRICS_EVERY_S
            msg["metrics"] = render(agent)
        link.send(msg)


def _requests(agent, link: LinkClient) -> None:
    while True:
        m = link.requests.get()
        if m["t"] == "stop":
            agent.stop()
            return
        try:
            info = agent.request_checkpoint(timeout=float(m.get("timeout", 30.0)))
            link.send({"t": "checkpoint_done", "id": m.get("id", 0), "path": str(info.path), "step": info.step})
        except TimeoutError as exc:
            link.send({"t": "checkpoint_done", "id": m.get("id", 0), "error": str(exc)})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agent.worker")
    p.add_argument("--link-fd", type=int, required=True)
    p.add_argument("--config-json", required=True, help="AgentConfig as JSON (no credential in it)")
    p.add_argument("--mode", default=None)
    p.add_argument("--config", default=None, help="the operator's config file, for where the mode came from")
    p.add_argument("--kernel-bound", action="store_true", help="the supervisor confines this worker (cgroup)")
    args = p.parse_args(argv)
    from agent.logs import setup as setup_logs
    setup_logs()
    import faulthandler
    with contextlib.suppress(ValueError, OSError, AttributeError):   # a stderr with no descriptor (in-process)
        faulthandler.register(signal.SIGUSR1, all_threads=True)   # as the supervisor: stacks on stderr
    sock = socket.socket(fileno=args.link_fd)
    from agent.cli import starting_mode
    from agent.config import AgentConfig
    from agent.crosssite.agent import CrossSiteAgent
    from agent.job import JobError
    cfg = AgentConfig.from_dict(json.loads(args.config_json))
    if args.kernel_bound:   # the kernel holds the tree to each lease: plan by CPU budget, not by slots
        cfg = replace(cfg, enforcer=replace(cfg.enforcer, kernel_bound=True, phase_fraction=0.0))
    holder: dict = {}

    def factory(config, device, mode="cpu_preferred"):
        holder["link"] = LinkClient(sock, config, device, mode)
        return holder["link"]
    try:
        cfg, evidence = starting_mode(cfg, args)
        agent = CrossSiteAgent(cfg, mode_evidence=evidence, client_factory=factory)
    except JobError as exc:   # the supervisor prints it: the operator's one line
        try:
            sock.sendall(wl.encode({"t": "refused", "why": f"bad job: {exc}"}))
        except OSError:
            print(f"weaver-agent: bad job: {exc}", file=sys.stderr)
        return 2
    link: LinkClient = holder["link"]
    link.send({"t": "hello", "device": asdict(agent.device), "mode": agent.modes.mode, "mode_evidence": evidence,
               "job": cfg.job.name, "params": sum(p.numel() for p in agent.trainer.model.parameters()),
               "pid": os.getpid()})
    link.start()
    stop = threading.Event()
    threading.Thread(target=_snapshots, args=(agent, link, stop), name="snapshots", daemon=True).start()
    threading.Thread(target=_requests, args=(agent, link), name="requests", daemon=True).start()
    try:
        agent.run()
    finally:
        stop.set()
        link.send({"t": "snapshot", "status": wl.pb(agent.status()),
                   "leases": wl.pb(lease_pb2.LeaseHistory(leases=agent.leases(64)))})
    return 0


if __name__ == "__main__":
    from agent.cli import exit_process
    exit_process(main())
