"""appmgr registration (e2-facts §7): POST /ric/v1/register when the platform's variables are present,
skipped with one log line when they are not. Unlike ricxappframe there is no 10-second sleep on stop and
a missing Service variable is a logged reason, not a crashed thread.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import aiohttp

log = logging.getLogger("weaver.xapp.appmgr")
REQUIRED = ("CONFIG_FILE", "HOSTNAME", "APP_NAMESPACE")


def registration(env=os.environ) -> tuple[str, dict] | str:
    """(url, body) to POST, or the reason registration does not apply."""
    missing = [v for v in REQUIRED if not env.get(v)]
    if missing:
        return f"not on an OSC platform ({', '.join(missing)} unset)"
    host, ns = env["HOSTNAME"], env["APP_NAMESPACE"]
    plt = env.get("PLT_NAMESPACE", "ricplt")
    prefix = f"SERVICE_{ns}_{host}".upper().replace("-", "_")
    http, rmr = env.get(f"{prefix}_HTTP_PORT"), env.get(f"{prefix}_RMR_PORT")
    if not http or not rmr:
        return f"{prefix}_HTTP_PORT / _RMR_PORT unset: Kubernetes Service variables missing"
    try:
        doc = json.loads(Path(env["CONFIG_FILE"]).read_text())
    except (OSError, ValueError) as exc:
        return f"cannot read CONFIG_FILE for registration: {exc}"
    body = {"appName": host, "appVersion": str(doc.get("version", "")), "configPath": "",
            "appInstanceName": str(doc.get("name", host)),
            "httpEndpoint": http.replace("tcp://", ""), "rmrEndpoint": rmr.replace("tcp://", ""),
            "config": json.dumps(doc)}
    return f"http://service-{plt}-appmgr-http.{plt}:8080/ric/v1/register", body


async def register_if_configured(app, env=os.environ, attempts: int = 5) -> bool:
    reg = registration(env)
    if isinstance(reg, str):
        log.info("appmgr registration skipped: %s", reg)
        return False
    url, body = reg
    for _ in range(attempts):
        if app.ready():
            break
        await asyncio.sleep(2.0)
    async with aiohttp.ClientSession() as s:
        for i in range(attempts):
            try:
                async with s.post(url, json=body, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status < 300:
                        log.info("registered with appmgr at %s", url)
                        return True
                    log.warning("appmgr answered %d: %s", r.status, (await r.text())[:200])
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("appmgr registration attempt %d failed: %s", i + 1, exc)
            await asyncio.sleep(2.0 * (i + 1))
    return False


async def deregister(env=os.environ) -> bool:
    """POST /ric/v1/deregister (what ricxappframe's stop() does, minus its 10 s sleep)."""
    reg = registration(env)
    if isinstance(reg, str):
        return False
    url, body = reg
    url = url.rsplit("/", 1)[0] + "/deregister"
    try:
        async with aiohttp.ClientSession() as s, s.post(
                url, json={"appName": body["appName"], "appInstanceName": body["appInstanceName"]},
                timeout=aiohttp.ClientTimeout(total=3)) as r:
            return r.status < 300
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("appmgr deregistration failed: %s", exc)
        return False
