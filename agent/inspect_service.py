"""`weaver.v1.AgentInspect` on localhost: what `weaver-agent status|watch|leases|checkpoint` talk to.

Thin adapter over `SiteAgent`'s public methods; requests are validated and refused with
INVALID_ARGUMENT, never with a crash.
"""
from __future__ import annotations

import time
from concurrent import futures

import grpc

from agent.site_agent import SiteAgent
from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc

MAX_HISTORY = 256


class AgentInspectService(lease_pb2_grpc.AgentInspectServicer):
    def __init__(self, agent: SiteAgent, watch_min_interval_s: float = 0.05):
        self.agent = agent
        self.watch_min_interval_s = watch_min_interval_s

    def Status(self, request, context):
        return self.agent.status()

    def Watch(self, request, context):
        """One AgentStatus per control period (every 100 ms while no lease is held)."""
        while context.is_active() and not self.agent.stop_event.is_set():
            st = self.agent.status()
            yield st
            period = st.period_ms / 1e3 if st.period_ms else 0.1
            time.sleep(max(self.watch_min_interval_s, period))

    def Leases(self, request, context):
        if request.limit > MAX_HISTORY:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit must be <= {MAX_HISTORY}, got {request.limit}")
        return lease_pb2.LeaseHistory(leases=self.agent.leases(request.limit))

    def Checkpoint(self, request, context):
        try:
            info = self.agent.request_checkpoint()
        except TimeoutError as exc:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        return lease_pb2.CheckpointReply(path=str(info.path), step=info.step)


def serve_inspect(agent: SiteAgent, addr: str = "127.0.0.1:0") -> tuple[grpc.Server, str]:
    """Start the server; returns it and the address it listens on (the real port when 0 was asked)."""
    host, _, port = addr.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        raise ValueError(f"the inspection service listens on localhost only, got {addr!r}")
    # so_reuseport off: a second agent on the same port must fail to bind, not silently share it.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="inspect"),
                         options=[("grpc.so_reuseport", 0)])
    lease_pb2_grpc.add_AgentInspectServicer_to_server(AgentInspectService(agent), server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:   # grpc raises instead of returning 0 in some versions
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen on {addr} (in use?)")
    server.start()
    return server, f"{host}:{bound}"
