"""The cross-site tier's arithmetic runs on the host: whatever device the model trains on, the
global weights, the outer optimizer, the deltas and every tensor handed to a collective are CPU
tensors, and the model's parameters only cross as copies at the round's boundaries. One round
against a quorum-of-one Manager (no Lighthouse); the CUDA variant also counts kernels (none)."""
from __future__ import annotations

import pytest
import torch

from agent.config import TrainConfig
from agent.crosssite.rounds import LocalWork
from agent.crosssite.site import TINY
from agent.crosssite.tier import CrossSiteTier, TierConfig
from agent.model import GPTConfig
from agent.trainer import Trainer

pytestmark = [pytest.mark.agent]


class _Done:
    def wait(self):
        return None


class SoloManager:
    """torchft's Manager for a quorum of one: collectives are the identity; records what it is given."""

    def __init__(self):
        self.reduced: list[torch.Tensor] = []

    def start_quorum(self):
        pass

    def allreduce(self, t, reduce_op):
        self.reduced.append(t)
        return _Done()

    def num_participants(self):
        return 1

    def participating_rank(self):
        return 0

    def current_step(self):
        return 0

    def errored(self):
        return None

    def should_commit(self):
        return True

    def shutdown(self, wait=False):
        pass


def one_round(device: str, monkeypatch):
    monkeypatch.setattr(CrossSiteTier, "_start_manager", lambda self: setattr(self, "manager", SoloManager()))
    trainer = Trainer(TrainConfig(model=GPTConfig(**TINY), seed=3), device=device)
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000, compression="bf16"),
                         sleep=lambda s: None)

    def local_work(deadline):
        r = trainer.micro_batch(4)
        trainer.optimizer_step()
        return LocalWork(r.tokens, 1, r.loss)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    rec = tier.run_round(local_work)
    return tier, trainer, before, rec


def tier_tensors(tier: CrossSiteTier) -> list[torch.Tensor]:
    outer = [v for st in tier.outer._opt.state.values() for v in st.values() if torch.is_tensor(v)]
    return [tier.global_flat, tier.outer._param, *outer, tier.wan_feedback.residual, *tier.manager.reduced]


def test_the_tier_computes_on_cpu_tensors(monkeypatch):
    tier, trainer, before, rec = one_round("cpu", monkeypatch)
    assert rec.committed and rec.tokens > 0
    made = tier_tensors(tier)
    assert len(made) >= 6 and all(t.device.type == "cpu" for t in made)
    # the committed global weights are what the model restarts from
    flat = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    torch.testing.assert_close(flat, tier.global_flat)
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_with_a_model_on_the_gpu_the_tier_runs_no_kernel(monkeypatch):
    from agent.gpu_check import cuda_kernels
    monkeypatch.setattr(CrossSiteTier, "_start_manager", lambda self: setattr(self, "manager", SoloManager()))
    trainer = Trainer(TrainConfig(model=GPTConfig(**TINY), seed=3), device="cuda")
    trainer.micro_batch(4)
    trainer.optimizer_step()
    tier = CrossSiteTier(trainer.model, TierConfig("http://127.0.0.1:1", "s0", round_ms=1000), sleep=lambda s: None)
    kernels = cuda_kernels(torch, lambda: tier.run_round(lambda deadline: LocalWork(0, 0)))
    assert kernels == 0
    assert all(t.device.type == "cpu" for t in tier_tensors(tier))
    assert all(p.device.type == "cuda" for p in trainer.model.parameters())
