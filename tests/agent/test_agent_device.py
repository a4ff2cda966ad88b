"""Where training runs: a demoted agent (cpu_preferred) moves its model, optimizer state and pending
gradients to the CPU and its fallback loop never touches the leased-device path; promotion moves them
back. On this CPU host the moves are checked with the meta device and a trainer that records them;
where CUDA is present the profiler counts the device work itself (none)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from agent import gpu_check
from agent.config import ModeConfig, tiny_cpu
from agent.modes import ModeController
from agent.monitors import DeviceFacts
from agent.site_agent import SiteAgent
from agent.trainer import Trainer


def tensors_of(t: Trainer) -> dict[str, list[torch.Tensor]]:
    params = list(t.model.parameters())
    state = [v for st in t.optimizer.state.values() for k, v in st.items() if torch.is_tensor(v) and k != "step"]
    return {"params": params, "grads": [p.grad for p in params if p.grad is not None], "state": state}


def test_trainer_to_moves_parameters_pending_gradients_and_optimizer_state():
    t = Trainer(tiny_cpu().train)
    t.micro_batch(2)
    t.optimizer_step()                 # optimizer state exists
    t.micro_batch(2)                   # and gradients are pending
    n_state = len(tensors_of(t)["state"])
    ids = [id(p) for p in t.model.parameters()]
    t.to("meta")                       # a second device every torch build has (no data: where only)
    moved = tensors_of(t)
    assert t.device == torch.device("meta")
    assert len(moved["grads"]) == len(moved["params"]) and len(moved["state"]) == n_state > 0
    assert all(x.device.type == "meta" for xs in moved.values() for x in xs)
    assert t.pending_samples == 2      # the accumulated micro-batch was kept, not dropped
    # the same Parameter objects (the optimizer's and the cross-site tier's), the tied weights still one
    assert [id(p) for p in t.model.parameters()] == ids
    assert t.model.wte.weight is t.model.lm_head.weight


class RecordingTrainer(Trainer):
    """Moves for real to the CPU; a move to "cuda" is only recorded (no GPU here), and every
    micro-batch records where the model's parameters were when it ran."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.moves: list[str] = []
        self.ran_on: list[set[str]] = []

    def to(self, device):
        self.moves.append(str(device))
        if torch.device(device).type == "cpu":
            super().to(device)
        else:
            self.device = torch.device(device)

    def micro_batch(self, size, fraction=1.0):
        self.ran_on.append({p.device.type for p in self.model.parameters()})
        return super().micro_batch(size, fraction)


def test_a_demoted_agent_trains_on_cpu_tensors_only_and_a_promoted_one_moves_back(tmp_path):
    cfg = replace(tiny_cpu(), checkpoint_dir=str(tmp_path), train=replace(tiny_cpu().train, eval_every=0))
    trainer = RecordingTrainer(cfg.train)
    agent = SiteAgent(cfg, device=DeviceFacts("cuda", "fake GPU", 132, 8, True), trainer=trainer)
    trainer.to("cuda")                 # as built for gpu_preferred on a GPU host
    trainer.moves.clear()
    agent.modes = ModeController(ModeConfig(mode="gpu_preferred", demote_after_s=0.0, min_leases=0,
                                            cooldown_s=0.0), now=agent.clock())
    agent._evaluate_mode()             # no usable lease for 0 s: cost demotion
    assert agent.modes.mode == "cpu_preferred" and trainer.moves == ["cpu"]
    assert all(x.device.type == "cpu" for xs in tensors_of(trainer).values() for x in xs)

    def leased_path(*a, **kw):
        raise AssertionError("the fallback loop entered the leased-device path")
    agent.partitions.scope = agent.partitions.acquire = leased_path
    agent.enforcer.decide = leased_path
    for _ in range(6):
        agent._fallback_iteration()
    assert trainer.ran_on and all(d == {"cpu"} for d in trainer.ran_on) and trainer.step >= 1
    assert all(x.device.type == "cpu" for xs in tensors_of(trainer).values() for x in xs)
    agent.modes.observe_lease(agent.clock(), 0.5)
    agent._evaluate_mode()             # goodput unknown counts as promising: promotion
    assert agent.modes.mode == "gpu_preferred" and trainer.moves == ["cpu", "cuda"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_demoted_and_partitionless_agents_run_no_kernel_on_the_gpu():
    res = gpu_check.idle_device(torch)
    assert res["demoted_state_on"] == ["cpu"], res
    assert res["demoted_cuda_events"] == 0 and res["partitionless_cuda_events"] == 0, res
    assert res["partitionless_refused"] == {"refused": 1} and res["ok"], res
