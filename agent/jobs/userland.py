"""Jobs written the way users write them, not the way the agent would like: each does something the
agent's own accounting never sees. They are the shipped char-GPT with one habit added, so a run with
them measures confinement, not a different model. The kernel bound (agent.confine) is what keeps each
inside its lease; tests/agent/test_confinement_jobs.py checks that it does, and that without it they
do not stay inside.

- `make_loader_job`: batches from a torch DataLoader with worker processes (num_workers=2, as the
  PyTorch tutorials write it), each sample "augmented" on the CPU in the loader process.
- `make_metrics_thread_job`: a background metrics thread started in the factory (6 ms of CPU every 20 ms).
- `make_threads_job`: sets torch.set_num_threads(4) in its loss, whatever the agent chose, and runs a
  matmul there that torch spreads over them.
"""
from __future__ import annotations

import threading
import time

import torch
from torch.utils.data import DataLoader, IterableDataset

from agent.job import JobContext
from agent.jobs.chargpt import CharGPTJob


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


class _Windows(IterableDataset):
    """Endless random training windows of the corpus, each 'augmented' (CPU work in the loader)."""

    def __init__(self, data: torch.Tensor, block: int, augment_s: float) -> None:
        self.data, self.block, self.augment_s = data, block, augment_s

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        g = torch.Generator().manual_seed(1000 + (info.id if info else 0))
        while True:
            i = int(torch.randint(0, len(self.data) - self.block - 1, (1,), generator=g))
            _burn(self.augment_s)
            w = self.data[i:i + self.block + 1]
            yield w[:-1], w[1:]


class LoaderJob(CharGPTJob):
    name = "userland-loader"

    def __init__(self, config, num_workers: int = 2, augment_ms: float = 5.0):
        super().__init__(config)
        data = self.dataset.splits["train"]
        self.loader = iter(DataLoader(_Windows(data, self.tokens_per_sample, augment_ms / 1e3), batch_size=1,
                                      num_workers=num_workers, prefetch_factor=8, persistent_workers=True))

    def batch(self, split: str, start: int, size: int, tokens: int):
        if split != "train":
            return super().batch(split, start, size, tokens)
        xs, ys = zip(*(next(self.loader) for _ in range(size)), strict=True)
        x, y = torch.cat(xs), torch.cat(ys)
        return (x, y) if tokens >= self.tokens_per_sample else (x[:, :tokens], y[:, :tokens])


class MetricsThreadJob(CharGPTJob):
    name = "userland-metrics-thread"

    def __init__(self, config, busy_ms: float = 6.0, every_ms: float = 20.0):
        super().__init__(config)
        self.samples = 0
        threading.Thread(target=self._report, args=(busy_ms / 1e3, every_ms / 1e3), name="job-metrics",
                         daemon=True).start()

    def _report(self, busy_s: float, every_s: float) -> None:
        while True:      # what a metrics exporter with a heavy serializer does
            _burn(busy_s)
            self.samples += 1
            time.sleep(max(0.0, every_s - busy_s))


class ThreadsJob(CharGPTJob):
    """Sets four intra-op threads in its loss, and computes a feature with a matmul large enough for torch
    to run it on all of them (the model alone is too small to use more than one)."""
    name = "userland-threads"

    def __init__(self, config):
        super().__init__(config)
        self.features = torch.randn(384, 384)

    def loss(self, x, y):
        torch.set_num_threads(4)
        feature = (self.features @ self.features).mean() * 0.0
        return super().loss(x, y) + feature


def make_loader_job(ctx: JobContext) -> LoaderJob:
    return LoaderJob(ctx.train)


def make_metrics_thread_job(ctx: JobContext) -> MetricsThreadJob:
    return MetricsThreadJob(ctx.train)


def make_threads_job(ctx: JobContext) -> ThreadsJob:
    return ThreadsJob(ctx.train)
