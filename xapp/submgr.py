"""OSC subscription manager REST client (e2-facts.md §6), written without ricxappframe's client.

ricxappframe 3.2.2's client POSTs and DELETEs to inconsistent URLs and emits snake_case keys; this one
builds the CamelCase body itself, POSTs `{base}/subscriptions`, DELETEs `{base}/subscriptions/{id}`.

The outcome of a POST arrives later as a notification that SubMgr POSTs to the xApp at
`/ric/v1/subscriptions/response` (served by `xapp.rest`, which hands the body to `on_notification`).
When SubMgr merges identical subscriptions that notification can arrive *before* the 201, so
notifications nobody waits for are parked (`NotificationBook`) and matched when the 201 lands.

Pure parts (`subscription_body`, `parse_subscription_response`, `NotificationBook`) have no I/O; the
async `SubmgrClient` adds HTTP with retries and exponential backoff (503 = node not connected yet).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from xapp.config import SubmgrConfig

log = logging.getLogger("weaver.xapp.submgr")

ACTION_TYPES = ("insert", "policy", "report")
ERROR_SOURCES = ("SUBMGR", "RTMGR", "DBAAS", "ASN1", "E2Node", "")


class SubmgrError(RuntimeError):
    """SubMgr refused, failed, or answered something that is not the documented schema."""


@dataclass(frozen=True, kw_only=True)
class ActionSpec:
    action_id: int
    definition: bytes | None = None
    action_type: str = "report"

    def __post_init__(self) -> None:
        if not 0 <= self.action_id <= 255:
            raise ValueError(f"ActionID {self.action_id} outside 0..255")
        if self.action_type not in ACTION_TYPES:
            raise ValueError(f"ActionType {self.action_type!r} not one of {ACTION_TYPES}")


@dataclass(frozen=True, kw_only=True)
class SubscriptionSpec:
    meid: str
    ran_function_id: int
    xapp_event_instance_id: int
    event_trigger: bytes
    actions: tuple[ActionSpec, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.ran_function_id <= 4095:
            raise ValueError(f"RANFunctionID {self.ran_function_id} outside 0..4095")
        if not 0 <= self.xapp_event_instance_id <= 65535:
            raise ValueError(f"XappEventInstanceId {self.xapp_event_instance_id} outside 0..65535")
        if not self.actions or len({a.action_type for a in self.actions}) != 1:
            raise ValueError("a subscription needs at least one action, all of one type (SubMgr refuses mixes)")


@dataclass(frozen=True, kw_only=True)
class SubscriptionInstance:
    xapp_event_instance_id: int
    e2_event_instance_id: int          # 0 = failed; otherwise the RMR sub_id of the indications
    error_cause: str = ""
    error_source: str = ""
    timeout_type: str = ""

    @property
    def ok(self) -> bool:
        return self.e2_event_instance_id != 0


@dataclass(frozen=True, kw_only=True)
class SubscriptionResponse:
    subscription_id: str
    instances: tuple[SubscriptionInstance, ...]


def subscription_body(spec: SubscriptionSpec, cfg: SubmgrConfig, subscription_id: str = "") -> dict[str, Any]:
    """The CamelCase JSON SubMgr expects; E2SM bytes travel as arrays of ints 0..255."""
    return {
        "SubscriptionId": subscription_id,
        "ClientEndpoint": {"Host": cfg.client_host, "HTTPPort": cfg.http_port, "RMRPort": cfg.rmr_port},
        "Meid": spec.meid,
        "RANFunctionID": spec.ran_function_id,
        "E2SubscriptionDirectives": {"E2TimeoutTimerValue": cfg.e2_timeout_s, "E2RetryCount": cfg.e2_retries,
                                     "RMRRoutingNeeded": True},
        "SubscriptionDetails": [{
            "XappEventInstanceId": spec.xapp_event_instance_id,
            "EventTriggers": list(spec.event_trigger),
            "ActionToBeSetupList": [
                {"ActionID": a.action_id, "ActionType": a.action_type,
                 **({"ActionDefinition": list(a.definition)} if a.definition is not None else {}),
                 "SubsequentAction": {"SubsequentActionType": "continue", "TimeToWait": "zero"}}
                for a in spec.actions],
        }],
    }


def _int(d: dict, key: str, lo: int, hi: int, where: str) -> int:
    v = d.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise SubmgrError(f"{where}.{key}: expected an integer in {lo}..{hi}, got {v!r}")
    return v


def parse_subscription_response(doc: Any) -> SubscriptionResponse:
    """The 201 body and the notification share this schema; anything else raises SubmgrError."""
    if not isinstance(doc, dict):
        raise SubmgrError(f"subscription response must be a JSON object, got {type(doc).__name__}")
    sid = doc.get("SubscriptionId")
    if not isinstance(sid, str) or not sid or len(sid) > 256:
        raise SubmgrError(f"SubscriptionId: expected a non-empty string, got {sid!r}")
    raw = doc.get("SubscriptionInstances")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise SubmgrError("SubscriptionInstances: expected a list")
    out = []
    for i, inst in enumerate(raw):
        where = f"SubscriptionInstances[{i}]"
        if not isinstance(inst, dict):
            raise SubmgrError(f"{where}: expected an object")
        strs = {}
        for k in ("ErrorCause", "ErrorSource", "TimeoutType"):
            v = inst.get(k) or ""
            if not isinstance(v, str):
                raise SubmgrError(f"{where}.{k}: expected a string")
            strs[k] = v
        out.append(SubscriptionInstance(
            xapp_event_instance_id=_int(inst, "XappEventInstanceId", 0, 65535, where),
            e2_event_instance_id=_int(inst, "E2EventInstanceId", 0, 65535, where),
            error_cause=strs["ErrorCause"], error_source=strs["ErrorSource"], timeout_type=strs["TimeoutType"]))
    return SubscriptionResponse(subscription_id=sid, instances=tuple(out))


class NotificationBook:
    """Matches notifications to the POSTs that caused them, in whichever order they arrive."""

    def __init__(self, max_parked: int = 1024) -> None:
        self.parked: dict[str, SubscriptionResponse] = {}
        self.max_parked = max_parked

    def park(self, resp: SubscriptionResponse) -> None:
        if len(self.parked) >= self.max_parked:           # bounded: a flood of strays cannot grow memory
            self.parked.pop(next(iter(self.parked)))
        self.parked[resp.subscription_id] = resp

    def take(self, subscription_id: str) -> SubscriptionResponse | None:
        return self.parked.pop(subscription_id, None)


@dataclass(frozen=True, kw_only=True)
class SubscriptionOutcome:
    subscription_id: str
    e2_event_instance_id: int


Sleep = Callable[[float], Awaitable[None]]


class SubmgrClient:
    """Async SubMgr client. `base_url` is e.g. `http://service-ricplt-submgr-http.ricplt:8088/ric/v1`."""

    def __init__(self, cfg: SubmgrConfig, session: aiohttp.ClientSession, sleep: Sleep = asyncio.sleep,
                 on_instance: Callable[[SubscriptionInstance], None] | None = None) -> None:
        """`on_instance` sees every successful instance as soon as its notification arrives, before
        `subscribe` returns: indications can start flowing that early, and the caller may route them."""
        self.on_instance = on_instance
        self.cfg = cfg
        self.base = cfg.url.rstrip("/")
        self.session = session
        self.sleep = sleep
        self.book = NotificationBook()
        self._waiting: dict[str, asyncio.Future[SubscriptionResponse]] = {}

    def on_notification(self, doc: Any) -> SubscriptionResponse:
        """Hand a notification body here (raises SubmgrError for a malformed one)."""
        resp = parse_subscription_response(doc)
        if self.on_instance is not None:
            for inst in resp.instances:
                if inst.ok:
                    self.on_instance(inst)
        fut = self._waiting.get(resp.subscription_id)
        if fut is not None and not fut.done():
            fut.set_result(resp)
        else:
            log.info("notification for %s arrived before its 201: parked", resp.subscription_id)
            self.book.park(resp)
        return resp

    async def _request(self, method: str, url: str, body: Any = None,
                       attempts: int | None = None) -> tuple[int, Any]:
        delay = self.cfg.backoff_s
        last = ""
        attempts = self.cfg.attempts if attempts is None else attempts
        for attempt in range(1, attempts + 1):
            try:
                async with self.session.request(method, url, json=body,
                                                timeout=aiohttp.ClientTimeout(total=10)) as r:
                    text = await r.text()
                    if r.status < 500:
                        try:
                            doc = await r.json(content_type=None) if text.strip() else None
                        except ValueError:
                            doc = text
                        return r.status, doc
                    last = f"HTTP {r.status}: {text[:200]}"
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < attempts:
                log.warning("%s %s failed (%s); retry %d/%d in %.2fs", method, url, last, attempt,
                            attempts - 1, delay)
                await self.sleep(delay)
                delay = min(delay * 2, 30.0)
        raise SubmgrError(f"{method} {url} failed after {attempts} attempts: {last}")

    async def subscribe(self, spec: SubscriptionSpec, timeout_s: float = 10.0) -> SubscriptionOutcome:
        status, doc = await self._request("POST", f"{self.base}/subscriptions", subscription_body(spec, self.cfg))
        if status != 201:
            raise SubmgrError(f"subscribe {spec.meid}/{spec.ran_function_id}: HTTP {status}: {doc!r}"[:400])
        first = parse_subscription_response(doc)
        sid = first.subscription_id
        resp = self.book.take(sid)
        if resp is None:
            fut = asyncio.get_running_loop().create_future()
            self._waiting[sid] = fut
            try:
                resp = await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                # SubMgr holds the id whatever became of it: delete it (retried while it answers 400, still
                # in progress) so nothing leaks, then report the failure.
                with contextlib.suppress(SubmgrError):
                    await self.unsubscribe(sid)
                raise SubmgrError(f"subscription {sid} for {spec.meid}: no notification within {timeout_s}s") from None
            finally:
                self._waiting.pop(sid, None)
        inst = next((i for i in resp.instances if i.xapp_event_instance_id == spec.xapp_event_instance_id), None)
        if inst is None or not inst.ok:
            why = f"{inst.error_source}: {inst.error_cause}" if inst else "no instance for our XappEventInstanceId"
            # The id is SubMgr's even when E2 failed: delete it so nothing leaks.
            await self.unsubscribe(sid)
            raise SubmgrError(f"subscription {sid} for {spec.meid} failed ({why})")
        return SubscriptionOutcome(subscription_id=sid, e2_event_instance_id=inst.e2_event_instance_id)

    async def unsubscribe(self, subscription_id: str) -> bool:
        """DELETE, as SubMgr answers it (pkg/control/control.go RESTSubscriptionDeleteHandler):
        - 204: SubMgr deletes it in the background, or does not know the id, or is deleting it already;
          it is gone either way -> True;
        - 400: its request is still being handled and nothing was deleted -> retried with backoff for
          as long as SubMgr may still be at it (E2 timeout x tries), then SubmgrError: not gone;
        - 404 (not SubMgr's, a proxy's or an older API's): unknown -> False."""
        url = f"{self.base}/subscriptions/{subscription_id}"
        budget = self.cfg.e2_timeout_s * (self.cfg.e2_retries + 1) + 2 * self.cfg.backoff_s
        delay, waited = self.cfg.backoff_s, 0.0
        while True:
            status, doc = await self._request("DELETE", url)
            if status in (200, 204):
                return True
            if status == 404:
                return False
            if status != 400 or waited >= budget:
                raise SubmgrError(f"unsubscribe {subscription_id}: HTTP {status}: {doc!r}"[:400])
            log.info("SubMgr still setting up %s (HTTP 400): DELETE again in %.2fs", subscription_id, delay)
            await self.sleep(delay)
            waited += delay
            delay = min(delay * 2, 5.0)

    async def list(self, attempts: int | None = None) -> list[dict[str, Any]]:
        """SubMgr's subscriptions. `attempts=1` for a periodic audit: the next period is the retry."""
        status, doc = await self._request("GET", f"{self.base}/subscriptions", attempts=attempts)
        if status != 200 or not isinstance(doc, list):
            raise SubmgrError(f"list subscriptions: HTTP {status}: {doc!r}"[:400])
        return doc
