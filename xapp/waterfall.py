"""The utilisation waterfall: usable spare -> granted -> held by the agent -> used, every SM·s between two
stages attributed to a named cause. Pure: no I/O, no clock (times are passed in).

Stages, per site and in total (SM·s):
- spare above the RAN's peak, and usable spare: the SMs above each period's RAN peak, less the guard,
  in partition steps (the head leg: guard, partition rounding);
- granted: the leases the control loop decided, each for one period (`GrantLedger`, fed by xapp.loop);
- held: what the agent held, summed over its report windows (`UsageTotals`, from UsageReport);
- used: what ran inside the leases.

Who owns which leg. usable -> granted is the xApp's (`GrantLedger.decided`, once per period decision:
the SMs above the measured peak less the guard, in steps, minus the grant, split by the step of the
decision that withheld them: the envelope's headroom above that peak, hysteresis, the invariant waiting
for acknowledgements, no agent, revocations by reason). granted -> held is the xApp's too for leases it
cut short between decisions (a stale-KPM or lost-node revoke mid-period). held -> used is the agent's
(agent.enforcer's idle accounting: host starvation, nothing fits, round waits, host reserve, its loop).

Meters. The xApp alone measures usable spare from its KPM and used from the agent's reports. Where a
platform measures them from ground truth (`weaver up`: the model's RAN peak, the agent process's CPU
clock), `combine` takes the platform's usable and used and names what its own meters do not explain as
`metering skew` on that leg: it is the only residual, shown, never folded into a cause.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from xapp.policy import floor_to

# usable -> granted (the xApp's control loop)
HEADROOM = "envelope-headroom"           # the envelope sized above this period's measured RAN peak (< 0: below it)
POLICY_MARGIN = "policy-margin"          # a policy that sizes no envelope (static, reactive, oracle): its own margin
HYSTERESIS = "hysteresis"                # the envelope held above what the policy wanted (hold periods, step down)
UNACKED = "envelope-unacknowledged"      # the invariant: a grant grows only on an acknowledged tighter envelope
QUOTA_IN_FLIGHT = "quota-caps-in-flight"
NO_AGENT = "no-agent"                    # no agent connected
LIFTED = "shaping-lifted"                # the envelope handed back after a while without a lease; regranted on ACK
PREVIOUS_EPOCH = "previous-epoch"        # a restarted xApp waits out the previous epoch's leases
# granted -> held, the xApp's part: a granted period cut short by a revoke between decisions
REVOKED_MID_PERIOD = "revoked-mid-period"
# head leg (the platform's definition of usable spare)
GUARD, ROUNDING = "guard", "partition-rounding"
SKEW = "metering skew"
# held -> used (the agent's UsageReport fields, lease.proto)
AGENT_CAUSES = {"starved_sm_ms": "host-starvation", "idle_nothing_fits_sm_ms": "nothing-fits",
                "idle_round_wait_sm_ms": "round-wait", "idle_host_reserve_sm_ms": "host-reserve",
                "idle_loop_sm_ms": "agent-loop", "idle_other_sm_ms": "enforcer-closing-term",
                "beyond_grant_sm_ms": "beyond-grant"}        # a negative loss: used beyond the grant
MAX_SUPERVISOR_CPU_MS = 60_000.0   # per report: a supervisor's CPU over one window is never near a minute
AGENT_FIELDS = ("sm_ms_granted", "sm_ms_used", "host_sm_ms", *AGENT_CAUSES, "warm_up_sm_ms", "eval_sm_ms")
FAILSAFE_REASONS = ("deadline-miss", "control-timeout", "control-failure", "site-error")


def revocation_cause(reason: str) -> str:
    """A no-grant decision's reason as a cause: `revoked:<why>` (fresh-KPM rule) or `failsafe:<why>`."""
    why = reason.split(":")[0].strip() or "unknown"
    if why.startswith("lifted"):
        return LIFTED
    if why == "not-leader":
        return "not-leader"
    return f"failsafe:{why}" if why in FAILSAFE_REASONS else f"revoked:{why}"


@dataclass
class GrantLedger:
    """One site's usable -> granted leg, as the control loop decides (SM·s since the xApp started)."""

    usable_sm_s: float = 0.0        # per decision: SMs above the measured peak + guard, in steps, x period
    granted_sm_s: float = 0.0       # per decision: the grant x period
    lost: dict = field(default_factory=dict)          # cause -> SM·s, usable -> granted
    cut_short: dict = field(default_factory=dict)     # cause -> SM·s of granted periods revoked mid-period
    decisions: int = 0
    peak_sm_s: float = 0.0          # the measured RAN peak each decision rested on x period (a meter check)
    last_peak: float | None = None  # the last measured RAN peak (a stale decision has none of its own)
    last: tuple = (0, 0, {})        # the last decision's (usable, grant, causes) in SMs
    carried_periods: int = 0        # periods the loop decided nothing in (late), the last decision in force

    def _lose(self, cause: str, sms: float, period_s: float) -> None:
        if sms:
            self.lost[cause] = self.lost.get(cause, 0.0) + sms * period_s

    def decided(self, *, period_s: float, gpu: int, guard: int, granularity: int, peak: float | None,
                grant: int, reason: str = "", wanted_env: int | None = None, wanted: int | None = None, ceiling: int | None = None, capped: int | None = None,
                training: bool = True, epoch_wait: bool = False) -> dict[str, float]:
        """Account one period decision; returns its causes in SMs (they sum to usable - grant).

        `reason` non-empty: no decision was made (stale KPM, fail-safe, ...), all of it is lost to that.
        Otherwise the grant's steps in xapp.loop._decide: `wanted_env` the envelope the policy wanted
        before hysteresis, `wanted` its grant in steps (for the envelope it used), `ceiling` what the invariant
        allows now, `capped` after the quota-in-flight rule, `training` an agent takes leases."""
        if peak is not None:
            self.last_peak = peak
        peak = self.last_peak
        usable = 0 if peak is None else floor_to(gpu - guard - peak, granularity)
        parts: dict[str, float] = {}
        if reason:
            parts[revocation_cause(reason)] = usable - grant
        else:
            g = granularity
            wanted = floor_to(wanted if wanted is not None else grant, g)
            # the envelope the policy wanted, against this period's peak; other policies (no envelope
            # wanted) size their margin into the grant itself: all of it is their headroom
            at_want = floor_to(gpu - guard - wanted_env, g) if wanted_env is not None else wanted
            parts[HEADROOM if wanted_env is not None else POLICY_MARGIN] = usable - at_want
            parts[HYSTERESIS] = at_want - wanted
            after_ceiling = min(wanted, ceiling) if ceiling is not None else wanted
            parts[UNACKED] = wanted - after_ceiling
            after_quota = min(after_ceiling, capped) if capped is not None else after_ceiling
            parts[QUOTA_IN_FLIGHT] = after_ceiling - after_quota
            if epoch_wait or not training:
                parts[PREVIOUS_EPOCH if epoch_wait else NO_AGENT] = after_quota - grant
            elif after_quota != grant:       # the loop grants what is left: anything else shows, unnamed
                parts["unattributed"] = after_quota - grant
        self._add(usable, grant, parts, period_s)
        self.peak_sm_s += (peak or 0.0) * period_s
        self.decisions += 1
        self.last = (usable, grant, parts)
        return parts

    def _add(self, usable: float, grant: float, parts: dict, seconds: float) -> None:
        for cause, sms in parts.items():
            self._lose(cause, sms, seconds)
        self.usable_sm_s += usable * seconds
        self.granted_sm_s += grant * seconds

    def carried(self, periods: int, period_s: float) -> None:
        """`periods` ticks the loop passed without deciding (it ran late): the last decision stayed in
        force through them (its lease is valid for several periods), so they count as it did."""
        if periods > 0:
            usable, grant, parts = self.last
            self._add(usable, grant, parts, periods * period_s)
            self.carried_periods += periods

    def revoked_mid_period(self, reason: str, sms: int, left_s: float) -> None:
        """A grant of `sms` revoked `left_s` before its period ended (granted, then not held)."""
        if sms > 0 and left_s > 0:
            cause = f"{REVOKED_MID_PERIOD}:{reason.split(':')[0]}"
            self.cut_short[cause] = self.cut_short.get(cause, 0.0) + sms * left_s

    def as_dict(self) -> dict:
        return {"usable_sm_s": self.usable_sm_s, "granted_sm_s": self.granted_sm_s, "decisions": self.decisions,
                "peak_sm_s": self.peak_sm_s, "carried_periods": self.carried_periods,
                "lost_sm_s": dict(self.lost), "cut_short_sm_s": dict(self.cut_short)}


@dataclass
class UsageTotals:
    """One site's held -> used leg from its agent's UsageReports, in site SM·ms (CPU core·ms scaled)."""

    sm_ms_granted: float = 0.0      # held: the windows' grants
    sm_ms_used: float = 0.0         # the recorded work's own measure
    host_sm_ms: float = 0.0
    starved_sm_ms: float = 0.0
    idle_nothing_fits_sm_ms: float = 0.0
    idle_round_wait_sm_ms: float = 0.0
    idle_host_reserve_sm_ms: float = 0.0
    idle_loop_sm_ms: float = 0.0
    idle_other_sm_ms: float = 0.0
    beyond_grant_sm_ms: float = 0.0
    warm_up_sm_ms: float = 0.0
    eval_sm_ms: float = 0.0
    # a confined agent's supervisor (agent.supervisor): core-ms outside the worker's cgroup and its lease,
    # not scaled to SMs (it is host CPU that never touches the GPU, not a stage of the waterfall)
    supervisor_cpu_ms: float = 0.0
    reports: int = 0

    def add(self, u, scale: float = 1.0) -> None:
        """A UsageReport (anything with the AGENT_FIELDS attributes) in agent units, times `scale`."""
        for name in AGENT_FIELDS:
            setattr(self, name, getattr(self, name) + float(getattr(u, name)) * scale)
        cpu = float(getattr(u, "supervisor_cpu_ms", 0.0))
        self.supervisor_cpu_ms += cpu if math.isfinite(cpu) and 0 <= cpu <= MAX_SUPERVISOR_CPU_MS else 0.0
        self.reports += 1

    def as_dict(self) -> dict:
        return asdict(self)


def xapp_view(ledger: GrantLedger, usage: UsageTotals) -> dict:
    """The waterfall on the xApp's own meters (REST, /metrics): usable from its KPM, used from reports."""
    held = usage.sm_ms_granted / 1e3
    used = (usage.sm_ms_used + usage.host_sm_ms) / 1e3
    return _build(usable=ledger.usable_sm_s, ledger=ledger, usage=usage, held=held, used=used,
                  meters={"usable": "xapp: SMs above the measured RAN peak less the guard, in steps",
                          "used": "agent reports: its work's measure plus the host CPU charged to its leases"})


def combine(*, spare_above_peak_sm_s: float, guard_sm_s: float, usable_sm_s: float, used_sm_s: float,
            ledger: dict, usage: dict) -> dict:
    """The waterfall with a platform's ground truth for usable and used (`weaver up`); `ledger` and
    `usage` as `GrantLedger.as_dict` / `UsageTotals.as_dict` (GET /api/v1/waterfall's `xapp`)."""
    led = GrantLedger(usable_sm_s=float(ledger.get("usable_sm_s", 0.0)),
                      granted_sm_s=float(ledger.get("granted_sm_s", 0.0)),
                      lost=dict(ledger.get("lost_sm_s", {})), cut_short=dict(ledger.get("cut_short_sm_s", {})),
                      decisions=int(ledger.get("decisions", 0)))
    tot = UsageTotals(**{k: float(usage.get(k, 0.0)) for k in (*AGENT_FIELDS, "supervisor_cpu_ms")})
    out = _build(usable=usable_sm_s, ledger=led, usage=tot, held=tot.sm_ms_granted / 1e3, used=used_sm_s,
                 meters={"usable": "platform: the model's RAN peak per period (ground truth)",
                         "used": "platform: what the agent process executed inside its lease (ground truth)"})
    head = {GUARD: guard_sm_s, ROUNDING: spare_above_peak_sm_s - guard_sm_s - usable_sm_s}
    out["stages_sm_s"] = {"spare_above_peak": spare_above_peak_sm_s, **out["stages_sm_s"]}
    # what the skew of the first xApp leg comes from: its own meter of usable spare, its decisions, the peaks
    out["xapp_meter"] = {"usable_sm_s": led.usable_sm_s, "decisions": led.decisions,
                         "carried_periods": int(ledger.get("carried_periods", 0)),
                         "peak_sm_s": float(ledger.get("peak_sm_s", 0.0))}
    out["legs"] = [_leg("spare_above_peak", "usable", spare_above_peak_sm_s, usable_sm_s, head), *out["legs"]]
    return out


def _leg(src: str, dst: str, a: float, b: float, causes: dict) -> dict:
    causes = {k: v for k, v in causes.items() if v}
    return {"from": src, "to": dst, "lost_sm_s": a - b, "causes_sm_s": causes,
            "causes_sum_sm_s": sum(causes.values())}


def _with_skew(a: float, b: float, causes: dict) -> dict:
    return {**causes, SKEW: (a - b) - sum(causes.values())}


def _build(*, usable: float, ledger: GrantLedger, usage: UsageTotals, held: float, used: float, meters: dict) -> dict:
    granted = ledger.granted_sm_s
    xapp_causes = dict(ledger.lost)
    if usable != ledger.usable_sm_s:   # another meter of usable spare: what the xApp's does not explain
        xapp_causes = _with_skew(usable, granted, xapp_causes)
    delivery = _with_skew(granted, held, dict(ledger.cut_short))
    agent = {name: getattr(usage, f) / 1e3 * (-1 if f == "beyond_grant_sm_ms" else 1)
             for f, name in AGENT_CAUSES.items()}
    agent = _with_skew(held, used, agent)
    return {
        "stages_sm_s": {"usable": usable, "granted": granted, "held": held, "used": used},
        "legs": [_leg("usable", "granted", usable, granted, xapp_causes),
                 _leg("granted", "held", granted, held, delivery),
                 _leg("held", "used", held, used, agent)],
        "used_not_training_sm_s": {"warm-up": usage.warm_up_sm_ms / 1e3, "validation": usage.eval_sm_ms / 1e3,
                                   "host": usage.host_sm_ms / 1e3},
        "outside_lease": {"supervisor_cpu_s": usage.supervisor_cpu_ms / 1e3},
        "ratios": {"used_over_usable": used / usable if usable > 0 else 0.0,
                   "used_over_granted": used / granted if granted > 0 else 0.0,
                   "granted_over_usable": granted / usable if usable > 0 else 0.0},
        "meters": meters,
    }


def total(sites: dict[str, dict]) -> dict:
    """The sum of per-site waterfalls (same shape), stage by stage and cause by cause."""
    views = list(sites.values())
    if not views:
        return {}
    stages = {k: sum(v["stages_sm_s"].get(k, 0.0) for v in views) for k in views[0]["stages_sm_s"]}
    legs = []
    for i, leg in enumerate(views[0]["legs"]):
        causes: dict = {}
        for v in views:
            for c, s in v["legs"][i]["causes_sm_s"].items():
                causes[c] = causes.get(c, 0.0) + s
        legs.append(_leg(leg["from"], leg["to"], stages[leg["from"]], stages[leg["to"]], causes))
    nt = {k: sum(v["used_not_training_sm_s"][k] for v in views) for k in views[0]["used_not_training_sm_s"]}
    sup = sum(v.get("outside_lease", {}).get("supervisor_cpu_s", 0.0) or 0.0 for v in views)
    u, g, used = stages.get("usable", 0.0), stages.get("granted", 0.0), stages.get("used", 0.0)
    return {"stages_sm_s": stages, "legs": legs, "used_not_training_sm_s": nt,
            "outside_lease": {"supervisor_cpu_s": sup},
            "ratios": {"used_over_usable": used / u if u > 0 else 0.0,
                       "used_over_granted": used / g if g > 0 else 0.0,
                       "granted_over_usable": g / u if u > 0 else 0.0},
            "meters": views[0]["meters"]}


def subtract(end: dict, start: dict) -> dict:
    """`end` - `start` of two GET /api/v1/waterfall `xapp` records of one site (a run's own share)."""
    def d(a: dict, b: dict) -> dict:
        out = {}
        for k, v in a.items():
            if isinstance(v, dict):
                out[k] = d(v, b.get(k, {}) or {})
            elif isinstance(v, int | float):
                out[k] = v - (b.get(k, 0) or 0)
            else:
                out[k] = v
        return out
    return d(end, start)


def add(a: dict, b: dict) -> dict:
    """`a` + `b` of two `xapp` records of one site from two xApp replicas (each decided some of its periods)."""
    out = dict(b)
    for k, v in a.items():
        if isinstance(v, dict):
            out[k] = add(v, b.get(k, {}) or {})
        elif isinstance(v, int | float) and isinstance(b.get(k, 0), int | float):
            out[k] = v + (b.get(k, 0) or 0)
        else:
            out[k] = v
    return out
