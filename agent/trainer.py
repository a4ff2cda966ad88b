"""Training, nanoGPT-clear: a `Trainer` that owns a training job's counters and its device, and one
loop (`train_under_lease`) that asks the budget enforcer before every micro-batch.

The job (`agent.job.TrainingJob`: model, optimizer, data, loss) is what a user writes; the Trainer is
what the lease loop, the bench and the cross-site tier call, the same over every job:
    t = Trainer(TrainConfig(), CharCorpus.shakespeare())   # the shipped char-GPT job
    t = Trainer(config, job=load_job(spec, ctx))            # any job (config: the loop's settings)
    r = t.micro_batch(16)        # forward + backward; gradients accumulate
    s = t.optimizer_step()       # mean gradient over everything accumulated, clip, optimizer step
    t.train_steps(k, 16)         # k optimizer steps of one 16-sample micro-batch each
    t.evaluate()                 # validation loss on the held-out slice
Gradients are accumulated as sums of per-sample losses and divided by the sample count at the
step, so an optimizer step over micro-batches 5+11 equals one over a single 16-batch.
"""
from __future__ import annotations

import logging
import math
import time

import torch

from agent.config import TrainConfig
from agent.data import Dataset
from agent.job import MicroBatchResult, StepResult, TrainingJob, check_job

__all__ = ["MicroBatchResult", "StepResult", "Trainer"]

log = logging.getLogger("weaver.agent.trainer")


class Trainer:
    def __init__(self, config: TrainConfig | None = None, dataset: Dataset | None = None,
                 device: str = "cpu", *, job: TrainingJob | None = None):
        if job is None:
            from agent.jobs.chargpt import CharGPTJob
            job = CharGPTJob(config or TrainConfig(), dataset)
        else:
            check_job(job)
        self.job = job
        # The char-GPT job's effective TrainConfig (vocabulary from its dataset); a user job's own config.
        self.config = getattr(job, "config", config)
        self.dataset = getattr(job, "dataset", None)
        self.model = job.model
        self.optimizer = job.optimizer
        self.tokens_per_sample = job.tokens_per_sample
        self.device = torch.device("cpu")     # every job is built on the CPU; `to` places it
        self.step = 0                # optimizer steps applied
        self.samples_seen = 0        # training samples drawn (the data position)
        self.tokens_seen = 0
        self.skipped_steps = 0
        self.last_loss = math.nan
        self.last_val_loss = math.nan
        self._pending_samples = 0
        self._pending_tokens = 0
        self._pending_loss_sum = 0.0
        self._eval_samples = (config or TrainConfig()).eval_samples   # the loop's setting, whatever the job
        if torch.device(device) != self.device:
            self.to(device)

    def to(self, device: str | torch.device) -> None:
        """Move everything training touches to `device`: parameters, pending gradients and optimizer
        state (Gaia's device switch: a demoted agent trains on the CPU with no device work at all)."""
        device = torch.device(device)
        if device == self.device:
            return
        # Each Parameter object is kept and its contents swapped for the moved ones: the optimizer, the
        # cross-site tier and the tied embedding/head weights all hold that same object (Module.to
        # replaces it instead wherever it cannot reuse the tensor in place, untying the weights).
        with torch.no_grad():
            for p in self.model.parameters():     # a tied parameter once
                grad, p.grad = p.grad, None
                torch.utils.swap_tensors(p, torch.nn.Parameter(p.detach().to(device), p.requires_grad))
                if grad is not None:              # pending micro-batches survive the move
                    p.grad = grad.to(device)
        self.model.to(device)                     # buffers, if any (the parameters are there already)
        # load_state_dict puts every state tensor on its parameter's device (AdamW's step counters
        # stay on the CPU, where torch keeps them unless capturable).
        self.optimizer.load_state_dict(self.optimizer.state_dict())
        self.device = device

    @property
    def pending_samples(self) -> int:
        return self._pending_samples

    @property
    def pending_tokens(self) -> int:
        """Tokens accumulated since the last optimizer step (a cut sample counts its prefix only)."""
        return self._pending_tokens

    def micro_batch(self, size: int, fraction: float = 1.0) -> MicroBatchResult:
        """Forward + backward on the next `size` training samples; gradients accumulate until `optimizer_step`.

        `fraction` < 1 trains on the first max(1, floor(fraction x block)) tokens of each sample (a
        causal LM's prefix is a valid sample): the enforcer uses it to fill the end of a lease window.
        Gradients are token-weighted, so every token weighs the same in the step's mean."""
        if size < 1:
            raise ValueError(f"micro-batch size must be >= 1, got {size}")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"micro-batch fraction must be in (0, 1], got {fraction}")
        block = self.tokens_per_sample
        tokens = max(1, math.floor(fraction * block + 1e-9))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        cuda = self.device.type == "cuda"
        batch = self.job.batch("train", self.samples_seen, size, tokens)
        if cuda:
            # Timed from the first device operation: building the batch on the host uses no SMs.
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        batch = tuple(t.to(self.device, non_blocking=True) for t in batch)
        self.model.train()
        loss = self.job.loss(*batch)
        # Sum of per-sample losses, a cut sample weighing its share of tokens; divided by the total at the step.
        (loss * (size * tokens / block)).backward()
        loss_value = loss.item()     # syncs the device, so the timing below covers the kernels
        if cuda:
            end.record()
            end.synchronize()
            wall = start.elapsed_time(end) / 1e3
        else:
            wall = time.perf_counter() - wall0
        self.samples_seen += size
        self.tokens_seen += size * tokens
        self._pending_samples += size
        self._pending_tokens += size * tokens
        self._pending_loss_sum += loss_value * size * tokens
        return MicroBatchResult(size, size * tokens, loss_value, wall, time.process_time() - cpu0)

    def optimizer_step(self) -> StepResult | None:
        """Apply the accumulated gradient (mean over pending samples). None when nothing is pending."""
        n, ntok = self._pending_samples, self._pending_tokens
        if n == 0:
            return None
        loss = self._pending_loss_sum / ntok
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.div_(ntok / self.tokens_per_sample)
        clip = self.job.grad_clip if self.job.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        # Check before stepping (torchtitan): a non-finite update would poison the weights for good.
        applied = math.isfinite(loss) and math.isfinite(grad_norm)
        if applied:
            self.optimizer.step()
            self.step += 1
            self.last_loss = loss
        else:
            self.skipped_steps += 1
            log.warning("skipping optimizer step: loss=%s grad_norm=%s", loss, grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self._pending_samples, self._pending_tokens, self._pending_loss_sum = 0, 0, 0.0
        return StepResult(self.step, n, loss, grad_norm, applied)

    def discard_pending(self) -> None:
        """Drop accumulated gradients (e.g. before a restore)."""
        self.optimizer.zero_grad(set_to_none=True)
        self._pending_samples, self._pending_tokens, self._pending_loss_sum = 0, 0, 0.0

    def train_steps(self, k: int, micro_batch: int, micro_batches_per_step: int = 1) -> list[StepResult]:
        """k optimizer steps, each over `micro_batches_per_step` micro-batches of `micro_batch` samples."""
        out = []
        for _ in range(k):
            for _ in range(micro_batches_per_step):
                self.micro_batch(micro_batch)
            out.append(self.optimizer_step())
        return out

    @torch.no_grad()
    def evaluate(self, samples: int | None = None, chunk: int = 64) -> float:
        """Mean loss over the first `samples` held-out samples (the same ones every time)."""
        samples = samples or self._eval_samples
        total = 0.0
        for start in range(0, samples, chunk):
            n = min(chunk, samples - start)
            total += self.eval_loss(start, n) * n
        self.last_val_loss = total / samples
        return self.last_val_loss

    @torch.no_grad()
    def eval_loss(self, start: int, n: int) -> float:
        """Mean loss of held-out samples `start .. start+n-1` (full length, forward only)."""
        self.model.eval()
        batch = self.job.batch("val", start, n, self.tokens_per_sample)
        return self.job.loss(*(t.to(self.device) for t in batch)).item()

    # --- checkpoint parts (named, like torchtitan's MODEL/OPTIMIZER/TRAIN_STATE) ------------------
    def state_dict(self) -> dict:
        """Named parts as of the last optimizer step. Micro-batches accumulated since are not in it:
        the data position is rewound past them, so a resumed run recomputes them identically."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "train_state": {"step": self.step, "samples_seen": self.samples_seen - self._pending_samples,
                            "tokens_seen": self.tokens_seen - self._pending_tokens, "skipped_steps": self.skipped_steps,
                            "last_loss": self.last_loss, "last_val_loss": self.last_val_loss},
            "config": self.job.config_dict(),
            "job": self.job.name,
        }

    def load_state_dict(self, state: dict) -> None:
        want = self.job.config_dict()["model"]
        if state.get("job", self.job.name) != self.job.name or state["config"]["model"] != want:
            raise ValueError(f"checkpoint of job {state.get('job', self.job.name)!r} model {state['config']['model']} "
                             f"does not match job {self.job.name!r} model {want}")
        self.discard_pending()
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        ts = state["train_state"]
        self.step, self.samples_seen, self.tokens_seen = ts["step"], ts["samples_seen"], ts["tokens_seen"]
        self.skipped_steps = ts["skipped_steps"]
        self.last_loss, self.last_val_loss = ts["last_loss"], ts["last_val_loss"]
