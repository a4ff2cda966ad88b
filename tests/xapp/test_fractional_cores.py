"""A CPU stand-in may stand for a fraction of a core (`weaver up` on a host with fewer cores than agents):
the broker checks the registered share and converts the agent's core·ms to site SM·ms by it."""
from __future__ import annotations

import math

import pytest

from schemas.proto.weaver.v1 import lease_pb2
from testbed.up import agent_cores_for
from xapp.agents import AgentBook, BadRequest, check_register


def register(cores: float, kind: str = "cpu", sm: int = 1) -> lease_pb2.Register:
    return lease_pb2.Register(site_id="s1", agent_id="a1", mode="gpu",
                              device=lease_pb2.DeviceFacts(kind=kind, name="x", sm_count=sm, granularity=1, cores=cores))


def test_a_fractional_stand_in_s_usage_is_scaled_by_its_share_of_a_core():
    book = AgentBook(epoch=1, period_ms=100, valid_periods=3, heartbeat_ms=200, timeout_heartbeats=3)
    session, _ = book.connect(check_register(register(0.25), {"s1"}, None), now=0.0)
    lease = book.issue("s1", 66, 132, "weaver", now_unix=1000.0).lease
    # 10 ms of CPU in a 100 ms window of a quarter-core stand-in: 40 % of its GPU = 52.8 of 132 SMs
    book.record_usage("s1", session, lease_pb2.UsageReport(lease_id=lease.lease_id, sm_ms_used=10.0,
                                                           sm_ms_granted=16.5, window_ms=100.0),
                      now=0.1, now_unix=1000.1, gpu_sms=132)
    u = book.agents["s1"].usage[-1]
    assert u.used_sms == pytest.approx(52.8)
    assert book.used_sm_ms["s1"] == pytest.approx(5280.0)


@pytest.mark.parametrize("cores, kind, sm", [(math.nan, "cpu", 1), (2.0, "cpu", 1), (0.001, "cpu", 1),
                                             (0.5, "cuda", 132), (-1.0, "cpu", 1)])
def test_a_bad_share_is_refused(cores, kind, sm):
    with pytest.raises(BadRequest, match="device.cores"):
        check_register(register(cores, kind, sm), {"s1"}, None)


def test_whole_cores_register_as_before():
    assert check_register(register(0.0, sm=4), {"s1"}, None).cores == 0.0


@pytest.mark.parametrize("host, sites, want", [(2, 3, 0.5), (2, 1, 1.0), (4, 3, 1.0), (16, 3, 1.0), (1, 3, 0.15),
                                               (3, 3, 0.8), (1, 8, 0.1)])
def test_up_gives_each_agent_what_the_host_can_serve(host, sites, want):
    assert agent_cores_for(sites, host) == pytest.approx(want)
