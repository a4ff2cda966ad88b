"""`weaver-xapp --record FILE`: what the control loop was given and what it decided, as JSON lines.

One line per call of `xapp.loop.step` in the running xApp, so that a replay of the file through the bench's
path (`testbed.bench.replay`, which drives the loop with `testbed.bench.liveloop.drive`, the call every arm
of `weaver bench policies` decides by) can check that it reproduces every decision:

- the first line, `{"kind": "start", "t", "controls", "cost_models"}`: the loop state's birth
  (`xapp.loop.new_state(XappConfig.from_controls(controls), t, cost_models)`);
- then `{"kind": "step", "t", "ext", "inputs", "actions", "decisions"}` per step: `inputs` is the
  `xapp.loop.Inputs` (KPM samples and refusals in arrival order, control outcomes, agents, lost nodes,
  lease releases), `actions` what step returned (RC controls with their E2AP bytes in hex, grants,
  revocations), `decisions` the period's `SiteDecisionView` of each site that ticked (envelope, grant,
  demand, reason).
- `ext`: what the shell changed in the loop state *outside* step since the previous line (a node's
  control mode after subscription, leadership, the restart wait, the control-id cursor, a config applied,
  a grant zeroed on a loop error), so the replay applies it at the same point. Found by comparing the
  state before each step with a snapshot taken after the previous one: nothing has to remember to log.

Floats are written with Python's repr (exact round trip); +-inf and NaN as JSON's Infinity/NaN. A write
error stops the recording (logged once); it never stops the loop.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import Any

from e2sm.rc import PrbQuotaIds, SliceQuota
from xapp.actuate import NodeControl
from xapp.config import XappConfig
from xapp.ingest import KpmRefusal, KpmSample
from xapp.loop import (
    Action,
    ControlOutcome,
    GrantLease,
    Inputs,
    LeaseRelease,
    LoopState,
    RevokeLease,
    SendControl,
    refresh_policy,
    set_node,
)

log = logging.getLogger("weaver.xapp.record")


# ----------------------------------------------------------------------------- encoding


def sample_json(s: KpmSample | KpmRefusal) -> dict:
    if isinstance(s, KpmRefusal):
        return {"refusal": asdict(s)}
    return {"meid": s.meid, "received": s.received, "collected": s.collected, "values": dict(s.values), "sn": s.sn,
            "collected_s": s.collected_s, "collected_res_s": s.collected_res_s}


def sample_of(d: dict) -> KpmSample | KpmRefusal:
    if "refusal" in d:
        return KpmRefusal(**d["refusal"])
    return KpmSample(meid=d["meid"], received=d["received"], collected=d["collected"], values=dict(d["values"]),
                     sn=d["sn"], collected_s=d["collected_s"], collected_res_s=d["collected_res_s"])


def inputs_json(i: Inputs) -> dict:
    return {"samples": [sample_json(s) for s in i.samples], "results": [asdict(r) for r in i.results],
            "agents": sorted(i.agents), "lost_nodes": sorted(i.lost_nodes), "releases": [asdict(r) for r in i.releases]}


def inputs_of(d: dict) -> Inputs:
    return Inputs(samples=tuple(sample_of(s) for s in d["samples"]),
                  results=tuple(ControlOutcome(**r) for r in d["results"]), agents=frozenset(d["agents"]),
                  lost_nodes=frozenset(d["lost_nodes"]), releases=tuple(LeaseRelease(**r) for r in d["releases"]))


def action_json(a: Action) -> dict:
    if isinstance(a, SendControl):
        return {"type": "control", "control_id": a.control_id, "site_id": a.site_id, "meid": a.meid, "kind": a.kind,
                "envelope_sms": a.envelope_sms, "payload": a.payload.hex(), "quotas": [asdict(q) for q in a.quotas],
                "instance": a.instance}
    if isinstance(a, GrantLease):
        return {"type": "grant", **asdict(a)}
    if isinstance(a, RevokeLease):
        return {"type": "revoke", **asdict(a)}
    raise TypeError(f"not a loop action: {a!r}")


def action_of(d: dict) -> Action:
    d = dict(d)
    kind = d.pop("type")
    if kind == "control":
        return SendControl(control_id=d["control_id"], site_id=d["site_id"], meid=d["meid"], kind=d["kind"],
                           envelope_sms=d["envelope_sms"], payload=bytes.fromhex(d["payload"]),
                           quotas=tuple(SliceQuota(**q) for q in d["quotas"]), instance=d.get("instance"))
    return GrantLease(**d) if kind == "grant" else RevokeLease(**d)


def node_json(nc: NodeControl) -> dict:
    return {"meid": nc.meid, "rc_function_id": nc.rc_function_id, "mode": nc.mode,
            "ids": asdict(nc.ids) if nc.ids is not None else None, "note": nc.note}


def node_of(d: dict) -> NodeControl:
    return NodeControl(meid=d["meid"], rc_function_id=d["rc_function_id"], mode=d["mode"],
                       ids=PrbQuotaIds(**d["ids"]) if d["ids"] is not None else None, note=d["note"])


# ----------------------------------------------------------------------------- what the shell changes


def external(state: LoopState) -> dict:
    """The parts of the loop state the shell (xapp.app) sets outside `step`."""
    return {"leader": state.control_leader, "grant_not_before": state.grant_not_before,
            "controlled_sites": None if state.controlled_sites is None else sorted(state.controlled_sites),
            "site_grant_not_before": dict(state.site_grant_not_before),
            "next_control_id": state.next_control_id,
            "control_tags": dict(state.control_tags),     # each node's RIC instance ID (its sub_id)
            "grants": {sid: rt.grant_sms for sid, rt in state.sites.items()},
            # a previous instance's leases the shell read from the ledger (SiteSafety.inherit)
            "inherited": {sid: [[h.sm_count, h.sent_at, h.hard_end] for h in rt.safety.inherited]
                          for sid, rt in state.sites.items() if rt.safety.inherited},
            "nodes": {m: node_json(nc) for rt in state.sites.values() for m, nc in rt.nodes.items()}}


def ext_diff(before: dict, now: dict) -> dict:
    out = {k: v for k, v in now.items() if k not in ("grants", "nodes") and before.get(k) != v}
    grants = {s: g for s, g in now["grants"].items() if before["grants"].get(s) != g}
    nodes = {m: n for m, n in now["nodes"].items() if before["nodes"].get(m) != n}
    if grants:
        out["grants"] = grants
    if nodes:
        out["nodes"] = nodes
    return out


def apply_ext(state: LoopState, ext: dict) -> None:
    """Make in `state` the outside changes a `step` line records (what xapp.app did to the live state)."""
    if "controls" in ext:              # XappApp.apply_config's part on the loop state
        cfg = XappConfig.from_controls(ext["controls"])
        state.cfg = cfg
        for rt in state.sites.values():
            rt.cfg = cfg.site(rt.cfg.site_id)
            refresh_policy(state, rt)
    for d in ext.get("nodes", {}).values():
        set_node(state, node_of(d))
    if "leader" in ext:
        state.control_leader = ext["leader"]
    if "grant_not_before" in ext:
        state.grant_not_before = ext["grant_not_before"]
    if "controlled_sites" in ext:
        c = ext["controlled_sites"]
        state.controlled_sites = None if c is None else frozenset(c)
    if "site_grant_not_before" in ext:
        state.site_grant_not_before = {s: float(t) for s, t in ext["site_grant_not_before"].items()}
    if "next_control_id" in ext:
        state.next_control_id = ext["next_control_id"]
    if "control_tags" in ext:
        state.control_tags = {m: int(t) for m, t in ext["control_tags"].items()}
    for sid, g in ext.get("grants", {}).items():
        state.sites[sid].grant_sms = g
    if "inherited" in ext:
        for sid, rt in state.sites.items():
            rt.safety.inherited = []
            for sm, sent_at, hard_end in ext["inherited"].get(sid, []):
                rt.safety.inherit(int(sm), float(sent_at), float(hard_end))


def decisions_json(state: LoopState, now: float) -> dict:
    """The decision each site made in this step (its view is stamped with this step's time)."""
    return {sid: asdict(rt.last_view) for sid, rt in state.sites.items()
            if rt.last_view is not None and rt.last_view.t == now}


# ----------------------------------------------------------------------------- the recorder


FLUSH_LINES = 64        # lines buffered before a write (a loop step is ~1-10 kB of JSON)
FLUSH_S = 1.0           # ... or this long: a SIGKILLed xApp loses at most a second of its record


class LoopRecorder:
    """Appends one JSON line per loop step to `path` (xapp.app calls `begin` once, then `before` and
    `after` around every step). Lines are written in batches (`FLUSH_LINES` or `FLUSH_S`, and on
    `close`), not one write and flush per step."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.f = open(path, "w", encoding="utf-8")     # noqa: SIM115 - held for the xApp's lifetime
        self.lines = 0
        self._buf: list[str] = []
        self._flushed = time.monotonic()
        self._snap: dict | None = None
        self._cfg: Any = None
        self._ext: dict = {}

    def _write(self, obj: dict) -> None:
        if self.f is None:
            return
        try:
            self._buf.append(json.dumps(obj, separators=(",", ":")) + "\n")
        except (ValueError, TypeError) as exc:
            log.error("recording to %s stopped: %s", self.path, exc)
            self.close()
            return
        self.lines += 1
        if len(self._buf) >= FLUSH_LINES or time.monotonic() - self._flushed >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        if self.f is None:
            return
        try:
            self.f.write("".join(self._buf))
            self.f.flush()
        except (OSError, ValueError) as exc:
            log.error("recording to %s stopped: %s", self.path, exc)
            self._buf.clear()
            self.close()
            return
        self._buf.clear()
        self._flushed = time.monotonic()

    def begin(self, state: LoopState, cost_models: dict | None) -> None:
        self._write({"kind": "start", "t": state.started, "controls": state.cfg.controls,
                     "cost_models": cost_models or {}})
        self._snap, self._cfg = external(state), state.cfg

    def before(self, state: LoopState) -> None:
        now = external(state)
        self._ext = ext_diff(self._snap, now) if self._snap is not None else now
        if state.cfg is not self._cfg:
            self._ext["controls"] = state.cfg.controls

    def after(self, state: LoopState, now: float, inputs: Inputs, actions: list[Action]) -> None:
        self._write({"kind": "step", "t": now, "ext": self._ext, "inputs": inputs_json(inputs),
                     "actions": [action_json(a) for a in actions], "decisions": decisions_json(state, now)})
        self._snap, self._cfg, self._ext = external(state), state.cfg, {}

    def close(self) -> None:
        if self.f is not None:
            if self._buf:
                self.flush()
            f, self.f = self.f, None
            if f is not None:
                f.close()


def read_record(path: str) -> tuple[dict, list[dict]]:
    """(start line, step lines) of a recording; a torn last line (the xApp was killed mid-write) is dropped."""
    start, steps = None, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("kind") == "start" and start is None:
                start = d
            elif d.get("kind") == "step" and start is not None:
                steps.append(d)
    if start is None:
        raise ValueError(f"{path}: no start line: not a weaver-xapp --record file")
    return start, steps
