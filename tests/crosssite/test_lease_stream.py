"""The coordinator seam, live: a site learns the Lighthouse address and round timing from the lease
stream (CrossSiteConfig) and nothing else, trains rounds on torchft, and its TransferPlans and
RoundReports arrive at the broker over the agent's real gRPC lease client."""
from __future__ import annotations

import time

import pytest
import torch

from agent.config import LeaseClientConfig, TrainConfig
from agent.crosssite.lighthouse import Lighthouse, LighthouseConfig
from agent.crosssite.site import TINY, make_local_work
from agent.crosssite.tier import CrossSiteTier, TierConfig, lease_stream_callbacks
from agent.data import CharCorpus
from agent.lease_client import LeaseClient
from agent.model import GPTConfig
from agent.monitors import DeviceFacts
from agent.trainer import Trainer
from schemas.proto.weaver.v1 import lease_pb2
from tests.agent.broker import ScriptedBroker, wait_for

pytestmark = [pytest.mark.agent, pytest.mark.slow]


def test_site_joins_from_the_lease_stream_and_reports_rounds_upstream():
    torch.set_num_threads(1)
    broker = ScriptedBroker()
    port = broker.start()
    client = LeaseClient(LeaseClientConfig(broker=f"127.0.0.1:{port}", site_id="s0"),
                         DeviceFacts("cpu", "x86_64", 2, 1, False)).start()
    tier = None
    try:
        assert wait_for(lambda: client.connected, 20)
        with Lighthouse(LighthouseConfig(heartbeat_timeout_ms=200, join_timeout_ms=600)) as lh:
            broker.push(lease_pb2.BrokerMessage(cross_site=lease_pb2.CrossSiteConfig(
                lighthouse_addr=lh.addr, round_ms=400, round_epoch_ms=int(time.time() * 1000),
                heartbeat_timeout_ms=200)))
            assert wait_for(lambda: client.cross_site is not None, 20)
            config = TierConfig.from_proto(client.cross_site, "s0")
            trainer = Trainer(TrainConfig(model=GPTConfig(**TINY), eval_samples=32), CharCorpus.shakespeare())
            on_plan, on_round = lease_stream_callbacks(client)
            tier = CrossSiteTier(trainer.model, config, on_transfer_plan=on_plan, on_round=on_round)
            records = [tier.run_round(make_local_work(trainer, 8, duty=1.0)) for _ in range(3)]

        def sent(kind):
            with broker._lock:
                return [getattr(m, kind) for m in broker.received if m.WhichOneof("body") == kind]
        assert wait_for(lambda: len(sent("transfer")) >= 3 and len(sent("round")) >= 3, 20)
        plans, reports = sent("transfer"), sent("round")
        assert [p.round for p in plans] == [r.round for r in records]
        for p, r in zip(plans, records, strict=True):
            assert p.bytes == tier.wire_bytes == 4 * sum(x.numel() for x in trainer.model.parameters())
            assert p.workers == 1
            # the window closes at the round's boundary, 400 ms rounds
            assert p.deadline_unix_ms == config.round_epoch_ms + (r.round + 1) * 400
        for rep, r in zip(reports, records, strict=True):
            assert rep.committed and rep.participants == 1 and rep.tokens == r.tokens > 0
            assert rep.bytes_sent == tier.wire_bytes and rep.wall_ms > 0
        assert records[-1].committed_total == sum(r.tokens for r in records)
    finally:
        if tier is not None:
            tier.close()
        client.stop()
        broker.stop()
