"""broker.job: the training job the xApp's sites train. An agent registering another job is refused before
it is leased anything (weaver up --job writes it); unset, any job registers."""
from __future__ import annotations

import asyncio

import grpc

from schemas.proto.weaver.v1 import lease_pb2
from tests.xapp.test_xapp_broker import _expect_error, make_cfg, run
from xapp.config import XappConfig

JOB = "agent.jobs.hf_causal_lm:make_job"


def cfg_with_job(job: str) -> XappConfig:
    base = make_cfg()
    return XappConfig.from_controls({
        "period_ms": 100, "policy": {"name": "weaver"},
        "sites": [{"site_id": "s1", "nodes": ["n1"], "gpu_sms": 128}],
        "broker": {"listen": "127.0.0.1:0", "heartbeat_ms": 100, "job": job}}) if job else base


def register(job: str) -> bytes:
    return lease_pb2.AgentMessage(register=lease_pb2.Register(
        site_id="s1", agent_id="agent-1", mode="gpu", job=job,
        device=lease_pb2.DeviceFacts(kind="cuda", name="H200", sm_count=128, granularity=8))).SerializeToString()


async def _welcomed(call_raw, msg: bytes) -> str:
    async def reqs():
        yield msg
        await asyncio.sleep(5)
    call = call_raw(reqs())
    w = await call.read()
    call.cancel()
    return w.welcome.site_id


def test_an_agent_with_another_job_is_refused():
    async def body(broker, call_raw, ledger):
        wrong = await _expect_error(call_raw, [register("agent.jobs.chargpt:make_job")])
        refused = dict(broker.refused_registrations)
        ok = await _welcomed(call_raw, register(JOB))
        return wrong, refused, ok

    (code, details), refused, ok = run(cfg_with_job(JOB), body)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "broker.job" in details and JOB in details
    assert refused == {"wrong-job": 1} and ok == "s1"


def test_without_broker_job_any_job_registers():
    async def body(broker, call_raw, ledger):
        return await _welcomed(call_raw, register("my.jobs:make"))
    assert run(cfg_with_job(""), body) == "s1"
