"""Identifier example: mixed - CUDA when there is one, the CPU otherwise."""
import torch


def make_job(ctx, **args):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Linear(8, 8).to(device)
    if torch.cuda.is_available():
        model = model.cuda()
    return model.cpu()
