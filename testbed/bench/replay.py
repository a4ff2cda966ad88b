"""Replay a `weaver-xapp --record FILE` run through the bench's path, and check it decides the same.

`python -m testbed.bench.replay FILE [--json OUT]`: rebuilds the loop state the recording starts from
(`xapp.loop.new_state` on the recorded controls and cost models), then for every recorded step applies
what the shell changed outside the loop (`ext`) and calls `testbed.bench.liveloop.drive` -- the one call
every arm of `weaver bench policies` decides by -- on the recorded inputs at the recorded time. Each step's
actions (RC controls, bytes included, grants, revocations) and each site's decision (envelope, grant,
demand, reason) must equal the recorded ones. Exit status 0 when every step matched, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field

from testbed.bench.liveloop import drive
from xapp.config import XappConfig
from xapp.loop import GrantLease, SendControl, new_state
from xapp.record import action_json, apply_ext, decisions_json, inputs_of, read_record


@dataclass
class ReplayResult:
    steps: int = 0
    ticks: int = 0                    # steps that decided at least one site
    matched: int = 0
    controls: int = 0
    grants: int = 0
    decisions: int = 0
    per_site: dict = field(default_factory=dict)   # site -> {"decisions", "grants", "envelopes"}
    mismatches: list = field(default_factory=list)  # first few: (step index, t, what, recorded, replayed)

    @property
    def identical(self) -> bool:
        return self.steps > 0 and self.matched == self.steps


def _norm(x):
    return json.loads(json.dumps(x))


def replay_record(path: str, keep: int = 10) -> ReplayResult:
    start, steps = read_record(path)
    cfg = XappConfig.from_controls(start["controls"])
    state = new_state(cfg, start["t"], start["cost_models"] or None)
    out = ReplayResult()
    for i, rec in enumerate(steps):
        apply_ext(state, rec["ext"])
        actions = drive(state, rec["t"], inputs_of(rec["inputs"]))
        got_actions = _norm([action_json(a) for a in actions])
        got_decisions = _norm(decisions_json(state, rec["t"]))
        out.steps += 1
        out.controls += sum(isinstance(a, SendControl) for a in actions)
        out.grants += sum(isinstance(a, GrantLease) for a in actions)
        out.decisions += len(got_decisions)
        out.ticks += bool(got_decisions)
        for sid, d in got_decisions.items():
            s = out.per_site.setdefault(sid, {"decisions": 0, "grants": 0, "envelopes": []})
            s["decisions"] += 1
            s["grants"] += d["grant_sms"] > 0
            if not s["envelopes"] or s["envelopes"][-1] != d["envelope_sms"]:
                s["envelopes"].append(d["envelope_sms"])
        ok = True
        for what, want, got in (("actions", rec["actions"], got_actions), ("decisions", rec["decisions"], got_decisions)):
            if _norm(want) != got:
                ok = False
                if len(out.mismatches) < keep:
                    out.mismatches.append((i, rec["t"], what, want, got))
        out.matched += ok
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.bench.replay", description=__doc__.splitlines()[0])
    p.add_argument("record", help="a weaver-xapp --record file (JSON lines)")
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    r = replay_record(args.record)
    print(f"replayed {r.steps} loop steps ({r.ticks} ticks, {r.decisions} site decisions, {r.controls} RC controls, "
          f"{r.grants} grants) through testbed.bench.liveloop.drive: {r.matched} identical, "
          f"{r.steps - r.matched} differ")
    for i, t, what, want, got in r.mismatches:
        print(f"  step {i} t={t:.3f}: {what} differ\n    recorded {want}\n    replayed {got}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**asdict(r), "identical": r.identical}, f, indent=1)
    return 0 if r.identical else 1


if __name__ == "__main__":
    sys.exit(main())
