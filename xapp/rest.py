"""The operator REST API (aiohttp) over a running `XappApp`; thin adapters, one library call each.

Health: `/ric/v1/health/alive`, `/ric/v1/health/ready` (503 until the RMR endpoint and SDL are up; the
body also reports subscriptions, broker and leader, which do not gate: `xapp.app.READY_GATES`). SubMgr
notifications: `POST /ric/v1/subscriptions/response`. Operator API under `/api/v1` (config GET / PUT
behind `Authorization: Bearer <token>`; sites; time series; agents; controls; KPM subscriptions and their
audit; cross-site transfer windows), Prometheus text at `/metrics` and `/ric/v1/metrics` (the Go
framework's path, which the descriptor's scrape annotations name), the OpenAPI document at `/openapi.json`,
and the dashboard's static files from `xapp/static/` under `/static/` (`/` redirects).
Every error is JSON `{"error": ...}` with a 4xx status; a refused request changes nothing.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from schemas.credential import credential_ok
from xapp import waterfall
from xapp.aggregates import AnnouncementBook, AnnouncementError, parse_announcement
from xapp.config import ConfigError, XappConfig
from xapp.loop import controls_site
from xapp.restguard import MAX_DEPTH, ConnectionGuard, JsonErrorHandler, parse_json
from xapp.submgr import SubmgrError

if TYPE_CHECKING:
    from xapp.app import XappApp

STATIC = Path(__file__).resolve().parent / "static"
MAX_BODY = 256 * 1024
BODY_TIMEOUT_S = 10.0       # a body trickled slower than this is a 408, not a handler held forever
HEAD_TIMEOUT_S = 5.0        # the first request head on a connection (restguard.ConnectionGuard)
# Later heads: aiohttp closes a kept-alive connection idle this long. Above aiohttp's client pool
# timeout (15 s), so a polling client drops an idle connection before we do and never reuses one we
# are just closing.
KEEPALIVE_S = 20.0
MAX_CONNECTIONS = 256
APP_KEY = web.AppKey("xapp", object)
GUARD_KEY = web.AppKey("guard", ConnectionGuard)
ERRORS_KEY = web.AppKey("errors", dict)        # status -> count of error responses, for /metrics
AGGREGATES_KEY = web.AppKey("aggregates", AnnouncementBook)  # federated aggregate-transfer announcements
log = logging.getLogger("weaver.xapp.rest")


def _err(status: int, msg: str) -> web.Response:
    return web.json_response({"error": msg}, status=status)


def _x(request) -> XappApp:
    return request.app[APP_KEY]


async def _json_body(request) -> object:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=request.content_length)
    try:
        raw = await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
    except TimeoutError:
        raise web.HTTPRequestTimeout() from None
    return parse_json(raw, MAX_DEPTH)       # ValueError (a 400) for bad UTF-8, bad JSON, too deep, NaN


def _num(v):
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


async def alive(request):
    return web.json_response({"alive": True})


async def ready(request):
    x = _x(request)
    ok = x.ready()
    return web.json_response({"ready": ok, **x.readiness()}, status=200 if ok else 503)


async def notification(request):
    try:
        doc = await _json_body(request)
        resp = _x(request).submgr.on_notification(doc)
    except (ValueError, SubmgrError) as exc:
        return _err(400, str(exc))
    return web.json_response({"accepted": resp.subscription_id})


async def get_config(request):
    x = _x(request)
    return web.json_response({"controls": x.cfg.controls, "reload_error": x.watcher.last_error if x.watcher else None})


async def put_config(request):
    x = _x(request)
    token = x.cfg.rest.token()
    if token is None:
        return _err(403, "config updates are disabled: set the env var named by rest.config_token_env")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return _err(401, "missing or wrong bearer token")
    try:
        doc = await _json_body(request)
        if isinstance(doc, dict) and "controls" in doc:
            doc = doc["controls"]
        cfg = XappConfig.from_controls(doc)
    except (ValueError, ConfigError) as exc:
        return _err(400, str(exc))
    why = x.apply_config(cfg)
    if why:
        return _err(409, why)
    return web.json_response({"applied": True, "policy": cfg.policy.name})


def site_view(x: XappApp, site_id: str) -> dict:
    rt = x.state.sites[site_id]
    now = x.now()
    ages = {m: round(now - s.received, 3) for m, s in rt.last.items()}
    agent = x.broker.book.agents.get(site_id) if x.broker else None
    usage = None
    if agent is not None and agent.usage:
        u = agent.usage[-1]
        usage = {"sm_ms_used": u.sm_ms_used, "sm_ms_granted": u.sm_ms_granted, "overrun_ms": u.overrun_ms,
                 "steps": u.steps, "tokens": u.tokens, "loss": _num(u.loss), "val_loss": _num(u.val_loss),
                 "mode": u.mode, "mode_reason": u.mode_reason, "device": u.device, "window_ms": u.window_ms,
                 "used_sms": _num(u.used_sms), "age_s": round(now - u.t, 3)}
    lease = x.broker.book.leases.get(site_id) if x.broker else None
    v = rt.last_view
    est = rt.last_estimate
    return {
        "site_id": site_id, "gpu_sms": rt.cfg.gpu_sms, "granularity": rt.cfg.granularity,
        "controlled": controls_site(x.state, site_id),   # False: another replica (or the leader) controls it
        "nodes": {m: {"mode": nc.mode, "note": nc.note} for m, nc in rt.nodes.items()},
        "envelope_sms": v.envelope_sms if v else None, "acked_envelope_sms": rt.acked_envelope,
        "caps": [[q.sst, q.sd, q.min_ratio, q.max_ratio] for q in rt.acked_caps],
        "grant_sms": rt.grant_sms, "lease": {"lease_id": lease.lease.lease_id, "sm_count": lease.lease.sm_count,
                                             "seq": lease.lease.seq, "epoch": lease.lease.epoch} if lease else None,
        "demand_mean_sms": _num(est.mean) if est else None, "demand_peak_sms": _num(est.peak) if est else None,
        "estimate_source": est.source if est else "none", "misses_reported": rt.misses,
        "policy_inputs": {**rt.inputs.as_dict(), "periods": dict(rt.input_periods)},   # xapp.inputs
        "kpm_age_s": ages, "fresh": v.fresh if v else False, "reason": v.reason if v else "",
        "safety": _safety_view(rt, now),
        "agent": agent.reg.agent_id if agent else None, "usage": usage,
        "counters": {**dataclasses.asdict(x.site_tally(site_id)),
                     "sm_s_used": (x.broker.book.used_sm_ms.get(site_id, 0.0) if x.broker else 0.0) / 1000.0},
    }


def _safety_view(rt, now: float) -> dict:
    """What the site's grants rest on (xapp.invariant): `envelope` (enforced by every node) or
    `forecast` (the policy's own demand bound), and the terms of the RAN-first rule right now."""
    s = rt.safety
    own, inherited = s.own_and_inherited_sms(now)
    # inherited: leases another xApp instance may have issued, counted to their hard end (SiteSafety.inherit)
    return {"basis": s.basis(), "envelope_bound_sms": s.envelope_bound(), "leased_sms_held": own,
            "inherited_sms_held": inherited,
            "guard_sms": s.guard_sms, "slack_sms": s.slack(now), "grant_ceiling_sms": s.grant_ceiling(now),
            "deferred_envelope_sms": rt.deferred_envelope, "lifted": rt.lifted,
            "conservative_for_s": round(max(0.0, rt.conservative_until - now), 3),
            "conservative_reason": rt.conservative_reason if rt.conservative_until > now else "",
            "nodes": {m: {"enforced": n.enforced, "known_sms": n.known,
                          "in_flight_sms": list(n.inflight.values()),
                          "unknown_reason": n.unknown_reason if n.known is None else "",
                          "kpm_dropped": rt.feeds[m].dropped if m in rt.feeds else 0}
                      for m, n in s.nodes.items()}}


async def sites(request):
    x = _x(request)
    return web.json_response({"sites": [site_view(x, s) for s in x.state.sites]})


async def site(request):
    x = _x(request)
    sid = request.match_info["site"]
    if sid not in x.state.sites:
        return _err(404, f"unknown site {sid!r}")
    return web.json_response(site_view(x, sid))


async def series(request):
    x = _x(request)
    sid = request.match_info["site"]
    if sid not in x.state.sites:
        return _err(404, f"unknown site {sid!r}")
    try:
        minutes = float(request.query.get("minutes", x.cfg.rest.history_minutes))
        if not 0 < minutes <= 1440:
            raise ValueError
    except ValueError:
        return _err(400, "minutes must be a number in (0, 1440]")
    since = x.now() - minutes * 60
    offset = x.wall() - x.now()
    pts = [{"t": round(v.t + offset, 3), "envelope_sms": v.envelope_sms, "grant_sms": v.grant_sms,
            "demand_mean_sms": _num(v.demand_mean), "demand_peak_sms": _num(v.demand_peak), "source": v.source,
            "fresh": v.fresh, "basis": v.basis, "slack_sms": v.slack_sms}
           for v in x.state.sites[sid].views if v.t >= since]
    return web.json_response({"site_id": sid, "minutes": minutes, "points": pts})


async def agents(request):
    x = _x(request)
    out = []
    for sid, a in (x.broker.book.agents.items() if x.broker else ()):
        r = a.reg
        out.append({"site_id": sid, "agent_id": r.agent_id, "kind": r.kind, "sm_count": r.sm_count,
                    "granularity": r.granularity, "mode": r.mode, "capabilities": list(r.capabilities),
                    "job": r.job, "mode_evidence": r.mode_evidence, "confinement": r.confinement,
                    "last_seen_s": round(x.now() - a.last_seen, 3), "reports": a.reports})
    return web.json_response({"agents": out, "epoch": x.epoch})


async def subscriptions(request):
    return web.json_response(_x(request).subscription_view())


async def controls(request):
    return web.json_response({"controls": list(_x(request).controls_log)[-200:]})


async def transfers(request):
    x = _x(request)
    out = []
    for sid, a in (x.broker.book.agents.items() if x.broker else ()):
        for rnd, nbytes, deadline, workers in a.transfers:
            out.append({"site_id": sid, "round": rnd, "bytes": nbytes, "deadline_unix_ms": deadline,
                        "workers": workers})
    return web.json_response({"transfers": out})


async def aggregate_transfers(request):
    """Announced federated aggregate transfers (issue 18; xapp.aggregates), for a transport controller."""
    return web.json_response({"aggregates": request.app[AGGREGATES_KEY].view()})


async def announce_aggregate(request):
    """A site announces its own aggregates only: with a broker secret configured, the bearer credential must be
    the site's (HMAC-SHA256(secret, site_id), as on the lease stream) and the site one of the xApp's."""
    try:
        a = parse_announcement(await _json_body(request))
    except (ValueError, AnnouncementError) as exc:
        return _err(400, str(exc))
    x = request.app[APP_KEY]
    if x is not None:
        if all(s.site_id != a.site_id for s in x.cfg.sites):
            return _err(403, "site_id: not a site of this xApp")
        secret = x.cfg.broker.secret()
        given = request.headers.get("Authorization", "")
        bearer = given[7:] if given.startswith("Bearer ") else ""
        if secret and not credential_ok(secret, a.site_id, bearer, time.time()):
            return _err(401, f"missing or wrong credential for {a.site_id} (Authorization: Bearer <site token>)")
    try:
        replaced = request.app[AGGREGATES_KEY].add(a)
    except AnnouncementError as exc:
        return _err(503, str(exc))
    return web.json_response({"accepted": True, "replaced": replaced}, status=200 if replaced else 201)


async def rounds(request):
    """What became of each round at each site (its RoundReport): committed, tokens, bytes, waiting."""
    x = _x(request)
    out = [{"site_id": sid, "round": rnd, "committed": committed, "participants": participants, "tokens": tokens,
            "bytes_sent": bytes_sent, "wall_ms": wall_ms, "wait_ms": wait_ms}
           for sid, a in (x.broker.book.agents.items() if x.broker else ())
           for rnd, committed, participants, tokens, bytes_sent, wall_ms, wait_ms in a.rounds]
    return web.json_response({"rounds": out})


def waterfall_view(x: XappApp) -> dict:
    """Per site and in total: usable spare -> granted -> held -> used, each leg's causes (xapp.waterfall),
    on the xApp's own meters; `xapp` carries the raw ledgers a platform combines with its ground truth."""
    book = x.broker.book if x.broker else None
    out = {}
    for sid, rt in x.state.sites.items():
        usage = book.usage_totals.get(sid) if book else None
        usage = usage or waterfall.UsageTotals()
        out[sid] = {**waterfall.xapp_view(rt.waterfall, usage),
                    "xapp": {"ledger": rt.waterfall.as_dict(), "usage": usage.as_dict()}}
    return {"sites": out, "total": waterfall.total(out)}


async def get_waterfall(request):
    return web.json_response(waterfall_view(_x(request)))


async def metrics(request):
    """The xApp's registry (xapp.metrics) in the format the scraper asks for, by prometheus_client."""
    m = _x(request).metrics
    m.rest = (request.app[GUARD_KEY], request.app[ERRORS_KEY])   # these two counters live on the REST app
    body, content_type = m.exposition(request.headers.get("Accept"))
    return web.Response(body=body, headers={"Content-Type": content_type})


def openapi_spec() -> dict:
    def op(summary, responses=None, **extra):
        return {"summary": summary, "responses": responses or {"200": {"description": "OK"}}, **extra}
    site_param = [{"name": "site", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "openapi": "3.0.3",
        "info": {"title": "Weaver xApp", "version": "0.1.0",
                 "description": "KPM in, compute-smoothing RC control and GPU leases out."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
                       "schemas": {"Error": {"type": "object", "properties": {"error": {"type": "string"}}}}},
        "paths": {
            "/ric/v1/health/alive": {"get": op("liveness")},
            "/ric/v1/health/ready": {"get": op("readiness: RMR and SDL up (subscriptions, broker, leader reported)",
                                               {"200": {"description": "ready"}, "503": {"description": "not ready"}})},
            "/ric/v1/subscriptions/response": {"post": op("SubMgr subscription notification",
                                                          {"200": {"description": "accepted"},
                                                           "400": {"description": "malformed"}})},
            "/api/v1/config": {"get": op("current controls"),
                               "put": op("replace controls (validated against schema.json)",
                                         {"200": {"description": "applied"}, "400": {"description": "invalid"},
                                          "401": {"description": "bad token"}, "409": {"description": "needs restart"}},
                                         security=[{"bearer": []}])},
            "/api/v1/sites": {"get": op("per-site state: envelope, caps, grant, usage, misses, KPM age")},
            "/api/v1/sites/{site}": {"get": op("one site", {"200": {"description": "OK"},
                                                            "404": {"description": "unknown site"}},
                                               parameters=site_param)},
            "/api/v1/sites/{site}/series": {"get": op("time series of the last N minutes", parameters=site_param + [
                {"name": "minutes", "in": "query", "schema": {"type": "number"}}])},
            "/api/v1/agents": {"get": op("connected agents")},
            "/api/v1/controls": {"get": op("RC controls log")},
            "/api/v1/subscriptions": {"get": op("each node's KPM subscription: state (pending, active, missing, "
                                                "resubscribing, failed), last audit against SubMgr's list, "
                                                "re-subscription count")},
            "/api/v1/transfers": {"get": op("planned cross-site transfer windows (site, bytes, deadline, round)")},
            "/api/v1/transfers/aggregates": {
                "get": op("announced federated aggregate transfers (site, round, bytes, earliest start, deadline)"),
                "post": op("announce one aggregate transfer (a re-announcement of a site's round replaces it)",
                           {"201": {"description": "stored"}, "200": {"description": "replaced"},
                            "400": {"description": "invalid (the message names the field)"},
                            "413": {"description": "body too large"}})},
            "/api/v1/waterfall": {"get": op("utilisation waterfall per site and in total: usable spare -> granted "
                                            "-> held -> used (SM·s), every leg's loss by cause (xapp.waterfall)")},
            "/api/v1/rounds": {"get": op("cross-site round reports per site (committed, tokens, bytes, wait)")},
            "/metrics": {"get": op("Prometheus metrics")},
            "/ric/v1/metrics": {"get": op("Prometheus metrics (the same as /metrics)")},
        },
    }


async def openapi(request):
    return web.json_response(openapi_spec())


async def index(request):
    raise web.HTTPFound("/static/index.html")


async def static_file(request):
    """A file under xapp/static/ or a JSON 404: nothing outside the directory (after resolving `..` and
    symlinks), no directory listings."""
    try:
        path = (STATIC / request.match_info["path"]).resolve()
        ok = path.is_relative_to(STATIC) and path.is_file()
    except (OSError, ValueError):           # a NUL byte, a name too long
        ok = False
    if not ok:
        return _err(404, f"no such file {request.path[:200]}")
    return web.FileResponse(path)


@web.middleware
async def json_errors(request, handler):
    """Every error a client sees is JSON {"error": ...}: a 4xx for the client's faults, a 500 for ours,
    logged here once and its traceback never sent."""
    try:
        resp = await handler(request)
    except web.HTTPRequestEntityTooLarge:
        resp = _err(413, f"body larger than {MAX_BODY} bytes")
    except web.HTTPMethodNotAllowed as exc:
        resp = _err(405, f"{request.method} not allowed on {request.path} (allowed: {sorted(exc.allowed_methods)})")
    except web.HTTPNotFound:
        resp = _err(404, f"no such path {request.path[:200]}")
    except web.HTTPException as exc:
        if exc.status < 400:                # redirects pass through
            raise
        resp = _err(exc.status, exc.reason)
    except Exception:
        log.exception("REST %s %s failed", request.method, request.path[:200])
        resp = _err(500, "internal error (the xApp logged it)")
    if resp.status >= 400 and resp.content_type != "application/json":
        resp = _err(resp.status, resp.reason or "error")
    if resp.status >= 400:
        errors = request.app[ERRORS_KEY]
        errors[resp.status] = errors.get(resp.status, 0) + 1
    return resp


def build_app(x: XappApp) -> web.Application:
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY)
    app[APP_KEY] = x
    app[GUARD_KEY] = ConnectionGuard(head_timeout_s=HEAD_TIMEOUT_S, max_connections=MAX_CONNECTIONS)
    app[ERRORS_KEY] = {}
    app[AGGREGATES_KEY] = AnnouncementBook()
    r = app.router
    r.add_get("/ric/v1/health/alive", alive)
    r.add_get("/ric/v1/health/ready", ready)
    r.add_post("/ric/v1/subscriptions/response", notification)
    r.add_get("/api/v1/config", get_config)
    r.add_put("/api/v1/config", put_config)
    r.add_get("/api/v1/sites", sites)
    r.add_get("/api/v1/sites/{site}", site)
    r.add_get("/api/v1/sites/{site}/series", series)
    r.add_get("/api/v1/agents", agents)
    r.add_get("/api/v1/controls", controls)
    r.add_get("/api/v1/subscriptions", subscriptions)
    r.add_get("/api/v1/transfers", transfers)
    r.add_get("/api/v1/transfers/aggregates", aggregate_transfers)
    r.add_post("/api/v1/transfers/aggregates", announce_aggregate)
    r.add_get("/api/v1/rounds", rounds)
    r.add_get("/api/v1/waterfall", get_waterfall)
    r.add_get("/metrics", metrics)
    r.add_get("/ric/v1/metrics", metrics)      # the Go xapp-frame's path; prometheus.io/path in the descriptor
    r.add_get("/openapi.json", openapi)
    r.add_get("/", index)
    if STATIC.is_dir():
        r.add_get("/static/{path:.+}", static_file)
    return app


class _GuardedSite(web.TCPSite):
    """TCPSite with the connection guard between the socket and aiohttp (TCPSite.start, but the factory
    handed to create_server is the guard; aiohttp offers no hook for it)."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard, keepalive_s: float):
        super().__init__(runner, host, port)
        self.guard, self.keepalive_s = guard, keepalive_s

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server, loop = self._runner.server, asyncio.get_running_loop()
        # what web.Server() makes, with the kwargs start_rest gives the runner, errors in JSON
        self.guard.factory = lambda: JsonErrorHandler(server, loop=loop, keepalive_timeout=self.keepalive_s,
                                                      access_log=None)
        self._server = await loop.create_server(self.guard, self._host, self._port, backlog=self._backlog)
        self._bound_port = self._server.sockets[0].getsockname()[1]


async def start_rest(x: XappApp, port: int, host: str = "0.0.0.0", *, head_timeout_s: float | None = None,
                     max_connections: int | None = None, keepalive_s: float = KEEPALIVE_S
                     ) -> tuple[web.AppRunner, int]:
    app = build_app(x)
    guard = app[GUARD_KEY]
    guard.head_timeout_s = head_timeout_s or guard.head_timeout_s
    guard.max_connections = max_connections or guard.max_connections
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=keepalive_s)
    await runner.setup()
    site = _GuardedSite(runner, host, port, guard, keepalive_s)
    await site.start()
    return runner, site.port
