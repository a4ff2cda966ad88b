"""`weaver bench training`: lockstep data parallel vs stock-DiLoCo lockstep rounds vs Weaver's
token-weighted time-boxed rounds, on the same per-site budget traces.

Real training (the agent's char-GPT, Trainer and corpus; the tier's round arithmetic from
`rounds.py`), virtual time: each site's micro-batch costs `step_cost_s` of full-GPU time, and a site
with budget share b(t) gets ∫b dt of it (traces from `traces.py`). A collective costs WAN latency +
2·bytes/bandwidth. Time is virtual so the three modes see the identical budget and the bench is
deterministic and fast; the live multi-process tier is exercised by tests/crosssite/test_churn.py.

  lockstep  every site does one micro-batch, gradients are averaged, AdamW steps: each step waits
            for the site with the least budget (DDP/FSDP across sites).
  diloco    every site does H local AdamW steps, pseudo-gradients are averaged, outer Nesterov step
            (stock DiLoCo): each round waits for the slowest site to finish H steps.
  weaver-blocking
            fixed rounds; each site does as many steps as its budget allows before the transfer
            window and idles through it; token-weighted (FedNova when step counts differ widely)
            outer Nesterov step (Weaver before rounds overlapped compute).
  weaver    what the agent runs: the same rounds, overlapped with compute (Streaming DiLoCo's
            one-round-delayed outer step): a site snapshots its weights at the start of the
            transfer window and trains on, through the window; once the exchange has landed
            (WAN time later) it continues from the new global weights plus what it trained since
            the snapshot (`rounds.merged`). The budget is spent continuously, with no per-round
            truncation: a step's leftover budget carries into the next round.

Run: `weaver bench training [--duration-s 60] [--json out.json]` (or `python -m agent.crosssite.bench`).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from agent.crosssite.rounds import (
    LocalWork,
    OuterOptimizer,
    RoundPolicy,
    combine,
    flatten,
    merged,
    unflatten_into,
)
from agent.crosssite.traces import Capacity, TraceSpec, budget_traces

MODES = ("lockstep", "diloco", "weaver-blocking", "weaver")


@dataclass(frozen=True)
class BenchConfig:
    sites: int = 3
    duration_s: float = 60.0         # virtual seconds of budget trace per mode
    round_s: float = 2.0
    transfer_window: float = 0.15    # share of each Weaver round reserved for the all-reduce
    step_cost_s: float = 0.05        # full-GPU time of one micro-batch
    micro_batch: int = 16
    diloco_h: int = 0                # 0 = what a full-budget site does in one Weaver work phase
    wan_latency_s: float = 0.02
    wan_gbps: float = 1.0
    eval_samples: int = 64
    seed: int = 0
    outer_lr: float = RoundPolicy.outer_lr
    outer_momentum: float = RoundPolicy.outer_momentum
    model: dict = field(default_factory=lambda: dict(block_size=32, n_layer=2, n_head=4, n_embd=64))
    traces_file: str = ""            # JSON {"slot_s": s, "budget": [[share per slot] per site]}; "" = generate

    @property
    def h(self) -> int:
        return self.diloco_h or max(1, int(self.round_s * (1 - self.transfer_window) / self.step_cost_s))


@dataclass
class ModeResult:
    mode: str
    committed_tokens: int = 0
    optimizer_steps: int = 0         # local steps (summed over sites) or global steps (lockstep)
    rounds: int = 0
    used_s: float = 0.0              # full-GPU seconds spent on micro-batches, all sites
    waiting_s: float = 0.0           # budget that was there but idled waiting for other sites
    elapsed_s: float = 0.0           # virtual time actually covered (<= duration)
    wall_s: float = 0.0              # real seconds this mode took to run
    curve: list = field(default_factory=list)   # (virtual t, committed tokens, val loss)

    def summary(self, duration_s: float, capacity_s: float) -> dict:
        return {"committed_tokens": self.committed_tokens,
                "committed_tokens_per_s": self.committed_tokens / duration_s,
                "final_val_loss": self.curve[-1][2], "rounds": self.rounds,
                "optimizer_steps": self.optimizer_steps,
                "budget_utilisation": self.used_s / capacity_s if capacity_s else 0.0,
                "waiting_share_of_budget": self.waiting_s / capacity_s if capacity_s else 0.0,
                "wall_s": self.wall_s}


def load_traces(path: str, sites: int, duration_s: float) -> tuple[torch.Tensor, float]:
    """Per-site budget shares from a file (e.g. exported from the testbed's RAN model)."""
    with open(path) as f:
        doc = json.load(f)
    try:
        slot_s = float(doc["slot_s"])
        rows = torch.tensor(doc["budget"], dtype=torch.float64)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: expected {{'slot_s': float, 'budget': [[share, ...] per site]}} ({exc})") from None
    if rows.dim() != 2 or rows.shape[0] != sites or not slot_s > 0:
        raise ValueError(f"{path}: need {sites} equally long rows and slot_s > 0, got shape {tuple(rows.shape)}")
    if not torch.isfinite(rows).all() or rows.min() < 0 or rows.max() > 1:
        raise ValueError(f"{path}: budget shares must lie in [0, 1]")
    if rows.shape[1] * slot_s < duration_s:
        raise ValueError(f"{path}: covers {rows.shape[1] * slot_s:.1f}s, the bench needs {duration_s:.1f}s")
    return rows, slot_s


def loss_at_tokens(curve: list, tokens: float) -> float:
    """Validation loss at a token count, linearly interpolated on the (tokens, loss) curve."""
    for (_, x0, y0), (_, x1, y1) in zip(curve, curve[1:], strict=False):
        if x0 <= tokens <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
    return math.nan


class Bench:
    def __init__(self, cfg: BenchConfig):
        from agent.config import TrainConfig
        from agent.data import CharCorpus
        from agent.model import GPTConfig
        from agent.trainer import Trainer

        self.cfg = cfg
        if cfg.traces_file:
            self.traces, slot_s = load_traces(cfg.traces_file, cfg.sites, cfg.duration_s)
        else:
            spec = TraceSpec(sites=cfg.sites, duration_s=cfg.duration_s, seed=cfg.seed)
            self.traces, slot_s = budget_traces(spec), spec.slot_s
        self.slot_s = slot_s
        self.cap = Capacity(self.traces, slot_s)
        self.capacity_s = sum(self.cap.work(i, 0, cfg.duration_s) for i in range(cfg.sites))
        corpus = CharCorpus.shakespeare()
        self._corpus = corpus
        self._make = lambda data_seed: Trainer(
            TrainConfig(model=GPTConfig(**cfg.model), seed=1337, eval_samples=cfg.eval_samples),
            self._site_data(data_seed))
        self.tokens_per_batch = cfg.micro_batch * cfg.model["block_size"]

    def _site_data(self, data_seed: int):
        # Same encoded text, a different sample stream per site (the batch hash is keyed by the seed).
        d = copy.copy(self._corpus)
        d.seed = 1000 + data_seed
        return d

    def comm_s(self, numel: int) -> float:
        return self.cfg.wan_latency_s + 2 * numel * 4 * 8 / (self.cfg.wan_gbps * 1e9)

    # -- modes -------------------------------------------------------------------------------------
    def lockstep(self) -> ModeResult:
        c, res = self.cfg, ModeResult("lockstep")
        tr = self._make(0)
        comm = self.comm_s(tr.model.num_params())
        res.curve.append((0.0, 0, tr.evaluate()))
        t, next_eval = 0.0, c.round_s
        while True:
            finish = [self.cap.finish(i, t, c.step_cost_s) for i in range(c.sites)]
            t_next = max(finish) + comm
            if t_next > c.duration_s:
                break
            for _ in range(c.sites):       # one micro-batch per site, one averaged gradient
                tr.micro_batch(c.micro_batch)
            tr.optimizer_step()
            res.waiting_s += sum(self.cap.work(i, f, t_next) for i, f in enumerate(finish))
            res.used_s += c.sites * c.step_cost_s
            res.optimizer_steps += 1
            res.rounds += 1
            res.committed_tokens += c.sites * self.tokens_per_batch
            t = t_next
            if t >= next_eval:
                res.curve.append((t, res.committed_tokens, tr.evaluate()))
                next_eval += c.round_s
        res.elapsed_s = t
        if res.curve[-1][1] != res.committed_tokens:
            res.curve.append((t, res.committed_tokens, tr.evaluate()))
        return res

    def _rounds(self, mode: str) -> ModeResult:
        c, res = self.cfg, ModeResult(mode)
        trainers = [self._make(i) for i in range(c.sites)]
        params = [list(tr.model.parameters()) for tr in trainers]
        global_flat = flatten(params[0]).clone()
        # Stock DiLoCo averages; Weaver weights by tokens and normalises by steps when they differ.
        outer = dict(outer_lr=c.outer_lr, outer_momentum=c.outer_momentum)
        policy = RoundPolicy(fednova_cv=math.inf, **outer) if mode == "diloco" else RoundPolicy(**outer)
        outer = OuterOptimizer(global_flat, policy)
        comm = self.comm_s(global_flat.numel())
        res.curve.append((0.0, 0, trainers[0].evaluate()))
        t = 0.0
        while True:
            if mode == "diloco":
                steps = [c.h] * c.sites
                finish = [self.cap.finish(i, t, c.h * c.step_cost_s) for i in range(c.sites)]
                t_next = max(finish) + comm
                if t_next > c.duration_s:
                    break
                res.waiting_s += sum(self.cap.work(i, f, t_next - comm) for i, f in enumerate(finish))
            else:
                t_next = t + c.round_s
                if t_next > c.duration_s:
                    break
                work_end = t_next - c.transfer_window * c.round_s
                assert comm <= c.transfer_window * c.round_s, "transfer window too short for the WAN model"
                steps = [int(self.cap.work(i, t, work_end) / c.step_cost_s + 1e-9) for i in range(c.sites)]
            locals_ = []
            for tr, p, n in zip(trainers, params, steps, strict=True):
                for _ in range(n):
                    tr.micro_batch(c.micro_batch)
                    tr.optimizer_step()
                locals_.append((flatten(p), LocalWork(n * self.tokens_per_batch, n)))
            g, stats, _ = combine(global_flat, locals_, policy)
            if g is not None:
                outer.step(g)
            for p in params:
                unflatten_into(global_flat, p)
            res.used_s += sum(steps) * c.step_cost_s
            res.optimizer_steps += sum(steps)
            res.rounds += 1
            res.committed_tokens += stats.tokens
            t = t_next
            res.curve.append((t, res.committed_tokens, trainers[0].evaluate()))
        res.elapsed_s = t
        return res

    def overlapped(self) -> ModeResult:
        c, res = self.cfg, ModeResult("weaver")
        trainers = [self._make(i) for i in range(c.sites)]
        params = [list(tr.model.parameters()) for tr in trainers]
        global_flat = flatten(params[0]).clone()
        outer = OuterOptimizer(global_flat, RoundPolicy(outer_lr=c.outer_lr, outer_momentum=c.outer_momentum))
        comm = self.comm_s(global_flat.numel())
        assert comm <= c.transfer_window * c.round_s, "transfer window too short for the WAN model"
        res.curve.append((0.0, 0, trainers[0].evaluate()))
        carry = [0.0] * c.sites        # budget (full-GPU s) not yet spent on a whole step
        done = [0] * c.sites           # steps since the last snapshot

        def train(t_from: float, t_to: float) -> None:
            for i, tr in enumerate(trainers):
                budget = carry[i] + self.cap.work(i, t_from, t_to)
                n = int(budget / c.step_cost_s + 1e-9)
                carry[i] = budget - n * c.step_cost_s
                for _ in range(n):
                    tr.micro_batch(c.micro_batch)
                    tr.optimizer_step()
                done[i] += n
                res.used_s += n * c.step_cost_s
                res.optimizer_steps += n

        policy = RoundPolicy(outer_lr=c.outer_lr, outer_momentum=c.outer_momentum)
        t, k = 0.0, 0
        while True:
            snap_t = (k + 1 - c.transfer_window) * c.round_s       # round k's transfer window opens
            if snap_t + comm > c.duration_s:
                break                          # work after the last snapshot would enter no round
            train(t, snap_t)
            snaps = [flatten(p) for p in params]
            locals_ = [(f, LocalWork(n * self.tokens_per_batch, n)) for f, n in zip(snaps, done, strict=True)]
            done = [0] * c.sites
            train(snap_t, snap_t + comm)                            # while the exchange is in flight
            g, stats, _ = combine(global_flat, locals_, policy)
            if g is not None:
                outer.step(g)
            for p, snap in zip(params, snaps, strict=True):
                unflatten_into(merged(global_flat, flatten(p), snap), p)
            t, k = snap_t + comm, k + 1
            res.rounds += 1
            res.committed_tokens += stats.tokens
            res.curve.append((t, res.committed_tokens, trainers[0].evaluate()))
        res.elapsed_s = t
        return res

    def run(self, mode: str) -> ModeResult:
        torch.manual_seed(self.cfg.seed)
        t0 = time.perf_counter()
        res = (self.lockstep() if mode == "lockstep" else self.overlapped() if mode == "weaver"
               else self._rounds(mode))
        res.wall_s = time.perf_counter() - t0
        return res


def trace_summary(traces: torch.Tensor) -> dict:
    mean = traces.mean(dim=1)
    zero = (traces == 0).double().mean(dim=1)
    corr = torch.corrcoef(traces)
    off = corr[~torch.eye(len(traces), dtype=torch.bool)]
    return {"mean_budget_per_site": [round(float(x), 3) for x in mean],
            "zero_budget_share_per_site": [round(float(x), 3) for x in zero],
            "mean_cross_site_correlation": round(float(off.mean()), 3) if off.numel() else 0.0,
            "min_site_budget_mean": round(float(traces.min(dim=0).values.mean()), 3)}


def _ratio(a: float, b: float) -> float | None:
    """a/b, or None when the baseline committed nothing in the budget (it never finished a round)."""
    return a / b if b > 0 else None


def report(cfg: BenchConfig, results: dict[str, ModeResult], bench: Bench) -> dict:
    summaries = {m: r.summary(cfg.duration_s, bench.capacity_s) for m, r in results.items()}
    equal = min(r.committed_tokens for r in results.values())
    for m, r in results.items():
        summaries[m]["val_loss_at_equal_tokens"] = loss_at_tokens(r.curve, equal)
    w, lk, dl, wb = summaries["weaver"], summaries["lockstep"], summaries["diloco"], summaries["weaver-blocking"]
    return {
        "bench": "training",
        "config": asdict(cfg) | {"diloco_h": cfg.h},
        "traces": trace_summary(bench.traces),
        "capacity_gpu_s": bench.capacity_s,
        "equal_tokens": equal,
        "modes": summaries,
        "weaver_vs_lockstep_tokens_ratio": _ratio(w["committed_tokens_per_s"], lk["committed_tokens_per_s"]),
        "weaver_vs_diloco_tokens_ratio": _ratio(w["committed_tokens_per_s"], dl["committed_tokens_per_s"]),
        "weaver_minus_lockstep_val_loss_at_equal_tokens": w["val_loss_at_equal_tokens"] - lk["val_loss_at_equal_tokens"],
        "weaver_minus_diloco_val_loss_at_equal_tokens": w["val_loss_at_equal_tokens"] - dl["val_loss_at_equal_tokens"],
        "weaver_minus_lockstep_final_val_loss": w["final_val_loss"] - lk["final_val_loss"],
        "weaver_vs_blocking_tokens_ratio": _ratio(w["committed_tokens_per_s"], wb["committed_tokens_per_s"]),
        "weaver_minus_blocking_val_loss_at_equal_tokens": w["val_loss_at_equal_tokens"] - wb["val_loss_at_equal_tokens"],
        "curves": {m: r.curve for m, r in results.items()},
    }


def print_table(out: dict) -> None:
    t = out["traces"]
    print(f"budget traces: mean share per site {t['mean_budget_per_site']}, zero-budget share "
          f"{t['zero_budget_share_per_site']}, cross-site correlation {t['mean_cross_site_correlation']}")
    print(f"{'mode':<16}{'tokens/s':>11}{'tokens':>10}{'rounds':>8}{'util':>7}{'waiting':>9}"
          f"{'val@end':>9}{'val@equal':>11}{'wall s':>8}")
    for m, s in out["modes"].items():
        print(f"{m:<16}{s['committed_tokens_per_s']:>11.0f}{s['committed_tokens']:>10}{s['rounds']:>8}"
              f"{s['budget_utilisation']:>7.2f}{s['waiting_share_of_budget']:>9.2f}{s['final_val_loss']:>9.3f}"
              f"{s['val_loss_at_equal_tokens']:>11.3f}{s['wall_s']:>8.1f}")
    def x(r):
        return "n/a (baseline committed nothing)" if r is None else f"{r:.2f}x"
    print(f"equal tokens = {out['equal_tokens']}; weaver vs lockstep committed tokens/s: "
          f"{x(out['weaver_vs_lockstep_tokens_ratio'])}, vs diloco: {x(out['weaver_vs_diloco_tokens_ratio'])}; "
          f"val loss at equal tokens, weaver - lockstep: {out['weaver_minus_lockstep_val_loss_at_equal_tokens']:+.3f}, "
          f"weaver - diloco: {out['weaver_minus_diloco_val_loss_at_equal_tokens']:+.3f}")
    print(f"overlapped vs blocking rounds: committed tokens/s {x(out['weaver_vs_blocking_tokens_ratio'])}, "
          f"val loss at equal tokens {out['weaver_minus_blocking_val_loss_at_equal_tokens']:+.3f}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    p.add_argument("--sites", type=int, default=d.sites)
    p.add_argument("--duration-s", type=float, default=d.duration_s, help="virtual seconds of budget per mode")
    p.add_argument("--round-s", type=float, default=d.round_s)
    p.add_argument("--step-cost-s", type=float, default=d.step_cost_s)
    p.add_argument("--micro-batch", type=int, default=d.micro_batch)
    p.add_argument("--diloco-h", type=int, default=0)
    p.add_argument("--wan-latency-s", type=float, default=d.wan_latency_s)
    p.add_argument("--wan-gbps", type=float, default=d.wan_gbps)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--outer-lr", type=float, default=d.outer_lr)
    p.add_argument("--outer-momentum", type=float, default=d.outer_momentum)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--traces", default="", help="read per-site budget traces from this JSON file instead")
    p.add_argument("--dump-traces", default="", help="write the budget traces used to this JSON file")
    p.add_argument("--json", default=None, help="write the full result (with loss curves) here")


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    cfg = BenchConfig(sites=args.sites, duration_s=args.duration_s, round_s=args.round_s,
                      step_cost_s=args.step_cost_s, micro_batch=args.micro_batch, diloco_h=args.diloco_h,
                      wan_latency_s=args.wan_latency_s, wan_gbps=args.wan_gbps, seed=args.seed,
                      outer_lr=args.outer_lr, outer_momentum=args.outer_momentum, traces_file=args.traces)
    modes = [m for m in args.modes.split(",") if m]
    if sorted(modes) != sorted(MODES):
        print(f"bench training compares all of {MODES}", file=sys.stderr)
        return 2
    try:
        bench = Bench(cfg)
    except (OSError, ValueError) as exc:
        print(f"bench training: {exc}", file=sys.stderr)
        return 2
    if args.dump_traces:
        with open(args.dump_traces, "w") as f:
            json.dump({"slot_s": bench.slot_s, "budget": bench.traces.tolist()}, f)
    results = {}
    for m in modes:
        results[m] = bench.run(m)
        print(f"  {m}: {results[m].committed_tokens} tokens in {results[m].wall_s:.1f}s wall", file=sys.stderr)
    out = report(cfg, results, bench)
    print_table(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="weaver bench training", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
