"""E2AP typed codec: the shared vectors byte-exact (typed API and JSON form), hypothesis round trips for
every message kind, and refusals with clear errors."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2sm import e2ap
from e2sm.e2ap import (
    Cause,
    E2NodeComponentAck,
    E2NodeComponentConfig,
    E2SetupFailure,
    E2SetupRequest,
    E2SetupResponse,
    ErrorIndication,
    GlobalE2NodeId,
    RanFunctionItem,
    RicAction,
    RicControlAcknowledge,
    RicControlFailure,
    RicControlRequest,
    RicIndication,
    RicRequestId,
    RicSubscriptionDeleteFailure,
    RicSubscriptionDeleteRequest,
    RicSubscriptionDeleteResponse,
    RicSubscriptionFailure,
    RicSubscriptionRequest,
    RicSubscriptionResponse,
    SubsequentAction,
    decode_e2ap,
    decode_e2ap_reference,
    encode_e2ap,
)
from e2sm.errors import E2DecodeError, E2EncodeError


def _vectors(vectors_dir):
    return {p.stem: json.loads(p.read_text()) for p in sorted(vectors_dir.glob("e2ap_*.json"))}


@pytest.fixture(scope="module")
def vectors(vectors_dir):
    v = _vectors(vectors_dir)
    assert len(v) >= 3, "expected the three E2AP vectors"
    return v


def test_every_vector_decodes_to_its_json_and_reencodes_byte_exact(vectors):
    for name, v in vectors.items():
        raw = bytes.fromhex(v["hex"])
        assert v["kind"] == "e2ap:E2AP-PDU"
        assert e2ap.decode_json(raw) == v["decoded"], name
        assert e2ap.encode_json(v["decoded"]) == raw, name


def test_every_vector_round_trips_through_the_typed_api(vectors):
    for name, v in vectors.items():
        raw = bytes.fromhex(v["hex"])
        msg = decode_e2ap(raw)
        assert msg == decode_e2ap_reference(raw), name
        assert encode_e2ap(msg) == raw, name


def test_vectors_decode_to_the_values_their_descriptions_state(vectors, vectors_dir):
    ind = decode_e2ap(bytes.fromhex(vectors["e2ap_ric_indication"]["hex"]))
    assert isinstance(ind, RicIndication)
    assert (ind.request_id, ind.ran_function_id, ind.action_id, ind.sn, ind.indication_type) == (
        RicRequestId(1, 2), 2, 1, 1, "report")
    embedded = {p.stem: bytes.fromhex(json.loads(p.read_text())["hex"]) for p in vectors_dir.glob("kpm_*.json")}
    assert ind.header == embedded["kpm_v3_ind_header_f1"]
    assert ind.message == embedded["kpm_v3_ind_message_f1"]

    ctl = decode_e2ap(bytes.fromhex(vectors["e2ap_ric_control_request"]["hex"]))
    assert ctl == RicControlRequest(RicRequestId(1, 3), 3, ctl.header, ctl.message, ack_request=True)

    sub = decode_e2ap(bytes.fromhex(vectors["e2ap_ric_subscription_request"]["hex"]))
    assert isinstance(sub, RicSubscriptionRequest)
    assert sub.request_id == RicRequestId(123, 1) and sub.ran_function_id == 2
    assert sub.event_trigger == embedded["kpm_v3_event_trigger_f1"]
    assert sub.actions == (RicAction(1, "report", embedded["kpm_v3_action_def_f1"]),)


# ---- hypothesis: every message kind round-trips through bytes and through the JSON form -----------------
u16 = st.integers(0, 65535)
fid = st.integers(0, 4095)
blob = st.binary(max_size=64)
request_ids = st.builds(RicRequestId, u16, u16)
causes = st.sampled_from(sorted(e2ap.CAUSE_GROUPS)).flatmap(
    lambda g: st.sampled_from(e2ap.CAUSE_GROUPS[g]).map(lambda v: Cause(g, v)))
printable = st.text(alphabet=sorted(e2ap._PRINTABLE), min_size=1, max_size=40)
actions = st.builds(RicAction, st.integers(0, 255), st.sampled_from(e2ap.ACTION_TYPES), st.none() | blob,
                    st.none() | st.builds(SubsequentAction, st.sampled_from(e2ap.SUBSEQUENT_TYPES),
                                          st.sampled_from(e2ap.TIMES_TO_WAIT)))
components = st.one_of(
    st.builds(E2NodeComponentConfig, st.sampled_from(["e1", "f1", "w1"]), st.integers(0, (1 << 36) - 1), blob, blob),
    st.builds(E2NodeComponentConfig, st.sampled_from(["ng", "s1"]), printable, blob, blob))
component_acks = st.one_of(
    st.builds(E2NodeComponentAck, st.sampled_from(["e1", "f1", "w1"]), st.integers(0, (1 << 36) - 1),
              st.booleans(), st.none() | causes),
    st.builds(E2NodeComponentAck, st.sampled_from(["ng", "s1"]), printable, st.booleans(), st.none() | causes))
plmns = st.from_regex(r"\A[0-9]{5,6}\Z")
node_ids = st.integers(22, 32).flatmap(lambda bits: st.builds(
    GlobalE2NodeId, plmns, st.integers(0, (1 << bits) - 1), st.just(bits),
    st.none() | st.integers(0, (1 << 36) - 1), st.none() | st.integers(0, (1 << 36) - 1)))
ran_functions = st.builds(RanFunctionItem, fid, blob, fid, printable)

MESSAGES = {
    "RicSubscriptionRequest": st.builds(RicSubscriptionRequest, request_ids, fid, blob,
                                        st.lists(actions, min_size=1, max_size=16).map(tuple)),
    "RicSubscriptionResponse": st.builds(RicSubscriptionResponse, request_ids, fid,
                                         st.lists(st.integers(0, 255), min_size=1, max_size=16).map(tuple),
                                         st.lists(st.tuples(st.integers(0, 255), causes), max_size=16).map(tuple)),
    "RicSubscriptionFailure": st.builds(RicSubscriptionFailure, request_ids, fid, causes),
    "RicSubscriptionDeleteRequest": st.builds(RicSubscriptionDeleteRequest, request_ids, fid),
    "RicSubscriptionDeleteResponse": st.builds(RicSubscriptionDeleteResponse, request_ids, fid),
    "RicSubscriptionDeleteFailure": st.builds(RicSubscriptionDeleteFailure, request_ids, fid, causes),
    "RicIndication": st.builds(RicIndication, request_ids, fid, st.integers(0, 255), blob, st.binary(max_size=400),
                               st.none() | u16, st.sampled_from(["report", "insert"]), st.none() | blob),
    "RicControlRequest": st.builds(RicControlRequest, request_ids, fid, blob, blob,
                                   st.sampled_from([None, True, False]), st.none() | blob),
    "RicControlAcknowledge": st.builds(RicControlAcknowledge, request_ids, fid, st.none() | blob, st.none() | blob),
    "RicControlFailure": st.builds(RicControlFailure, request_ids, fid, causes, st.none() | blob, st.none() | blob),
    "E2SetupRequest": st.builds(E2SetupRequest, st.integers(0, 255), node_ids,
                                st.lists(ran_functions, min_size=1, max_size=4).map(tuple),
                                st.lists(components, min_size=1, max_size=4).map(tuple)),
    "E2SetupResponse": st.builds(E2SetupResponse, st.integers(0, 255), plmns, st.integers(0, (1 << 20) - 1),
                                 st.lists(st.tuples(fid, fid), max_size=4).map(tuple),
                                 st.lists(st.tuples(fid, causes), max_size=4).map(tuple),
                                 st.lists(component_acks, min_size=1, max_size=4).map(tuple)),
    "E2SetupFailure": st.builds(E2SetupFailure, st.integers(0, 255), causes,
                                st.none() | st.sampled_from(e2ap.SETUP_TIMES_TO_WAIT)),
    "ErrorIndication": st.builds(ErrorIndication, st.none() | st.integers(0, 255), st.none() | request_ids,
                                 st.none() | fid, st.none() | causes),
}
any_message = st.one_of(*MESSAGES.values())


def test_strategies_cover_every_typed_message():
    assert {cls.__name__ for cls in e2ap._PROCEDURES} == set(MESSAGES)


@pytest.mark.parametrize("kind", sorted(MESSAGES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip(kind, data):
    msg = data.draw(MESSAGES[kind])
    raw = encode_e2ap(msg)
    assert decode_e2ap(raw) == msg
    assert decode_e2ap_reference(raw) == msg
    assert e2ap.encode_json(e2ap.decode_json(raw)) == raw


def test_large_fields_after_a_fragmented_one_decode():
    # >= 16 kB fields are fragmented (X.691 11.9.3.8); pycrate 0.8.1 misaligned what follows them.
    msg = RicIndication(RicRequestId(1, 2), 2, 1, b"h" * 300, bytes(range(256)) * 80, sn=7,
                        call_process_id=b"\x01" * 17000)
    assert decode_e2ap(encode_e2ap(msg)) == msg


# ---- refusals -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build, where", [
    (lambda: RicRequestId(65536, 0), "ricRequestorID"),
    (lambda: RicIndication(RicRequestId(1, 2), 4096, 1, b"", b""), "RANfunctionID"),
    (lambda: RicIndication(RicRequestId(1, 2), 1, 256, b"", b""), "RICactionID"),
    (lambda: RicIndication(RicRequestId(1, 2), 1, 1, b"", b"", sn=-1), "RICindicationSN"),
    (lambda: RicIndication(RicRequestId(1, 2), 1, 1, "text", b""), "RICindicationHeader"),
    (lambda: RicSubscriptionRequest(RicRequestId(1, 2), 1, b"", ()), "ricAction-ToBeSetup-List"),
    (lambda: RicSubscriptionResponse(RicRequestId(1, 2), 1, ()), "RICaction-Admitted-List"),
    (lambda: Cause("ricRequest", "no-such-cause"), "Cause.ricRequest"),
    (lambda: GlobalE2NodeId("00101", 1 << 22, 22), "gnb-ID"),
    (lambda: GlobalE2NodeId("0010", 1), "plmn"),
    (lambda: RanFunctionItem(1, b"", 1, "bad\u00e9oid"), "ranFunctionOID"),
    (lambda: E2NodeComponentConfig("xn", 1), "e2nodeComponentInterfaceType"),
    (lambda: E2SetupResponse(1, "00101", 1 << 20), "ric-ID"),
])
def test_out_of_range_values_are_refused_with_the_field_named(build, where):
    with pytest.raises(E2EncodeError) as err:
        build()
    assert err.value.where.endswith(where)


def test_encoding_something_else_is_refused():
    with pytest.raises(E2EncodeError, match="not an E2AP message"):
        encode_e2ap(RicRequestId(1, 2))


def test_json_encode_names_the_bad_path(vectors):
    bad = json.loads(json.dumps(vectors["e2ap_ric_indication"]["decoded"]))
    bad["initiatingMessage"]["value"]["RICindication"]["protocolIEs"][2]["value"] = {"RICactionID": "one"}
    with pytest.raises(E2EncodeError, match=r"protocolIEs\[2\]"):
        e2ap.encode_json(bad)
    bad["initiatingMessage"]["value"]["RICindication"]["protocolIEs"][2]["value"] = {"NoSuchType": 1}
    with pytest.raises(E2EncodeError, match="NoSuchType"):
        e2ap.encode_json(bad)
    with pytest.raises(E2EncodeError):
        e2ap.encode_json({"initiatingMessage": {"procedureCode": 5}})


@pytest.mark.parametrize("data, match", [
    (b"", "empty"),
    (b"\x00", "does not decode"),
    (bytes(e2ap.MAX_PDU_BYTES + 1), "limit"),
    ("00", "must be bytes"),
])
def test_bad_input_is_an_e2_decode_error(data, match):
    with pytest.raises(E2DecodeError, match=match):
        decode_e2ap(data)


def test_trailing_bytes_are_refused(vectors):
    raw = bytes.fromhex(vectors["e2ap_ric_subscription_request"]["hex"])
    with pytest.raises(E2DecodeError, match="trailing"):
        decode_e2ap(raw + b"\x00")
    with pytest.raises(E2DecodeError, match="trailing"):
        e2ap.decode_json(raw + b"\x00\x00")


def _pdu_with_ies(alt: str, code: int, crit: str, name: str, ies: list) -> bytes:
    return e2ap._aper_encode((alt, {"procedureCode": code, "criticality": crit,
                                    "value": (name, {"protocolIEs": ies})}))


def test_missing_mandatory_ie_and_repeated_ie_are_named():
    rid = {"id": 29, "criticality": "reject", "value": ("RICrequestID", {"ricRequestorID": 1, "ricInstanceID": 2})}
    fid_ie = {"id": 5, "criticality": "reject", "value": ("RANfunctionID", 2)}
    with pytest.raises(E2DecodeError, match="mandatory IE missing: 5"):
        decode_e2ap(_pdu_with_ies("initiatingMessage", 9, "reject", "RICsubscriptionDeleteRequest", [rid]))
    with pytest.raises(E2DecodeError, match="appears twice"):
        decode_e2ap(_pdu_with_ies("initiatingMessage", 9, "reject", "RICsubscriptionDeleteRequest",
                                  [rid, fid_ie, fid_ie]))


def test_unsupported_procedure_is_named():
    raw = e2ap._aper_encode(("initiatingMessage", {"procedureCode": 3, "criticality": "reject", "value": (
        "ResetRequest", {"protocolIEs": [{"id": 49, "criticality": "reject", "value": ("TransactionID", 1)}]})}))
    with pytest.raises(E2DecodeError, match="unsupported E2AP message: Reset"):
        decode_e2ap(raw)
    # the JSON form covers every E2AP-PDU, not only the typed ones
    assert e2ap.encode_json(e2ap.decode_json(raw)) == raw


def test_plmn_tbcd():
    assert e2ap.plmn_to_bytes("00101") == bytes.fromhex("00f110")
    assert e2ap.plmn_from_bytes(bytes.fromhex("00f110")) == "00101"
    assert e2ap.plmn_from_bytes(e2ap.plmn_to_bytes("310410")) == "310410"
    with pytest.raises(E2DecodeError):
        e2ap.plmn_from_bytes(bytes.fromhex("0af110"))


def test_stray_octets_inside_an_ie_are_refused_not_read_as_the_next_ie():
    raw = bytearray(encode_e2ap(RicSubscriptionDeleteRequest(RicRequestId(1, 2), 2)))
    i = raw.index(bytes.fromhex("000500020002"))          # RANfunctionID IE: id 5, reject, length 2, value 2
    mutated = raw[:i] + bytes.fromhex("00050003000200") + raw[i + 6:]
    mutated[3] += 1                                          # the outer open type grows by the stray octet
    with pytest.raises(E2DecodeError, match="left unread"):
        decode_e2ap(bytes(mutated))
    with pytest.raises(E2DecodeError, match="left unread"):
        e2ap.decode_json(bytes(mutated))


@pytest.mark.parametrize("path, value", [
    (("procedureCode",), 3),                                            # RICindication body under Reset
    (("procedureCode",), 8),
    (("value", "RICindication", "protocolIEs", 1, "id"), 15),           # RANfunctionID value under id 15
    (("value", "RICindication", "protocolIEs", 0, "value", "RICrequestID", "ricRequestorID"), 65536),
])
def test_json_encode_refuses_inconsistent_pdus(vectors, path, value):
    bad = json.loads(json.dumps(vectors["e2ap_ric_indication"]["decoded"]))
    node = bad["initiatingMessage"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(E2EncodeError):
        e2ap.encode_json(bad)


def test_json_encode_accepts_upper_case_hex(vectors):
    value = json.loads(json.dumps(vectors["e2ap_ric_subscription_request"]["decoded"]).replace("0063", "0063".upper()))
    details = value["initiatingMessage"]["value"]["RICsubscriptionRequest"]["protocolIEs"][2]["value"]
    details["RICsubscriptionDetails"]["ricEventTriggerDefinition"] = "0A03E7"
    assert e2ap.decode_e2ap(e2ap.encode_json(value)).event_trigger == bytes.fromhex("0a03e7")
