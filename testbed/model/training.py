"""How much of a lease a training agent really uses: the agent's measured micro-batch step model.

Source (compute-and-training-facts.md, tag M): char-GPT on 2 CPU threads takes 4.2 ms at B = 1 and
24.9 ms at B = 16 (section 5.3 / 9.2), so t(B) = alpha + beta * B with alpha = 2.82 ms, beta = 1.38 ms.
The agent (section 5.2-5.3 rule) fits B to the time left, B = floor((s * remaining - alpha) / beta) with
s = 0.9, at most `max_batch`, stops when B < 1, and reserves the optimizer step at the window's end.
Used SM*s = partition SMs x busy time (micro-batches + optimizer step), as the agent meters itself;
the host gap between micro-batches is not metered (it brings budget use to ~96 %, as measured there).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class StepCostModel:
    alpha_s: float = 0.00282
    beta_s: float = 0.00138
    optimizer_s: float = 0.002
    safety: float = 0.9
    max_batch: int = 32
    gap_s: float = 0.0008  # host time between micro-batches (re-read lease, pick green context): not metered

    @property
    def quantum_s(self) -> float:
        """Smallest useful unit: one micro-batch of 16 plus the optimizer step (~27 ms)."""
        return self.alpha_s + 16 * self.beta_s + self.optimizer_s

    def busy_s(self, window_s: float) -> float:
        return _busy(self, round(window_s, 6))


@lru_cache(maxsize=4096)
def _busy(model: StepCostModel, window_s: float) -> float:
    remaining = window_s - model.optimizer_s
    busy = 0.0
    while True:
        b = min(model.max_batch, math.floor((model.safety * remaining - model.alpha_s) / model.beta_s))
        if b < 1:
            break
        t = model.alpha_s + model.beta_s * b
        busy += t
        remaining -= t + model.gap_s
    return busy + model.optimizer_s if busy > 0 else 0.0
