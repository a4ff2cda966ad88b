"""Identifier example: a torch job its author pinned to the CPU."""
import torch

DEVICE = torch.device("cpu")


def make_job(ctx, **args):
    model = torch.nn.Linear(8, 8).to("cpu")
    data = torch.randn(64, 8, device="cpu")
    return model, data.cpu()
