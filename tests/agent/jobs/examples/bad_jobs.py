"""Factories that break the training-job contract, for the start-up checks."""
import torch


def raising(ctx, **args):
    raise RuntimeError("the data set at /nonexistent is missing")


class NoOptimizer:
    name = "no-optimizer"
    tokens_per_sample = 8
    grad_clip = 0.0

    def __init__(self):
        self.model = torch.nn.Linear(4, 4)

    def batch(self, split, start, size, tokens):
        return (torch.zeros(size, tokens, dtype=torch.long),)

    def loss(self, x):
        return self.model(x.float()).mean()

    def config_dict(self):
        return {"model": {}}


def no_optimizer(ctx, **args):
    return NoOptimizer()


def foreign_optimizer(ctx, **args):
    job = NoOptimizer()
    job.optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    return job


def wrong_batch(ctx, **args):
    job = NoOptimizer()
    job.optimizer = torch.optim.SGD(job.model.parameters(), lr=0.1)
    job.batch = lambda split, start, size, tokens: (torch.zeros(size, 3),)
    return job
