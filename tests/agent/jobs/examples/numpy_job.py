"""Identifier example: a pure-CPU job, numpy only (linear regression by gradient descent)."""
import numpy as np


class NumpyJob:
    def __init__(self, n: int = 256):
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(n, 4))
        self.y = self.x @ np.array([1.0, -2.0, 0.5, 3.0])
        self.w = np.zeros(4)

    def step(self, lr: float = 0.1) -> float:
        err = self.x @ self.w - self.y
        self.w -= lr * self.x.T @ err / len(self.y)
        return float(np.mean(err ** 2))


def make_job(ctx, **args):
    return NumpyJob(**args)
