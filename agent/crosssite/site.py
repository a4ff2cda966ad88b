"""One site of the cross-site tier as a process: the agent's Trainer inside time-boxed rounds.

Used by the multi-process tests and usable by hand (one line of JSON per round on --log):
    python -m agent.crosssite.site --site-id s0 --lighthouse http://127.0.0.1:29510 \
        --round-ms 800 --duty 1.0 --rounds 20 --log s0.jsonl
The budget is emulated as a duty cycle per round (`--duty 1,0.2,0` cycles per round): after each
micro-batch the site stays idle for the share of time its lease does not cover, as the agent's lease
enforcer would. In the real agent `local_work` is the lease loop itself.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import torch

from agent.crosssite.rounds import LocalWork
from agent.crosssite.tier import CrossSiteTier, TierConfig
from schemas.tierpass import TierIdentity

# Small enough that three sites plus the Lighthouse share two cores with room to spare.
TINY = dict(block_size=32, n_layer=1, n_head=2, n_embd=32)


@dataclass(frozen=True)
class DutyCycle:
    """Share of wall time the site may compute, per round (cycled)."""

    duties: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.duties or any(not 0.0 <= d <= 1.0 for d in self.duties):
            raise ValueError(f"duties must be a non-empty list of values in [0, 1], got {self.duties}")

    def at(self, round_index: int) -> float:
        return self.duties[round_index % len(self.duties)]


def make_local_work(trainer, micro_batch: int, duty: float, clock=time.time, sleep=time.sleep):
    """Train until the deadline at `duty`, never starting a step predicted to end after it."""
    def local_work(deadline: float) -> LocalWork:
        tokens = steps = 0
        losses: list[float] = []
        est = getattr(local_work, "step_s", 0.01)
        while duty > 0:
            now = clock()
            if now + est > deadline:
                break
            t0 = now
            r = trainer.micro_batch(micro_batch)
            trainer.optimizer_step()
            busy = clock() - t0
            est = 0.7 * est + 0.3 * busy   # EWMA of the step time: stop before the deadline, not after
            tokens += r.tokens
            steps += 1
            losses.append(r.loss)
            idle = busy * (1.0 - duty) / duty
            if idle > 0:
                sleep(max(0.0, min(idle, deadline - clock())))
        local_work.step_s = est
        rest = deadline - clock()
        if rest > 0:
            sleep(rest)   # the budget is spent or the next step would overrun: wait for the boundary
        return LocalWork(tokens, steps, sum(losses) / len(losses) if losses else math.nan)
    return local_work


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent.crosssite.site")
    ap.add_argument("--site-id", required=True)
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--round-ms", type=int, default=800)
    ap.add_argument("--round-epoch-ms", type=int, default=0)
    ap.add_argument("--heartbeat-timeout-ms", type=int, default=400)
    ap.add_argument("--duty", default="1.0", help="comma-separated duty cycle per round, cycled")
    ap.add_argument("--rounds", type=int, default=10, help="stop after this many rounds (0 = forever)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--compression", default="none", choices=("none", "bf16"))
    ap.add_argument("--eval-samples", type=int, default=64)
    ap.add_argument("--timeout-s", type=float, default=10.0, help="collectives / should_commit timeout")
    ap.add_argument("--workers", type=int, default=1, help="processes at this site (one local gloo group)")
    ap.add_argument("--worker-rank", type=int, default=0, help="0 = the site leader, the only one on the WAN")
    ap.add_argument("--site-port", type=int, default=0, help="local rendezvous port when --workers > 1")
    ap.add_argument("--local-compression", default="none", choices=("none", "bf16", "int8"))
    ap.add_argument("--log", required=True)
    ap.add_argument("--tier-epoch", type=int, default=0, help="the epoch WEAVER_TIER_KEY is of (a gated tier)")
    ap.add_argument("--tier-host", default="127.0.0.1", help="the site's tier interface (a gated tier's gate)")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    from agent.config import TrainConfig
    from agent.data import CharCorpus
    from agent.model import GPTConfig
    from agent.trainer import Trainer

    reducer = None
    if args.workers > 1:
        import torch.distributed as dist

        from agent.crosssite.aggregate import SiteReducer
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.site_port}",
                                rank=args.worker_rank, world_size=args.workers)
        reducer = SiteReducer(rank=args.worker_rank, world_size=args.workers, group=dist.group.WORLD,
                              compression=args.local_compression)
    # every site, and every worker in it, draws its own samples
    corpus = CharCorpus.shakespeare(seed=1000 + args.data_seed + 100 * args.worker_rank)
    trainer = Trainer(TrainConfig(model=GPTConfig(**TINY), seed=1337, eval_samples=args.eval_samples), corpus)
    duty = DutyCycle(tuple(float(x) for x in args.duty.split(",")))
    tier = dict(lighthouse_addr=args.lighthouse, site_id=args.site_id, round_ms=args.round_ms,
                round_epoch_ms=args.round_epoch_ms, heartbeat_timeout_ms=args.heartbeat_timeout_ms,
                compression=args.compression, timeout_s=args.timeout_s,
                # the tier's key (hex) and the site's pass from the environment, as the broker would hand them
                # (not argv: ps shows it)
                tier_key=bytes.fromhex(os.environ.get("WEAVER_TIER_KEY", "")), bind_host=args.tier_host)
    if os.environ.get("WEAVER_TIER_PASS"):
        config = TierConfig.with_identity(TierIdentity.decode(os.environ["WEAVER_TIER_PASS"]), **tier)
    else:
        config = TierConfig(tier_epoch=args.tier_epoch, **tier)
    log = open(args.log, "a", buffering=1)   # line-buffered: a SIGKILL loses at most the current round

    def emit(kind: str, **fields) -> None:
        log.write(json.dumps({"kind": kind, "pid": _pid(), "t": time.time(), **fields}) + "\n")

    tier = CrossSiteTier(trainer.model, config, reducer=reducer,
                         on_transfer_plan=lambda p: emit("transfer", **p.__dict__))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    emit("start", site_id=args.site_id, worker_rank=args.worker_rank, workers=args.workers,
         gate_port=tier.gate.port if tier.gate is not None else 0,
         val_loss=trainer.evaluate())   # the untrained model: what "the loss falls" is measured against
    done = 0
    try:
        while not stopping and (args.rounds == 0 or done < args.rounds):
            k = config.next_round(time.time())
            try:
                rec = tier.run_round(make_local_work(trainer, args.micro_batch, duty.at(k)))
            except Exception as exc:   # a failed quorum: report and try the next round
                emit("error", error=f"{type(exc).__name__}: {exc}")
                time.sleep(args.round_ms / 1000)
                continue
            val = trainer.evaluate() if rec.committed else math.nan
            emit("round", val_loss=val, duty=duty.at(rec.round), worker_rank=args.worker_rank, **rec.to_json())
            done += 1
    finally:
        emit("stop", site_id=args.site_id)
        tier.close()
        log.close()
    return 0


def _pid() -> int:
    import os
    return os.getpid()


if __name__ == "__main__":
    sys.exit(main())
