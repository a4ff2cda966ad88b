"""`weaver bench federated`: federated LoRA fine-tuning through the RAN (issue 18), three transport arms
on the same UEs, the same radio and the same learning code.

  optical    the gNB aggregates its UEs' updates per round (agent.federated.aggregate) and announces one
             transfer per round through the xApp's REST API; the circuit-switch controller reads the
             announcements and sets a circuit up just in time, released after (testbed.federated.transport)
  packet     no aggregation in the network: every UE update is its own flow over the site's packet
             backhaul to the cloud aggregator
  always-on  gNB aggregation as in `optical`, over one circuit per site held for the whole run

The radio is shared: each round every available, idle UE trains for its device class's compute time,
then uploads its real adapter delta (bytes of the encoded tensors) as best-effort uplink traffic in the
testbed MAC (testbed.federated.uplink); mobility outages delay some. The same uploads' PRBs then go into the
cells' uplink of the RAN model under the xApp's own loop (testbed.federated.rancost): the PRBs, RAN GPU
and training lease they cost, beside the same run without them. The learning (base LM, LoRA,
FedAvg) runs in the agent venv (agent.federated.worker) over a pipe; the REST API is the xApp's own
(xapp.rest.build_app, only its announcement routes are used: no control loop runs here).
Run: `weaver bench federated [--rounds 6] [--json F] [--plot F.png]`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace

import numpy as np

from testbed import scenarios
from testbed.federated.learner import Learner
from testbed.federated.population import Population, PopulationConfig
from testbed.federated.rancost import ran_cost
from testbed.federated.transport import (
    CircuitConfig,
    CircuitSwitch,
    Flow,
    Placed,
    Transfer,
    always_on,
    packet_flows,
)
from testbed.federated.uplink import Uplink
from testbed.model.training import StepCostModel

ARMS = ("optical", "packet", "always-on")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    rounds: int = 6
    round_s: float = 6.0             # a round's deadline at the cloud, after its start
    transport_budget_s: float = 0.2  # the gNB closes its aggregate this long before the deadline
    ues_per_cell: int = 32
    local_steps: int = 3
    n_embd: int = 64                 # the LM's width (agent.federated.lm.LMConfig)
    lora_rank: int = 4
    compression: str = "fp16"
    max_aggregate_bytes: int | None = None
    circuits: int = 1
    circuit_gbps: float = 10.0
    reconfig_s: float = 1e-3
    propagation_s: float = 2.5e-4
    packet_gbps: float = 1.0
    pretrain_steps: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 1 or not self.round_s > self.transport_budget_s > 0:
            raise ValueError("BenchConfig: need rounds >= 1 and round_s > transport_budget_s > 0")


class _Rest:
    """The xApp's REST app on a free localhost port, in a thread of its own."""

    def __init__(self):
        from aiohttp import web

        from xapp.rest import build_app
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(build_app(None))
        ready = threading.Event()

        def serve():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}/api/v1/transfers/aggregates"

    def announcements(self) -> list[dict]:
        with urllib.request.urlopen(self.url, timeout=5) as r:
            return json.loads(r.read())["aggregates"]

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def radio(cfg: BenchConfig, pop: Population, update_bytes: int) -> tuple[list[list[int]], dict, Uplink]:
    """Every round's participants, when each update (ue, round) reached its gNB (NaN: never), and the
    uplink that carried them (its PRBs per slot and cell, for the RAN's side: testbed.federated.rancost)."""
    sc = scenarios.get("demo")
    up = Uplink(sc, pop.cell, pop.mcs_offset, cfg.seed)
    parts: list[list[int]] = []
    arrival: dict[tuple[int, int], float] = {}
    last: dict[int, int] = {}
    for r in range(cfg.rounds):
        t0 = r * cfg.round_s
        up.advance_to(t0)
        d = pop.round_draws(cfg.seed, r, cfg.local_steps, cfg.round_s)
        now = []
        for i in range(len(pop.site)):
            if not d.available[i] or up.busy(i):
                continue
            if i in last:
                arrival[(i, last[i])] = up.finish_s(i)
            o = None if math.isnan(d.outage_start_s[i]) else (t0 + d.outage_start_s[i], t0 + d.outage_end_s[i])
            up.submit(i, t0 + d.compute_s[i], update_bytes, o)
            last[i] = r
            now.append(i)
        parts.append(now)
    up.advance_to((cfg.rounds + 1) * cfg.round_s)  # late uploads of the last round may still land
    for i, r in last.items():
        arrival[(i, r)] = up.finish_s(i)
    return parts, arrival, up


def events(cfg: BenchConfig, parts, arrival: dict, where: dict[int, str], cutoff) -> tuple[dict, dict]:
    """Per round, per aggregator: its offers (updates arriving since its last close, in order) then its
    close, at min(cutoff, when all of the round's expected updates are in). Returns (events by round,
    close time by (aggregator, round))."""
    names = sorted(set(where.values()))
    by_round: dict[int, dict] = {}
    closes: dict[tuple[str, int], float] = {}
    prev = {n: -math.inf for n in names}
    for r in range(cfg.rounds):
        t_cut = cutoff(r)
        ev = {}
        for n in names:
            mine = [arrival[(i, r)] for i in parts[r] if where[i] == n]
            close = max(mine) if mine and all(a <= t_cut for a in mine) else t_cut
            offers = sorted((a, i, rr) for (i, rr), a in arrival.items()
                            if where[i] == n and prev[n] < a <= close)
            ev[n] = [["offer", i, rr] for a, i, rr in offers]
            ev[n].append(["close", close, r * cfg.round_s + cfg.round_s])
            closes[(n, r)] = close
            prev[n] = close
        by_round[r] = ev
    return by_round, closes


def run_bench(cfg: BenchConfig, agent_python, root, log=print) -> dict:
    t_wall = time.monotonic()
    pcfg = PopulationConfig(ues_per_cell=cfg.ues_per_cell)
    pop = Population.build(pcfg, cfg.seed)
    M = len(pop.site)
    site_name = {i: f"site-{pop.site[i]}" for i in range(M)}
    # Two workers, one per learning trajectory, on the two cores: the gNB-aggregation arms (optical and
    # always-on admit the same updates, so the second reuses the first's local runs) and packet. Both
    # build the same base from the seed.
    learners = {"gnb": Learner(agent_python, root), "packet": Learner(agent_python, root)}
    rest = _Rest()
    init = dict(seed=cfg.seed, n_ues=M, sites=[site_name[i] for i in range(M)],
                lm={"n_embd": cfg.n_embd, "lora_rank": cfg.lora_rank},
                local={"steps": cfg.local_steps}, compression={"encoding": cfg.compression},
                aggregator={"max_bytes": cfg.max_aggregate_bytes}, pretrain_steps=cfg.pretrain_steps)
    try:
        with ThreadPoolExecutor(2) as pool:
            infos = list(pool.map(lambda lr: lr.call("init", **init), learners.values()))
        info = infos[0]
        if infos[1]["val_loss"] != info["val_loss"]:
            raise RuntimeError("the two learning workers built different base models from one seed")
        log(f"federated: {M} UEs, adapter {info['adapter_params']} parameters, update {info['update_bytes']} B "
            f"({cfg.compression}), base {info['base_params']} parameters, val loss {info['val_loss']:.3f}")
        parts, arrival, uplink = radio(cfg, pop, info["update_bytes"])
        # what the same uploads cost the RAN, under the xApp's loop: their PRBs, decode, the lease they displace
        ran = ran_cost(scenarios.get("demo"), cfg.seed, uplink.carried_prbs, StepCostModel())
        ran["updates_bytes_carried"] = uplink.carried_bytes
        log(f"federated: the updates took {ran['updates_prbs_per_u_slot_mean']:.2f} uplink PRBs per U slot and cell "
            f"({100 * ran['updates_share_of_ul_prbs']:.2f} % of the cells' uplink PRBs), {ran['updates_ran_gpu_sm_s']:.2f} "
            f"SM-s of RAN GPU, displaced {ran['training_lease_displaced_sm_s']:.1f} SM-s of training lease")
        ccfg = CircuitConfig(n_circuits=cfg.circuits, gbps=cfg.circuit_gbps, reconfig_s=cfg.reconfig_s,
                             propagation_s=cfg.propagation_s)
        gnb_ev, gnb_close = events(cfg, parts, arrival, site_name,
                                   lambda r: r * cfg.round_s + cfg.round_s - cfg.transport_budget_s)
        flows = [Flow(key=k, site=site_name[k[0]], nbytes=info["update_bytes"], start_s=a)
                 for k, a in arrival.items() if not math.isnan(a)]
        at_cloud = packet_flows(flows, cfg.packet_gbps, cfg.propagation_s)
        cloud_arrival = {k: at_cloud.get(k, math.nan) for k in arrival}
        pkt_ev, pkt_close = events(cfg, parts, cloud_arrival, dict.fromkeys(range(M), "cloud"),
                                   lambda r: r * cfg.round_s + cfg.round_s)
        epoch_ms = math.floor(time.time()) * 1e3  # announcements carry Unix ms: the bench's t=0 is now
        out = {"config": asdict(cfg), "learning": {k: v for k, v in info.items() if k not in ("samples", "ok")},
               "participants_per_round": [len(p) for p in parts],
               "participants_per_site_mean": float(np.mean([len(p) for p in parts]) / pcfg.n_sites),
               "updates_reaching_gnb": len(flows), "ran_cost": ran, "arms": {}}

        def arms(names):
            lr = learners["packet" if names == ("packet",) else "gnb"]
            return {a: run_arm(a, cfg, ccfg, lr, rest, parts, gnb_ev if a != "packet" else pkt_ev,
                               gnb_close if a != "packet" else pkt_close, epoch_ms, info, len(flows), log, pcfg.n_sites)
                    for a in names}
        with ThreadPoolExecutor(2) as pool:
            done = list(pool.map(arms, [("optical", "always-on"), ("packet",)]))
        out["arms"] = {a: {**done[0], **done[1]}[a] for a in ARMS}
        out["reconfig_sweep"] = sweep(cfg, ccfg, out["arms"]["optical"].pop("transfers"))
        out["wall_s"] = time.monotonic() - t_wall
        return out
    finally:
        for lr in learners.values():
            lr.close()
        rest.close()


def run_arm(arm, cfg: BenchConfig, ccfg: CircuitConfig, learner, rest, parts, ev, closes, epoch_ms, info,
            n_flows, log, n_sites: int) -> dict:
    switch = CircuitSwitch(ccfg)
    placed_all, losses, completion, missed, agg_bytes, made, late, refused = [], [], [], 0, [], 0, 0, 0
    transfers_all: list[Transfer] = []
    for r in range(cfg.rounds):
        deadline = r * cfg.round_s + cfg.round_s
        ms = {n: [e if e[0] == "offer" else ["close", epoch_ms + e[1] * 1e3, epoch_ms + e[2] * 1e3] for e in evs]
              for n, evs in ev[r].items()}
        rep = learner.call("round", arm=arm, round=r, train=parts[r], events=ms,
                           announce_url=rest.url if arm == "optical" else None)
        aggs = {n: a for n, a in rep["aggregates"].items() if a is not None}
        for a in aggs.values():
            made += sum(1 for _, rr in a["included"] if rr == r)
            late += len(a["late"])
            refused += a["admissions"]["stale"]
        if arm == "packet":
            on_time = list(aggs)
            completion.append(closes[("cloud", r)] - r * cfg.round_s)
        else:
            if arm == "optical":  # the controller consumes what the aggregators announced
                tr = [Transfer(key=(a["site_id"], a["round"]), site=a["site_id"], nbytes=a["bytes"],
                               earliest_s=(a["earliest_start_unix_ms"] - epoch_ms) / 1e3,
                               deadline_s=(a["deadline_unix_ms"] - epoch_ms) / 1e3)
                      for a in rest.announcements() if a["round"] == r]
                placed = with_fallback(switch.schedule(tr), tr, cfg)
            else:
                tr = [Transfer(key=(n, r), site=n, nbytes=a["bytes"], earliest_s=closes[(n, r)],
                               deadline_s=deadline) for n, a in aggs.items()]
                placed = always_on(tr, ccfg)
            placed_all += placed
            transfers_all += tr
            agg_bytes += [t.nbytes for t in tr]
            on_time = [p.key[0] for p in placed if p.on_time]
            missed += sum(1 for p in placed if not p.on_time)
            completion.append(max(p.arrive_s for p in placed) - r * cfg.round_s if placed else cfg.round_s)
        losses.append(learner.call("apply", arm=arm, round=r, aggregates=on_time)["val_loss"])
        log(f"  {arm:9s} round {r}: {len(parts[r])} UEs, val loss {losses[-1]:.4f}, "
            f"completion {completion[-1]:.3f} s")
    produced = sum(len(p) for p in parts)
    horizon = cfg.rounds * cfg.round_s
    res = {"val_loss": losses, "val_loss_start": info["val_loss"], "val_loss_end": losses[-1],
           "round_completion_s_p50": float(np.percentile(completion, 50)),
           "round_completion_s_p99": float(np.percentile(completion, 99)), "round_completion_s": completion,
           "updates_produced": produced, "updates_made_their_round": made,
           "share_made_their_round": made / produced, "updates_admitted_late": late,
           "updates_refused_stale": refused, "deadlines_missed_by_transport": missed}
    if arm == "packet":
        res.update(transport_flows=n_flows, transport_bytes=n_flows * info["update_bytes"],
                   circuit_s_held=None, circuit_s_used=None, occupancy=None)
    else:
        used = sum(p.end_s - p.start_s for p in placed_all if not p.fallback)
        res["fell_back_to_packet"] = sum(1 for p in placed_all if p.fallback)
        if arm == "optical":
            books = switch.finish()
            held, setup = sum(b.release_s - b.up_s for b in books), sum(b.setup_s for b in books)
            res["intervals"] = switch.intervals
            res["booking_spans"] = [[b.up_s, b.release_s, b.setup_s, b.site, b.circuit] for b in books]
            res["transfers"] = transfers_all
            res["bookings"] = len(books)
        else:
            held, setup = n_sites * horizon, 0.0  # one circuit per site, always up
        res["transfer_spans"] = [[p.start_s, p.end_s, p.key[0]] for p in placed_all]
        res.update(transport_flows=len(agg_bytes), transport_bytes=int(sum(agg_bytes)), circuit_s_held=held,
                   circuit_s_used=used, circuit_s_setup=setup, occupancy=used / held if held else None,
                   occupancy_incl_setup=used / (held + setup) if held + setup else None)
    return res


SWEEP_RECONFIG_S = (10e-6, 1e-3, 25e-3, 100e-3)


def with_fallback(placed: list[Placed], transfers: list[Transfer], cfg: BenchConfig) -> list[Placed]:
    """The switch's fallbacks sent over their site's packet backhaul from their earliest start."""
    by_key = {t.key: t for t in transfers}
    fb = [Flow(key=p.key, site=by_key[p.key].site, nbytes=by_key[p.key].nbytes, start_s=by_key[p.key].earliest_s)
          for p in placed if p.fallback]
    if not fb:
        return placed
    at = packet_flows(fb, cfg.packet_gbps, cfg.propagation_s)
    return [replace(p, arrive_s=at[p.key], on_time=at[p.key] <= by_key[p.key].deadline_s + 1e-12)
            if p.fallback else p for p in placed]


def sweep(cfg: BenchConfig, ccfg: CircuitConfig, transfers: list[Transfer]) -> list[dict]:
    """The optical arm's announced transfers scheduled again for other switch reconfiguration times (the
    aggregates do not depend on the switch; a transfer that would now miss its deadline is counted)."""
    rows = []
    for rc in SWEEP_RECONFIG_S:
        sw = CircuitSwitch(CircuitConfig(n_circuits=ccfg.n_circuits, gbps=ccfg.gbps, reconfig_s=rc,
                                         propagation_s=ccfg.propagation_s))
        placed = with_fallback(sw.schedule(transfers), transfers, cfg)
        books = sw.finish()
        held, setup = sum(b.release_s - b.up_s for b in books), sum(b.setup_s for b in books)
        used = sum(p.end_s - p.start_s for p in placed if not p.fallback)
        done = {}
        for p in placed:
            r = p.key[1]
            done[r] = max(done.get(r, 0.0), p.arrive_s - r * cfg.round_s)
        rows.append({"reconfig_s": rc, "occupancy": used / held if held else None,
                     "occupancy_incl_setup": used / (held + setup) if held + setup else None,
                     "round_completion_s_p99": float(np.percentile(list(done.values()), 99)),
                     "fell_back_to_packet": sum(1 for p in placed if p.fallback),
                     "deadlines_missed_by_transport": sum(1 for p in placed if not p.on_time)})
    return rows


def _pct(share: float | None) -> str:
    """A share as a percentage; '-' when nothing was booked (no circuit held)."""
    return "-" if share is None else f"{100 * share:.1f} %"


def print_table(out: dict) -> None:
    cols = ("arm", "transport bytes", "flows", "circuit-s held", "circuit-s used", "occupancy while held",
            "occupancy incl. set-up",
            "round completion p50 / p99 s", "updates making their round", "late admitted", "missed by transport",
            "val loss start -> end")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for arm, r in out["arms"].items():
        occ, occ_s = _pct(r["occupancy"]), _pct(r.get("occupancy_incl_setup"))
        held = "-" if r["circuit_s_held"] is None else f"{r['circuit_s_held']:.3g}"
        used = "-" if r["circuit_s_used"] is None else f"{r['circuit_s_used']:.3g}"
        print(f"| {arm} | {r['transport_bytes']:,} | {r['transport_flows']:,} | {held} | {used} | {occ} | {occ_s} | "
              f"{r['round_completion_s_p50']:.3f} / {r['round_completion_s_p99']:.3f} | "
              f"{100 * r['share_made_their_round']:.1f} % | {r['updates_admitted_late']} | "
              f"{r['deadlines_missed_by_transport']} | {r['val_loss_start']:.3f} -> {r['val_loss_end']:.3f} |")


def print_ran_cost(rc: dict) -> None:
    """The RAN's side of the updates: the same xApp loop and RAN model, with and without them."""
    print(f"\nthe updates in the RAN ({rc['scenario']}, {rc['periods']} periods of {rc['period_s'] * 1e3:g} ms, "
          f"{rc['driver']}): {rc['updates_prbs_per_u_slot_mean']:.2f} uplink PRBs per U slot and cell "
          f"(max {rc['updates_prbs_per_u_slot_max']:.0f}), {100 * rc['updates_share_of_ul_prbs']:.2f} % of the "
          f"cells' uplink PRBs; decode {rc['updates_ran_gpu_sm_s']:.2f} SM-s of RAN GPU "
          f"({rc['updates_decode_sm_s_from_bytes']:.2f} from bytes x PUSCH work per byte); training lease "
          f"displaced {rc['training_lease_displaced_sm_s']:.1f} SM-s")
    print("| run | uplink PRBs per U slot (KPM) | RAN GPU SM-s | mean envelope SMs | lease SM-s granted | "
          "training-caused misses | RAN-alone misses |\n|---|---|---|---|---|---|---|")
    for name, r in rc["runs"].items():
        env = "-" if r["envelope_sms_mean"] is None else f"{r['envelope_sms_mean']:.1f}"
        print(f"| {name} | {r['prb_used_ul_per_u_slot_mean']:.2f} | {r['ran_sm_s']:.1f} | {env} | "
              f"{r['lease_sm_s_granted']:.1f} | {r['deadline_misses_attributable_to_training']} | "
              f"{r['deadline_misses_ran_alone']} |")


def plot(out: dict, path: str) -> None:
    """Top: one round's transfer window on the optical arm's circuits. Bottom: circuit occupancy per
    round (bytes on the wire / circuit time held in that round), optical vs always-on."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    opt, aon = out["arms"]["optical"], out["arms"]["always-on"]
    cfg = out["config"]
    R, rs = cfg["rounds"], cfg["round_s"]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 7))
    ivs = opt["intervals"]
    k = 1 if R > 1 else 0
    win = sorted([iv for iv in ivs if k * rs <= iv[1] < (k + 1) * rs] or ivs, key=lambda iv: iv[1])
    # the first burst of that round (sites that closed early would stretch the axis over seconds)
    gap = 10 * cfg["reconfig_s"] + 1e-3
    burst = [win[0]]
    for iv in win[1:]:
        if iv[1] - max(b_[2] for b_ in burst) > gap:
            break
        burst.append(iv)
    win = burst
    t0 = min(iv[1] for iv in win)
    t1 = max(iv[2] for iv in win)
    for c, s0, e, kind in win:
        a.barh(c, (e - s0) * 1e3, left=(s0 - t0) * 1e3, height=0.5,
               color="tab:orange" if kind == "setup" else "tab:blue", edgecolor="k", linewidth=0.3)
    for up, _, _, site, c in opt["booking_spans"]:
        if t0 <= up <= t1:
            a.annotate(site, ((up - t0) * 1e3, c + 0.3), fontsize=8)
    a.set_xlabel(f"ms after {t0:.4f} s (round {k}'s transfer window)")
    a.set_ylabel("circuit")
    a.set_yticks(range(cfg["circuits"]))
    a.set_ylim(-0.5, cfg["circuits"] - 0.2)
    a.set_title(f"optical arm: reconfiguration ({cfg['reconfig_s'] * 1e3:g} ms, orange) and aggregate transfers "
                f"(blue)", fontsize=9)

    def per_round(spans):
        return np.array([sum(max(0.0, min(e, (r + 1) * rs) - max(s0, r * rs)) for s0, e in spans)
                         for r in range(R)]) if spans else np.zeros(R)

    used_o = per_round([(s0, e) for _, s0, e, kind in ivs if kind == "transfer"])
    held_o = per_round([(u, r_) for u, r_, _, _, _ in opt["booking_spans"]])
    setup_o = np.array([sum(st for u, _, st, _, _ in opt["booking_spans"] if r * rs <= u < (r + 1) * rs)
                        for r in range(R)])
    used_a = per_round([(s0, e) for s0, e, _ in aon["transfer_spans"]])
    n_sites = len({site for _, _, site in aon["transfer_spans"]})
    held_a = np.full(R, n_sites * rs)
    x = np.arange(R)
    w = 0.27
    b.bar(x - w, 100 * used_o / np.maximum(held_o, 1e-30), w, label="optical, while held")
    b.bar(x, 100 * used_o / np.maximum(held_o + setup_o, 1e-30), w, label="optical, incl. set-up")
    b.bar(x + w, 100 * used_a / held_a, w, label="always-on circuit per site")
    b.set_yscale("log")
    b.set_ylim(1e-4, 200)
    b.axhline(90, color="k", linestyle=":", linewidth=0.8)
    b.set_xticks(x)
    b.set_xlabel("round")
    b.set_ylabel("circuit occupancy (%)")
    b.legend(fontsize=8, loc="upper center", ncol=3, bbox_to_anchor=(0.5, -0.15))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    for name, default in asdict(d).items():
        flag = "--" + name.replace("_", "-")
        typ = int if name in ("rounds", "ues_per_cell", "local_steps", "circuits", "pretrain_steps", "seed",
                              "max_aggregate_bytes", "n_embd", "lora_rank") else str if name == "compression" else float
        extra = {"choices": ("fp32", "fp16", "topk")} if name == "compression" else {}
        p.add_argument(flag, type=typ, default=default, **extra)
    p.add_argument("--json", default=None, help="write the full result here")
    p.add_argument("--plot", default="federated_occupancy.png", help="circuit occupancy plot (PNG)")


def run(args: argparse.Namespace) -> int:
    from testbed.cli import ROOT, agent_python
    cfg = BenchConfig(**{k: getattr(args, k) for k in asdict(BenchConfig())})
    out = run_bench(cfg, agent_python(), ROOT)
    print_table(out)
    opt, pkt = out["arms"]["optical"], out["arms"]["packet"]
    print("\n| switch reconfiguration | occupancy while held | incl. set-up | round completion p99 s | "
          "fell back to packet | missed by transport |\n|---|---|---|---|---|---|")
    for row in out["reconfig_sweep"]:
        print(f"| {row['reconfig_s'] * 1e3:g} ms | {_pct(row['occupancy'])} | "
              f"{_pct(row['occupancy_incl_setup'])} | {row['round_completion_s_p99']:.3f} | "
              f"{row['fell_back_to_packet']} | {row['deadlines_missed_by_transport']} |")
    print_ran_cost(out["ran_cost"])
    print(f"flows: packet / optical = {pkt['transport_flows'] / max(opt['transport_flows'], 1):.1f}x "
          f"(participating UEs per site per round: {out['participants_per_site_mean']:.1f}; updates that reached "
          f"their gNB: {out['updates_reaching_gnb']} of {pkt['updates_produced']}); seed {cfg.seed}; "
          f"{out['wall_s']:.0f} s")
    if args.plot:
        plot(out, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0
