"""The transformers causal-LM example job: trains under leases from a real gRPC broker with falling loss,
resumes bit-exactly from a checkpoint file (full and LoRA), and loads weights from a local directory."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from agent.checkpoint import CheckpointStore
from agent.config import LeaseClientConfig, tiny_cpu
from agent.job import JobContext, JobSpec, load_job
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent
from agent.trainer import Trainer
from tests.agent.broker import ScriptedBroker, wait_for

HF = "agent.jobs.hf_causal_lm:make_job"
SMALL = {"hidden_size": "32", "num_layers": "1", "num_heads": "2", "intermediate_size": "64", "block_size": "16"}


def trainer(**args) -> Trainer:
    cfg = tiny_cpu()
    return Trainer(cfg.train, job=load_job(JobSpec(HF, {**SMALL, **args}), JobContext(cfg.train)))


@pytest.fixture()
def broker():
    b = ScriptedBroker(heartbeat_ms=100)
    b.start()
    yield b
    b.stop()


def test_trains_under_leases_from_a_real_broker_with_falling_loss(broker, tmp_path):
    torch.set_num_threads(1)
    cfg = tiny_cpu()
    cfg = replace(cfg, job=JobSpec(HF, dict(SMALL)), modes=replace(cfg.modes, mode="gpu"),
                  train=replace(cfg.train, eval_every=0, checkpoint_every=0),
                  checkpoint_dir=str(tmp_path / "ckpt"), inspect_addr="127.0.0.1:0",
                  lease=LeaseClientConfig(broker=f"127.0.0.1:{broker.port}", site_id="site-0", heartbeat_ms=100,
                                          backoff_initial_s=0.05, backoff_max_s=0.2))
    agent = SiteAgent(cfg, device=cpu_facts(1))
    untrained = trainer().evaluate(64)           # the same seed builds the same initial weights
    t = threading.Thread(target=agent.run, kwargs={"max_seconds": 60}, daemon=True)
    t.start()
    try:
        assert wait_for(lambda: agent.client.connected, 20)
        assert agent.trainer.step == 0           # no lease yet: nothing trained
        broker.renew_every_period(sm_count=1, period_ms=50, valid_for_ms=150, duty=0.8)
        assert wait_for(lambda: agent.trainer.step >= 60, 40), agent.trainer.step
        broker.stop_renewing()
    finally:
        agent.stop()
        t.join(30)
    assert not t.is_alive()
    usage = broker.usage()
    assert sum(u.tokens for u in usage) > 0 and all(u.sm_ms_used <= 1.3 * u.sm_ms_granted + 5 for u in usage)
    trained = agent.trainer.evaluate(64)
    print(f"\nhf_causal_lm under leases: {agent.trainer.step} steps, val loss {untrained:.3f} -> {trained:.3f}")
    assert trained < 0.85 * untrained
    assert CheckpointStore(tmp_path / "ckpt").latest() is not None   # the shutdown checkpoint


@pytest.mark.parametrize("args", [{}, {"lora_r": "4", "model_type": "llama"}], ids=["full", "lora"])
def test_resume_from_a_checkpoint_file_is_bit_exact(tmp_path, args):
    full = trainer(**args)
    full.micro_batch(5)
    full.micro_batch(3, fraction=0.5)           # a cut micro-batch, as the enforcer launches at a window's end
    full.optimizer_step()
    full.train_steps(2, 8)
    store = CheckpointStore(tmp_path)
    store.save(full.state_dict(), full.step)
    full.micro_batch(4)                          # pending at the save point's successor: not in the checkpoint
    tail = [r.loss for r in full.train_steps(3, 8)]

    again = trainer(**args)
    again.load_state_dict(store.load())
    again.micro_batch(4)
    assert [r.loss for r in again.train_steps(3, 8)] == tail
    assert all(torch.equal(a, b) for a, b in zip(full.model.state_dict().values(),
                                                  again.model.state_dict().values(), strict=True))
    if args:
        trainable = [n for n, p in again.model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)      # only the adapters train


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    a = trainer()
    a.train_steps(1, 2)
    with pytest.raises(ValueError, match="does not match"):
        trainer(hidden_size="16").load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="does not match job 'chargpt'"):
        Trainer(tiny_cpu().train).load_state_dict(a.state_dict())


def test_weights_load_from_a_local_directory(tmp_path):
    src = trainer()
    src.train_steps(1, 4)
    src.model.save_pretrained(tmp_path / "w")
    loaded = trainer(weights=str(tmp_path / "w"))
    assert all(torch.equal(a, b) for a, b in zip(src.model.state_dict().values(),
                                                  loaded.model.state_dict().values(), strict=True))
    with pytest.raises(Exception, match="does not exist"):
        trainer(weights=str(tmp_path / "missing"))
