"""The Execution Mode Identifier on example job files: the mode it emits and the evidence for it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main
from agent.modeid import GPU_ONLY_PARAMS, ModeIdError, identify

EXAMPLES = Path(__file__).resolve().parent / "examples"


def target(name: str) -> str:
    return f"{EXAMPLES / name}.py:make_job"


def test_a_numpy_job_is_cpu():
    r = identify(target("numpy_job"))
    assert r.mode == "cpu"
    assert r.dl_imports == () and "no deep-learning library imported (imports: numpy)" in r.evidence[0]


def test_a_torch_job_pinned_to_the_cpu_is_cpu_preferred():
    r = identify(target("torch_cpu_job"))
    assert r.mode == "cpu_preferred" and r.dl_imports == ("torch",) and not r.gpu_calls
    assert "pinned to the CPU" in r.evidence[0]
    assert any(":8: torch.nn.Linear(8, 8).to('cpu')" in c for c in r.cpu_calls)
    assert any("device='cpu'" in c for c in r.cpu_calls)


def test_explicit_cuda_calls_are_gpu_with_each_call_as_evidence():
    r = identify(target("cuda_job"))
    assert r.mode == "gpu" and r.guarded_gpu_calls == 0 and not r.cpu_calls
    assert [c.split(": ", 1)[0] for c in r.gpu_calls] == ["cuda_job.py:6", "cuda_job.py:7", "cuda_job.py:8"]
    assert "explicit GPU calls with no CPU path" in r.evidence[0]


def test_a_mixed_job_is_gpu_preferred():
    r = identify(target("mixed_job"))
    assert r.mode == "gpu_preferred" and r.guarded_gpu_calls == 1 and r.cpu_calls
    assert r.evidence[0].startswith("mixed: GPU calls")


def test_an_unparsable_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken_job.py"
    bad.write_text("import torch\n\ndef make_job(ctx:\n    return None\n")
    with pytest.raises(ModeIdError, match=r"broken_job.py:3:\d+: cannot parse the job's source: SyntaxError"):
        identify(f"{bad}:make_job")


def test_a_missing_module_is_a_clear_error():
    with pytest.raises(ModeIdError, match="no Python source for module 'nosuchpkg.job'"):
        identify("nosuchpkg.job:make_job")


def test_the_shipped_jobs_prefer_the_leased_device_by_model_size_and_density():
    gpt = identify("agent.jobs.chargpt:make_job")
    assert gpt.mode == "gpu_preferred"      # the agent's default mode before the identifier: unchanged
    assert gpt.params_from.startswith("GPTConfig (model.py)") and 350_000 < gpt.params < 450_000
    assert any(f.endswith("agent/model.py") for f in gpt.files)
    assert not any(f.endswith(("agent/trainer.py", "agent/job.py")) for f in gpt.files)   # the platform's, not the job's
    hf = identify("agent.jobs.hf_causal_lm:make_job")
    assert hf.mode == "gpu_preferred" and {"torch", "transformers", "peft"} <= set(hf.dl_imports)
    # the factory's config says how big the model is; --job-arg values override its defaults
    big = identify("agent.jobs.hf_causal_lm:make_job", {"hidden_size": "8192", "num_layers": "24"})
    assert big.params >= GPU_ONLY_PARAMS and big.mode == "gpu" and "too large for a CPU" in big.evidence[0]


def test_inspect_job_prints_the_mode_and_json(capsys):
    assert main(["inspect-job", target("cuda_job")]) == 0
    out = capsys.readouterr().out
    assert "mode      gpu" in out and "evidence  explicit GPU calls" in out
    assert main(["inspect-job", target("numpy_job"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mode"] == "cpu" and d["evidence_summary"].startswith("cpu: no deep-learning library")
    assert main(["inspect-job", "nosuchpkg.job:make_job"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuchpkg.job" in err
