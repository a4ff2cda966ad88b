"""Issue 13 item 4 (AgentInspect): open Watch streams never starve the unary calls.

Before: the server had 4 pool threads and every Watch stream held one for as long as it was open, so
four idle watchers left `Status` queued until its deadline (what stalled `weaver up`'s probe). Here
against the real gRPC server and a real SiteAgent (tests/agent: it needs torch).
"""
from __future__ import annotations

import time
from dataclasses import replace

import grpc
import pytest

from agent.config import tiny_cpu
from agent.inspect_service import MAX_WATCHERS, serve_inspect
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent
from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc

FLOOD = 24  # watchers a hostile local client opens, each on its own channel


@pytest.fixture()
def inspect(tmp_path):
    agent = SiteAgent(replace(tiny_cpu(), checkpoint_dir=str(tmp_path)), device=cpu_facts(1))
    server, addr = serve_inspect(agent, "127.0.0.1:0")
    yield server, addr
    server.stop(0)


def test_a_watcher_flood_is_refused_and_status_still_answers_at_once(inspect):
    server, addr = inspect
    channels = [grpc.insecure_channel(addr) for _ in range(FLOOD)]
    try:
        # a deadline only so that a starved stream cannot hang this test
        streams = [lease_pb2_grpc.AgentInspectStub(ch).Watch(lease_pb2.WatchRequest(), timeout=8) for ch in channels]
        open_, refused = [], []
        for s in streams:  # one message from each accepted stream; after that they are never read again
            try:
                next(s)
                open_.append(s)
            except grpc.RpcError as exc:
                refused.append(exc)
        assert len(open_) == MAX_WATCHERS and len(refused) == FLOOD - MAX_WATCHERS
        assert {e.code() for e in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert f"at most {MAX_WATCHERS} Watch streams" in refused[0].details()
        assert server.inspect_service.watchers.refused == FLOOD - MAX_WATCHERS

        with grpc.insecure_channel(addr) as ch:
            stub = lease_pb2_grpc.AgentInspectStub(ch)
            for _ in range(20):  # every unary call finds a thread, quickly
                t0 = time.monotonic()
                st = stub.Status(lease_pb2.StatusRequest(), timeout=1.0)
                assert st.site_id == "site-0" and time.monotonic() - t0 < 0.5
            assert len(stub.Leases(lease_pb2.HistoryRequest(limit=5), timeout=1.0).leases) == 0

            # a closed stream gives its slot back: a new watcher is then accepted
            open_[0].cancel()
            deadline = time.monotonic() + 5
            while server.inspect_service.watchers.held >= MAX_WATCHERS and time.monotonic() < deadline:
                time.sleep(0.02)
            again = stub.Watch(lease_pb2.WatchRequest(), timeout=5)
            assert next(again).site_id == "site-0"
            again.cancel()
    finally:
        for ch in channels:
            ch.close()


def test_a_second_checkpoint_while_one_is_pending_is_refused(inspect):
    """Checkpoint waits for the training loop (not running here): a second one is refused, not queued."""
    server, addr = inspect
    import threading
    with grpc.insecure_channel(addr) as ch:
        stub = lease_pb2_grpc.AgentInspectStub(ch)
        first = threading.Thread(target=lambda: pytest.raises(grpc.RpcError, stub.Checkpoint,
                                                              lease_pb2.CheckpointRequest(), timeout=1.5))
        first.start()
        deadline = time.monotonic() + 2
        while server.inspect_service.checkpoints.held == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(grpc.RpcError) as err:
            stub.Checkpoint(lease_pb2.CheckpointRequest(), timeout=1.0)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "already" in err.value.details()
        assert stub.Status(lease_pb2.StatusRequest(), timeout=1.0).site_id == "site-0"
        first.join()
