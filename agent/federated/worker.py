"""The learning half of `weaver bench federated`, in the agent venv: a JSON-lines process (one request
per stdin line, one reply per stdout line) that holds the base model, every UE's shard, and per arm the
global adapter and the aggregators. The testbed side decides timing (who trains, when each update
arrives where, when each round closes); this side does the tensors.

Requests (`op`):
  init   {seed, n_ues, sites, lm, local, compression, aggregator, pretrain_steps, val_batches}
  round  {arm, round, train: [ue], events: {aggregator: [["offer", ue, round] | ["close", t0_ms, t1_ms]]},
          announce_url}   -> per aggregator the aggregate's bytes, weight, included and late updates
  apply  {arm, round, aggregates: [names on time]} -> the cloud's FedAvg step and the validation loss
A UE's update is what arrives: its delta encoded with the UE's compression and decoded again. Local
runs are a pure function of (global adapter, UE, round), so arms whose globals agree share them (cache).
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict

import numpy as np
import torch

from agent.data import SHAKESPEARE, CharTokenizer
from agent.federated import lm, updates
from agent.federated.aggregate import Admission, AggregatorConfig, RoundAggregator, Update, combine
from agent.federated.announce import announce
from agent.federated.ue import LocalConfig, Shard, local_round
from agent.federated.updates import Compression

PUBLIC, UE_PART = 0.25, 0.70  # corpus shares: base pre-training, the UEs' shards; the tail is validation


class Worker:
    def init(self, req: dict) -> dict:
        torch.set_num_threads(int(req.get("threads", 1)))
        self.seed = int(req["seed"])
        text = SHAKESPEARE.read_text(encoding="utf-8")
        tok = CharTokenizer.from_text(text)
        ids = torch.tensor(tok.encode(text), dtype=torch.long)
        self.cfg = lm.LMConfig(vocab_size=tok.vocab_size, **req.get("lm", {}))
        self.local = LocalConfig(**req.get("local", {}))
        self.comp = Compression(**req.get("compression", {}))
        self.agg_cfg = AggregatorConfig(**req.get("aggregator", {}))
        n = len(ids)
        public, ue_part, val = ids[:int(n * PUBLIC)], ids[int(n * PUBLIC):int(n * (PUBLIC + UE_PART))], \
            ids[int(n * (PUBLIC + UE_PART)):]
        B = self.cfg.block_size
        gen = torch.Generator().manual_seed(self.seed)

        def windows(src, count):
            off = torch.randint(0, len(src) - B - 1, (count,), generator=gen)
            w = src[off[:, None] + torch.arange(B + 1)[None, :]]
            return w[:, :-1], w[:, 1:]

        self.model = lm.build(self.cfg, seed=self.seed)
        steps = int(req.get("pretrain_steps", 300))
        pre_loss = lm.pretrain_base(self.model, (windows(public, 16) for _ in range(steps))) if steps else None
        self.val = [windows(val, 16) for _ in range(int(req.get("val_batches", 16)))]
        # Contiguous shards of unequal size (non-IID: each UE holds a stretch of one play), so that the
        # sample weights of FedAvg matter.
        n_ues = int(req["n_ues"])
        rng = np.random.default_rng(self.seed)
        sizes = np.exp(rng.normal(0, 0.5, n_ues))
        cuts = np.concatenate([[0], np.cumsum(sizes / sizes.sum() * len(ue_part)).astype(int)])
        self.shards = [Shard(ue_part[cuts[i]:cuts[i + 1]], B) for i in range(n_ues)]
        self.sites = list(req["sites"])
        self.init_adapter = lm.adapter_of(self.model)
        self.arms: dict[str, dict] = {}
        self.cache: dict[tuple, tuple[Update, float]] = {}
        zero = {k: torch.zeros_like(v) for k, v in self.init_adapter.items()}
        val0 = lm.evaluate(self.model, self.val)
        return {"update_bytes": len(updates.encode(zero, self.comp)),
                "aggregate_dense_bytes": len(updates.encode(zero, Compression(self.agg_cfg.encoding))),
                "adapter_params": sum(v.numel() for v in zero.values()),
                "base_params": sum(p.numel() for p in lm.base_parameters(self.model)),
                "samples": [s.samples for s in self.shards], "val_loss": val0, "pretrain_loss": pre_loss,
                "lm": asdict(self.cfg), "local": asdict(self.local), "compression": asdict(self.comp),
                "aggregator": asdict(self.agg_cfg)}

    def _arm(self, name: str) -> dict:
        if name not in self.arms:
            self.arms[name] = {"global": {k: v.clone() for k, v in self.init_adapter.items()},
                               "aggs": {}, "updates": {}, "closed": {}}
        return self.arms[name]

    def _train(self, arm: dict, digest: str, ue: int, rnd: int) -> tuple[Update, float]:
        g = arm["global"]
        key = (digest, ue, rnd)
        if key not in self.cache:
            delta, loss = local_round(self.model, g, self.shards[ue], self.local, seed=self.seed * 100003 + ue * 131 + rnd)
            received = updates.decode(updates.encode(delta, self.comp))
            self.cache[key] = (Update(ue_id=str(ue), round=rnd, samples=self.shards[ue].samples, delta=received), loss)
        return self.cache[key]

    def round(self, req: dict) -> dict:
        arm = self._arm(req["arm"])
        rnd = int(req["round"])
        losses = []
        digest = hashlib.sha1(updates.encode(arm["global"], Compression("fp32"))).hexdigest()
        for ue in req["train"]:
            u, loss = self._train(arm, digest, int(ue), rnd)
            arm["updates"][(int(ue), rnd)] = u
            losses.append(loss)
        out = {}
        arm["closed"] = {}
        for name, events in req["events"].items():
            agg = arm["aggs"].setdefault(name, RoundAggregator(site=name, cfg=self.agg_cfg, open_round=rnd))
            counts = {a.value: 0 for a in Admission}
            for ev in events:
                if ev[0] == "offer":
                    counts[agg.offer(arm["updates"][(int(ev[1]), int(ev[2]))]).value] += 1
                    continue
                a = agg.close()
                arm["closed"][name] = a
                out[name] = None if a is None else {
                    "bytes": a.nbytes, "weight": a.weight, "samples": a.samples,
                    "included": [[int(u), r] for u, r in a.included], "late": [[int(u), r] for u, r in a.late],
                    "admissions": counts}
                if a is not None and req.get("announce_url"):
                    announce(req["announce_url"], site_id=name, round=rnd, nbytes=a.nbytes,
                             earliest_start_unix_ms=float(ev[1]), deadline_unix_ms=float(ev[2]))
        return {"aggregates": out, "train_loss": float(np.mean(losses)) if losses else None}

    def apply(self, req: dict) -> dict:
        arm = self._arm(req["arm"])
        aggs = [arm["closed"][n] for n in req["aggregates"] if arm["closed"].get(n) is not None]
        if aggs:
            delta, _ = combine(aggs)
            arm["global"] = {k: v + delta[k] for k, v in arm["global"].items()}
        lm.load_adapter(self.model, arm["global"])
        return {"val_loss": lm.evaluate(self.model, self.val), "combined": len(aggs)}


def main() -> int:
    w = Worker()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            reply = getattr(w, req["op"])(req)
            reply["ok"] = True
        except Exception as exc:  # the bench prints it and stops; the worker stays a plain pipe
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
