"""`weaver bench safety`: every fault of `testbed.faults` against the real processes, plus a no-fault baseline.

Each row is one `weaver up` run (the same machinery: testbed world, mini-RIC, the xApp process, one agent
process per site dialling the broker through its TCP proxy), small (1 site x 2 cells, no cross-site tier
by default) and short: an idle probe first (the xApp grants nothing for `--probe` s, so the agent's idle
baseline is measured in the same run), then `--duration` s with the fault in the middle (from 35 %, for
25 %; the RC ACK faults from the first KPM, for 60 %: the xApp sends a control only when an envelope
changes, most of them as KPM starts to flow).

Per row, all from the platform's side:
- training-caused deadline misses by ground truth (after the idle probe; those in it - the agent's own
  start-up work, e.g. its first validation pass, before any lease - in brackets): slots whose RAN demand
  exceeded what the agent process *executed* left it (`testbed.groundtruth`: /proc CPU time at gpu_sms / cores site SMs per
  core), beside the same count against the lease the agent *reported* holding;
- SM·ms executed beyond a lease: per world period, executed SMs minus the SMs of the lease the agent
  reported holding, when positive; max over periods and total. It includes the agent's idle host work,
  so the total above the idle baseline (p90) is given too;
- time from revoke/expiry to the agent idle: from the xApp's revoke instant (its lease for the site, as
  its REST API shows it, polled once a world period, going from > 0 SMs to none) or from a lease's hard
  end (sent_unix_ms + valid_for_ms of the lease the agent holds, when no newer lease reached it by then),
  to the end of the first world period whose executed SMs are at most the idle baseline (p90 + 1 % of the
  GPU). Resolution: one world period (100 ms), plus the REST poll for revokes. Events in the idle probe
  are not counted; an event followed by a new lease (the xApp's, or one reaching the agent) before the
  agent went idle counts as "re-granted first", one after which it never went idle as "never";
- leases granted (the xApp's counter: after an xApp restart, the new instance's) and leases the agent
  was seen holding (distinct lease ids), and tokens trained.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ORDER = ("none", "ack-delay", "ack-loss", "ack-dup", "ack-reorder", "node-restart", "node-lost", "slow-reader",
         "partition", "xapp-stall", "xapp-kill", "green-context-fail")


def fault_spec(name: str, for_s: float) -> str | None:
    """The fault of each row, lasting `for_s` where it has a length."""
    f = f"{for_s:g}"
    return {
        "none": None,
        "ack-delay": f"ack-delay:ms=500,for={f}",
        "ack-loss": f"ack-loss:for={f}",
        "ack-dup": f"ack-dup:for={f}",
        "ack-reorder": f"ack-reorder:for={f}",
        "node-restart": "node-restart:site=0,down=0.5",
        "node-lost": f"node-lost:site=0,down={f}",
        "slow-reader": f"slow-reader:site=0,for={f},rate=256",
        "partition": f"partition:site=0,for={f}",
        "xapp-stall": f"xapp-stall:ms={for_s * 1000:g}",
        "xapp-kill": "xapp-kill:down=1",
        "green-context-fail": "green-context-fail",
    }[name]


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else math.nan


def _median(xs: list) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.median(xs)) if xs else math.nan


def analyse(summary: dict, gpu_sms: dict[str, float]) -> dict:
    """Per-row figures from a `record_series` run summary (see the module docstring)."""
    rows = summary.get("series", {}).get("rows", [])
    probe_end = summary.get("idle_probe_end_unix") or 0.0
    leases = summary.get("xapp_leases", {}).get("rows", [])
    out_sites = {}
    to_idle_ms: list[float] = []
    censored = 0
    beyond_max = beyond_total = above_idle_total = 0.0
    misses_post = misses_probe = 0
    regranted = 0
    leases_seen = 0
    for sid, site in summary["sites"].items():
        i = int(sid.rsplit("-", 1)[1])
        gt = site.get("ground_truth", {})
        base = gt.get("idle_baseline_sms_p90")
        base = base if base is not None and not (isinstance(base, float) and math.isnan(base)) else math.nan
        thr = (base if not math.isnan(base) else 0.0) + 0.01 * gpu_sms.get(sid, 100.0)
        mine = [r for r in rows if r[1] == i]
        post = [(r, mine[k - 1][3] if k else 0.0) for k, r in enumerate(mine) if r[0] >= probe_end]
        misses_probe += sum(r[8] for r in mine if r[0] < probe_end)
        misses_post += sum(r[8] for r in mine if r[0] >= probe_end)
        for (_t, _, sms, lease, _, _, dt, _, _), before in post:
            held = max(lease, before)   # the lease reported at the period's start or end, the larger
            b = max(sms - held, 0.0) * dt * 1000.0
            beyond_total += b
            beyond_max = max(beyond_max, b)
            above_idle_total += max(sms - held - (0.0 if math.isnan(base) else base), 0.0) * dt * 1000.0
        leases_seen += len({r[4] for r in mine if r[4] and r[3] > 0})
        # events: the xApp's revokes, then hard ends that passed without a newer lease reaching the agent
        events: list[tuple[float, str, float]] = []   # (instant, kind, until: a new lease ends the wait)
        prev = None
        grants = [t for t, s_id, sms in leases if s_id == sid and sms > 0]
        for t, s_id, sms in leases:
            if s_id != sid:
                continue
            if prev is not None and prev > 0 and sms == 0 and t >= probe_end:
                events.append((t, "revoke", min((g for g in grants if g > t), default=math.inf)))
            prev = sms
        first_seen: dict[str, float] = {}   # lease id -> when the agent was first seen holding it
        hard_end: dict[str, float] = {}     # lease id -> its hard end (unix s, the broker's clock)
        latest_end: dict[str, float] = {}   # ... the latest it can be (receipt is known to a world period)
        for t, _, _sms, _lease, lid, end_ms, dt, valid_ms, _ in mine:
            if not lid:
                continue
            first_seen.setdefault(lid, t)
            if end_ms:      # the lease's own hard end (sent_unix_ms + valid_for_ms)
                hard_end[lid] = latest_end[lid] = end_ms / 1000.0
            elif valid_ms and lid not in hard_end:
                # a broker that sends no sent_unix_ms: the agent's receipt + valid_for_ms, the receipt within
                # the period it was first seen in: the event is at the earliest end (the longer wait), and
                # only if no newer lease was seen by the latest (no event from the period's uncertainty)
                hard_end[lid] = t - dt + valid_ms / 1000.0
                latest_end[lid] = t + valid_ms / 1000.0
        order = sorted(first_seen, key=first_seen.get)
        last_t = mine[-1][0] if mine else 0.0
        for k, (t, kind, until) in enumerate(events):   # ... or a lease reaching the agent after the revoke
            events[k] = (t, kind, min(until, min((f for f in first_seen.values() if f > t), default=math.inf)))
        for k, lid in enumerate(order):
            if lid not in hard_end:
                continue
            end = hard_end[lid]
            next_seen = first_seen[order[k + 1]] if k + 1 < len(order) else math.inf
            # expired: nothing newer had reached the agent by the hard end (a revoke while it was held, or just
            # before it was first seen, is the event instead)
            if next_seen > latest_end[lid] and probe_end <= end <= last_t \
                    and not any(kind == "revoke" and first_seen[lid] - 0.2 <= e <= end for e, kind, _ in events):
                events.append((end, "expiry", next_seen))
        waits = []
        for ev, _kind, until in sorted(events):
            idle = next((r for r in mine if ev <= r[0] and r[2] <= thr), None)
            if idle is not None and idle[0] <= until + 0.05:  # idle in the period that ends as the new lease is seen
                waits.append((idle[0] - ev) * 1000.0)
            elif until <= last_t:
                regranted += 1   # a new lease came before the agent was idle: it may work again
            else:
                censored += 1
        to_idle_ms += waits
        out_sites[sid] = {"idle_baseline_sms_p90": base, "idle_threshold_sms": thr,
                          "events": [{"t_unix": e, "kind": k, "until_unix": None if math.isinf(u) else u}
                                     for e, k, u in sorted(events)],
                          "revoke_or_expiry_to_idle_ms": waits}
    t = summary["totals"]
    return {
        "deadline_misses": t["deadline_misses"],
        "deadline_misses_attributable_to_training": t["deadline_misses_attributable_to_training"],
        "deadline_misses_attributable_to_training_after_probe": misses_post,
        "deadline_misses_attributable_to_training_in_probe": misses_probe,
        "deadline_misses_attributable_to_reported_lease": t["deadline_misses_attributable_to_reported_lease"],
        "sm_ms_beyond_lease_max": beyond_max,
        "sm_ms_beyond_lease_total": beyond_total,
        "sm_ms_beyond_lease_above_idle_total": above_idle_total,
        "revoke_or_expiry_events": sum(len(s["events"]) for s in out_sites.values()),
        "revoke_or_expiry_to_idle_ms_p50": _pct(to_idle_ms, 50),
        "revoke_or_expiry_to_idle_ms_p99": _pct(to_idle_ms, 99),
        "revoke_or_expiry_to_idle_ms_max": max(to_idle_ms) if to_idle_ms else math.nan,
        "revoke_or_expiry_never_idle": censored,
        "revoke_or_expiry_regranted_before_idle": regranted,
        "idle_baseline_sms_median": _median([s.get("ground_truth", {}).get("idle_baseline_sms_median")
                                             for s in summary["sites"].values()]),
        "leases_granted": t["leases_granted"],
        "leases_seen_by_agent": leases_seen,
        "tokens_trained": t["tokens_trained"],
        "sm_seconds_executed": t["sm_seconds_executed"],
        "sm_seconds_held_by_agent": t["sm_seconds_held_by_agent"],
        "sites": out_sites,
    }


def run_one(name: str, args, log_out) -> dict:
    from testbed.faults import parse_faults
    from testbed.up import UpConfig, run_up, scenario_for

    for_s = max(1.0, round(args.duration * 0.25, 1))
    at_s = round(args.duration * 0.35, 1)
    if name.startswith("ack-"):
        # the xApp sends RC control only when an envelope changes: a handful per run, most of them as KPM
        # starts to flow. An ACK fault therefore starts with KPM (the end of the idle probe) and lasts 60 %
        at_s, for_s = 0.0, round(args.duration * 0.6, 1)
    spec = fault_spec(name, for_s)
    faults = parse_faults([spec] if spec else [], at_s)
    run_dir = Path(tempfile.mkdtemp(prefix=f"weaver-safety-{name}-"))
    cfg = UpConfig(sites=args.sites, cells=args.cells, duration_s=args.probe + args.duration, seed=args.seed,
                   run_dir=run_dir, cross_site=False, faults=faults, fault_at_s=at_s, record_series=True,
                   idle_probe_s=args.probe)
    root = logging.getLogger()
    handlers = list(root.handlers)
    t0 = time.monotonic()
    try:
        summary = asyncio.run(run_up(cfg, out=log_out))
    finally:
        for h in root.handlers[len(handlers):]:
            root.removeHandler(h)
            h.close()
    gpu = {f"site-{i}": float(s.gpu_sms) for i, s in enumerate(scenario_for(cfg).sites)}
    row = {"fault": name, "spec": spec or "", "wall_s": round(time.monotonic() - t0, 1),
           "timeline": summary.get("faults", []), "run_dir": str(run_dir)}
    tl = row["timeline"]
    row["applied"] = all(e["applicable"] for e in tl) if tl else name == "none"
    row["note"] = "; ".join(e["note"] for e in tl if e.get("note"))
    if spec and not tl:
        row["note"] = "fault did not start within the run"
    row["gpu_sms"] = gpu
    row.update(analyse(summary, gpu))
    row["summary"] = {k: v for k, v in summary.items() if k not in ("series", "xapp_leases")}
    row["series"] = summary.get("series")            # per world period and site: the ground truth beside the lease
    row["xapp_leases"] = summary.get("xapp_leases")  # the xApp's lease per site, at each change
    return row


def _f(x, fmt="{:.0f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def table(rows: list[dict]) -> str:
    head = ("| fault | applied | training misses by ground truth (in idle probe) | by reported lease | beyond lease max SM·ms | total SM·s "
            "| idle baseline SMs (median) | above idle SM·s | revoke/expiry -> idle p50 / p99 / max ms (events, re-granted first, never) | leases granted (seen) "
            "| tokens | note |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['fault']} | {'yes' if r['applied'] else 'no'} "
            f"| {r['deadline_misses_attributable_to_training_after_probe']} "
            f"({r['deadline_misses_attributable_to_training_in_probe']}) "
            f"| {r['deadline_misses_attributable_to_reported_lease']} | {_f(r['sm_ms_beyond_lease_max'])} "
            f"| {_f(r['sm_ms_beyond_lease_total'] / 1000, '{:.1f}')} "
            f"| {_f(r.get('idle_baseline_sms_median'), '{:.1f}')} "
            f"| {_f(r['sm_ms_beyond_lease_above_idle_total'] / 1000, '{:.1f}')} "
            f"| {_f(r['revoke_or_expiry_to_idle_ms_p50'])} / {_f(r['revoke_or_expiry_to_idle_ms_p99'])} / "
            f"{_f(r['revoke_or_expiry_to_idle_ms_max'])} ({r['revoke_or_expiry_events']}, "
            f"{r['revoke_or_expiry_regranted_before_idle']}, {r['revoke_or_expiry_never_idle']}) | {r['leases_granted']} ({r['leases_seen_by_agent']}) "
            f"| {r['tokens_trained']} | {r['note'][:90]} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--faults", default=",".join(ORDER[1:]),
                        help=f"comma-separated rows to run besides the baseline (default all: {','.join(ORDER[1:])})")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per row after the idle probe, the fault starting at 35 %% and lasting 25 %% "
                             "(default 16; --quick 8)")
    parser.add_argument("--probe", type=float, default=None, help="idle probe seconds per row (default 3; --quick 2)")
    parser.add_argument("--sites", type=int, default=1)
    parser.add_argument("--cells", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="CI size: short rows")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--verbose", action="store_true", help="echo every run's status lines")
    parser.add_argument("--from-json", default=None, metavar="FILE",
                        help="run nothing: analyse the runs recorded in an earlier --json FILE again and print the table")


def reanalyse(doc: dict) -> list[dict]:
    """The rows of an earlier `--json` document, analysed again from their recorded series."""
    rows = []
    for r in doc["rows"]:
        summary = {**r["summary"], "series": r["series"], "xapp_leases": r["xapp_leases"]}
        gpu = {sid: float(site.get("ground_truth", {}).get("gpu_sms", 0) or 132.0)
               for sid, site in summary["sites"].items()}
        rows.append({**r, **analyse(summary, r.get("gpu_sms", gpu))})
    return rows


def run(args) -> int:
    from testbed.up import _json_safe

    if args.from_json:
        doc = json.loads(Path(args.from_json).read_text())
        rows = reanalyse(doc)
        print(table(rows))
        if args.json:
            Path(args.json).write_text(json.dumps(_json_safe({**doc, "rows": rows}), indent=2))
        return 0

    args.duration = args.duration if args.duration is not None else (8.0 if args.quick else 16.0)
    args.probe = args.probe if args.probe is not None else (2.0 if args.quick else 3.0)
    names = [n.strip() for n in args.faults.split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        print(f"weaver bench safety: unknown fault(s) {unknown} (one of {', '.join(ORDER[1:])})", file=sys.stderr)
        return 2
    log_out = (lambda s: print("  " + s, flush=True)) if args.verbose else (lambda s: None)
    rows = []
    t0 = time.monotonic()
    for name in ["none", *names]:
        print(f"weaver bench safety: {name} ...", flush=True)
        row = run_one(name, args, log_out)
        rows.append(row)
        print(f"weaver bench safety: {name} done in {row['wall_s']:.0f}s: training misses (truth) "
              f"{row['deadline_misses_attributable_to_training_after_probe']} "
              f"(+{row['deadline_misses_attributable_to_training_in_probe']} in the idle probe), beyond lease max "
              f"{row['sm_ms_beyond_lease_max']:.0f} SM·ms, to idle max {_f(row['revoke_or_expiry_to_idle_ms_max'])} ms",
              flush=True)
    print()
    print(table(rows))
    print(f"\n{len(rows)} runs in {time.monotonic() - t0:.0f}s; {args.sites} site(s) x {args.cells} cells, "
          f"{args.probe:g} s idle probe + {args.duration:g} s per run")
    if args.json:
        doc = {"bench": "safety", "sites": args.sites, "cells": args.cells, "probe_s": args.probe,
               "duration_s": args.duration, "seed": args.seed, "definitions": __doc__, "rows": rows}
        Path(args.json).write_text(json.dumps(_json_safe(doc), indent=2))
    return 0
