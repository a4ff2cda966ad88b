"""A bad --job fails at start with one line naming the problem, and nothing is leased to it: the agent
never registers with the (real gRPC) broker. A good one registers its job and the mode's evidence."""
from __future__ import annotations

import threading

import pytest

from agent.cli import build_config, format_status, main, make_parser, starting_mode
from agent.config import TrainConfig
from agent.job import JobContext, JobError, JobSpec, SLOs, coerce, load_job, parse_job_args, resolve_factory
from agent.jobs.hf_causal_lm import HFCausalLMConfig
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent
from tests.agent.broker import ScriptedBroker, wait_for

BAD = "tests.agent.jobs.examples.bad_jobs"


@pytest.fixture()
def broker():
    b = ScriptedBroker(heartbeat_ms=100)
    b.start()
    yield b
    b.stop()


def run_args(port, tmp_path, *extra):
    return ["run", "--preset", "tiny", "--broker", f"127.0.0.1:{port}", "--site-id", "site-0",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--inspect-addr", "127.0.0.1:0", "--metrics-addr", "",
            "--max-seconds", "5", *extra]


@pytest.mark.parametrize("job,says", [
    ("nosuchpkg.jobs:make_job", "no Python source for module 'nosuchpkg.jobs'"),
    (f"{BAD}:nope", f"module {BAD} has no callable 'nope'"),
    (f"{BAD}:raising", "factory raised RuntimeError: the data set at /nonexistent is missing"),
    (f"{BAD}:no_optimizer", "violates the training-job contract: NoOptimizer has no attribute 'optimizer'"),
    (f"{BAD}:foreign_optimizer", "violates the training-job contract: optimizer steps parameters that are not"),
    (f"{BAD}:wrong_batch", "violates the training-job contract: batch('train', 0, 2, 8) returned shapes [(2, 3)]"),
    ("agent.jobs.hf_causal_lm:make_job --job-arg hidden_size=abc", "hf_causal_lm.hidden_size: expected int"),
    ("agent.jobs.hf_causal_lm:make_job --job-arg widht=64", "unknown argument(s) ['widht']"),
])
def test_a_bad_job_fails_at_start_with_one_line_and_never_registers(broker, tmp_path, capsys, job, says):
    target, *rest = job.split(" ")
    rc = main(run_args(broker.port, tmp_path, "--job", target, *rest))
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and says in err and target in err, err
    assert broker.sessions == 0 and broker.registers == []   # nothing is leased to an agent that is not ready


def test_the_job_and_the_mode_evidence_are_registered_and_in_status(broker, tmp_path):
    argv = run_args(broker.port, tmp_path, "--job", "agent.jobs.hf_causal_lm:make_job", "--job-arg", "num_layers=1",
                    "--job-arg", "min_tokens_per_s=50")
    args = make_parser().parse_args(argv)
    cfg, evidence = starting_mode(build_config(args), args)
    # one layer: ~68 k parameters by the job's config, so the identifier prefers the CPU
    assert cfg.modes.mode == "cpu_preferred"
    assert evidence.startswith("identified: cpu_preferred: imports peft, torch, transformers") and "< 100,000" in evidence
    agent = SiteAgent(cfg, device=cpu_facts(1), mode_evidence=evidence)
    assert agent.modes.slos == SLOs(min_tokens_per_s=50)          # the job's SLO reached the mode controller
    t = threading.Thread(target=agent.run, kwargs={"max_seconds": 30}, daemon=True)
    t.start()
    try:
        assert wait_for(lambda: broker.registers, 20)
        reg = broker.registers[0]
        assert reg.job == "agent.jobs.hf_causal_lm:make_job" and reg.mode == "cpu_preferred"
        assert reg.mode_evidence == evidence
        st = agent.status()
        assert st.job == reg.job and st.mode_evidence == evidence
        shown = format_status(st)                                  # what `weaver-agent status` prints
        assert "job         agent.jobs.hf_causal_lm:make_job" in shown
        assert "evidence    identified: cpu_preferred: imports peft" in shown
    finally:
        agent.stop()
        t.join(20)


def test_job_args_are_typed_by_the_jobs_config():
    c = coerce(HFCausalLMConfig, parse_job_args(["hidden_size=32", "lr=0.01", "text=a.txt,b.txt"]))
    assert (c.hidden_size, c.lr, c.text) == (32, 0.01, "a.txt,b.txt")
    assert coerce(HFCausalLMConfig, {"hidden_size": 32, "lr": 1}).lr == 1.0      # JSON values
    with pytest.raises(ValueError, match="expected name=value"):
        parse_job_args(["hidden_size"])
    with pytest.raises(ValueError, match="expected int, got True"):
        coerce(HFCausalLMConfig, {"hidden_size": True})


def test_the_default_job_is_the_char_gpt():
    job = load_job(JobSpec(), JobContext(TrainConfig()))
    assert job.name == "chargpt" and JobSpec().name == "agent.jobs.chargpt:make_job"
    with pytest.raises(ValueError, match="package.module:factory"):
        JobSpec("agent.jobs.chargpt")
    with pytest.raises(JobError, match="expected package.module:factory"):
        resolve_factory("x")
