"""A real gRPC LeaseBroker for the agent's tests: implements `weaver.v1.LeaseBroker/Session` from the
contract, scriptable from the test (push leases/revocations, auto-renew every period), and
restartable on the same port. It is a fake of the *broker*, not of the agent: the agent under test
talks to it over a real socket. Like the xApp's broker it stamps Welcome and Lease with its wall
clock (`offset_ms` ahead of this host's, to test the agent's offset bound) and echoes heartbeats.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent import futures

import grpc

from schemas.credential import parse_proof, proof_mac
from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc
from schemas.redirect import REDIRECT_METADATA


def wait_for(pred, timeout: float, every: float = 0.02) -> bool:
    """Poll `pred` every `every` seconds until it holds (True) or `timeout` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return False


def record_releases(agent) -> list[tuple]:
    """For in-process tests without a stream: the agent's LeaseReleased messages are recorded instead of
    sent, as (lease_id, reason, overrun_ms, held_sm_count) in the returned list."""
    sent: list[tuple] = []
    agent.client.send_release = lambda *a: sent.append(a) or True
    return sent


class ScriptedBroker(lease_pb2_grpc.LeaseBrokerServicer):
    def __init__(self, heartbeat_ms: int = 200, epoch: int = 1, token: str = "", offset_ms: float = 0.0,
                 echo_heartbeats: bool = True):
        self.heartbeat_ms, self.epoch, self.token = heartbeat_ms, epoch, token
        self.offset_ms, self.echo_heartbeats = offset_ms, echo_heartbeats
        self.received: list[lease_pb2.AgentMessage] = []
        self.registers: list[lease_pb2.Register] = []
        self.sessions = 0
        self.seq = 0
        self.auto: dict | None = None       # renew a lease every period while set
        self.redirect_to: str | None = None  # set: refuse as a replica of another shard, naming this broker
        self.redirected = 0
        self._outs: list[queue.Queue] = []
        self._lock = threading.Lock()
        self.server: grpc.Server | None = None
        self.port = 0

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self, port: int = 0) -> int:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        lease_pb2_grpc.add_LeaseBrokerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()
        return self.port

    def stop(self) -> None:
        with self._lock:
            for q in self._outs:
                q.put(None)
        if self.server is not None:
            self.server.stop(grace=0).wait()

    # --- script ----------------------------------------------------------------------------------
    def wall_ms(self) -> int:
        """The broker's wall clock in whole ms, as the xApp stamps it."""
        return int(time.time() * 1e3 + self.offset_ms)

    def lease(self, sm_count=2, period_ms=50, valid_for_ms=150, duty=0.5, lease_id=None, reason="test",
              transit_ms=0):
        """Push a lease stamped `transit_ms` before now (a lease that spent that long on the way)."""
        with self._lock:
            self.seq += 1
            msg = lease_pb2.Lease(lease_id=lease_id or f"L{self.seq}", site_id="site-0", sm_count=sm_count,
                                  period_ms=period_ms, valid_for_ms=valid_for_ms, epoch=self.epoch,
                                  seq=self.seq, duty=duty, reason=reason, sent_unix_ms=self.wall_ms() - transit_ms)
        self.push(lease_pb2.BrokerMessage(lease=msg))
        return msg

    def revoke(self, lease_id: str = "", reason: str = "test-revoke"):
        self.push(lease_pb2.BrokerMessage(revoke=lease_pb2.Revoke(lease_id=lease_id, reason=reason)))

    def push(self, msg: lease_pb2.BrokerMessage) -> None:
        with self._lock:
            for q in self._outs:
                q.put(msg)

    def renew_every_period(self, **lease_kw) -> None:
        """Send a fresh lease (same id, next seq) every period, as the xApp does."""
        self.auto = dict(lease_kw)

    def stop_renewing(self) -> None:
        self.auto = None

    def usage(self) -> list[lease_pb2.UsageReport]:
        with self._lock:
            return [m.usage for m in self.received if m.WhichOneof("body") == "usage"]

    def released(self) -> list[lease_pb2.LeaseReleased]:
        with self._lock:
            return [m.released for m in self.received if m.WhichOneof("body") == "released"]

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        return wait_for(predicate, timeout)

    # --- the RPC ---------------------------------------------------------------------------------
    def Session(self, request_iterator, context):
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if first.WhichOneof("body") != "register" or not first.register.site_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message must be Register with a site_id")
        p = parse_proof(first.register.token)     # the agent proves its credential (`token` here), never sends it
        if self.token and (p is None or p.mac != proof_mac(self.token, first.register.site_id,
                                                            first.register.agent_id, p)):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
        if self.redirect_to is not None:     # as xapp.broker does for a site of another shard
            with self._lock:
                self.redirected += 1
            if self.redirect_to:
                context.set_trailing_metadata(((REDIRECT_METADATA, self.redirect_to),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "site is controlled by another xApp replica")
        out: queue.Queue = queue.Queue()
        with self._lock:
            self.registers.append(first.register)
            self.sessions += 1
            self._outs.append(out)

        def read():
            try:
                for m in request_iterator:
                    with self._lock:
                        self.received.append(m)
                    if self.echo_heartbeats and m.WhichOneof("body") == "heartbeat":
                        out.put(lease_pb2.BrokerMessage(heartbeat=lease_pb2.Heartbeat(
                            seq=m.heartbeat.seq, sent_unix_ms=self.wall_ms())))
            except grpc.RpcError:
                pass
            out.put(None)

        threading.Thread(target=read, daemon=True).start()
        yield lease_pb2.BrokerMessage(welcome=lease_pb2.Welcome(
            site_id=first.register.site_id, epoch=self.epoch, heartbeat_ms=self.heartbeat_ms,
            sent_unix_ms=self.wall_ms()))
        next_renew = time.monotonic()
        try:
            while context.is_active():
                if self.auto is not None and time.monotonic() >= next_renew:
                    kw = dict(self.auto)
                    self.lease(**kw)
                    next_renew = time.monotonic() + kw.get("period_ms", 50) / 1e3
                try:
                    msg = out.get(timeout=0.005)
                except queue.Empty:
                    continue
                if msg is None:
                    return
                yield msg
        finally:
            with self._lock:
                self._outs.remove(out)
