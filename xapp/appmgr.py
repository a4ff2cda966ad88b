"""appmgr registration (e2-facts §7), as both OSC frameworks do it: once the xApp is ready (RMR and SDL
up, `XappApp.ready`), POST /ric/v1/register to appmgr. rtmgr builds the xApp's routes from appmgr's
records, so an unregistered xApp gets no subscription route ("XApp instance not found").

The body is ricxappframe 3.2.2's `register()`: appName = HOSTNAME (the xapp-std chart sets the pod's
hostname to the xApp name), appInstanceName / appVersion = the descriptor's name / version,
httpEndpoint / rmrEndpoint from the Kubernetes Service variables SERVICE_<APP_NAMESPACE>_<HOSTNAME>_
{HTTP,RMR}_PORT without their tcp:// scheme, config = the descriptor. APP_NAMESPACE comes from the
environment (Go xapp-frame), else the descriptor's top-level key (ricxappframe reads it there), else
"ricxapp" (both frameworks' DEFAULT_XAPP_NS): the chart sets neither. PLT_NAMESPACE defaults to "ricplt".

Unlike ricxappframe, registration waits for readiness as long as it takes (the framework gives up after
five 2-second checks and then never registers), appmgr is retried with a capped backoff until it answers
2xx, stop has no 10-second sleep, and a missing Service variable is a logged reason, not a crashed thread.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import aiohttp

log = logging.getLogger("weaver.xapp.appmgr")
REQUIRED = ("CONFIG_FILE", "HOSTNAME")
DEFAULT_XAPP_NS = "ricxapp"         # ricxappframe util/constants.py, xapp-frame pkg/xapp/types.go
DEFAULT_PLT_NS = "ricplt"
MAX_BACKOFF_S = 30.0


def appmgr_base(env=os.environ) -> str:
    plt = env.get("PLT_NAMESPACE") or DEFAULT_PLT_NS
    return f"http://service-{plt}-appmgr-http.{plt}:8080"


def registration(env=os.environ) -> tuple[str, dict] | str:
    """(url, body) to POST, or the reason registration does not apply."""
    missing = [v for v in REQUIRED if not env.get(v)]
    if missing:
        return f"not on an OSC platform ({', '.join(missing)} unset)"
    try:
        doc = json.loads(Path(env["CONFIG_FILE"]).read_text())
    except (OSError, ValueError) as exc:
        return f"cannot read CONFIG_FILE for registration: {exc}"
    if not isinstance(doc, dict):
        return "CONFIG_FILE is not a JSON object"
    host = env["HOSTNAME"]
    ns = env.get("APP_NAMESPACE") or str(doc.get("APP_NAMESPACE") or "") or DEFAULT_XAPP_NS
    prefix = f"SERVICE_{ns}_{host}".upper().replace("-", "_")
    http, rmr = env.get(f"{prefix}_HTTP_PORT"), env.get(f"{prefix}_RMR_PORT")
    if not http or not rmr:
        return f"{prefix}_HTTP_PORT / _RMR_PORT unset: Kubernetes Service variables missing"
    body = {"appName": host, "appVersion": str(doc.get("version", "")), "configPath": "",
            "appInstanceName": str(doc.get("name", host)),
            "httpEndpoint": http.split("//")[-1], "rmrEndpoint": rmr.split("//")[-1],
            "config": json.dumps(doc)}
    return f"{appmgr_base(env)}/ric/v1/register", body


async def register_if_configured(app, env=os.environ, attempts: int | None = None, *,
                                 appmgr_url: str | None = None, poll_s: float = 0.5) -> bool:
    """Register once `app.ready()`; `attempts` POSTs at most (None: until appmgr accepts). `appmgr_url`
    replaces the in-cluster appmgr address (tests, a RIC whose appmgr lives elsewhere)."""
    reg = registration(env)
    if isinstance(reg, str):
        log.info("appmgr registration skipped: %s", reg)
        return False
    url, body = reg
    if appmgr_url:
        url = appmgr_url.rstrip("/") + "/ric/v1/register"
    waited = False
    while not app.ready():              # RMR and SDL only: never the subscriptions (READY_GATES)
        if not waited:
            log.info("appmgr registration waits for readiness: %s", app.readiness())
            waited = True
        await asyncio.sleep(poll_s)
    i = 0
    async with aiohttp.ClientSession() as s:
        while attempts is None or i < attempts:
            i += 1
            try:
                async with s.post(url, json=body, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status < 300:
                        log.info("registered with appmgr at %s as %s/%s", url, body["appName"],
                                 body["appInstanceName"])
                        app.counters.appmgr_registered = 1
                        return True
                    log.warning("appmgr answered %d: %s", r.status, (await r.text())[:200])
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("appmgr registration attempt %d failed: %s", i, exc)
            await asyncio.sleep(min(2.0 * i, MAX_BACKOFF_S))
    return False


async def deregister(env=os.environ, *, appmgr_url: str | None = None) -> bool:
    """POST /ric/v1/deregister (what ricxappframe's stop() does, minus its 10 s sleep)."""
    reg = registration(env)
    if isinstance(reg, str):
        return False
    url, body = reg
    url = (appmgr_url.rstrip("/") + "/ric/v1" if appmgr_url else url.rsplit("/", 1)[0]) + "/deregister"
    try:
        async with aiohttp.ClientSession() as s, s.post(
                url, json={"appName": body["appName"], "appInstanceName": body["appInstanceName"]},
                timeout=aiohttp.ClientTimeout(total=3)) as r:
            return r.status < 300
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("appmgr deregistration failed: %s", exc)
        return False
