"""One UE's local round, nanoGPT-plain: start from the global adapter, a few AdamW steps on the UE's
own text shard, return the delta. The base model is shared by every UE of the process (it is frozen);
only the adapter tensors are swapped in and out, so a whole population trains on one model object."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from agent.federated import lm
from agent.federated.updates import Adapter


@dataclass(frozen=True, kw_only=True)
class LocalConfig:
    steps: int = 3
    batch: int = 8
    lr: float = 5e-3

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1:
            raise ValueError(f"LocalConfig.steps and .batch must be >= 1, got {self.steps}, {self.batch}")
        if not self.lr > 0:
            raise ValueError(f"LocalConfig.lr must be > 0, got {self.lr}")


@dataclass(frozen=True)
class Shard:
    """A UE's local text as token ids; `samples` (its FedAvg weight) is the number of context windows."""

    ids: torch.Tensor
    block_size: int

    @property
    def samples(self) -> int:
        return max(1, len(self.ids) - self.block_size)

    def batch(self, gen: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        span = len(self.ids) - self.block_size - 1
        if span < 1:
            raise ValueError(f"shard of {len(self.ids)} tokens is shorter than a context window")
        off = torch.randint(0, span, (size,), generator=gen)
        idx = off[:, None] + torch.arange(self.block_size + 1)[None, :]
        w = self.ids[idx]
        return w[:, :-1], w[:, 1:]


def local_round(model: torch.nn.Module, global_adapter: Adapter, shard: Shard, cfg: LocalConfig,
                seed: int) -> tuple[Adapter, float]:
    """Fine-tune the adapter from `global_adapter` on `shard`; returns (delta, last training loss).
    A fresh optimizer each round: a UE keeps no state between rounds (it may not take part in the next)."""
    lm.load_adapter(model, global_adapter)
    params = lm.adapter_parameters(model)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    last = float("nan")
    for _ in range(cfg.steps):
        x, y = shard.batch(gen, cfg.batch)
        out = lm.loss(model, x, y)
        if not torch.isfinite(out):  # never ship a poisoned update
            raise FloatingPointError(f"local loss is {float(out)}")
        opt.zero_grad(set_to_none=True)
        out.backward()
        opt.step()
        last = float(out.detach())
    local = lm.adapter_of(model)
    return {k: local[k] - global_adapter[k] for k in global_adapter}, last
