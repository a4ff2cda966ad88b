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
- time from revoke/expiry to the agent idle. The instants come from the xApp's own record of its
  decisions (`/api/v1/sites/{site}/series`, read at the end of the run and just before an xApp kill;
  `testbed.up.XappViews`), to 1 ms: a revoke is its first decision without a grant after one with a grant;
  a lease's hard end is the instant of the decision that issued it (lease seq k of an epoch: that
  epoch's k-th decision with a grant) + valid_for, and it is an expiry when no newer lease can have
  reached the agent by then (a revoke while it was held is the event instead). Where the xApp's record
  is lost (a killed xApp's last leases) the hard end is the agent's receipt + valid_for, known to a world
  period (`events_with_instant_known_to_a_period_only`). Idle is measured by the platform two ways:
  - from a 2 ms trace of the agent process's CPU clock (`testbed.groundtruth.CpuTrace`): the start of the
    first 10 ms window whose CPU rate is back at the idle baseline (the p99 of that rate in the idle
    probe: ~0.1 core, its polls and heartbeats, + 0.1 core, at most 0.5), no window in the next 100 ms
    above 0.5 core (work resumed, e.g. after a duty cycle's gap; a training agent reads ~1 core, a burst of
    host work such as a reconnect less) (`idle_from`). Resolution: the trace's p99
    sample gap + the 1 ms of the event instant (`resolution_ms`); the trace thread's own cost is reported
    (`trace_thread_cpu_fraction_of_one_core`, `trace_cpu_us_per_sample`);
  - at the world's period: the end of the first period whose executed SMs are at most the idle baseline
    (p90 + 1 % of the GPU): 100 ms resolution (`revoke_or_expiry_to_idle_ms_*`).
  Events in the idle probe are not counted; an event followed by a new lease before the agent went idle
  counts as "re-granted first", one after which it never went idle as "never";
- revokes while the agent works, and how long until its work stopped (`revoke_while_busy_to_stopped`).
  The xApp decides on its own 100 ms grid, and the agent spends its period's duty budget at the front of
  its period, which starts with the lease's arrival: a revoke at a decision finds the agent idle already
  (`events_agent_already_idle` above), so the waits above say nothing about stopping work. Two revokes
  land off that grid, each with a platform-side instant: every control-loop revoke the xApp logs (1 ms;
  the `revoke-mid-period` row times stale-KPM revokes, last KPM + 2 periods, into the agent's busy
  stretch, several per run) and the xApp's SIGTERM at the end of every run (sent while the agent works,
  `testbed.up.end_revoke`; its revoke follows within the xApp's signal handling, so the wait from the
  signal is an upper bound). An event counts as busy when the agent's CPU rate over the 3 ms before it
  is above half a core; the wait ends where its traced work stops (`work_stopped_at`: the first trace
  interval at or below half a core with no 10 ms window above it for 100 ms, placed inside the interval
  by the CPU time spent in it). Resolution: the trace's p99 sample gap + the instant's 1 ms. The target:
  one planned micro-batch, the enforcer's edge fraction 0.2 x the 100 ms period = 20 ms;
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

from testbed.groundtruth import idle_from, rate_before, window_rates, work_stopped_at

ORDER = ("none", "ack-delay", "ack-loss", "ack-dup", "ack-reorder", "node-restart", "node-lost", "slow-reader",
         "partition", "revoke-mid-period", "xapp-stall", "xapp-kill", "green-context-fail")


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
        "revoke-mid-period": f"revoke-mid-period:site=0,for={f}",
        "xapp-stall": f"xapp-stall:ms={for_s * 1000:g}",
        "xapp-kill": "xapp-kill:down=1",
        "green-context-fail": "green-context-fail",
    }[name]


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else math.nan


def _median(xs: list) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.median(xs)) if xs else math.nan


WINDOW_S = 0.010   # the fine measure's quiet window: half the target (one planned micro-batch, 20 ms)
HOLD_S = 0.100     # ... and how long the quiet must last (one world period: a duty cycle's gap is not idle)
IDLE_MARGIN_CORES = 0.10   # idle: CPU rate over a window <= the idle probe's p99 over the same window + 0.1 core
IDLE_CAP_CORES = 0.5       # ... and never above half a core (a probe with start-up work in it must not hide work)
IDLE_DEFAULT_CORES = 0.2   # without an idle probe in the trace
WORKING_CORES = 0.5        # work resumed: a window more than half on CPU (a host burst, e.g. a reconnect, is less)
BUSY_SPAN_S = 0.003        # busy at an instant: the CPU rate over the last 3 ms before it above WORKING_CORES


def _idle_threshold(t: np.ndarray, rates: np.ndarray, probe_end: float) -> tuple[float, float]:
    """(p99 of the agent's CPU rate over WINDOW_S windows in the idle probe, the idle threshold), cores.
    The agent's idle host work comes in bursts (its inspect and status polls, heartbeats): about 1 ms of
    CPU every 100 ms, so a 10 ms window of an idle agent reads up to ~0.15 core; training reads ~1."""
    m = (t >= (t[0] + 0.5 if len(t) else 0.0)) & (t <= probe_end - WINDOW_S) & np.isfinite(rates)
    if not probe_end or m.sum() < 50:
        return math.nan, IDLE_DEFAULT_CORES
    p99 = float(np.percentile(rates[m], 99))
    return p99, min(p99 + IDLE_MARGIN_CORES, IDLE_CAP_CORES)


def _xapp_instances(summary: dict, sid: str) -> list[dict]:
    """Per xApp instance, a site's decisions [(t_unix, grant_sms)] and how its grants map onto lease
    seqs: `first_seq`, the seq of its first grant in the record (None: unknown)."""
    out = []
    for k, inst in enumerate((summary.get("xapp_views") or {}).get("instances", [])):
        site = inst["sites"].get(sid, {})
        vs = [(float(t), int(g)) for t, g in site.get("views", [])]
        n = sum(1 for _, g in vs if g > 0)
        seq = site.get("lease_seq")
        first = seq - n + 1 if seq is not None else (1 if k == 0 else None)
        out.append({"epoch": int(inst["epoch"]), "views": vs, "first_seq": first,
                    "grants": [t for t, g in vs if g > 0]})
    return out


def _leases(mine: list, instances: list[dict]):
    """The leases the agent was seen holding: (first seen {lease id: (t, period, valid_for_ms)}, the
    broker's stamped hard ends, issued(lid): the instant of the xApp decision that issued it or None,
    received_from(lid): the earliest the agent can have received it, next_lease(t): the earliest a lease
    newer than instant t can have reached the agent (an xApp grant or a lease first seen after t))."""
    all_grants = sorted(t for inst in instances for t in inst["grants"])
    first_seen: dict[str, tuple[float, float, int]] = {}   # lease id -> (first seen, period, valid_for_ms)
    stamped: dict[str, float] = {}                          # lease id -> sent_unix_ms + valid_for_ms, if the agent shows it
    for t, _, _sms, _lease, lid, end_ms, dt, valid_ms, _ in mine:
        if lid and lid not in first_seen:
            first_seen[lid] = (t, dt, valid_ms or 300)
        if lid and end_ms:
            stamped[lid] = end_ms / 1000.0

    def issued(lid: str) -> float | None:   # the instant of the xApp decision that issued it
        try:
            _, e, k = lid.rsplit(".", 2)
            e, k = int(e), int(k)
        except ValueError:
            return None
        for inst in instances:
            if inst["epoch"] == e and inst["first_seq"] is not None \
                    and 0 <= k - inst["first_seq"] < len(inst["grants"]):
                return inst["grants"][k - inst["first_seq"]]
        return None

    def received_from(lid: str) -> float:     # the earliest the agent can have received it
        t, dt, _ = first_seen[lid]
        i = issued(lid)
        return max(t - dt, i if i is not None else -math.inf)

    def next_lease(t: float) -> float:
        return min(min((g for g in all_grants if g > t), default=math.inf),
                   min((received_from(lid) for lid in first_seen if received_from(lid) > t), default=math.inf))

    return first_seen, stamped, issued, received_from, next_lease


def _events(mine: list, instances: list[dict], probe_end: float) -> list[dict]:
    """Revokes and expiries of one site (module docstring), each with the instant the agent must be idle
    from, how that instant is known, and `until`: the earliest a newer lease can have reached the agent."""
    revokes = []
    for inst in instances:
        vs = inst["views"]
        for (_, g0), (t, g) in zip(vs, vs[1:], strict=False):
            if g0 > 0 and g == 0 and t >= probe_end:
                revokes.append(t)
    first_seen, stamped, issued, received_from, next_lease = _leases(mine, instances)
    order = sorted(first_seen, key=lambda lid: first_seen[lid][0])
    out = [{"t_unix": t, "kind": "revoke", "instant": "xapp decision (1 ms)", "until_unix": next_lease(t)}
           for t in revokes]
    last_t = mine[-1][0] if mine else 0.0
    for k, lid in enumerate(order):
        t_seen, dt, valid_ms = first_seen[lid]
        i = issued(lid)
        if i is not None:
            end, latest, how = i + valid_ms / 1000.0, i + valid_ms / 1000.0, "xapp decision + valid_for (1 ms)"
        elif lid in stamped:   # the broker's stamp, as the agent's status shows it
            end, latest, how = stamped[lid], stamped[lid], "lease sent_unix_ms + valid_for (1 ms)"
        else:   # an xApp whose decisions are lost (killed): the agent's receipt, known to a world period
            end, latest = t_seen - dt + valid_ms / 1000.0, t_seen + valid_ms / 1000.0
            how = f"receipt + valid_for ({dt * 1000:.0f} ms)"
        nxt = received_from(order[k + 1]) if k + 1 < len(order) else math.inf
        # expired: nothing newer can have reached the agent by the hard end (a revoke while it was held is
        # the event instead)
        if nxt > latest and probe_end <= end <= last_t \
                and not any(t_seen - 0.2 <= r <= end for r in revokes):
            out.append({"t_unix": end, "kind": "expiry", "instant": how, "until_unix": nxt})
    return sorted(out, key=lambda e: e["t_unix"])


def _period_wait(mine: list, ev: dict, thr_sms: float) -> float | str:
    """Event -> the end of the first world period at or below the idle threshold (100 ms resolution)."""
    idle = next((r for r in mine if ev["t_unix"] <= r[0] and r[2] <= thr_sms), None)
    if idle is not None and idle[0] <= ev["until_unix"] + 0.05:  # idle in the period that ends as the new lease is seen
        return (idle[0] - ev["t_unix"]) * 1000.0
    return "regranted" if ev["until_unix"] <= (mine[-1][0] if mine else 0.0) else "never"


def _last_work_before(trace, ev: dict) -> float | None:
    """How long before the event the agent last worked (a window above WORKING_CORES ended), ms: an agent
    idle at the event already (e.g. its period's budget spent before the xApp's next decision) says 0 ms
    to idle without having had to stop anything."""
    t, _, rates = trace
    if not len(t):
        return None
    busy = np.flatnonzero((t < ev["t_unix"]) & (rates > WORKING_CORES))
    last = t[busy[-1]] + WINDOW_S if len(busy) else t[0]   # never worked in the trace: idle since its start
    return (ev["t_unix"] - last) * 1000.0


def _fine_wait(trace, ev: dict, thr_cores: float) -> float | str:
    """Event -> the first instant the agent's traced CPU rate is at its idle baseline (`idle_from`)."""
    t, cpu, rates = trace
    idle = idle_from(t, cpu, ev["t_unix"], thr_cores, WINDOW_S, HOLD_S, ev["until_unix"], rates,
                     hold_threshold_cores=max(WORKING_CORES, thr_cores))
    if idle is not None:
        return (idle - ev["t_unix"]) * 1000.0
    return "regranted" if len(t) and ev["until_unix"] <= t[-1] else "never"


def _busy_revokes(summary: dict, sid: str, mine: list, instances: list[dict], trace, probe_end: float) -> list[dict]:
    """Revokes whose instant the platform knows off the xApp's decision grid, and whether the agent was at
    work then (its CPU rate over the last BUSY_SPAN_S above WORKING_CORES: `rate_before`); for those, how
    long until its work stopped (`work_stopped_at`). The instants: every control-loop revoke of the site
    the xApp logged (1 ms; a stale-KPM revoke comes at the last KPM + 2 periods, off the decision grid:
    the `revoke-mid-period` fault times it into the agent's work), and the xApp's SIGTERM at the end of
    the run (`testbed.up.end_revoke`: sent while the agent works; the xApp's revoke follows within its
    signal handling, so the wait measured from the signal is an upper bound)."""
    next_lease = _leases(mine, instances)[4]
    evs = [{"t_unix": float(t), "kind": f"revoke ({reason})", "instant": "xapp log (1 ms)", "until_unix": next_lease(t)}
           for t, site, reason in (summary.get("xapp_revokes") or {}).get("rows", [])
           if site == sid and t >= probe_end]
    end = summary.get("end_revoke") or {}
    if end.get("sigterm_unix"):
        evs.append({"t_unix": float(end["sigterm_unix"]), "kind": "revoke (xapp-shutdown)",
                    "instant": "SIGTERM to the xApp (upper bound)", "until_unix": math.inf})
    t, cpu, rates = trace
    for e in evs:
        r = rate_before(t, cpu, e["t_unix"], BUSY_SPAN_S) if len(t) > 1 else None
        e["rate_before_cores"] = r
        e["busy"] = r is not None and r > WORKING_CORES
        e["to_stopped_ms"] = None
        if e["busy"]:
            stop = work_stopped_at(t, cpu, e["t_unix"], e["until_unix"], WORKING_CORES, WINDOW_S, HOLD_S, rates)
            e["to_stopped_ms"] = ((stop - e["t_unix"]) * 1000.0 if stop is not None
                                  else "regranted" if e["until_unix"] <= t[-1] else "never")
    return sorted(evs, key=lambda e: e["t_unix"])


def _stats(waits: list) -> dict:
    ms = [w for w in waits if not isinstance(w, str)]
    return {"p50_ms": _pct(ms, 50), "p99_ms": _pct(ms, 99), "max_ms": max(ms) if ms else math.nan,
            "measured": len(ms), "regranted_before_idle": waits.count("regranted"), "never_idle": waits.count("never")}


def analyse(summary: dict, gpu_sms: dict[str, float]) -> dict:
    """Per-row figures from a `record_series` run summary (see the module docstring)."""
    rows = summary.get("series", {}).get("rows", [])
    probe_end = summary.get("idle_probe_end_unix") or 0.0
    ctrace = summary.get("cpu_trace") or {}
    out_sites = {}
    period_waits: list = []
    fine_waits: list = []
    busy_events: list = []
    beyond_max = beyond_total = above_idle_total = 0.0
    misses_post = misses_probe = 0
    leases_seen = 0
    for sid, site in summary["sites"].items():
        i = int(sid.rsplit("-", 1)[1])
        gt = site.get("ground_truth", {})
        base = gt.get("idle_baseline_sms_p90")
        base = base if base is not None and not (isinstance(base, float) and math.isnan(base)) else math.nan
        gpu = gpu_sms.get(sid, 100.0)
        thr = (base if not math.isnan(base) else 0.0) + 0.01 * gpu
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
        events = _events(mine, _xapp_instances(summary, sid), probe_end)
        pts = np.asarray(ctrace.get("sites", {}).get(sid, []), dtype=float).reshape(-1, 2)
        trace = (pts[:, 0], pts[:, 1], window_rates(pts[:, 0], pts[:, 1], WINDOW_S))
        idle_p99, thr_cores = _idle_threshold(trace[0], trace[2], probe_end)
        pw = [_period_wait(mine, ev, thr) for ev in events]
        fw = [_fine_wait(trace, ev, thr_cores) for ev in events] if len(pts) else ["never"] * len(events)
        lw = [_last_work_before(trace, ev) for ev in events]
        bw = _busy_revokes(summary, sid, mine, _xapp_instances(summary, sid), trace, probe_end)
        busy_events += bw
        period_waits += pw
        fine_waits += fw
        out_sites[sid] = {"idle_baseline_sms_p90": base, "idle_threshold_sms": thr,
                          "idle_probe_window_rate_cores_p99": idle_p99, "idle_threshold_cores": thr_cores,
                          "events": [{**e, "until_unix": None if math.isinf(e["until_unix"]) else e["until_unix"],
                                      "to_idle_ms_at_period": w, "to_idle_ms_traced": f,
                                      "agent_last_worked_ms_before_event": lw_}
                                     for e, w, f, lw_ in zip(events, pw, fw, lw, strict=True)],
                          "revoke_or_expiry_to_idle_ms": [w for w in pw if not isinstance(w, str)],
                          "revokes_off_the_decision_grid": [{**e, "until_unix": None if math.isinf(e["until_unix"])
                                                             else e["until_unix"]} for e in bw]}
    t = summary["totals"]
    ps, fs = _stats(period_waits), _stats(fine_waits)
    ov = ctrace.get("overhead", {})
    n_events = sum(len(s["events"]) for s in out_sites.values())
    coarse = sum(1 for s in out_sites.values() for e in s["events"] if e["instant"].startswith("receipt"))
    bs = _stats([e["to_stopped_ms"] for e in busy_events if e["busy"]])
    busy = {
        **bs, "revokes": len(busy_events), "busy_at_instant": sum(1 for e in busy_events if e["busy"]),
        "busy_at_instant_stale_kpm": sum(1 for e in busy_events if e["busy"] and "stale-kpm" in e["kind"]),
        "busy_at_instant_xapp_shutdown": sum(1 for e in busy_events if e["busy"] and "shutdown" in e["kind"]),
        "not_traced_at_instant": sum(1 for e in busy_events if e["rate_before_cores"] is None),
        "resolution_ms": ov.get("sample_gap_ms_p99", math.nan) + 1.0,   # + the instant's 1 ms (the log's)
        "busy": f"CPU rate over the last {BUSY_SPAN_S * 1000:g} ms before the instant above {WORKING_CORES:g} core",
        "stopped": f"the first trace interval after the instant at or below {WORKING_CORES:g} core with no "
                   f"{WINDOW_S * 1000:g} ms window above it in the next {HOLD_S * 1000:g} ms, placed inside the "
                   "interval by the CPU time spent in it",
        "target_ms": 0.2 * 100.0}   # one planned micro-batch: the enforcer's edge fraction x the 100 ms period
    return {
        "revoke_while_busy_to_stopped": busy,
        "deadline_misses": t["deadline_misses"],
        "deadline_misses_attributable_to_training": t["deadline_misses_attributable_to_training"],
        "deadline_misses_attributable_to_training_after_probe": misses_post,
        "deadline_misses_attributable_to_training_in_probe": misses_probe,
        "deadline_misses_attributable_to_reported_lease": t["deadline_misses_attributable_to_reported_lease"],
        "sm_ms_beyond_lease_max": beyond_max,
        "sm_ms_beyond_lease_total": beyond_total,
        "sm_ms_beyond_lease_above_idle_total": above_idle_total,
        "revoke_or_expiry_events": n_events,
        # at the world's period (100 ms resolution)
        "revoke_or_expiry_to_idle_ms_p50": ps["p50_ms"],
        "revoke_or_expiry_to_idle_ms_p99": ps["p99_ms"],
        "revoke_or_expiry_to_idle_ms_max": ps["max_ms"],
        "revoke_or_expiry_never_idle": ps["never_idle"],
        "revoke_or_expiry_regranted_before_idle": ps["regranted_before_idle"],
        # from the 2 ms CPU trace
        "revoke_or_expiry_to_idle_traced": {
            **fs, "events": n_events, "events_with_instant_known_to_a_period_only": coarse,
            # events at which the agent was not working already (its last work ended before the instant)
            "events_agent_already_idle": sum(1 for s in out_sites.values() for e in s["events"]
                                             if (e["agent_last_worked_ms_before_event"] or 0.0) > 0.0),
            # (negative: the agent was working at the event instant, and had to stop)
            "trace_interval_ms": ov.get("interval_ms", math.nan),
            "trace_sample_gap_ms_p99": ov.get("sample_gap_ms_p99", math.nan),
            "resolution_ms": ov.get("sample_gap_ms_p99", math.nan) + 1.0,   # + the event instant's 1 ms
            "window_ms": WINDOW_S * 1000.0, "hold_ms": HOLD_S * 1000.0,
            "idle": f"the first {WINDOW_S * 1000:g} ms window whose CPU rate is at most the idle probe's p99 over "
                    f"such windows + {IDLE_MARGIN_CORES:g} core (at most {IDLE_CAP_CORES:g}), no window in the next "
                    f"{HOLD_S * 1000:g} ms above {WORKING_CORES:g} core (work resumed)",
            "trace_thread_cpu_fraction_of_one_core": ov.get("thread_cpu_fraction_of_one_core", math.nan),
            "trace_cpu_us_per_sample": ov.get("cpu_us_per_sample", math.nan)},
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
    elif name == "revoke-mid-period":
        # one revoke per ~1 s cycle (lead, KPM silence, re-grant): as many as fit from 15 % for 70 %
        at_s, for_s = round(args.duration * 0.15, 1), round(args.duration * 0.7, 1)
    spec = fault_spec(name, for_s)
    faults = parse_faults([spec] if spec else [], at_s)
    run_dir = Path(tempfile.mkdtemp(prefix=f"weaver-safety-{name}-"))
    shape = {} if args.scenario != "demo" else {"sites": args.sites, "cells": args.cells}
    cfg = UpConfig.for_scenario(args.scenario, **shape, duration_s=args.probe + args.duration, seed=args.seed,
                                run_dir=run_dir, cross_site=False, faults=faults, fault_at_s=at_s,
                                record_series=True, idle_probe_s=args.probe)
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
           "timeline": summary.get("faults", []), "run_dir": str(run_dir), "startup": summary.get("startup", {})}
    tl = row["timeline"]
    row["applied"] = all(e["applicable"] for e in tl) if tl else name == "none"
    row["note"] = "; ".join(e["note"] for e in tl if e.get("note"))
    if spec and not tl:
        row["note"] = "fault did not start within the run"
    row["gpu_sms"] = gpu
    row.update(analyse(summary, gpu))
    row["summary"] = {k: v for k, v in summary.items() if k not in ("series", "xapp_views", "cpu_trace")}
    row["series"] = summary.get("series")            # per world period and site: the ground truth beside the lease
    row["xapp_views"] = summary.get("xapp_views")    # the xApp's decisions per epoch and site (instant, grant)
    row["cpu_trace"] = summary.get("cpu_trace")      # each agent's CPU clock every 2 ms
    return row


def _f(x, fmt="{:.0f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def table(rows: list[dict]) -> str:
    head = ("| fault | applied | training misses by ground truth (in idle probe) | by reported lease | beyond lease max SM·ms | total SM·s "
            "| idle baseline SMs (median) | above idle SM·s | revoke/expiry -> agent idle p50 / p99 / max ms, 2 ms CPU trace "
            "(events, agent already idle at the instant, re-granted first, never) | resolution ms | same at the 100 ms period: p99 / max "
            "| revoke while busy -> work stopped p50 / p99 / max ms, 2 ms CPU trace (busy at the instant / revokes off the grid; "
            "of them stale-KPM, shutdown) | leases granted (seen) "
            "| tokens | note |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        f = r.get("revoke_or_expiry_to_idle_traced") or {}
        b = r.get("revoke_while_busy_to_stopped") or {}
        lines.append(
            f"| {r['fault']} | {'yes' if r['applied'] else 'no'} "
            f"| {r['deadline_misses_attributable_to_training_after_probe']} "
            f"({r['deadline_misses_attributable_to_training_in_probe']}) "
            f"| {r['deadline_misses_attributable_to_reported_lease']} | {_f(r['sm_ms_beyond_lease_max'])} "
            f"| {_f(r['sm_ms_beyond_lease_total'] / 1000, '{:.1f}')} "
            f"| {_f(r.get('idle_baseline_sms_median'), '{:.1f}')} "
            f"| {_f(r['sm_ms_beyond_lease_above_idle_total'] / 1000, '{:.1f}')} "
            f"| {_f(f.get('p50_ms'), '{:.1f}')} / {_f(f.get('p99_ms'), '{:.1f}')} / {_f(f.get('max_ms'), '{:.1f}')} "
            f"({r['revoke_or_expiry_events']}, {f.get('events_agent_already_idle', 0)}, "
            f"{f.get('regranted_before_idle', 0)}, {f.get('never_idle', 0)}) "
            f"| {_f(f.get('resolution_ms'), '{:.1f}')} "
            f"| {_f(r['revoke_or_expiry_to_idle_ms_p99'])} / {_f(r['revoke_or_expiry_to_idle_ms_max'])} "
            f"| {_f(b.get('p50_ms'), '{:.1f}')} / {_f(b.get('p99_ms'), '{:.1f}')} / {_f(b.get('max_ms'), '{:.1f}')} "
            f"({b.get('busy_at_instant', 0)} / {b.get('revokes', 0)}; {b.get('busy_at_instant_stale_kpm', 0)}, "
            f"{b.get('busy_at_instant_xapp_shutdown', 0)}"
            + (f"; re-granted {b['regranted_before_idle']}" if b.get("regranted_before_idle") else "")
            + (f"; never {b['never_idle']}" if b.get("never_idle") else "") + ") "
            f"| {r['leases_granted']} ({r['leases_seen_by_agent']}) "
            f"| {r['tokens_trained']} | {r['note'][:90]} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--faults", default=",".join(ORDER[1:]),
                        help=f"comma-separated rows to run besides the baseline (default all: {','.join(ORDER[1:])})")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per row after the idle probe, the fault starting at 35 %% and lasting 25 %% "
                             "(default 16; --quick 8)")
    parser.add_argument("--probe", type=float, default=None, help="idle probe seconds per row (default 3; --quick 2)")
    parser.add_argument("--scenario", default="demo",
                        help="the load regime of every row (weaver up --scenario: demo, gh200-multicell, "
                             "heavy-small-gpu, slow-partition); --sites/--cells apply to demo only")
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
        summary = {**r["summary"], "series": r["series"], "xapp_views": r.get("xapp_views"),
                   "cpu_trace": r.get("cpu_trace")}
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
    from testbed.up import check_scenario
    try:
        check_scenario(args.scenario)
    except ValueError as exc:
        print(f"weaver bench safety: {exc}", file=sys.stderr)
        return 2
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
        up = row["startup"]
        print(f"weaver bench safety: {name} done in {row['wall_s']:.0f}s (agents connected at "
              f"{up.get('agents_connected_s', math.nan):.0f}s"
              + (f", not: {', '.join(up['agents_not_connected'])}" if up.get("agents_not_connected") else "")
              + "): training misses (truth) "
              f"{row['deadline_misses_attributable_to_training_after_probe']} "
              f"(+{row['deadline_misses_attributable_to_training_in_probe']} in the idle probe), beyond lease max "
              f"{row['sm_ms_beyond_lease_max']:.0f} SM·ms, to idle max "
              f"{_f(row['revoke_or_expiry_to_idle_traced']['max_ms'], '{:.1f}')} ms (traced); revoked while busy "
              f"{row['revoke_while_busy_to_stopped']['busy_at_instant']}/{row['revoke_while_busy_to_stopped']['revokes']}, "
              f"stopped p99 {_f(row['revoke_while_busy_to_stopped']['p99_ms'], '{:.1f}')} ms",
              flush=True)
    print()
    print(table(rows))
    shape = args.scenario if args.scenario != "demo" else f"{args.sites} site(s) x {args.cells} cells"
    print(f"\n{len(rows)} runs in {time.monotonic() - t0:.0f}s; {shape}, "
          f"{args.probe:g} s idle probe + {args.duration:g} s per run")
    if args.json:
        doc = {"bench": "safety", "scenario": args.scenario, "sites": args.sites, "cells": args.cells,
               "probe_s": args.probe,
               "duration_s": args.duration, "seed": args.seed, "definitions": __doc__, "rows": rows}
        Path(args.json).write_text(json.dumps(_json_safe(doc), indent=2))
    return 0
