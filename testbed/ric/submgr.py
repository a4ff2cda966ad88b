"""The subscription manager: OSC SubMgr's REST API in front, E2 subscription procedures over RMR behind.

Behaviour follows e2-facts §6 and OSC SubMgr's code (ric-plt-submgr pkg/control/control.go and
registry.go; the notifier is ric-plt-xapp-frame pkg/xapp/subscription.go), difference by difference:
- `POST /ric/v1/subscriptions` validates the CamelCase body, answers 503 while the node is not
  connected, de-duplicates an identical re-POST by md5 (same SubscriptionId back), and answers
  **201** `{SubscriptionId, SubscriptionInstances: null}` at once (SubMgr fills in only the id). A
  POST naming a `SubscriptionId` it does not hold (or one whose request is still being handled) is
  **404**; naming one it holds runs the new details under that id. The outcome follows
  asynchronously: a POST to `http://<Host>:<HTTPPort>/ric/v1/subscriptions/response` with one
  instance per subscription detail, `E2EventInstanceId` = the RMR sub_id its indications will carry,
  or 0 with `ErrorCause`/`ErrorSource` (/`TimeoutType`) on failure. A notification is tried up to 10
  times, `notify_interval_s` (SubMgr: 5 s) apart, and only a 200 answer counts as delivered.
- E2 side: RIC requestor ID 123, instance ID = the sub_id; one E2 procedure per node at a time;
  `E2TimeoutTimerValue` seconds per try and `E2RetryCount` retries. The indication route (sub_id ->
  the xApp's RMR port) is installed before the request goes out, as rtmgr would be asked to.
- `DELETE /ric/v1/subscriptions/{id}` answers **400** and deletes nothing while the subscription's
  request is still being handled (the caller retries later); otherwise **204** at once -- also for an id
  it does not know, or one already being deleted -- and runs RICsubscriptionDelete for each E2
  subscription in the background, so the list holds them until the nodes answered.
  `GET /ric/v1/subscriptions` lists the E2 subscriptions as SubMgr does: `SubscriptionId` = the E2
  instance ID (the sub_id), `Meid`, `ClientEndpoint` = the RMR endpoints, `SubscriptionInstances` null;
  no REST id. The REST ids are listed per node by SubMgr's debug route
  `GET /ric/v1/get_e2node_rest_subscriptions/{ranName}` (served here too, same shape). As OSC's, the
  DELETE asks nothing of the caller: any client that knows (or lists) an id can delete another client's
  subscription (issue 13 tests on it).
- State is in memory only: `forget_all()` is a restart that lost its store (OSC's SubMgr restores from
  SDL unless its DB went too): every REST subscription and indication route is gone, and no E2 delete
  reaches the nodes, which keep theirs.
Every bad request gets a 4xx with a JSON body `{"error": "..."}` and changes nothing.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import ClientSession, ClientTimeout, web

from e2sm import e2ap
from e2sm.errors import E2DecodeError, E2EncodeError
from xapp.rmr import RmrMessage, RmrSendError

from .routes import (
    RIC_SUB_DEL_FAILURE,
    RIC_SUB_DEL_REQ,
    RIC_SUB_DEL_RESP,
    RIC_SUB_FAILURE,
    RIC_SUB_REQ,
    RIC_SUB_RESP,
)
from .subscriptions import (
    SubscriptionDetail,
    SubscriptionInstance,
    SubscriptionParams,
    SubscriptionRequestError,
    parse_subscription_params,
    render_response,
)

log = logging.getLogger("weaver.ric.submgr")

REQUESTOR_ID = 123  # OSC submgr's RIC requestor ID
MAX_SUB_ID = 65535
# xapp-frame's Subscriber.Notify: subscription.retryCount (10) tries, subscription.retryDelay (5 s) apart.
NOTIFY_TRIES, NOTIFY_INTERVAL_S = 10, 5.0


class NodeNotConnected(Exception):
    """The E2 node named by Meid has no E2 connection (REST 503)."""


class UnknownSubscription(KeyError):
    """A POST names a SubscriptionId that is not held, or is still being handled (REST 404)."""


class SubscriptionInProgress(Exception):
    """A DELETE of a subscription whose request is still being handled (REST 400: retry later)."""


@dataclass
class RestSubscription:
    """One REST subscription and the E2 subscriptions (one per detail) it created."""

    subscription_id: str
    params: SubscriptionParams
    digest: str
    instances: dict[int, SubscriptionInstance] = field(default_factory=dict)  # by XappEventInstanceId
    sub_ids: dict[int, int] = field(default_factory=dict)  # XappEventInstanceId -> live sub_id
    task: asyncio.Task | None = None
    processed: bool = False      # SubMgr's !SubReqOngoing: set before each detail's notification
    deleted: bool = False        # SubMgr's SubDelReqOngoing: the background delete has begun


RmrSend = Callable[[RmrMessage], Awaitable[object]]
Notify = Callable[[str, dict], Awaitable[None]]


class SubscriptionManager:
    """Owns sub_ids, the REST <-> E2 mapping and the E2 procedures.

    `send` puts an RMR message on the way to the E2 termination; `is_connected(meid)` says whether a
    node is E2-connected (the R-NIB's view); `routes(sub_id, rmr_endpoint | None)` installs or removes
    an indication route; `notify(url, body)` POSTs a notification. Feed replies from the E2
    termination to `on_rmr`.
    """

    def __init__(self, send: RmrSend, is_connected: Callable[[str], bool],
                 routes: Callable[[int, str | None], None], notify: Notify | None = None,
                 notify_tries: int = NOTIFY_TRIES, notify_interval_s: float = NOTIFY_INTERVAL_S) -> None:
        self._send = send
        self._is_connected = is_connected
        self._routes = routes
        self._notify = notify or functools.partial(post_notification, tries=notify_tries,
                                                   interval_s=notify_interval_s)
        self._subs: dict[str, RestSubscription] = {}
        self._by_digest: dict[str, str] = {}
        self._in_use: set[int] = set()
        self._next_sub_id = 1
        self._waiters: dict[tuple[int, str], asyncio.Future] = {}
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task] = set()
        self.stats = {"e2_decode_errors": 0, "unexpected_replies": 0, "notify_failures": 0}

    # -- REST-facing calls --------------------------------------------------------------------------

    def subscribe(self, params: SubscriptionParams) -> tuple[str, bool]:
        """Accept a validated request; returns (SubscriptionId, created). Raises `NodeNotConnected`, and
        `UnknownSubscription` for a `SubscriptionId` not held (or still being handled), as SubMgr's
        GetOrCreateRestSubscription does."""
        if not self._is_connected(params.meid):
            raise NodeNotConnected(params.meid)
        if params.subscription_id:
            named = self._subs.get(params.subscription_id)
            if named is None or named.deleted or not named.processed:
                raise UnknownSubscription(params.subscription_id)
        digest = params.digest()
        existing = self._by_digest.get(digest)
        if existing is not None and not self._subs[existing].deleted:
            sub = self._subs[existing]
            if sub.task is not None and sub.task.done() and sub.instances:
                # The xApp asked again: it may have lost the first notification, so repeat it.
                self._background(self._notify_all(sub))
            return existing, False
        if params.subscription_id:          # new details under a held id (SubMgr reuses the REST subscription)
            sub = self._subs[params.subscription_id]
            sub.params, sub.digest, sub.processed = params, digest, False
            self._by_digest[digest] = sub.subscription_id
            sub.task = asyncio.ensure_future(self._run_subscribe(sub))
            return sub.subscription_id, False
        rest_id = secrets.token_hex(8)
        while rest_id in self._subs:
            rest_id = secrets.token_hex(8)
        sub = RestSubscription(rest_id, params, digest)
        self._subs[rest_id] = sub
        self._by_digest[digest] = rest_id
        sub.task = asyncio.ensure_future(self._run_subscribe(sub))
        return rest_id, True

    def _background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # keep a reference until it is done
        task.add_done_callback(self._tasks.discard)

    def unsubscribe(self, subscription_id: str) -> asyncio.Task | None:
        """SubMgr's RESTSubscriptionDeleteHandler: raises `SubscriptionInProgress` while the request is
        still being handled (nothing deleted); an unknown id, or one already being deleted, is no error
        (None). Otherwise the E2 deletes start in the background: returns their task."""
        sub = self._subs.get(subscription_id)
        if sub is None or sub.deleted:
            return None
        if not sub.processed:
            raise SubscriptionInProgress(subscription_id)
        sub.deleted = True
        task = asyncio.ensure_future(self._delete_all(sub))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _delete_all(self, sub: RestSubscription) -> None:
        if sub.task is not None and not sub.task.done():   # a notification still being retried
            await asyncio.wait([sub.task])
        for xid, sub_id in list(sub.sub_ids.items()):
            await self._run_delete(sub, sub_id)
            sub.sub_ids.pop(xid, None)
        if self._by_digest.get(sub.digest) == sub.subscription_id:
            del self._by_digest[sub.digest]
        if self._subs.get(sub.subscription_id) is sub:
            del self._subs[sub.subscription_id]

    def forget_all(self) -> int:
        """A restart without its store: everything forgotten, routes withdrawn; returns how many.
        The sub_id allocator goes on (the nodes still hold the old E2 subscriptions under those ids)."""
        n = len(self._subs)
        for sub in self._subs.values():
            sub.deleted = True
            if sub.task is not None and not sub.task.done():
                sub.task.cancel()
            for sub_id in sub.sub_ids.values():
                self._in_use.discard(sub_id)
                self._routes(sub_id, None)
        self._subs.clear()
        self._by_digest.clear()
        return n

    def list(self) -> list[dict]:
        """GET /ric/v1/subscriptions: one entry per live E2 subscription (SubscriptionData schema)."""
        out = []
        for sub in self._subs.values():
            for sub_id in sub.sub_ids.values():
                # registry.go QueryHandler: these three fields; SubscriptionInstances stays null.
                out.append({"SubscriptionId": sub_id, "Meid": sub.params.meid,
                            "ClientEndpoint": [sub.params.client.rmr], "SubscriptionInstances": None})
        return out

    def node_rest_subscriptions(self, meid: str) -> dict[str, dict]:
        """SubMgr's GetAllE2NodeRestSubscriptions: REST id -> the exported RESTSubscription fields."""
        return {rid: {"Created": "", "Meid": sub.params.meid, "InstanceIds": list(sub.sub_ids.values()) or None,
                      "SubReqOngoing": not sub.processed, "SubDelReqOngoing": sub.deleted}
                for rid, sub in self._subs.items() if sub.params.meid == meid}

    async def close(self) -> None:
        tasks = [s.task for s in self._subs.values() if s.task is not None and not s.task.done()]
        tasks += [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)

    # -- E2 side ------------------------------------------------------------------------------------

    def on_rmr(self, msg: RmrMessage) -> None:
        """A reply from the E2 termination (12011/12012/12021/12022)."""
        kind = {RIC_SUB_RESP: "sub", RIC_SUB_FAILURE: "sub", RIC_SUB_DEL_RESP: "del",
                RIC_SUB_DEL_FAILURE: "del"}.get(msg.mtype)
        if kind is None:
            self.stats["unexpected_replies"] += 1
            return
        try:
            pdu = e2ap.decode_e2ap(msg.payload)
        except E2DecodeError as exc:
            self.stats["e2_decode_errors"] += 1
            log.warning("submgr: undecodable mtype %d from %s: %s", msg.mtype, msg.meid, exc)
            return
        request_id = getattr(pdu, "request_id", None)
        if request_id is None or request_id.requestor != REQUESTOR_ID:
            self.stats["unexpected_replies"] += 1
            return
        fut = self._waiters.get((request_id.instance, kind))
        if fut is None or fut.done():
            self.stats["unexpected_replies"] += 1
            return
        fut.set_result(pdu)

    def _allocate(self) -> int:
        for _ in range(MAX_SUB_ID):
            sid = self._next_sub_id
            self._next_sub_id = 1 if sid >= MAX_SUB_ID else sid + 1
            if sid not in self._in_use:
                self._in_use.add(sid)
                return sid
        raise RuntimeError("all 65535 E2 subscription instance IDs are in use")

    def _release(self, sub_id: int) -> None:
        self._in_use.discard(sub_id)
        self._routes(sub_id, None)

    async def _procedure(self, meid: str, sub_id: int, kind: str, mtype: int, payload: bytes,
                         timeout_s: float, retries: int):
        """Send and wait for the reply, retrying; returns the decoded reply or None on timeout."""
        lock = self._node_locks.setdefault(meid, asyncio.Lock())
        async with lock:  # one E2 procedure per node at a time, as OSC submgr
            for _ in range(retries + 1):
                fut = asyncio.get_running_loop().create_future()
                self._waiters[(sub_id, kind)] = fut
                try:
                    await self._send(RmrMessage(mtype, payload, sub_id=sub_id, meid=meid))
                    return await asyncio.wait_for(fut, timeout_s)
                except TimeoutError:
                    log.info("submgr: %s %d to %s: no reply in %ss", kind, sub_id, meid, timeout_s)
                except RmrSendError as exc:
                    log.info("submgr: %s %d to %s: %s", kind, sub_id, meid, exc)
                    await asyncio.sleep(min(timeout_s, 0.2))
                finally:
                    self._waiters.pop((sub_id, kind), None)
            return None

    async def _run_subscribe(self, sub: RestSubscription) -> None:
        for detail in sub.params.details:
            inst = await self._subscribe_detail(sub, detail)
            sub.instances[detail.xapp_event_instance_id] = inst
            if not sub.sub_ids and self._by_digest.get(sub.digest) == sub.subscription_id:
                # Nothing is live: a re-POST must try the E2 node again, not replay this failure.
                del self._by_digest[sub.digest]
            sub.processed = True      # SubMgr marks it processed before notifying: a DELETE may come now
            await self._notify_one(sub, inst)

    async def _subscribe_detail(self, sub: RestSubscription, detail: SubscriptionDetail) -> SubscriptionInstance:
        p = sub.params
        xid = detail.xapp_event_instance_id
        sub_id = self._allocate()
        try:
            request = e2ap.RicSubscriptionRequest(
                request_id=e2ap.RicRequestId(REQUESTOR_ID, sub_id), ran_function_id=p.ran_function_id,
                event_trigger=detail.event_triggers,
                actions=tuple(e2ap.RicAction(action_id=a.action_id, action_type=a.action_type,
                                             definition=a.definition, subsequent=_subsequent(a.subsequent))
                              for a in detail.actions))
            payload = e2ap.encode_e2ap(request)
        except (E2EncodeError, ValueError, TypeError) as exc:
            self._release(sub_id)
            return SubscriptionInstance(xid, 0, f"E2AP encode failed: {exc}", "ASN1")
        if p.directives.rmr_routing_needed:
            self._routes(sub_id, p.client.rmr)
        reply = await self._procedure(p.meid, sub_id, "sub", RIC_SUB_REQ, payload, p.directives.timeout_s,
                                      p.directives.retries)
        if isinstance(reply, e2ap.RicSubscriptionResponse) and reply.admitted:
            sub.sub_ids[xid] = sub_id
            return SubscriptionInstance(xid, sub_id)
        self._release(sub_id)
        if reply is None:
            return SubscriptionInstance(xid, 0, "E2 subscription request timed out", "SUBMGR", "E2-Timeout")
        if isinstance(reply, e2ap.RicSubscriptionFailure):
            return SubscriptionInstance(xid, 0, f"RICsubscriptionFailure: {_cause_text(reply.cause)}", "E2Node")
        if isinstance(reply, e2ap.RicSubscriptionResponse):
            causes = ", ".join(f"action {a}: {_cause_text(c)}" for a, c in reply.not_admitted)
            return SubscriptionInstance(xid, 0, f"no action admitted ({causes})", "E2Node")
        return SubscriptionInstance(xid, 0, f"unexpected reply {type(reply).__name__}", "E2Node")

    async def _run_delete(self, sub: RestSubscription, sub_id: int) -> None:
        p = sub.params
        payload = e2ap.encode_e2ap(e2ap.RicSubscriptionDeleteRequest(
            request_id=e2ap.RicRequestId(REQUESTOR_ID, sub_id), ran_function_id=p.ran_function_id))
        reply = await self._procedure(p.meid, sub_id, "del", RIC_SUB_DEL_REQ, payload, p.directives.timeout_s,
                                      p.directives.retries)
        if reply is None:
            log.warning("submgr: delete of sub_id %d on %s timed out; released anyway", sub_id, p.meid)
        self._release(sub_id)

    async def _notify_one(self, sub: RestSubscription, inst: SubscriptionInstance) -> None:
        try:
            await self._notify(sub.params.client.notification_url, render_response(sub.subscription_id, (inst,)))
        except Exception as exc:  # the xApp being away must not break the manager
            self.stats["notify_failures"] += 1
            log.warning("submgr: notification to %s failed: %s", sub.params.client.notification_url, exc)

    async def _notify_all(self, sub: RestSubscription) -> None:
        for inst in list(sub.instances.values()):
            await self._notify_one(sub, inst)


def _subsequent(s) -> e2ap.SubsequentAction | None:
    # The REST API allows TimeToWait "zero", which E2AP v2's RICtimeToWait lacks: w1ms is the nearest.
    if s is None:
        return None
    return e2ap.SubsequentAction(s.kind, "w1ms" if s.time_to_wait == "zero" else s.time_to_wait)


def _cause_text(cause) -> str:
    if cause is None:
        return "unspecified"
    return f"{getattr(cause, 'group', '?')}:{getattr(cause, 'value', '?')}"


async def post_notification(url: str, body: dict, tries: int = NOTIFY_TRIES,
                            interval_s: float = NOTIFY_INTERVAL_S) -> None:
    """POST the notification body as xapp-frame's Notify does: up to `tries` POSTs `interval_s` apart,
    and only 200 counts as delivered (a 201 or 204 is tried again). Raises after the last try."""
    async with ClientSession(timeout=ClientTimeout(total=5)) as session:
        for attempt in range(1, tries + 1):
            try:
                async with session.post(url, json=body) as resp:
                    if resp.status == 200:
                        return
                    raise RuntimeError(f"HTTP {resp.status}")
            except Exception:
                if attempt == tries:
                    raise
                await asyncio.sleep(interval_s)


# -- HTTP adapter -----------------------------------------------------------------------------------

def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def build_app(manager: SubscriptionManager, max_body: int = 1 << 20) -> web.Application:
    """The aiohttp application serving the SubMgr REST API on `manager`."""

    async def post(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > max_body:
            return _error(413, f"body over {max_body} bytes")
        try:
            raw = await request.read()
        except web.HTTPException as exc:
            return _error(exc.status, exc.reason)
        try:
            params = parse_subscription_params(raw)
        except SubscriptionRequestError as exc:
            return _error(400, str(exc))
        try:
            sub_id, _ = manager.subscribe(params)
        except NodeNotConnected:
            return _error(503, f"no E2 connection to {params.meid}")
        except UnknownSubscription:
            return _error(404, f"no subscription {params.subscription_id!r} to add to")
        return web.json_response(render_response(sub_id, None), status=201)

    async def delete(request: web.Request) -> web.Response:
        try:
            manager.unsubscribe(request.match_info["id"])
        except SubscriptionInProgress:
            return _error(400, f"subscription {request.match_info['id']!r} is still being set up; retry later")
        return web.Response(status=204)

    async def get(request: web.Request) -> web.Response:
        return web.json_response(manager.list())

    async def node_subs(request: web.Request) -> web.Response:
        return web.json_response(manager.node_rest_subscriptions(request.match_info["ran"]))

    async def alive(request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    @web.middleware
    async def json_errors(request: web.Request, handler):
        # Unknown paths and wrong methods also answer JSON, so a client parsing errors always can.
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _error(exc.status, exc.reason)
            raise

    app = web.Application(middlewares=[json_errors], client_max_size=max_body)
    app.router.add_post("/ric/v1/subscriptions", post)
    app.router.add_get("/ric/v1/subscriptions", get)
    app.router.add_delete("/ric/v1/subscriptions/{id}", delete)
    app.router.add_get("/ric/v1/get_e2node_rest_subscriptions/{ran}", node_subs)
    app.router.add_get("/ric/v1/health/alive", alive)
    app.router.add_get("/ric/v1/health/ready", alive)
    return app

