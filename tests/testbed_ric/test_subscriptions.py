"""The SubMgr REST model: valid bodies parse, every kind of garbage gives SubscriptionRequestError only."""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.ric.subscriptions import (
    SubscriptionInstance,
    SubscriptionRequestError,
    parse_subscription_params,
    render_response,
    subscription_body,
)

GOOD = {
    "SubscriptionId": "",
    "ClientEndpoint": {"Host": "service-ricxapp-weaver-http.ricxapp", "HTTPPort": 8080, "RMRPort": 4560},
    "Meid": "gnb_001_01_00000001", "RANFunctionID": 2,
    "E2SubscriptionDirectives": {"E2TimeoutTimerValue": 2, "E2RetryCount": 2, "RMRRoutingNeeded": True},
    "SubscriptionDetails": [{"XappEventInstanceId": 1, "EventTriggers": [0, 99],
                             "ActionToBeSetupList": [{"ActionID": 1, "ActionType": "report",
                                                      "ActionDefinition": [0, 1, 1],
                                                      "SubsequentAction": {"SubsequentActionType": "continue",
                                                                           "TimeToWait": "zero"}}]}],
}


def test_good_body_parses_and_round_trips():
    p = parse_subscription_params(json.dumps(GOOD).encode())
    assert p.meid == "gnb_001_01_00000001" and p.ran_function_id == 2
    assert p.details[0].event_triggers == b"\x00\x63"
    assert p.details[0].actions[0].definition == b"\x00\x01\x01"
    assert p.client.notification_url == "http://service-ricxapp-weaver-http.ricxapp:8080/ric/v1/subscriptions/response"
    assert parse_subscription_params(subscription_body(p)) == p


def test_digest_ignores_subscription_id_but_not_content():
    a = parse_subscription_params(GOOD)
    b = copy.deepcopy(GOOD)
    b["SubscriptionId"] = "mine"
    assert parse_subscription_params(b).digest() == a.digest()
    b["SubscriptionDetails"][0]["EventTriggers"] = [0, 98]
    assert parse_subscription_params(b).digest() != a.digest()


def _mutated(path, value):
    body = copy.deepcopy(GOOD)
    target = body
    for k in path[:-1]:
        target = target[k]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


@pytest.mark.parametrize("path,value,needle", [
    (("Meid",), KeyError, "Meid"),
    (("Meid",), "", "Meid"),
    (("Meid",), "x" * 40, "Meid"),
    (("RANFunctionID",), 4096, "RANFunctionID"),
    (("RANFunctionID",), True, "RANFunctionID"),
    (("RANFunctionID",), "2", "RANFunctionID"),
    (("ClientEndpoint",), KeyError, "ClientEndpoint"),
    (("ClientEndpoint", "HTTPPort"), 0, "HTTPPort"),
    (("ClientEndpoint", "Host"), "a b", "Host"),
    (("E2SubscriptionDirectives", "E2TimeoutTimerValue"), 11, "E2TimeoutTimerValue"),
    (("E2SubscriptionDirectives", "RMRRoutingNeeded"), "yes", "RMRRoutingNeeded"),
    (("SubscriptionDetails",), [], "SubscriptionDetails"),
    (("SubscriptionDetails", 0, "EventTriggers"), [256], "EventTriggers"),
    (("SubscriptionDetails", 0, "EventTriggers"), KeyError, "EventTriggers"),
    (("SubscriptionDetails", 0, "XappEventInstanceId"), 70000, "XappEventInstanceId"),
    (("SubscriptionDetails", 0, "ActionToBeSetupList", 0, "ActionType"), "destroy", "ActionType"),
    (("SubscriptionDetails", 0, "ActionToBeSetupList", 0, "ActionID"), 256, "ActionID"),
    (("SubscriptionDetails", 0, "ActionToBeSetupList", 0, "SubsequentAction", "TimeToWait"), "w3ms", "TimeToWait"),
])
def test_bad_fields_named(path, value, needle):
    with pytest.raises(SubscriptionRequestError, match=needle):
        parse_subscription_params(_mutated(path, value))


def test_mixed_action_types_refused():
    body = copy.deepcopy(GOOD)
    body["SubscriptionDetails"][0]["ActionToBeSetupList"].append({"ActionID": 2, "ActionType": "policy"})
    with pytest.raises(SubscriptionRequestError, match="mixed"):
        parse_subscription_params(body)


def test_render_failure_instance_like_submgr():
    body = render_response("abc", (SubscriptionInstance(1, 0, "timeout", "SUBMGR", "E2-Timeout"),))
    assert body == {"SubscriptionId": "abc", "SubscriptionInstances": [
        {"XappEventInstanceId": 1, "E2EventInstanceId": 0, "ErrorCause": "timeout", "ErrorSource": "SUBMGR",
         "TimeoutType": "E2-Timeout"}]}


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode())))
def test_fuzz_garbage_only_raises_request_error(data):
    try:
        parse_subscription_params(data)
    except SubscriptionRequestError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["ClientEndpoint", "Meid", "RANFunctionID", "SubscriptionDetails", "E2SubscriptionDirectives"]),
       json_values)
def test_fuzz_field_replacement(key, value):
    body = copy.deepcopy(GOOD)
    body[key] = value
    try:
        parse_subscription_params(body)
    except SubscriptionRequestError:
        pass
