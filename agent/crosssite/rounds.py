"""The round policy of the cross-site tier: how the sites' local work becomes one global update.

Pure tensor arithmetic, no I/O and no collectives, so that the torchft tier (`tier.py`), the
single-process bench (`bench.py`) and the tests all run the same maths.

One round, seen from site i (compute-and-training-facts.md §6.2):
  Δ_i = global − local_i                       pseudo-gradient after τ_i local steps over t_i tokens
  g   = Σ t_i·Δ_i / Σ t_i                      token-weighted outer gradient (FedAvg weighting)
  or, when step counts differ widely (FedNova): g = τ_eff · Σ t_i·(Δ_i/τ_i) / Σ t_i,
        τ_eff = Σ t_i·τ_i / Σ t_i
  global ← Nesterov-SGD(global, g)             DiLoCo's outer optimiser

Everything a site contributes is a SUM, so a cross-site all-reduce of (payload, stats) is the whole
protocol: a site with t_i = 0 contributes zeros and stays in the quorum without stalling it.

All of it runs on the host. `flatten` copies the parameters off their device into one float32 CPU
vector (device-to-host copies, no kernel), and `unflatten_into` writes a CPU vector back with one
host-to-device copy per parameter tensor, converted to its dtype on the host first: the tier does
both at round boundaries, outside any lease, so a site with no lease runs no kernel on the GPU for
the tier's arithmetic (deltas, outer step, compression, checksums), which is not leased work.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

# Layout of the small SUM-reduced statistics vector every site sends first.
STAT_TOKENS, STAT_TOKEN_STEPS, STAT_STEPS, STAT_STEPS2, STAT_CONTRIBUTORS, STAT_SITES = range(6)
N_STATS = 6
MAX_EXACT = float(2**53)  # largest count a float64 all-reduce still sums exactly


@dataclass(frozen=True)
class RoundPolicy:
    """Knobs of the outer step: Nesterov SGD as in DiLoCo, which uses lr 0.7 / momentum 0.9 for
    H≈500. Our rounds are short (tens of local steps), where lr 0.8 / momentum 0.5 reached a lower
    loss at equal tokens in `weaver bench training` (0.7/0.9 overshoots in the first rounds)."""

    outer_lr: float = 0.8
    outer_momentum: float = 0.5
    # Switch to FedNova normalisation when the coefficient of variation of the contributors' step
    # counts exceeds this (0 = always, inf = never). FedNova scales a site's per-step update by the
    # effective step count, which amplifies the noisy few-step deltas of slow sites: keep it for
    # wide spreads only.
    fednova_cv: float = 1.0

    def __post_init__(self) -> None:
        if not (self.outer_lr > 0 and math.isfinite(self.outer_lr)):
            raise ValueError(f"RoundPolicy.outer_lr must be a positive finite number, got {self.outer_lr}")
        if not 0.0 <= self.outer_momentum < 1.0:
            raise ValueError(f"RoundPolicy.outer_momentum must be in [0, 1), got {self.outer_momentum}")
        if not self.fednova_cv >= 0:
            raise ValueError(f"RoundPolicy.fednova_cv must be >= 0, got {self.fednova_cv}")


@dataclass(frozen=True)
class LocalWork:
    """What one site did inside one round."""

    tokens: int
    steps: int
    loss: float = float("nan")   # mean training loss of those steps

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.steps < 0:
            raise ValueError(f"LocalWork needs tokens >= 0 and steps >= 0, got {self.tokens}, {self.steps}")
        if (self.tokens == 0) != (self.steps == 0):
            raise ValueError(f"LocalWork: tokens ({self.tokens}) and steps ({self.steps}) must be both zero or both > 0")


@dataclass(frozen=True)
class RoundStats:
    """The SUM-reduced statistics of a round, identical on every site after the all-reduce."""

    tokens: int
    token_steps: float       # Σ t_i·τ_i
    steps: float             # Σ τ_i
    steps2: float            # Σ τ_i²
    contributors: int        # sites with t_i > 0
    sites: int               # sites in the quorum

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> RoundStats:
        """From the reduced statistics; ValueError when they cannot be sums of honest LocalWork."""
        if t.shape != (N_STATS,):
            raise ValueError(f"round statistics must have shape ({N_STATS},), got {tuple(t.shape)}")
        v = t.tolist()
        if not all(math.isfinite(x) and 0 <= x <= MAX_EXACT for x in v):
            # beyond 2**53 float64 sums are no longer exact counts (and no round trains that many tokens)
            raise ValueError(f"round statistics must be finite, non-negative and <= 2**53, got {v}")
        return cls(tokens=int(round(v[STAT_TOKENS])), token_steps=v[STAT_TOKEN_STEPS], steps=v[STAT_STEPS],
                   steps2=v[STAT_STEPS2], contributors=int(round(v[STAT_CONTRIBUTORS])),
                   sites=int(round(v[STAT_SITES])))

    @property
    def steps_cv(self) -> float:
        """Coefficient of variation of the contributors' step counts (idle sites excluded)."""
        if self.contributors < 2 or self.steps <= 0:
            return 0.0
        mean = self.steps / self.contributors
        var = max(self.steps2 / self.contributors - mean * mean, 0.0)
        return math.sqrt(var) / mean

    @property
    def tau_eff(self) -> float:
        return self.token_steps / self.tokens if self.tokens > 0 else 0.0



def stats_tensor(work: LocalWork) -> torch.Tensor:
    """This site's contribution to the statistics all-reduce (float64: token counts stay exact)."""
    t = torch.zeros(N_STATS, dtype=torch.float64)
    t[STAT_TOKENS] = work.tokens
    t[STAT_TOKEN_STEPS] = work.tokens * work.steps
    t[STAT_STEPS] = work.steps
    t[STAT_STEPS2] = work.steps * work.steps
    t[STAT_CONTRIBUTORS] = 1.0 if work.tokens > 0 else 0.0
    t[STAT_SITES] = 1.0
    return t


def use_fednova(stats: RoundStats, policy: RoundPolicy) -> bool:
    """Same answer on every site, because it reads only the reduced statistics."""
    return stats.contributors > 1 and stats.steps_cv > policy.fednova_cv


def flatten(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """One float32 CPU vector of `tensors` (copied to the host first, converted there)."""
    return torch.cat([t.detach().reshape(-1).cpu().to(torch.float32) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy a flat (CPU) vector back into `tensors`, in place and keeping their dtypes and devices:
    each slice is converted on the host, then copied across as it is (no conversion kernel)."""
    total = sum(t.numel() for t in tensors)
    if total != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} elements, the tensors {total}")
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t).to(t.dtype))
            offset += n


def merged(global_flat: torch.Tensor, local_flat: torch.Tensor, snapshot_flat: torch.Tensor) -> torch.Tensor:
    """Where a site continues once its round has landed (overlapped rounds): the new global weights
    plus what it trained since the snapshot its delta was taken from. Every local step then enters
    exactly one round's delta; with nothing trained since the snapshot it is the global weights."""
    return global_flat + (local_flat - snapshot_flat)


def weighted_delta(global_flat: torch.Tensor, local_flat: torch.Tensor, work: LocalWork,
                   fednova: bool) -> torch.Tensor:
    """The vector this site sends: t_i·Δ_i, or t_i·Δ_i/τ_i under FedNova. Zero when it did nothing."""
    if work.tokens == 0:
        return torch.zeros_like(global_flat)
    scale = work.tokens / work.steps if fednova else float(work.tokens)
    return (global_flat - local_flat).mul_(scale)


def contribution_ok(global_flat: torch.Tensor, local_flat: torch.Tensor, max_delta_norm: float) -> bool:
    """Whether this site's weights may enter the round: finite, and no further from the global weights than any
    real round's training moves them. A site whose weights are not (a NaN step, a diverged run) contributes
    nothing this round instead of taking every site's global model with it."""
    if not torch.isfinite(local_flat).all():
        return False
    return float((local_flat - global_flat).double().norm()) <= max_delta_norm


def slotted(row: torch.Tensor, rank: int | None, n: int) -> torch.Tensor:
    """`row` in slot `rank` of an n-row tensor, zeros elsewhere: its SUM all-reduce is an all-gather, so every
    site gets every site's own row and can check each one before anything is summed (None: this replica is
    not a participant and sends nothing)."""
    out = torch.zeros((n, *row.shape), dtype=row.dtype)
    if rank is not None and 0 <= rank < n:
        out[rank] = row
    return out


MAX_SITE_WORKERS = 1024     # workers one site's row may sum (agent.crosssite.aggregate.SiteReducer)


def stats_row_ok(row: torch.Tensor) -> bool | None:
    """Whether one gathered statistics row can be one site's: the sum of its workers' honest LocalWork
    (stats_tensor each); None for an empty slot (a replica that sent nothing). A row another peer wrote into,
    or one that claims what no set of workers can (tokens with no contributor, fewer steps than contributors,
    step moments no step counts give), is not one site's and is dropped."""
    if not bool(row.any()):
        return None
    try:
        st = RoundStats.from_tensor(row)
    except ValueError:
        return False
    if not 1 <= st.sites <= MAX_SITE_WORKERS or not 0 <= st.contributors <= st.sites:
        return False
    if (st.tokens > 0) != (st.contributors > 0):
        return False
    if st.contributors == 0:
        return st.steps == st.steps2 == st.token_steps == 0
    # each contributor made >= 1 step: Σ τ >= n, Σ τ² between (Σ τ)² / n and (Σ τ)², Σ tτ between Σ t and Σ t · Σ τ
    n, steps, tol = st.contributors, st.steps, 1e-9
    return (steps >= n and steps * steps / n * (1 - tol) <= st.steps2 <= steps * steps * (1 + tol)
            and st.tokens * (1 - tol) <= st.token_steps <= st.tokens * steps * (1 + tol))


def payload_row_ok(row: torch.Tensor, stats_row: torch.Tensor, max_delta_norm: float) -> bool:
    """Whether one gathered payload row can be its site's summed weighted deltas (weighted_delta per worker):
    finite, zero for a site that did nothing, and no larger than its tokens times max_delta_norm (each worker's
    t·Δ, or t·Δ/τ under FedNova, is at most t times the bound)."""
    row = row.to(torch.float32)
    if not torch.isfinite(row).all():
        return False
    tokens = float(stats_row[STAT_TOKENS])
    if tokens <= 0:
        return not bool(row.any())
    return float(row.double().norm()) <= tokens * max_delta_norm * 1.01    # bf16 rounding of the wire


def gradient_ok(g: torch.Tensor, max_delta_norm: float, fednova: bool) -> bool:
    """Whether a round's reduced outer gradient can be what admitted contributions sum to: each contributor's
    delta is within `max_delta_norm`, so their token-weighted mean is too (FedNova's τ rescaling can move it by
    the spread of local step counts: a factor 4 is allowed). Every site sees the same reduced sum, so every site
    decides the same: a round whose sum is not finite or is beyond that bound (a peer sent more than it could
    have trained) commits nowhere."""
    if not torch.isfinite(g).all():
        return False
    return float(g.double().norm()) <= max_delta_norm * (4.0 if fednova else 1.0) * (1 + 1e-6)


def outer_gradient(summed: torch.Tensor, stats: RoundStats, fednova: bool) -> torch.Tensor | None:
    """Σ-reduced payload → outer gradient; None when no site did any work this round."""
    if stats.tokens <= 0:
        return None
    g = summed / stats.tokens
    if fednova:
        g.mul_(stats.tau_eff)
    return g


def combine(global_flat: torch.Tensor, locals_: Sequence[tuple[torch.Tensor, LocalWork]],
            policy: RoundPolicy) -> tuple[torch.Tensor | None, RoundStats, bool]:
    """Single-process reference of one round's reduction (what the all-reduces compute together)."""
    stats = RoundStats.from_tensor(sum((stats_tensor(w) for _, w in locals_), torch.zeros(N_STATS, dtype=torch.float64)))
    fednova = use_fednova(stats, policy)
    summed = torch.zeros_like(global_flat)
    for local_flat, work in locals_:
        summed += weighted_delta(global_flat, local_flat, work, fednova)
    return outer_gradient(summed, stats, fednova), stats, fednova


class OuterOptimizer:
    """Nesterov SGD on the global parameters (a flat float32 vector), with a state dict for healing."""

    def __init__(self, global_flat: torch.Tensor, policy: RoundPolicy):
        self.params = global_flat
        self.policy = policy
        self._param = torch.nn.Parameter(global_flat, requires_grad=False)
        self._opt = torch.optim.SGD([self._param], lr=policy.outer_lr, momentum=policy.outer_momentum,
                                    nesterov=policy.outer_momentum > 0)

    def step(self, grad: torch.Tensor) -> None:
        if grad.shape != self.params.shape or not torch.isfinite(grad).all():
            raise ValueError("outer gradient has the wrong shape or is not finite")
        self._param.grad = grad
        self._opt.step()
        self._param.grad = None

    def state_dict(self) -> dict:
        return self._opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        # torch keeps same-dtype tensors by reference: copy, so two optimisers never share a buffer.
        self._opt.load_state_dict(copy.deepcopy(state))

    def heal_state(self, copy: bool = False) -> dict:
        """What a joiner takes from a peer: the momentum only (tensors and a flag, no structure to trust);
        the learning rate and momentum factor are this site's own configuration. `copy`: a snapshot, not the
        live buffer the next step updates in place."""
        buf = self._opt.state.get(self._param, {}).get("momentum_buffer")
        if buf is None:
            return {"momentum": torch.zeros_like(self.params), "has_momentum": False}
        return {"momentum": buf.clone() if copy else buf, "has_momentum": True}

    def load_heal_state(self, state: dict) -> None:
        if state["has_momentum"]:
            self._opt.state[self._param]["momentum_buffer"] = state["momentum"].clone()
        else:
            self._opt.state.pop(self._param, None)


@dataclass
class TokenLedger:
    """Exactly-once accounting: tokens count only when their round commits.

    `committed_total` is global (the same on every site, carried across heals); `committed_own` is
    what this site contributed to committed rounds.
    """

    committed_rounds: int = 0
    committed_total: int = 0
    committed_own: int = 0
    discarded_own: int = 0

    def settle(self, own_tokens: int, round_tokens: int, committed: bool) -> None:
        if committed:
            self.committed_rounds += 1
            self.committed_total += round_tokens
            self.committed_own += own_tokens
        else:
            self.discarded_own += own_tokens

    def state_dict(self) -> dict:
        return {"committed_rounds": self.committed_rounds, "committed_total": self.committed_total}

    def load_state_dict(self, state: dict) -> None:
        # Own counters stay: they describe this process's work, not the global model.
        self.committed_rounds = int(state["committed_rounds"])
        self.committed_total = int(state["committed_total"])
