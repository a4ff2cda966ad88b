"""A job joins the cross-site tier by its trainable parameters: a LoRA job's frozen base never changes,
so the tier averages (and sends) the adapters only. One round against a quorum-of-one Manager."""
from __future__ import annotations

import torch

from agent.config import tiny_cpu
from agent.crosssite.rounds import LocalWork
from agent.crosssite.tier import CrossSiteTier, TierConfig
from agent.job import JobContext, JobSpec, load_job
from agent.trainer import Trainer
from tests.crosssite.test_tier_host import SoloManager


def test_a_lora_job_joins_the_tier_with_its_adapters_only(monkeypatch):
    monkeypatch.setattr(CrossSiteTier, "_start_manager", lambda self: setattr(self, "manager", SoloManager()))
    cfg = tiny_cpu()
    args = {"model_type": "llama", "lora_r": "4", "hidden_size": "32", "num_layers": "1", "num_heads": "2",
            "intermediate_size": "64", "block_size": "16"}
    trainer = Trainer(cfg.train, job=load_job(JobSpec("agent.jobs.hf_causal_lm:make_job", args), JobContext(cfg.train)))
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000), sleep=lambda s: None)
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert frozen and tier.global_flat.numel() == sum(p.numel() for p in trainable)
    assert tier.global_flat.numel() < sum(p.numel() for p in trainer.model.parameters()) / 5

    def local_work(deadline):
        r = trainer.micro_batch(4)
        trainer.optimizer_step()
        return LocalWork(r.tokens, 1, r.loss)
    rec = tier.run_round(local_work)
    assert rec.committed and rec.tokens > 0
    torch.testing.assert_close(torch.cat([p.detach().reshape(-1) for p in trainable]), tier.global_flat)
    assert all(torch.equal(p, frozen[n]) for n, p in trainer.model.named_parameters() if not p.requires_grad)
