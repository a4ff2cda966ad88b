"""The bench's xApp: the live control loop (`xapp.loop.step`) over the RAN model, wired as `weaver up` wires it.

Per period of the trace:
1. the RAN model steps one period; each site's E2 node (the testbed's sans-IO `testbed.e2node.E2Node`,
   the same object `weaver up`'s nodes run) encodes its KPM indications (real E2AP + E2SM-KPM bytes, the
   subscription the xApp asked for);
2. the xApp's `xapp.ingest.Ingest` decodes them into `KpmSample`s (e2sm's fast readers, as `weaver-xapp`);
3. `drive` -- one call of `xapp.loop.step` -- ticks the loop: estimator, policy, guard, hysteresis, the
   RAN-first ledger and ACK gating all run as they do live;
4. every `SendControl` it returns (real RICcontrolRequest bytes from `xapp.actuate`) goes to the node's
   `receive`, whose control code (`testbed.e2node.control.execute`) decodes it and applies it to the model;
   the node's RICcontrolAcknowledge/Failure is parsed by the xApp's `parse_control_reply` and handed back
   to the loop `rtt_s` later (a step between ticks, as the live shell does when a reply arrives);
5. a `GrantLease` is the lease the training arm holds for the next period; the agent answers a newer lease
   or a revoke with a `LeaseRelease` of the one before, also `rtt_s` later (the agent replaces its lease
   at receipt, agent/site_agent.py).

Stated simplifications: a control lands on the model at the next period boundary (the model steps whole
periods; a real node applies it rtt/2 after the tick, so tightening starts up to rtt/2 early and a
grant, which grows only on an ACK, is never affected); one round trip `rtt_s` stands for both the E2 path
(control -> ACK) and the agent's lease path (lease -> release); the model's RAN demand does not depend on
training, so the training-caused misses are counted offline from the per-slot demand
(`testbed.bench.policies.account`), not by the node's GPU.DeadlineMiss.

`drive` is also the path a recorded live run is replayed through (`testbed.bench.replay`), so the bench
and `weaver-xapp` decide by the same code: a test counts the calls into `xapp.loop.step`.
"""
from __future__ import annotations

import copy
import heapq
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from e2sm import e2ap
from testbed.e2node.config import node_configs
from testbed.e2node.functions import kpm_oid
from testbed.e2node.measure import from_period_report
from testbed.e2node.node import CONTROL_ACK, CONTROL_FAILURE, CONTROL_REQ, SUB_REQ, SUB_RESP, E2Node
from xapp import loop as xloop
from xapp.actuate import node_control, parse_control_reply
from xapp.config import XappConfig
from xapp.ingest import Ingest, IngestError, KpmSubscription, KpmValueError, meas_key
from xapp.loop import (
    Action,
    ControlOutcome,
    GrantLease,
    Inputs,
    LeaseRelease,
    RevokeLease,
    SendControl,
    new_state,
    set_node,
)
from xapp.policy import OraclePolicy
from xapp.rnib import E2Node as NodeInfo
from xapp.rnib import RanFunction

DRIVER = "xapp.loop.step"
DEFAULT_RTT_MS = 15.0          # a realistic E2 round trip (E2T + SCTP + the DU's RC handler), LAN lease path
SUB_REQUESTOR = 123            # SubMgr's requestor ID for subscriptions
ROOT = Path(__file__).resolve().parents[2]
NTP_BASE = 3_900_000_000       # an NTP-era second for t = 0 (only differences matter to the loop)


def drive(state: xloop.LoopState, now: float, inputs: Inputs) -> list[Action]:
    """One step of the live loop: the one call through which the bench, and the replay of a recorded
    `weaver-xapp` run, make every decision (looked up on the module, so a test can count the calls)."""
    _, actions = xloop.step(state, now, inputs)
    return actions


def site_name(i: int) -> str:
    return f"site-{i}"


def bench_nodes(scenario):
    """The benches' E2 nodes: srsRAN's ID table, and the standard text's dialect, so that a slice-quota control
    caps the slice as the weaver-quota arm assumes (srsRAN's own DU would limit one UE's grants instead:
    testbed.e2node.dialects.ue_grant_limit, which makes the arm's controls no shaping at all)."""
    return node_configs(scenario, overrides={s.site_id: {"dialect": "o-ran"} for s in scenario.sites})


def xapp_config(scenario, policy: str, knob: int | None = None, mode: str = "auto", quota=None) -> XappConfig:
    """The shipped descriptor's `controls` (as `weaver up` starts the xApp), with the scenario's sites and one
    arm's policy and knob. `mode`: the actuation mode (`quota` forces weaver's quota arm); `quota`: the
    QuotaCost the weaver policy sizes best-effort caps with."""
    c = copy.deepcopy(json.loads((ROOT / "descriptors" / "config-file.json").read_text())["controls"])
    c["period_ms"] = int(round(scenario.period_s * 1000))
    p = c["policy"]
    # The config refuses `oracle` (it needs the future): its loop runs on a baseline's config, and
    # `LiveLoop(oracle_peaks=...)` plugs the foresight policy into every site.
    p["name"] = "reactive" if policy == "oracle" else policy
    g = scenario.sites[0].granularity
    if policy == "static":
        p["static_reserve_sms"] = int(knob if knob is not None else g)
    elif policy == "reactive":
        p["reactive_margin_sms"] = int(knob if knob is not None else g)
    elif policy == "weaver":
        p["guard_sms"] = int(knob if knob is not None else g)
    if quota is not None:
        p.update(quota_dl_sms_per_prb=quota.dl_sms_per_prb, quota_ul_sms_per_prb=quota.ul_sms_per_prb,
                 cell_prbs=int(quota.cell_prbs))
    c["actuation"]["mode"] = mode
    # The descriptor's best-effort delay budget for the envelope (as `weaver up` runs it), not the slice's
    # whole end-to-end budget: the MAC's own queueing takes part of that (29.5 of 30 ms at p99 in
    # heavy-small-gpu), so a deferral allowed the whole of it blew the slice's budget.
    nodes = bench_nodes(scenario)
    c["sites"] = [{
        "site_id": site_name(i), "gpu_sms": site.gpu_sms, "granularity": site.granularity,
        "nodes": [nodes[i].inventory_name],
        "protected_slices": [{"sst": s.sst, "sd": s.sd} for s in site.slices if s.protected],
        "best_effort_slices": [{"sst": s.sst, "sd": s.sd} for s in site.slices if not s.protected],
    } for i, site in enumerate(scenario.sites)]
    c["e2"]["discovery"] = "static"
    c["e2"]["static_nodes"] = [{"meid": n.inventory_name, "kpm_function_id": n.kpm_function_id,
                                "kpm_oid": kpm_oid(n), "rc_function_id": n.rc_function_id, "envelope": True}
                               for n in nodes]
    return XappConfig.from_controls(c)


@dataclass
class Foresight:
    """The oracle plugged into the loop: `OraclePolicy` told each period the peak of the period its lease
    will cover (benchmarks only: the live xApp cannot know it)."""

    next_peak: np.ndarray          # (P,) per-period RAN peak of this site, from the same trace
    period_s: float
    name: str = "oracle"

    def decide(self, obs, history):
        p = int(round(obs.now / self.period_s))      # the tick at the end of period p - 1 decides period p
        peak = float(self.next_peak[min(p, len(self.next_peak) - 1)])
        return OraclePolicy().decide(replace(obs, oracle_next_max=peak), history)


class RecordedRan:
    """The RAN behind the nodes when an unshaped arm replays a recorded trace: the node's control code
    runs as usual, but nothing may shape (the trace was recorded unshaped); a control that would is
    refused, so the node answers RICcontrolFailure and the loop's fail-safe shows in the result."""

    def __init__(self, gpu_sms: list[int]) -> None:
        self.gpu_sms = gpu_sms
        self.applied = 0

    def set_envelope(self, site: int, sms, be_delay_budget_ms=None) -> None:
        if sms is not None and sms < self.gpu_sms[site]:
            raise ValueError("a recorded unshaped trace cannot take an envelope")
        self.applied += 1

    def set_slice_quota(self, site, cell, sst, sd, min_ratio, max_ratio, dedicated_ratio) -> None:
        if max_ratio < 100:
            raise ValueError("a recorded unshaped trace cannot take a PRB quota")
        self.applied += 1


@dataclass
class LoopTally:
    controls: int = 0
    acks: int = 0
    failures: int = 0
    steps: int = 0
    revokes: dict = field(default_factory=dict)     # reason -> count (grant-zero included)
    kpm_refused: int = 0


class LiveLoop:
    """One `weaver-xapp` control loop over one RAN (the model, or a `RecordedRan`), one E2 node per site."""

    def __init__(self, cfg: XappConfig, scenario, ran, rtt_s: float = DEFAULT_RTT_MS / 1000.0,
                 oracle_peaks: np.ndarray | None = None) -> None:
        self.cfg, self.scenario, self.ran, self.rtt_s = cfg, scenario, ran, float(rtt_s)
        self.state = new_state(cfg, 0.0)
        self.ingest = Ingest()
        self.ingest.set_limits(cfg.sites)
        self.nodes = [E2Node(nc, ran) for nc in bench_nodes(scenario)]
        self.by_meid = {n.config.inventory_name: n for n in self.nodes}
        self.site_ids = [s.site_id for s in cfg.sites]
        self.agents = frozenset(self.site_ids)
        self.sub_ids: dict[str, int] = {}
        self.grants = {s: 0 for s in self.site_ids}
        self.lease_seq = {s: 0 for s in self.site_ids}
        self.events: list = []              # heap of (t, n, kind, obj): replies and releases in flight
        self._n = 0
        self.tally = LoopTally()
        for i, node in enumerate(self.nodes):
            self._attach(i, node)
        if oracle_peaks is not None:        # the oracle: the loop's policy object, told the future
            for i, sid in enumerate(self.site_ids):
                self.state.sites[sid].policy = Foresight(oracle_peaks[:, i], scenario.period_s)

    # ------------------------------------------------------------------ set-up: E2 setup + subscription
    def _attach(self, i: int, node: E2Node) -> None:
        from xapp.app import kpm_request

        setup = e2ap.decode_e2ap(node.setup_request().payload)
        node.connected = True               # the E2T's E2setupResponse carries nothing the node keeps
        meid = node.config.inventory_name
        info = NodeInfo(meid=meid, connected=True, functions=tuple(
            RanFunction(ran_function_id=f.ran_function_id, oid=f.oid, definition=f.definition)
            for f in setup.ran_functions))
        set_node(self.state, node_control(info, self.cfg.actuation))
        kpm = info.kpm
        version, meas, trigger, action = kpm_request(self.cfg, info)     # what XappApp asks the node for
        req = e2ap.RicSubscriptionRequest(e2ap.RicRequestId(SUB_REQUESTOR, i + 1), kpm.ran_function_id, trigger,
                                          (e2ap.RicAction(1, "report", action),))
        replies = node.receive(SUB_REQ, e2ap.encode_e2ap(req))
        if [o.mtype for o in replies] != [SUB_RESP]:
            raise RuntimeError(f"{meid}: subscription refused ({[o.mtype for o in replies]})")
        self.sub_ids[meid] = i + 1          # SubMgr's E2 instance id is the indications' RMR sub_id
        xloop.set_control_tag(self.state, meid, i + 1)   # controls carry it as instance id, as XappApp._activate
        self.ingest.add(KpmSubscription(i + 1, meid, kpm.ran_function_id, version,
                                        tuple(meas_key(m.name, m.labels[0] if m.labels else None) for m in meas)))

    # ------------------------------------------------------------------ the period
    def indications(self, report, now: float) -> list[tuple[str, bytes]]:
        """The KPM each node sends for `report` (a model PeriodReport), as (meid, RICindication bytes)."""
        now_ms = now * 1000.0
        start = now - self.scenario.period_s
        stamp = ((NTP_BASE + int(start)) << 32) | int((start % 1.0) * 2**32)
        out = []
        for i, node in enumerate(self.nodes):
            m = from_period_report(report, i, node.config.gpu_sms)
            out += [(node.config.inventory_name, o.payload) for o in node.on_period(m, now_ms, stamp)]
        return out

    def tick(self, now: float, indications: list[tuple[str, bytes]]) -> dict[str, int]:
        """Deliver what is due before `now`, then the period's KPM and the tick; returns the grant each
        site holds for the next period."""
        self.flush(now)
        samples = []
        for meid, payload in indications:
            try:
                samples.append(self.ingest.indication(self.sub_ids[meid], meid, payload, now))
            except KpmValueError as exc:
                samples.append(exc.refusal)
                self.tally.kpm_refused += 1
            except IngestError:
                self.tally.kpm_refused += 1
        results, releases = self._due(now)
        self._step(now, Inputs(samples=tuple(samples), results=results, releases=releases, agents=self.agents))
        return dict(self.grants)

    def flush(self, until: float) -> None:
        """Steps between ticks: each reply or release in flight with a time before `until`, in time order
        (replies at one instant go in one step, as the live shell batches what arrived before it woke)."""
        while self.events and self.events[0][0] < until - xloop.TICK_SLACK:
            t = self.events[0][0]
            results, releases = self._due(t)
            self._step(t, Inputs(results=results, releases=releases, agents=self.agents))

    def _due(self, t: float) -> tuple[tuple[ControlOutcome, ...], tuple[LeaseRelease, ...]]:
        results, releases = [], []
        while self.events and self.events[0][0] <= t + 1e-12:
            _, _, kind, obj = heapq.heappop(self.events)
            (results if kind == "result" else releases).append(obj)
        return tuple(results), tuple(releases)

    def _later(self, t: float, kind: str, obj) -> None:
        self._n += 1
        heapq.heappush(self.events, (t, self._n, kind, obj))

    def _step(self, now: float, inputs: Inputs) -> None:
        self.tally.steps += 1
        self._perform(now, drive(self.state, now, inputs))

    def _perform(self, now: float, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, SendControl):
                self.tally.controls += 1
                for out in self.by_meid[a.meid].receive(CONTROL_REQ, a.payload):
                    if out.mtype not in (CONTROL_ACK, CONTROL_FAILURE):
                        continue
                    r = parse_control_reply(out.payload)
                    if r.ok:
                        self.tally.acks += 1
                    else:
                        self.tally.failures += 1
                    # matched as the live xApp matches it (requestor, node, the instance the reply echoes)
                    self._later(now + self.rtt_s, "result", ControlOutcome(
                        instance=r.instance, ok=r.ok, cause=r.cause, meid=a.meid, requestor=r.requestor))
            elif isinstance(a, GrantLease):
                prev, self.lease_seq[a.site_id] = self.lease_seq[a.site_id], a.seq
                self.grants[a.site_id] = a.sm_count
                if prev:        # the agent adopts the new lease at receipt and releases the one before
                    self._later(now + self.rtt_s, "release", LeaseRelease(site_id=a.site_id, seq=prev,
                                                                          reason="replaced"))
            elif isinstance(a, RevokeLease):
                self.grants[a.site_id] = 0
                why = a.reason.split(":")[0]
                self.tally.revokes[why] = self.tally.revokes.get(why, 0) + 1
                if self.lease_seq[a.site_id]:
                    self._later(now + self.rtt_s, "release", LeaseRelease(
                        site_id=a.site_id, seq=self.lease_seq[a.site_id], reason="revoked"))
                    self.lease_seq[a.site_id] = 0   # released: the next grant replaces nothing

    def grant_row(self) -> np.ndarray:
        return np.array([self.grants[s] for s in self.site_ids], dtype=int)

    def sized_row(self) -> np.ndarray:
        """The envelope each site's last decision was sized for (0: none)."""
        out = []
        for s in self.site_ids:
            v = self.state.sites[s].last_view
            out.append(v.envelope_sms if v is not None and v.fresh else 0)
        return np.array(out, dtype=float)


def replay_trace(cfg: XappConfig, scenario, trace: list[list[tuple[str, bytes]]], rtt_s: float,
                 oracle_peaks: np.ndarray | None = None) -> tuple[np.ndarray, LoopTally]:
    """An unshaped arm over a recorded trace of KPM bytes (per period, what every node sent): the same loop,
    the same nodes' control code, a RAN that refuses shaping. Grants (P, S): grant[p] decided at the end of
    period p - 1."""
    ran = RecordedRan([s.gpu_sms for s in scenario.sites])
    live = LiveLoop(cfg, scenario, ran, rtt_s, oracle_peaks=oracle_peaks)
    P, D = len(trace), scenario.period_s
    grants = np.zeros((P, scenario.n_sites), dtype=int)
    for p, inds in enumerate(trace):
        live.tick((p + 1) * D, inds)
        if p + 1 < P:
            grants[p + 1] = live.grant_row()
    return grants, live.tally


def check_rtt(rtt_ms: float) -> float:
    if not (math.isfinite(rtt_ms) and 0 <= rtt_ms < 1000):
        raise ValueError(f"--ack-delay-ms must be in [0, 1000), got {rtt_ms}")
    return rtt_ms / 1000.0
