"""The agent's side of `weaver.v1.LeaseBroker/Session`: one long-lived gRPC stream per agent.

A background thread owns the stream: it sends Register first (site id, device facts, mode, token),
then heartbeats at the broker's interval plus whatever the trainer queues (usage reports, transfer
plans, round reports); it turns Welcome/Lease/Revoke into events stamped with the agent's own
monotonic clock. When the stream breaks it emits `Disconnected` and reconnects with exponential
backoff (reset once a Welcome arrives). A Register the broker refuses (a wrong credential, or
ALREADY_EXISTS while the broker still holds this site's previous session, e.g. a cut connection it has
not noticed yet) is retried the same way: the broker takes the reconnect once that session is gone.
The token is this site's credential from the operator (`weaver-xapp site-token SITE`); it goes out only
in the Register and its metadata, never into a log line.

The client never decides whether work may run: the trainer loop feeds these events to the budget
enforcer, which lets a lease lapse on its own clock whether or not the broker is still there;
`Disconnected` revokes every lease at once.

A lease's hard end is `Lease.sent_unix_ms + valid_for_ms` on the broker's wall clock (the contract),
and transit must not extend it. The client maps it onto its own monotonic clock with a causal bound
on the offset theta = broker wall - agent clock: a message the agent sent at a0 (its clock) and the
broker answered at b (broker wall) gives theta <= b - a0, whatever the delays were. The samples are
the Register/Welcome pair and every heartbeat with its echo (same seq); the bound is the smallest
over the last OFFSET_SAMPLES of the current stream (`ClockOffsetBound`), and `lease_hard_end` is the
pure mapping. Without a sample yet, or from a broker that does not stamp leases (sent_unix_ms = 0),
a lease ends at receipt + valid_for_ms on the agent's clock (the contract's fallback), which a slow
transit does extend.
"""
from __future__ import annotations

import logging
import os
import queue
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from agent.config import LeaseClientConfig
from agent.enforcer import LeaseTerms
from agent.monitors import DeviceFacts
from schemas.credential import make_proof
from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc
from schemas.redirect import REDIRECT_METADATA

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
    transit_ms: float | None = None   # the broker's decision instant (sent_unix_ms) -> receipt, on the wall clocks


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

OFFSET_SAMPLES = 64       # offset samples the bound is taken over (at 500 ms heartbeats: the last 32 s)
SENT_KEPT = 2 * OFFSET_SAMPLES   # heartbeat send times kept waiting for their echo
REFUSALS = ("UNAUTHENTICATED", "ALREADY_EXISTS", "INVALID_ARGUMENT", "PERMISSION_DENIED")


@dataclass
class ClockOffsetBound:
    """Upper bound on theta = broker wall clock - agent clock, in ms, from request/answer pairs.

    A message the agent sent when its clock read `sent_ms`, answered by the broker with its wall clock
    `broker_ms`, proves theta <= broker_ms - sent_ms: the answer was stamped after the request left.
    The bound is the smallest such value over the last `window` samples; it exceeds the true offset
    by the fastest sample's upward delay (plus 1 ms, below), so it only ever shortens a lease. Drift
    between the two clocks over the window (ppm: microseconds) is not corrected for.
    """
    window: int = OFFSET_SAMPLES
    _samples: deque[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._samples = deque(maxlen=self.window)

    def observe(self, sent_ms: float, broker_ms: int) -> None:
        # The broker stamps whole ms rounded down, so its clock read up to 1 ms more than it wrote.
        self._samples.append(broker_ms + 1 - sent_ms)

    @property
    def max_offset_ms(self) -> float | None:
        """The bound, or None before the first sample."""
        return min(self._samples) if self._samples else None


def lease_hard_end(sent_unix_ms: int, valid_for_ms: int, max_offset_ms: float | None) -> float | None:
    """The lease's hard end on the agent's clock (seconds): sent_unix_ms + valid_for_ms on the broker's
    clock, less the offset bound (theta <= bound, so this is never later than the true end). None when
    it cannot be bounded: the broker did not stamp the lease (0) or no offset sample exists yet."""
    if sent_unix_ms == 0 or max_offset_ms is None:
        return None
    return (sent_unix_ms + valid_for_ms - max_offset_ms) / 1e3


def lease_terms(msg: lease_pb2.Lease, received_at: float, not_after: float | None = None) -> LeaseTerms:
    """Proto -> terms. A lease without a duty is a spatial one (green context): busy the whole period.
    `not_after`: its hard end on the agent's clock (`lease_hard_end`), None = receipt + valid_for only."""
    duty = msg.duty if msg.duty > 0 else (1.0 if msg.sm_count > 0 else 0.0)
    return LeaseTerms(msg.lease_id, msg.sm_count, msg.period_ms / 1e3, msg.valid_for_ms / 1e3,
                      min(duty, 1.0), received_at, msg.epoch, msg.seq, msg.reason, not_after)


class _Stream:
    """State of one stream shared by its request generator (gRPC's thread) and its reader: the out
    queue and the clock-offset samples, which are per stream (a new broker may have a new clock)."""

    def __init__(self) -> None:
        self.out: queue.Queue = queue.Queue()
        self.offset = ClockOffsetBound()
        self.register_ms: float | None = None     # agent clock (ms) when the Register was handed to gRPC
        self.heartbeat_ms: dict[int, float] = {}  # seq -> agent clock (ms) when it was handed to gRPC


_STOP = object()


def drain(q: queue.Queue, timeout: float = 0.0) -> list:
    """Everything queued now; waits up to `timeout` seconds for the first item."""
    out = []
    try:
        out.append(q.get(timeout=timeout) if timeout > 0 else q.get_nowait())
        while True:
            out.append(q.get_nowait())
    except queue.Empty:
        pass
    return out


def _redirect_of(exc: grpc.RpcError, allowed: tuple[str, ...]) -> str | None:
    """The broker a refusal names for this site, if it is one of the configured ones: a broker is where
    leases come from, so a redirect is a choice among the operator's brokers, never a new address."""
    try:
        md = exc.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - not every RpcError carries metadata
        return None
    for key, value in md:
        if key == REDIRECT_METADATA and isinstance(value, str):
            if value in allowed:
                return value
            log.warning("a broker redirected to %r, which is not one of the configured brokers: ignored", value[:80])
    return None


class LeaseClient:
    def __init__(self, config: LeaseClientConfig, device: DeviceFacts, mode: str = "cpu_preferred",
                 capabilities: tuple[str, ...] = ("cpu_fallback",), clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.config = config
        self.device = device
        self.mode = mode
        self.job = ""              # the training job and the evidence for the mode, both registered
        self.mode_evidence = ""
        self.confinement = ""      # what bounds the training worker (agent.supervisor), registered
        self.capabilities = capabilities
        self.clock = clock          # the agent's clock: every event time, and the offset samples
        self.wall = wall            # unix seconds: only to stamp what the agent sends
        self.agent_id = config.agent_id or f"{socket.gethostname()}-{os.getpid()}"
        self.connected = False
        self.epoch = 0
        self.cross_site: lease_pb2.CrossSiteConfig | None = None
        self.sessions = 0           # streams opened that got a Welcome
        self.dropped_reports = 0    # reports queued while disconnected (not buffered: they describe the past)
        self._events: queue.Queue[Event] = queue.Queue()
        self._stream: _Stream | None = None   # the current session's (out queue, offset bound)
        self._stop = threading.Event()
        self._call = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lease-client", daemon=True)
        self._heartbeat_s = config.heartbeat_ms / 1e3
        self._refused = ""          # the last refusal logged (a retried refusal is logged once, not per try)
        # Several xApp replicas (xapp.shards): the brokers are tried in turn, and one that serves another
        # shard names the replica that serves this site (`weaver-redirect`), which is tried next
        self._next = 0
        self._redirect: str | None = None
        self.target = config.brokers[0]   # the broker of the current (or last) stream
        self.redirects = 0

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> LeaseClient:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0, drain_s: float = 1.0) -> None:
        """Close the stream. What was queued before (a final LeaseReleased) is written first: the
        request stream ends after it, and the call is cancelled only if the broker has not closed
        its side `drain_s` later."""
        self._stop.set()
        with self._lock:
            if self._stream is not None:
                self._stream.out.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(drain_s)
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        if self._thread.is_alive():   # stop() before start() is a no-op, not an error
            self._thread.join(timeout)

    @property
    def max_offset_ms(self) -> float | None:
        """The current stream's bound on broker wall - agent clock (ms); None before a sample."""
        stream = self._stream
        return None if stream is None else stream.offset.max_offset_ms

    # --- trainer side ----------------------------------------------------------------------------
    def poll(self, timeout: float = 0.0) -> list[Event]:
        """Events since the last call; waits up to `timeout` seconds for the first one."""
        return drain(self._events, timeout)

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

    def send_release(self, lease_id: str, reason: str, overrun_ms: float, held_sm_count: int) -> bool:
        """LeaseReleased: nothing more will be launched under `lease_id` nor any earlier lease of this
        site and epoch; in-flight work under them has finished and the partition has switched."""
        return self._send(lease_pb2.AgentMessage(released=lease_pb2.LeaseReleased(
            lease_id=lease_id, reason=reason, sent_unix_ms=int(self.wall() * 1e3), overrun_ms=overrun_ms,
            held_sm_count=held_sm_count)))

    def _send(self, msg: lease_pb2.AgentMessage) -> bool:
        with self._lock:
            out = self._stream.out if self.connected and self._stream is not None else None
        if out is None:
            self.dropped_reports += 1
            return False
        out.put(msg)
        return True

    # --- the stream thread -----------------------------------------------------------------------
    def _proof(self) -> str:
        """A fresh one-time proof of the site's credential for this Register (schemas.credential); a new one
        for every connection, so a captured Register is worth nothing to anyone else."""
        if not self.config.token:
            return ""
        return make_proof(self.config.token, self.config.site_id, self.agent_id, int(self.wall() * 1000))

    def _register(self) -> lease_pb2.AgentMessage:
        return lease_pb2.AgentMessage(register=lease_pb2.Register(
            site_id=self.config.site_id, agent_id=self.agent_id, device=self.device.to_proto(),
            capabilities=list(self.capabilities), token=self._proof(), mode=self.mode,
            job=self.job, mode_evidence=self.mode_evidence, confinement=self.confinement))

    def _requests(self, stream: _Stream):
        # Each send time is taken before the message is handed over, so it can only be early: the bound
        # b - a0 it gives is then looser, never below the true offset.
        stream.register_ms = self.clock() * 1e3
        yield self._register()
        seq = 0
        while True:   # until _STOP: whatever was queued before it (a final LeaseReleased) goes out first
            try:
                msg = stream.out.get(timeout=self._heartbeat_s)
            except queue.Empty:
                if self._stop.is_set():
                    return
                seq += 1
                stream.heartbeat_ms[seq] = self.clock() * 1e3
                if len(stream.heartbeat_ms) > SENT_KEPT:   # a broker that does not echo: keep the newest
                    del stream.heartbeat_ms[next(iter(stream.heartbeat_ms))]
                msg = lease_pb2.AgentMessage(heartbeat=lease_pb2.Heartbeat(
                    seq=seq, sent_unix_ms=int(self.wall() * 1e3)))
            if msg is _STOP:
                return
            yield msg

    def _run(self) -> None:
        backoff = self.config.backoff_initial_s
        while not self._stop.is_set():
            welcomed = self._session()
            if self._stop.is_set():
                break
            backoff = (self.config.backoff_initial_s if welcomed or self._redirect
                       else min(backoff * 2, self.config.backoff_max_s))
            # jitter so that a fleet of agents does not reconnect in lockstep after an xApp restart
            self._stop.wait(backoff * random.uniform(0.8, 1.2))

    def _session(self) -> bool:
        """One stream, from connect to break. True when the broker welcomed us."""
        welcomed = False
        stream = _Stream()
        metadata = None   # the proof travels in Register.token; the credential itself never goes on the wire
        # No client keepalive pings: servers with default settings answer frequent pings with GOAWAY
        # (too_many_pings). A silent broker is caught anyway: its leases lapse on the agent's clock.
        reason = "stream ended"
        brokers = self.config.brokers
        target, self._redirect = self._redirect or brokers[self._next % len(brokers)], None
        self.target = target
        redirect = None
        with grpc.insecure_channel(target) as channel:
            call = lease_pb2_grpc.LeaseBrokerStub(channel).Session(self._requests(stream), metadata=metadata)
            with self._lock:
                self._call, self._stream = call, stream
            try:
                for msg in call:
                    welcomed |= self._handle(msg, stream)
            except grpc.RpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}" if hasattr(exc, "code") else str(exc)
                redirect = _redirect_of(exc, brokers)
            finally:
                stream.out.put(_STOP)
                with self._lock:
                    was_connected, self.connected = self.connected, False
                    self._call = self._stream = None
        if was_connected or welcomed:
            self._refused = ""
            if not self._stop.is_set():
                log.warning("lease stream to %s lost: %s", target, reason)
            self._events.put(Disconnected(self.clock(), reason))
        elif redirect:
            self._redirect = redirect
            self.redirects += 1
            log.info("broker %s serves another shard: site %s is served at %s", target, self.config.site_id, redirect)
        elif reason != self._refused and not self._stop.is_set() and reason.split(":")[0] in REFUSALS:
            self._refused = reason
            log.warning("broker %s refused site %s: %s (retrying with backoff)", target,
                        self.config.site_id, reason)
        if not welcomed and not redirect:
            self._next += 1            # the next replica's broker (a dead one, or one that knows no owner)
        return welcomed

    def _handle(self, msg: lease_pb2.BrokerMessage, stream: _Stream) -> bool:
        now = self.clock()
        kind = msg.WhichOneof("body")
        if kind == "welcome":
            w = msg.welcome
            if w.sent_unix_ms and stream.register_ms is not None:
                stream.offset.observe(stream.register_ms, w.sent_unix_ms)
            if w.heartbeat_ms:
                self._heartbeat_s = w.heartbeat_ms / 1e3
            cs = w.cross_site if w.HasField("cross_site") else None
            with self._lock:
                self.connected, self.epoch, self.cross_site = True, w.epoch, cs
            self.sessions += 1
            log.info("registered with %s as %s (epoch %d)", self.target, self.agent_id, w.epoch)
            self._events.put(Connected(now, w.site_id, w.epoch, w.heartbeat_ms, cs))
            return True
        if kind == "heartbeat":
            sent = stream.heartbeat_ms.pop(msg.heartbeat.seq, None)   # each echo counts once
            if sent is not None and msg.heartbeat.sent_unix_ms:
                stream.offset.observe(sent, msg.heartbeat.sent_unix_ms)
        elif kind == "lease":
            not_after = lease_hard_end(msg.lease.sent_unix_ms, msg.lease.valid_for_ms, stream.offset.max_offset_ms)
            try:
                transit = self.wall() * 1e3 - msg.lease.sent_unix_ms if msg.lease.sent_unix_ms else None
                self._events.put(LeaseGranted(lease_terms(msg.lease, now, not_after), transit))
            except ValueError as exc:   # a malformed lease is refused, and grants nothing
                log.warning("ignoring malformed lease %r: %s", msg.lease.lease_id, exc)
        elif kind == "revoke":
            self._events.put(LeaseRevoked(now, msg.revoke.lease_id, msg.revoke.reason or "revoked"))
        elif kind == "cross_site":
            self.cross_site = msg.cross_site
            self._events.put(CrossSiteChanged(now, msg.cross_site))
        return False
