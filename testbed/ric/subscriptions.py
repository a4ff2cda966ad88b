"""The OSC subscription manager's REST model (e2-facts §6), parsed into frozen dataclasses.

`parse_subscription_params(body)` turns the CamelCase JSON an xApp POSTs to `/ric/v1/subscriptions`
into `SubscriptionParams`, or raises `SubscriptionRequestError` naming the field; nothing else.
`render_*` produce the response and notification bodies with the exact OSC key names.
Pure: no I/O.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

TIME_TO_WAIT = ("zero", "w1ms", "w2ms", "w5ms", "w10ms", "w20ms", "w30ms", "w40ms", "w50ms", "w100ms",
                "w200ms", "w500ms", "w1s", "w2s", "w5s", "w10s", "w20s", "w60s")
ACTION_TYPES = ("insert", "policy", "report")
ERROR_SOURCES = ("SUBMGR", "RTMGR", "DBAAS", "ASN1", "E2Node")
TIMEOUT_TYPES = ("E2-Timeout", "RTMGR-Timeout", "DBAAS-Timeout")


class SubscriptionRequestError(ValueError):
    """A request body that does not follow the SubMgr REST schema; the message names the field."""


@dataclass(frozen=True)
class ClientEndpoint:
    host: str
    http_port: int
    rmr_port: int

    @property
    def rmr(self) -> str:
        return f"{self.host}:{self.rmr_port}"

    @property
    def notification_url(self) -> str:
        return f"http://{self.host}:{self.http_port}/ric/v1/subscriptions/response"


@dataclass(frozen=True)
class SubsequentAction:
    kind: str  # "continue" | "wait"
    time_to_wait: str  # "zero" | "w1ms" ... "w60s"


@dataclass(frozen=True)
class ActionToBeSetup:
    action_id: int
    action_type: str
    definition: bytes | None = None
    subsequent: SubsequentAction | None = None


@dataclass(frozen=True)
class SubscriptionDetail:
    xapp_event_instance_id: int
    event_triggers: bytes
    actions: tuple[ActionToBeSetup, ...]


@dataclass(frozen=True)
class E2Directives:
    timeout_s: int = 2
    retries: int = 2
    rmr_routing_needed: bool = True


@dataclass(frozen=True)
class SubscriptionParams:
    """A validated POST /ric/v1/subscriptions body."""

    client: ClientEndpoint
    meid: str
    ran_function_id: int
    details: tuple[SubscriptionDetail, ...]
    directives: E2Directives = E2Directives()
    subscription_id: str = ""

    def digest(self) -> str:
        """md5 over everything but SubscriptionId: what submgr uses to spot an identical re-POST."""
        return hashlib.md5(json.dumps(_canonical(self), sort_keys=True).encode(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class SubscriptionInstance:
    """One E2 subscription's outcome: `e2_event_instance_id` 0 means it failed."""

    xapp_event_instance_id: int
    e2_event_instance_id: int
    error_cause: str = ""
    error_source: str = ""
    timeout_type: str = ""


def _canonical(p: SubscriptionParams) -> dict:
    return {
        "client": [p.client.host, p.client.http_port, p.client.rmr_port], "meid": p.meid,
        "ran_function_id": p.ran_function_id,
        "details": [[d.xapp_event_instance_id, d.event_triggers.hex(),
                     [[a.action_id, a.action_type, a.definition.hex() if a.definition is not None else None,
                       [a.subsequent.kind, a.subsequent.time_to_wait] if a.subsequent else None]
                      for a in d.actions]] for d in p.details],
    }


def _obj(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise SubscriptionRequestError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _int(obj: dict, key: str, where: str, lo: int, hi: int, default: int | None = None) -> int:
    if key not in obj or obj[key] is None:
        if default is None:
            raise SubscriptionRequestError(f"{where}.{key}: required")
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise SubscriptionRequestError(f"{where}.{key}: expected an integer, got {json.dumps(v)[:40]}")
    if not lo <= v <= hi:
        raise SubscriptionRequestError(f"{where}.{key}: {v} is outside {lo}..{hi}")
    return v


def _str(obj: dict, key: str, where: str, max_len: int, required: bool = True) -> str:
    v = obj.get(key)
    if v is None:
        if required:
            raise SubscriptionRequestError(f"{where}.{key}: required")
        return ""
    if not isinstance(v, str):
        raise SubscriptionRequestError(f"{where}.{key}: expected a string")
    if len(v) > max_len or (required and not v):
        raise SubscriptionRequestError(f"{where}.{key}: must be 1..{max_len} characters")
    return v


def _octets(v, where: str) -> bytes:
    # E2SM bytes travel as JSON arrays of integers 0..255 (e2-facts §6).
    if not isinstance(v, list) or any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b <= 255 for b in v):
        raise SubscriptionRequestError(f"{where}: expected an array of integers 0..255")
    return bytes(v)


def _action(raw, where: str) -> ActionToBeSetup:
    a = _obj(raw, where)
    action_type = a.get("ActionType")
    if action_type not in ACTION_TYPES:
        raise SubscriptionRequestError(f"{where}.ActionType: must be one of {', '.join(ACTION_TYPES)}")
    definition = a.get("ActionDefinition")
    subsequent = None
    if a.get("SubsequentAction") is not None:
        s = _obj(a["SubsequentAction"], f"{where}.SubsequentAction")
        kind = s.get("SubsequentActionType")
        if kind not in ("continue", "wait"):
            raise SubscriptionRequestError(f"{where}.SubsequentAction.SubsequentActionType: continue or wait")
        ttw = s.get("TimeToWait", "zero")
        if ttw not in TIME_TO_WAIT:
            raise SubscriptionRequestError(f"{where}.SubsequentAction.TimeToWait: zero or w1ms..w60s")
        subsequent = SubsequentAction(kind, ttw)
    return ActionToBeSetup(
        action_id=_int(a, "ActionID", where, 0, 255), action_type=action_type,
        definition=None if definition is None else _octets(definition, f"{where}.ActionDefinition"),
        subsequent=subsequent)


def _detail(raw, where: str) -> SubscriptionDetail:
    d = _obj(raw, where)
    actions_raw = d.get("ActionToBeSetupList")
    if not isinstance(actions_raw, list) or not 1 <= len(actions_raw) <= 16:
        raise SubscriptionRequestError(f"{where}.ActionToBeSetupList: expected an array of 1..16 actions")
    actions = tuple(_action(a, f"{where}.ActionToBeSetupList[{i}]") for i, a in enumerate(actions_raw))
    if len({a.action_type for a in actions}) > 1:
        # OSC submgr refuses mixed action types in one subscription.
        raise SubscriptionRequestError(f"{where}.ActionToBeSetupList: mixed action types are not supported")
    if len({a.action_id for a in actions}) != len(actions):
        raise SubscriptionRequestError(f"{where}.ActionToBeSetupList: duplicate ActionID")
    if "EventTriggers" not in d:
        raise SubscriptionRequestError(f"{where}.EventTriggers: required")
    return SubscriptionDetail(
        xapp_event_instance_id=_int(d, "XappEventInstanceId", where, 0, 65535),
        event_triggers=_octets(d["EventTriggers"], f"{where}.EventTriggers"), actions=actions)


def parse_subscription_params(body: bytes | str | dict) -> SubscriptionParams:
    """Validate a POST body; raises `SubscriptionRequestError` (never anything else) on bad input."""
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SubscriptionRequestError(f"body is not JSON: {exc}") from None
        except RecursionError:    # json's decoder recurses per nesting level: deeply nested input is refused
            raise SubscriptionRequestError("body is nested too deeply") from None
    p = _obj(body, "body")
    ce = _obj(p.get("ClientEndpoint"), "body.ClientEndpoint")
    client = ClientEndpoint(
        host=_str(ce, "Host", "body.ClientEndpoint", 253),
        http_port=_int(ce, "HTTPPort", "body.ClientEndpoint", 1, 65535),
        rmr_port=_int(ce, "RMRPort", "body.ClientEndpoint", 1, 65535))
    if any(c in client.host for c in " |;,/:"):
        raise SubscriptionRequestError("body.ClientEndpoint.Host: not a host name")
    directives = E2Directives()
    if p.get("E2SubscriptionDirectives") is not None:
        dd = _obj(p["E2SubscriptionDirectives"], "body.E2SubscriptionDirectives")
        routing = dd.get("RMRRoutingNeeded", True)
        if not isinstance(routing, bool):
            raise SubscriptionRequestError("body.E2SubscriptionDirectives.RMRRoutingNeeded: expected a boolean")
        directives = E2Directives(
            timeout_s=_int(dd, "E2TimeoutTimerValue", "body.E2SubscriptionDirectives", 1, 10, default=2),
            retries=_int(dd, "E2RetryCount", "body.E2SubscriptionDirectives", 0, 10, default=2),
            rmr_routing_needed=routing)
    details_raw = p.get("SubscriptionDetails")
    if not isinstance(details_raw, list) or not 1 <= len(details_raw) <= 64:
        raise SubscriptionRequestError("body.SubscriptionDetails: expected an array of 1..64 entries")
    details = tuple(_detail(d, f"body.SubscriptionDetails[{i}]") for i, d in enumerate(details_raw))
    meid = _str(p, "Meid", "body", 31)
    if any(c.isspace() or c == "|" for c in meid):
        raise SubscriptionRequestError("body.Meid: must not contain spaces or '|'")
    return SubscriptionParams(
        client=client, meid=meid, ran_function_id=_int(p, "RANFunctionID", "body", 0, 4095), details=details,
        directives=directives, subscription_id=_str(p, "SubscriptionId", "body", 64, required=False))


def render_instance(inst: SubscriptionInstance) -> dict:
    out: dict = {"XappEventInstanceId": inst.xapp_event_instance_id, "E2EventInstanceId": inst.e2_event_instance_id}
    if inst.error_cause:
        out["ErrorCause"] = inst.error_cause
    if inst.error_source:
        out["ErrorSource"] = inst.error_source
    if inst.timeout_type:
        out["TimeoutType"] = inst.timeout_type
    return out


def render_response(subscription_id: str, instances: tuple[SubscriptionInstance, ...] | None = ()) -> dict:
    """The SubscriptionResponse schema: the 201 body and the notification body share it. `None`
    renders `SubscriptionInstances: null`, as SubMgr's 201 (it sets only the id)."""
    return {"SubscriptionId": subscription_id,
            "SubscriptionInstances": None if instances is None else [render_instance(i) for i in instances]}


def subscription_body(params: SubscriptionParams) -> dict:
    """The JSON an xApp would POST for `params` (the inverse of `parse_subscription_params`)."""
    details = []
    for d in params.details:
        actions = []
        for a in d.actions:
            act: dict = {"ActionID": a.action_id, "ActionType": a.action_type}
            if a.definition is not None:
                act["ActionDefinition"] = list(a.definition)
            if a.subsequent is not None:
                act["SubsequentAction"] = {"SubsequentActionType": a.subsequent.kind,
                                           "TimeToWait": a.subsequent.time_to_wait}
            actions.append(act)
        details.append({"XappEventInstanceId": d.xapp_event_instance_id, "EventTriggers": list(d.event_triggers),
                        "ActionToBeSetupList": actions})
    return {
        "SubscriptionId": params.subscription_id,
        "ClientEndpoint": {"Host": params.client.host, "HTTPPort": params.client.http_port,
                           "RMRPort": params.client.rmr_port},
        "Meid": params.meid, "RANFunctionID": params.ran_function_id,
        "E2SubscriptionDirectives": {"E2TimeoutTimerValue": params.directives.timeout_s,
                                     "E2RetryCount": params.directives.retries,
                                     "RMRRoutingNeeded": params.directives.rmr_routing_needed},
        "SubscriptionDetails": details,
    }
