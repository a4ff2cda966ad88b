"""`weaver bench sim`: simulated time per wall-clock second of the RAN model (3 sites x 4 cells).

The baseline is real time: a ratio of 1.0 means the model just keeps up with the radio. Rows vary the
period (slots advanced per model call: 200 is what the E2 node simulator uses, one 100 ms KPM period,
without the histograms), the envelope (compute-aware stage on/off) and the bytes-weighted delay
histograms (`weaver bench policies` uses them); the target is
>= 200x real time (400,000 slots of 3 sites x 4 cells per second) on one core. Ratios are given by
wall clock and by process CPU time: on a shared host the wall figure mostly measures the load.
"""
from __future__ import annotations

import json
import os
import sys
import time

from testbed import scenarios
from testbed.model import SLOT_S, RanModel


def measure(scenario_name: str, period_slots: int, envelope: float | None, sim_seconds: float, seed: int,
            track_delay: bool = True) -> dict:
    sc = scenarios.get(scenario_name, period_slots=period_slots)
    model = RanModel(sc, seed, track_delay=track_delay)
    for s in range(sc.n_sites):
        model.set_envelope(s, envelope)
    model.step_period()  # warm-up (first-call allocations)
    n = max(1, int(round(sim_seconds / (period_slots * SLOT_S))))
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    for _ in range(n):
        model.step_period()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    slots = n * period_slots
    return {"scenario": scenario_name, "sites": sc.n_sites, "cells_per_site": sc.n_cells,
            "period_slots": period_slots, "envelope_sms": envelope, "delay_histograms": track_delay, "slots": slots,
            "simulated_s": slots * SLOT_S, "wall_s": wall, "cpu_s": cpu, "slots_per_s": slots / wall,
            "realtime_factor": slots * SLOT_S / wall, "realtime_factor_cpu": slots * SLOT_S / cpu,
            "ten_minutes_wall_s": 600 * wall / (slots * SLOT_S), "ten_minutes_cpu_s": 600 * cpu / (slots * SLOT_S)}


def add_arguments(parser) -> None:
    parser.add_argument("--scenario", default="demo", help="named scenario (default: 3 sites x 4 cells)")
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated seconds per row")
    parser.add_argument("--periods", type=int, nargs="*", default=[200, 2000], help="slots per step_period call")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None)


def run(args) -> int:
    try:
        scenarios.check(args.scenario)
    except ValueError as exc:
        print(f"weaver bench sim: {exc}", file=sys.stderr)
        return 2
    rows = []
    for period in args.periods:
        for envelope in (None, 24.0):
            for track in (True, False):
                rows.append(measure(args.scenario, period, envelope, args.seconds, args.seed, track))
    print(f"{'period':>7} {'envelope':>9} {'delay hist':>10} {'slots':>9} {'wall s':>8} {'cpu s':>7} {'slots/s':>10} "
          f"{'x real time':>12} {'x (cpu time)':>13} {'10 min in (cpu)':>16}")
    for r in rows:
        env = "-" if r["envelope_sms"] is None else f"{r['envelope_sms']:.0f}"
        print(f"{r['period_slots']:7d} {env:>9} {'yes' if r['delay_histograms'] else 'no':>10} {r['slots']:9d} "
              f"{r['wall_s']:8.2f} {r['cpu_s']:7.2f} {r['slots_per_s']:10.0f} {r['realtime_factor']:11.1f}x "
              f"{r['realtime_factor_cpu']:12.1f}x {r['ten_minutes_cpu_s']:15.2f}s")
    best = max(rows, key=lambda r: r["realtime_factor_cpu"])
    met = sum(r["realtime_factor_cpu"] >= 200 for r in rows)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"baseline: real time (1.0x); target >= 200x on one core: {met} of {len(rows)} rows by CPU time; best "
          f"{best['realtime_factor_cpu']:.1f}x cpu / {best['realtime_factor']:.1f}x wall (period {best['period_slots']}, "
          f"delay hist {'on' if best['delay_histograms'] else 'off'}); seed {args.seed}; load average {load}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "sim", "seed": args.seed, "target_realtime_factor": 200,
                       "load_average_1m": load, "rows": rows, "rows_meeting_target_cpu": met,
                       "best_realtime_factor": best["realtime_factor"],
                       "best_realtime_factor_cpu": best["realtime_factor_cpu"]}, f, indent=1)
    return 0
