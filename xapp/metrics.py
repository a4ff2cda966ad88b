"""The xApp's Prometheus metrics, on `prometheus_client`: one registry per `XappApp`, every family defined here.

Two kinds of family, both exposed by the library (HELP, TYPE, label escaping, content negotiation):

- **Histograms** the shell observes as things happen (`XappMetrics.kpm_age`, `.step_seconds`,
  `.control_rtt`): distributions that exist nowhere else.
- **Read at scrape** (`COLLECTED`, `SITE_GAUGES`): counts and levels whose owner already keeps them
  (`xapp.app.Counters`, the ingest's refusals, the broker's refusals, the loop's site state, the REST
  guard). The library's custom-collector pattern reads them when Prometheus scrapes, so each number keeps
  one owner and no second copy can drift from it.

Adding a metric:

    @collected("weaver_thing_total", "counter", "What it counts, in which unit.", ("reason",))
    def _thing(x, rest):                      # x: the XappApp; rest: (guard, errors) of the REST app or None
        return x.counters.things.items()      # ((label values...) or one str, value) pairs, or a number

    @site_gauge("weaver_site_thing_sms", "Per-site level, SMs.")          # labels: site
    def _site_thing(x, sid, rt):              # rt: xapp.loop.SiteRuntime
        return rt.thing                       # None: no sample for this site now

    @site_gauge("weaver_site_waterfall_sms", "...", label="stage")        # labels: site, stage
    def _waterfall(x, sid, rt):
        return {"spare": ..., "usable": ...}

Names are the ones `/metrics` has always had (tests, the dashboard and docker/grafana/weaver.json read
them); docs/contracts.md lists them.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from xapp import lograte
from xapp.waterfall import UsageTotals, xapp_view

if TYPE_CHECKING:
    from xapp.app import XappApp

# `*_created` series double every counter and histogram for a timestamp nobody here reads.
disable_created_metrics()

# Bucket edges in seconds. KPM is reported every period (10 ms - 1 s, default 100 ms) and goes stale at
# two periods: the edges resolve ages from a fraction of the fastest period to past the slowest limit.
KPM_AGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
# One loop step decides every site; it must stay far below the period.
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
# Send -> ACK/FAILURE through e2term and the DU; the loop's ACK timeout is a few periods.
RTT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
MAX_PENDING = 4096      # controls awaiting a reply, remembered for their round trip (a bounded table)


@dataclass(frozen=True)
class Family:
    name: str
    kind: str                   # "counter" | "gauge"
    help: str
    labels: tuple[str, ...]
    read: Callable[..., Any]    # (x, rest) -> number | None | iterable of (label values, number)


COLLECTED: list[Family] = []
SITE_GAUGES: list[tuple[Family, str | None]] = []   # (family, extra label or None)


def collected(name: str, kind: str, help_: str, labels: tuple[str, ...] = ()):
    """Register a family read at scrape time (see the module doc). Returns the function unchanged."""
    def register(fn):
        COLLECTED.append(Family(name, kind, help_, labels, fn))
        return fn
    return register


def site_gauge(name: str, help_: str, label: str | None = None):
    """Register a per-site gauge: `fn(x, site_id, rt)` returns a number, None (no sample), or with
    `label` a dict {label value: number}. Labels: ("site",) or ("site", label)."""
    def register(fn):
        SITE_GAUGES.append((Family(name, "gauge", help_, ("site",) + ((label,) if label else ()), fn), label))
        return fn
    return register


def _family(f: Family) -> Metric:
    cls = CounterMetricFamily if f.kind == "counter" else GaugeMetricFamily
    return cls(f.name, f.help, labels=f.labels)


def _add(m: Metric, labels: tuple[str, ...], value) -> None:
    if value is None or (isinstance(value, float) and math.isnan(value) and m.type == "counter"):
        return
    m.add_metric(list(labels), float(value))


class _Collector:
    """The read-at-scrape families of one xApp (prometheus_client's custom collector protocol)."""

    def __init__(self, owner: XappMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterable[Metric]:
        x, rest = self.owner.app, self.owner.rest
        for f in COLLECTED:
            m = _family(f)
            got = f.read(x, rest)
            if isinstance(got, (int, float)) or got is None:
                _add(m, (), got)
            else:
                for key, value in got:
                    _add(m, (key,) if isinstance(key, str) else tuple(str(k) for k in key), value)
            yield m
        for f, label in SITE_GAUGES:
            m = _family(f)
            for sid, rt in x.state.sites.items():
                got = f.read(x, sid, rt)
                if label is None:
                    _add(m, (sid,), got)
                else:
                    for key, value in (got or {}).items():
                        _add(m, (sid, str(key)), value)
            yield m


class XappMetrics:
    """One xApp's registry. The shell calls the observation hooks; `/metrics` calls `exposition`."""

    def __init__(self, app: XappApp) -> None:
        self.app = app
        self.rest: tuple[Any, dict] | None = None     # (ConnectionGuard, {status: count}) of the REST app
        self.registry = CollectorRegistry()
        self.kpm_age = Histogram(
            "weaver_kpm_age_at_decision_seconds",
            "Age of the oldest KPM report a site's period decision rested on (per decision, fresh sites).",
            ("site",), buckets=KPM_AGE_BUCKETS, registry=self.registry)
        self.step_seconds = Histogram(
            "weaver_loop_step_seconds", "Wall time of one control-loop step (xapp.loop.step, every site).",
            buckets=STEP_BUCKETS, registry=self.registry)
        self.control_rtt = Histogram(
            "weaver_control_round_trip_seconds",
            "RC control sent -> its E2 ACK or FAILURE reached the loop, by outcome (timeouts are not here: "
            "weaver_controls_total{result=\"failed\"} counts them with the failures).",
            ("site", "outcome"), buckets=RTT_BUCKETS, registry=self.registry)
        self._sent: dict[int, float] = {}
        self.registry.register(_Collector(self))

    # --- observation hooks (one call each in the shell) ----------------------------------------
    def stepped(self, state, now: float, wall_s: float) -> None:
        """After `xapp.loop.step(state, now, ...)` that took `wall_s`: the step's duration, and for each site
        it decided this step on fresh KPM, how old the oldest report behind that decision was."""
        self.step_seconds.observe(wall_s)
        for sid, rt in state.sites.items():
            v = rt.last_view
            if v is not None and v.t == now and v.fresh and rt.last:
                self.kpm_age.labels(sid).observe(max(0.0, now - min(s.received for s in rt.last.values())))

    def control_sent(self, control_id: int, now: float) -> None:
        if len(self._sent) >= MAX_PENDING:
            self._sent.pop(next(iter(self._sent)))
        self._sent[control_id] = now

    def control_done(self, site_id: str, control_id: int, outcome: str, now: float) -> None:
        """`outcome` as the shell logs it: "ack", "failure <cause>" or "timeout" (no round trip)."""
        sent = self._sent.pop(control_id, None)
        if sent is not None and outcome != "timeout":
            self.control_rtt.labels(site_id, outcome.split()[0]).observe(max(0.0, now - sent))

    # --- exposition -------------------------------------------------------------------------------
    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The scrape body and its content type, in the format the scraper's Accept header asks for."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


# ---------------------------------------------------------------- families read at scrape time
@collected("weaver_indications_total", "counter", "KPM indications decoded and accepted.")
def _indications(x, rest):
    return x.counters.indications


@collected("weaver_ingest_errors_total", "counter", "Indications dropped undecoded, by kind (xapp.ingest).",
           ("kind",))
def _ingest_errors(x, rest):
    return sorted(x.ingest.errors.items())


@collected("weaver_kpm_refused_total", "counter",
           "KPM reports refused for impossible values, by node (our subscription's) and reason.", ("node", "reason"))
def _kpm_refused(x, rest):
    return sorted(x.ingest.refused.items())


@collected("weaver_controls_total", "counter", "RC controls by result: sent, ack, failed (FAILURE or timeout).",
           ("result",))
def _controls(x, rest):
    c = x.counters
    return (("sent", c.controls_sent), ("ack", c.controls_acked), ("failed", c.controls_failed))


@collected("weaver_control_send_errors_total", "counter", "RC controls the RMR endpoint could not send.")
def _send_errors(x, rest):
    return x.counters.send_errors


@collected("weaver_control_replies_unmatched_total", "counter",
           "Control replies to no control of ours (another xApp's on the RIC's default route, or late).")
def _unmatched(x, rest):
    return x.counters.control_replies_unmatched


@collected("weaver_control_replies_bad_total", "counter", "Control replies that did not decode.")
def _bad_replies(x, rest):
    return x.counters.control_replies_bad


@collected("weaver_lease_grants_total", "counter", "Leases granted or renewed.")
def _grants(x, rest):
    return x.counters.grants


@collected("weaver_lease_revocations_total", "counter", "Leases revoked, by reason.", ("reason",))
def _revocations(x, rest):
    return sorted(x.counters.revocations.items())


@collected("weaver_broker_revocations_total", "counter",
           "Leases the broker ended, by reason, on every path: the loop's revocations, shutdown, a replaced, "
           "closed or disconnected agent stream (weaver_lease_revocations_total counts the xApp's decisions).",
           ("reason",))
def _broker_revocations(x, rest):
    return sorted((x.broker.revoked if x.broker else {}).items())


@collected("weaver_rmr_dropped_total", "counter", "RMR frames and connections refused, by reason.", ("reason",))
def _rmr_dropped(x, rest):
    c = x.counters
    dropped = dict(c.rmr_dropped, unknown_mtype=c.rmr_other)
    rs = getattr(x.rmr, "stats", None)
    if rs is not None:
        dropped.update(bad_frame_connection=rs.frame_errors, overflow_connection=rs.overflow_closes,
                       evicted_connection=rs.connections_evicted, health_check=rs.health_dropped)
    return sorted(dropped.items())


@collected("weaver_rmr_buffered_bytes", "gauge", "Bytes of partial RMR frames held (python backend).")
def _rmr_buffered(x, rest):
    return x.rmr.buffered if getattr(x.rmr, "stats", None) is not None else None


@collected("weaver_resubscriptions_total", "counter",
           "KPM subscriptions made again (SubMgr lost them, or the node's KPM went silent).")
def _resubscriptions(x, rest):
    return x.counters.resubscriptions


@collected("weaver_subscription_active", "gauge", "1 while the node's KPM subscription is active.", ("meid",))
def _subscription_active(x, rest):
    return [(st.meid, int(st.state == "active")) for st in x.sub_status.values()]


@collected("weaver_appmgr_registered", "gauge", "1 once appmgr accepted the xApp's registration.")
def _appmgr(x, rest):
    return x.counters.appmgr_registered


@collected("weaver_agents_connected", "gauge", "Agents with a lease stream open.")
def _agents(x, rest):
    return len(x.broker.sessions) if x.broker else 0


@collected("weaver_broker_refused_registrations_total", "counter",
           "Agent registrations the broker refused, by reason (xapp.agents).", ("reason",))
def _refused_registrations(x, rest):
    return sorted((x.broker.refused_registrations if x.broker else {}).items())


@collected("weaver_broker_refused_usage_reports_total", "counter",
           "Agent usage reports the broker refused, by reason (xapp.agents).", ("reason",))
def _refused_usage(x, rest):
    return sorted((x.broker.refused_usage if x.broker else {}).items())


@collected("weaver_site_grant_basis", "gauge",
           "1 for what the site's grants rest on: envelope (enforced by every node) or forecast.", ("site", "basis"))
def _grant_basis(x, rest):
    return [((sid, b), int(b == rt.safety.basis())) for sid, rt in x.state.sites.items()
            for b in ("envelope", "forecast")]


@collected("weaver_site_used_sms_seconds_total", "counter",
           "SM-seconds the site's agents reported using this run.", ("site",))
def _used(x, rest):
    book = x.broker.book.used_sm_ms if x.broker else {}
    return [(sid, book.get(sid, 0.0) / 1000.0) for sid in x.state.sites]


@collected("weaver_site_granted_sms_seconds_total", "counter",
           "SM-seconds leased to the site's agents (each grant or renewal covers one period).", ("site",))
def _granted(x, rest):
    return [(sid, x.site_tally(sid).sm_s_granted) for sid in x.state.sites]


@collected("weaver_site_deadline_misses_total", "counter",
           "Slots whose RAN demand missed its deadline, as the site's nodes report them in KPM (GPU.DeadlineMiss).",
           ("site",))
def _misses_total(x, rest):
    return [(sid, rt.misses) for sid, rt in x.state.sites.items()]


@collected("weaver_rest_connections", "gauge", "Open REST connections.")
def _rest_open(x, rest):
    return len(rest[0].open) if rest else None


@collected("weaver_rest_connections_cut_total", "counter", "REST connections cut by the guard, by reason.",
           ("reason",))
def _rest_cut(x, rest):
    if not rest:
        return ()
    g = rest[0]
    return (("head_timeout", g.head_timeouts), ("evicted", g.evicted), ("limit", g.refused))


@collected("weaver_rest_errors_total", "counter", "REST error responses, by status.", ("status",))
def _rest_errors(x, rest):
    return sorted((str(k), v) for k, v in (rest[1] if rest else {}).items())


@collected("weaver_log_lines_suppressed_total", "counter", "Log lines dropped by the rate limit (xapp.lograte).")
def _suppressed(x, rest):
    return lograte.suppressed_total()


# ---------------------------------------------------------------- per-site gauges
@site_gauge("weaver_site_gpu_sms", "SMs of the site's GPU (its declared capacity).")
def _gpu(x, sid, rt):
    return rt.cfg.gpu_sms


@site_gauge("weaver_site_envelope_sms", "SM envelope of the site's last period decision.")
def _envelope(x, sid, rt):
    return rt.last_view.envelope_sms if rt.last_view else None


@site_gauge("weaver_site_acked_envelope_sms", "The envelope the site's nodes acknowledged last.")
def _acked(x, sid, rt):
    return rt.acked_envelope


@site_gauge("weaver_site_grant_sms", "SMs granted to the site's agent by the last decision (0 = none).")
def _grant(x, sid, rt):
    return rt.grant_sms


@site_gauge("weaver_site_demand_mean_sms", "Estimated mean RAN SM demand of the next period.")
def _demand(x, sid, rt):
    return rt.last_estimate.mean if rt.last_estimate else None


@site_gauge("weaver_site_kpm_age_seconds", "Age of the site's oldest KPM report now.")
def _kpm_age(x, sid, rt):
    now = x.now()
    return max((now - s.received for s in rt.last.values()), default=None)


@site_gauge("weaver_site_misses_reported", "Deadline misses the site's nodes reported in KPM (a running total).")
def _misses(x, sid, rt):
    return rt.misses


@site_gauge("weaver_site_safety_slack_sms", "SMs between the RAN-first bound and the site's GPU (xapp.invariant).")
def _slack(x, sid, rt):
    return rt.safety.slack(x.now())


def _waterfall_of(x, sid, rt) -> dict:
    usage = x.broker.book.usage_totals.get(sid) if x.broker else None
    return xapp_view(rt.waterfall, usage or UsageTotals())


@site_gauge("weaver_site_waterfall_sm_seconds", "Utilisation waterfall stages since start, SM·s, on the xApp's "
            "meters: usable spare, granted, held (the agent's windows), used (its reports) (xapp.waterfall).",
            label="stage")
def _waterfall_stages(x, sid, rt):
    return _waterfall_of(x, sid, rt)["stages_sm_s"]


@site_gauge("weaver_site_waterfall_lost_sm_seconds", "SM·s lost between two waterfall stages since start, by "
            "cause; the label is '<from>-<to>/<cause>' (xapp.waterfall).", label="cause")
def _waterfall_lost(x, sid, rt):
    return {f"{leg['from']}-{leg['to']}/{c}": v for leg in _waterfall_of(x, sid, rt)["legs"]
            for c, v in leg["causes_sm_s"].items()}
