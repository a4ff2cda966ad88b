"""The shipped job: the char-level GPT (agent/model.py) on the Shakespeare slice (agent/data).

What it was before the job contract, unchanged: the model is built after seeding torch with the
config's seed, AdamW decays matrices only (nanoGPT's configure_optimizers), and a batch is the
corpus's deterministic windows, cut to the first `tokens` tokens of each sample.
"""
from __future__ import annotations

from dataclasses import asdict, replace

import torch

from agent.config import TrainConfig
from agent.data import CharCorpus, Dataset
from agent.job import JobContext
from agent.model import GPT


class CharGPTJob:
    name = "chargpt"

    def __init__(self, config: TrainConfig, dataset: Dataset | None = None):
        self.dataset = dataset if dataset is not None else CharCorpus.shakespeare(seed=config.seed)
        # The vocabulary is the dataset's; the config records the effective value.
        self.config = replace(config, model=replace(config.model, vocab_size=self.dataset.vocab_size))
        torch.manual_seed(self.config.seed)
        self.model = GPT(self.config.model)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        c = self.config
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=c.lr, betas=(c.beta1, c.beta2), foreach=False)
        self.tokens_per_sample = c.model.block_size
        self.grad_clip = c.grad_clip

    def batch(self, split: str, start: int, size: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        block = self.tokens_per_sample
        x, y = self.dataset.batch(split, start, size, block)
        return (x, y) if tokens >= block else (x[:, :tokens], y[:, :tokens])

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.model(x, y)[1]

    def config_dict(self) -> dict:
        return asdict(self.config)


def make_job(ctx: JobContext) -> CharGPTJob:
    return CharGPTJob(ctx.train)
