"""The xApp keeps an agent's registered training job and mode evidence (display only, bounded)."""
from __future__ import annotations

from schemas.proto.weaver.v1 import lease_pb2
from xapp.agents import MAX_SHOWN, check_register


def register(**kw) -> lease_pb2.Register:
    return lease_pb2.Register(site_id="s1", agent_id="a1", mode="gpu_preferred",
                              device=lease_pb2.DeviceFacts(kind="cpu", name="cpu", sm_count=4, granularity=1), **kw)


def test_the_job_and_the_mode_evidence_are_kept():
    reg = check_register(register(job="agent.jobs.hf_causal_lm:make_job",
                                  mode_evidence="identified: gpu_preferred: imports torch"), {"s1"}, None)
    assert reg.job == "agent.jobs.hf_causal_lm:make_job"
    assert reg.mode_evidence == "identified: gpu_preferred: imports torch"


def test_an_agent_that_states_neither_still_registers_and_long_text_is_cut():
    assert check_register(register(), {"s1"}, None).job == ""
    reg = check_register(register(mode_evidence="x" * (3 * MAX_SHOWN)), {"s1"}, None)
    assert len(reg.mode_evidence) == MAX_SHOWN
