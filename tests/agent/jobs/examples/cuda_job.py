"""Identifier example: a job with explicit CUDA calls and no CPU path."""
import torch


def make_job(ctx, **args):
    model = torch.nn.Linear(8, 8).cuda()
    data = torch.randn(64, 8).to("cuda")
    torch.cuda.synchronize()
    return model, data
