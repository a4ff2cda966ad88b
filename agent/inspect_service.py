"""`weaver.v1.AgentInspect` on localhost: what `weaver-agent status|watch|leases|checkpoint` talk to.

Thin adapter over `SiteAgent`'s public methods; requests are validated and refused with
INVALID_ARGUMENT, never with a crash.

Bounded (issue 13): the sync gRPC server runs every RPC on a pool thread and a `Watch` stream holds
its thread for as long as it is open, so open streams could take every thread and leave `Status`
(what `weaver up` and operators poll) queued behind them. Watchers are therefore counted and capped
below the pool size (an extra `Watch` is refused with RESOURCE_EXHAUSTED), only one `Checkpoint`
(which may wait up to 30 s for the training loop) runs at a time, and the server refuses RPCs beyond
a fixed total instead of queueing them without bound. The unary calls always find a free thread.
"""
from __future__ import annotations

import threading
from concurrent import futures
from typing import TYPE_CHECKING

import grpc

from agent.config import LOOPBACK
from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc

if TYPE_CHECKING:   # a SiteAgent in tests, the agent.supervisor.Supervisor in `weaver-agent run`
    from agent.site_agent import SiteAgent

MAX_HISTORY = 256
MAX_WATCHERS = 4        # open Watch streams at once; each holds one pool thread
UNARY_THREADS = 4       # threads no watcher can take: Status/Leases (fast) and one Checkpoint
MAX_CONCURRENT_RPCS = 64  # beyond this gRPC answers RESOURCE_EXHAUSTED instead of queueing


class _Slots:
    """A non-blocking counter of held slots: `take()` says whether one was free."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.held >= self.limit:
                self.refused += 1
                return False
            self.held += 1
            return True

    def give(self) -> None:
        with self._lock:
            self.held -= 1


class AgentInspectService(lease_pb2_grpc.AgentInspectServicer):
    def __init__(self, agent: SiteAgent, watch_min_interval_s: float = 0.05, max_watchers: int = MAX_WATCHERS):
        self.agent = agent
        self.watch_min_interval_s = watch_min_interval_s
        self.watchers = _Slots(max_watchers)
        self.checkpoints = _Slots(1)

    def Status(self, request, context):
        return self.agent.status()

    def Watch(self, request, context):
        """One AgentStatus per control period (every 100 ms while no lease is held)."""
        if not self.watchers.take():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"at most {self.watchers.limit} Watch streams at once and {self.watchers.held} are open; "
                          "close one, or poll Status")
        # woken at once when the client goes away, so a closed stream frees its thread without a
        # period's delay
        gone = threading.Event()
        context.add_callback(gone.set)
        try:
            while context.is_active() and not self.agent.stop_event.is_set():
                st = self.agent.status()
                yield st
                period = st.period_ms / 1e3 if st.period_ms else 0.1
                if gone.wait(max(self.watch_min_interval_s, period)):
                    return
        finally:
            self.watchers.give()

    def Leases(self, request, context):
        if request.limit > MAX_HISTORY:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit must be <= {MAX_HISTORY}, got {request.limit}")
        return lease_pb2.LeaseHistory(leases=self.agent.leases(request.limit))

    def Checkpoint(self, request, context):
        if not self.checkpoints.take():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "a checkpoint is already being taken; retry when it ends")
        # no use waiting for the training loop past the caller's deadline: the thread is freed with it
        left = context.time_remaining()
        try:
            info = self.agent.request_checkpoint(timeout=30.0 if left is None else max(0.0, min(30.0, left)))
        except TimeoutError as exc:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        finally:
            self.checkpoints.give()
        return lease_pb2.CheckpointReply(path=str(info.path), step=info.step)


def serve_inspect(agent: SiteAgent, addr: str = "127.0.0.1:0",
                  max_watchers: int = MAX_WATCHERS) -> tuple[grpc.Server, str]:
    """Start the server; returns it and the address it listens on (the real port when 0 was asked)."""
    host, _, port = addr.rpartition(":")
    if host not in LOOPBACK:
        raise ValueError(f"the inspection service listens on localhost only, got {addr!r}")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_watchers + UNARY_THREADS,
                                                    thread_name_prefix="inspect"),
                         maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
                         # so_reuseport off: a second agent on the same port must fail to bind, not share it.
                         options=[("grpc.so_reuseport", 0)])
    server.inspect_service = service = AgentInspectService(agent, max_watchers=max_watchers)  # for tests, counters
    lease_pb2_grpc.add_AgentInspectServicer_to_server(service, server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:   # grpc raises instead of returning 0 in some versions
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen on {addr} (in use?)")
    server.start()
    return server, f"{host}:{bound}"
