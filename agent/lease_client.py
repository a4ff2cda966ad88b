"""The agent's side of `weaver.v1.LeaseBroker/Session`: one long-lived gRPC stream per agent.

A background thread owns the stream: it sends Register first (site id, device facts, mode, token),
then heartbeats at the broker's interval plus whatever the trainer queues (usage reports, transfer
plans, round reports); it turns Welcome/Lease/Revoke into events stamped with the agent's own
monotonic clock. When the stream breaks it emits `Disconnected` and reconnects with exponential
backoff (reset once a Welcome arrives).

The client never decides whether work may run: the trainer loop feeds these events to the budget
enforcer, which lets a lease lapse on its own clock (`received_at + valid_for`) whether or not the
broker is still there; `Disconnected` revokes every lease at once.
"""
from __future__ import annotations

import logging
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from agent.config import LeaseClientConfig
from agent.enforcer import LeaseTerms
from agent.monitors import DeviceFacts
from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc

log = logging.getLogger("weaver.agent.lease")


@dataclass(frozen=True)
class Connected:
    at: float
    site_id: str
    epoch: int
    heartbeat_ms: int
    cross_site: lease_pb2.CrossSiteConfig | None


@dataclass(frozen=True)
class Disconnected:
    at: float
    reason: str


@dataclass(frozen=True)
class LeaseGranted:
    terms: LeaseTerms


@dataclass(frozen=True)
class LeaseRevoked:
    at: float
    lease_id: str        # "" = every lease of this site
    reason: str


@dataclass(frozen=True)
class CrossSiteChanged:
    at: float
    config: lease_pb2.CrossSiteConfig


Event = Connected | Disconnected | LeaseGranted | LeaseRevoked | CrossSiteChanged


def lease_terms(msg: lease_pb2.Lease, received_at: float) -> LeaseTerms:
    """Proto -> terms. A lease without a duty is a spatial one (green context): busy the whole period."""
    duty = msg.duty if msg.duty > 0 else (1.0 if msg.sm_count > 0 else 0.0)
    return LeaseTerms(msg.lease_id, msg.sm_count, msg.period_ms / 1e3, msg.valid_for_ms / 1e3,
                      min(duty, 1.0), received_at, msg.epoch, msg.seq, msg.reason)


_STOP = object()


class LeaseClient:
    def __init__(self, config: LeaseClientConfig, device: DeviceFacts, mode: str = "cpu_preferred",
                 capabilities: tuple[str, ...] = ("cpu_fallback",), clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.device = device
        self.mode = mode
        self.capabilities = capabilities
        self.clock = clock
        self.agent_id = config.agent_id or f"{socket.gethostname()}-{os.getpid()}"
        self.connected = False
        self.epoch = 0
        self.cross_site: lease_pb2.CrossSiteConfig | None = None
        self.sessions = 0           # streams opened that got a Welcome
        self.dropped_reports = 0    # reports queued while disconnected (not buffered: they describe the past)
        self._events: queue.Queue[Event] = queue.Queue()
        self._out: queue.Queue | None = None
        self._stop = threading.Event()
        self._call = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lease-client", daemon=True)
        self._heartbeat_s = config.heartbeat_ms / 1e3

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> LeaseClient:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            if self._out is not None:
                self._out.put(_STOP)
            if self._call is not None:
                self._call.cancel()
        if self._thread.is_alive():   # stop() before start() is a no-op, not an error
            self._thread.join(timeout)

    # --- trainer side ----------------------------------------------------------------------------
    def poll(self, timeout: float = 0.0) -> list[Event]:
        """Events since the last call; waits up to `timeout` seconds for the first one."""
        out = []
        try:
            out.append(self._events.get(timeout=timeout) if timeout > 0 else self._events.get_nowait())
            while True:
                out.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return out

    def send_usage(self, report: lease_pb2.UsageReport) -> bool:
        return self._send(lease_pb2.AgentMessage(usage=report))

    def send_transfer_plan(self, round: int, bytes: int, deadline_unix_ms: int, workers: int) -> bool:  # noqa: A002
        return self._send(lease_pb2.AgentMessage(transfer=lease_pb2.TransferPlan(
            round=round, bytes=bytes, deadline_unix_ms=deadline_unix_ms, workers=workers)))

    def send_round_report(self, round: int, committed: bool, participants: int, tokens: int,  # noqa: A002
                          bytes_sent: int, wall_ms: float, wait_ms: float) -> bool:
        return self._send(lease_pb2.AgentMessage(round=lease_pb2.RoundReport(
            round=round, committed=committed, participants=participants, tokens=tokens,
            bytes_sent=bytes_sent, wall_ms=wall_ms, wait_ms=wait_ms)))

    def _send(self, msg: lease_pb2.AgentMessage) -> bool:
        with self._lock:
            out = self._out if self.connected else None
        if out is None:
            self.dropped_reports += 1
            return False
        out.put(msg)
        return True

    # --- the stream thread -----------------------------------------------------------------------
    def _register(self) -> lease_pb2.AgentMessage:
        return lease_pb2.AgentMessage(register=lease_pb2.Register(
            site_id=self.config.site_id, agent_id=self.agent_id, device=self.device.to_proto(),
            capabilities=list(self.capabilities), token=self.config.token, mode=self.mode))

    def _requests(self, out: queue.Queue):
        yield self._register()
        seq = 0
        while not self._stop.is_set():
            try:
                msg = out.get(timeout=self._heartbeat_s)
            except queue.Empty:
                seq += 1
                msg = lease_pb2.AgentMessage(heartbeat=lease_pb2.Heartbeat(
                    seq=seq, sent_unix_ms=int(time.time() * 1e3)))
            if msg is _STOP:
                return
            yield msg

    def _run(self) -> None:
        backoff = self.config.backoff_initial_s
        while not self._stop.is_set():
            welcomed = self._session()
            if self._stop.is_set():
                break
            backoff = self.config.backoff_initial_s if welcomed else min(backoff * 2, self.config.backoff_max_s)
            # jitter so that a fleet of agents does not reconnect in lockstep after an xApp restart
            self._stop.wait(backoff * random.uniform(0.8, 1.2))

    def _session(self) -> bool:
        """One stream, from connect to break. True when the broker welcomed us."""
        welcomed = False
        out: queue.Queue = queue.Queue()
        metadata = (("authorization", f"Bearer {self.config.token}"),) if self.config.token else None
        # No client keepalive pings: servers with default settings answer frequent pings with GOAWAY
        # (too_many_pings). A silent broker is caught anyway: its leases lapse on the agent's clock.
        reason = "stream ended"
        with grpc.insecure_channel(self.config.broker) as channel:
            call = lease_pb2_grpc.LeaseBrokerStub(channel).Session(self._requests(out), metadata=metadata)
            with self._lock:
                self._call, self._out = call, out
            try:
                for msg in call:
                    welcomed |= self._handle(msg, out)
            except grpc.RpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}" if hasattr(exc, "code") else str(exc)
            finally:
                out.put(_STOP)
                with self._lock:
                    was_connected, self.connected = self.connected, False
                    self._call = self._out = None
        if was_connected or welcomed:
            if not self._stop.is_set():
                log.warning("lease stream to %s lost: %s", self.config.broker, reason)
            self._events.put(Disconnected(self.clock(), reason))
        return welcomed

    def _handle(self, msg: lease_pb2.BrokerMessage, out: queue.Queue) -> bool:
        now = self.clock()
        kind = msg.WhichOneof("body")
        if kind == "welcome":
            w = msg.welcome
            if w.heartbeat_ms:
                self._heartbeat_s = w.heartbeat_ms / 1e3
            cs = w.cross_site if w.HasField("cross_site") else None
            with self._lock:
                self.connected, self.epoch, self.cross_site = True, w.epoch, cs
            self.sessions += 1
            log.info("registered with %s as %s (epoch %d)", self.config.broker, self.agent_id, w.epoch)
            self._events.put(Connected(now, w.site_id, w.epoch, w.heartbeat_ms, cs))
            return True
        if kind == "lease":
            try:
                self._events.put(LeaseGranted(lease_terms(msg.lease, now)))
            except ValueError as exc:   # a malformed lease is refused, and grants nothing
                log.warning("ignoring malformed lease %r: %s", msg.lease.lease_id, exc)
        elif kind == "revoke":
            self._events.put(LeaseRevoked(now, msg.revoke.lease_id, msg.revoke.reason or "revoked"))
        elif kind == "cross_site":
            self.cross_site = msg.cross_site
            self._events.put(CrossSiteChanged(now, msg.cross_site))
        return False
