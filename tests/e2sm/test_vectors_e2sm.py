"""The shared reference vectors: every E2SM vector decodes to its `decoded` value and re-encodes to
identical bytes, through the generic JSON codec and through the typed API; the E2SM payloads that
the E2AP vectors embed are exactly E2SM vectors and decode too."""
from __future__ import annotations

import json

import pytest

import e2sm
from e2sm import kpm, rc

E2SM_PREFIXES = ("kpm-v2.03:", "kpm-v3.00:", "rc-v1.03:")


def load(vectors_dir, prefix=None):
    out = []
    for path in sorted(vectors_dir.glob("*.json")):
        v = json.loads(path.read_text())
        if prefix is None or v["kind"].startswith(prefix):
            out.append(v)
    return out


def e2sm_vectors(vectors_dir):
    return [v for v in load(vectors_dir) if v["kind"].startswith(E2SM_PREFIXES)]


def test_there_are_e2sm_vectors(vectors_dir):
    kinds = {v["kind"] for v in e2sm_vectors(vectors_dir)}
    assert "kpm-v3.00:E2SM-KPM-IndicationMessage" in kinds
    assert "rc-v1.03:E2SM-RC-ControlMessage" in kinds
    assert len(e2sm_vectors(vectors_dir)) >= 7


def test_json_form_decode_and_encode(vectors_dir):
    for v in e2sm_vectors(vectors_dir):
        data = bytes.fromhex(v["hex"])
        assert e2sm.decode_json(v["kind"], data) == v["decoded"], v["name"]
        assert e2sm.encode_json(v["kind"], v["decoded"]).hex() == v["hex"], v["name"]


def test_json_key_order_follows_asn1_component_order(vectors_dir):
    # The README says key order follows the ASN.1 component order; ours must too, so that text diffs
    # of decoded captures against the vectors are meaningful.
    for v in e2sm_vectors(vectors_dir):
        got = json.dumps(e2sm.decode_json(v["kind"], bytes.fromhex(v["hex"])))
        assert got == json.dumps(v["decoded"]), v["name"]


TYPED = {
    "E2SM-KPM-EventTriggerDefinition": (kpm.decode_event_trigger, kpm.encode_event_trigger),
    "E2SM-KPM-ActionDefinition": (kpm.decode_action_definition, kpm.encode_action_definition),
    "E2SM-KPM-IndicationHeader": (kpm.decode_indication_header, kpm.encode_indication_header),
    "E2SM-KPM-IndicationMessage": (kpm.decode_indication_message, kpm.encode_indication_message),
    "E2SM-KPM-RANfunction-Description": (kpm.decode_ran_function_description, kpm.encode_ran_function_description),
}
RC_TYPED = {
    "E2SM-RC-ControlHeader": (rc.decode_control_header, rc.encode_control_header),
    "E2SM-RC-ControlMessage": (rc.decode_control_message, rc.encode_control_message),
    "E2SM-RC-ControlOutcome": (rc.decode_control_outcome, rc.encode_control_outcome),
    "E2SM-RC-RANFunctionDefinition": (rc.decode_ran_function_definition, rc.encode_ran_function_definition),
}


def test_typed_api_round_trips_every_vector_byte_exactly(vectors_dir):
    for v in e2sm_vectors(vectors_dir):
        module, type_name = v["kind"].split(":")
        data = bytes.fromhex(v["hex"])
        if module.startswith("kpm"):
            version = KPM_VERSION[module]
            decode, encode = TYPED[type_name]
            assert encode(decode(data, version), version) == data, v["name"]
        else:
            decode, encode = RC_TYPED[type_name]
            assert encode(decode(data)) == data, v["name"]


KPM_VERSION = {"kpm-v2.03": kpm.KpmVersion.V2_03, "kpm-v3.00": kpm.KpmVersion.V3_00}


def test_typed_values_of_the_kpm_vectors(vectors_dir):
    by_name = {v["name"]: v for v in load(vectors_dir)}
    v3 = kpm.KpmVersion.V3_00
    hdr = kpm.decode_indication_header(bytes.fromhex(by_name["kpm_v3_ind_header_f1"]["hex"]), v3)
    assert hdr == kpm.KpmIndicationHeader(0xEB1F040000000000, None, "gnb-sim-1", "gNB-DU", "example")
    msg = kpm.decode_indication_message(bytes.fromhex(by_name["kpm_v3_ind_message_f1"]["hex"]), v3)
    assert msg.records == ((42, 17, 40, 15360.5), (53, 21, 50, 18944.25))
    assert msg.granul_period_ms == 100
    assert msg.columns()["DRB.UEThpDl"] == (15360.5, 18944.25)
    names = ("RRU.PrbUsedDl", "RRU.PrbUsedUl", "RRU.PrbTotDl", "DRB.UEThpDl")
    action = kpm.KpmActionDefinition(1, kpm.ActionDefFormat1(tuple(kpm.MeasInfo(n) for n in names), 100))
    assert kpm.encode_action_definition(action, v3).hex() == by_name["kpm_v3_action_def_f1"]["hex"]
    assert kpm.encode_event_trigger(kpm.KpmEventTrigger(100), v3).hex() == by_name["kpm_v3_event_trigger_f1"]["hex"]


def test_typed_values_of_the_rc_vectors(vectors_dir):
    by_name = {v["name"]: v for v in load(vectors_dir)}
    assert rc.encode_control_header(rc.RcControlHeader(2, 6)).hex() == by_name["rc_control_header_f1"]["hex"]


@pytest.mark.parametrize(("table", "vector"), [("srsran", "rc_control_message_f1_prbquota_srsran"), ("oai", "rc_control_message_f1_prbquota_oai")])
def test_prb_quota_vectors_reproduced_by_the_builder(vectors_dir, table, vector):
    ids = {"srsran": rc.SRSRAN_IDS, "oai": rc.OAI_IDS}[table]
    want = {v["name"]: v for v in load(vectors_dir)}[vector]["hex"]
    quota = rc.SliceQuota(plmn="00101", sst=1, sd=1, min_ratio=10, max_ratio=60, dedicated_ratio=5)
    msg = rc.build_prb_quota_control([quota], ids)
    assert rc.encode_control_message(msg).hex() == want
    assert rc.parse_prb_quota_control(rc.decode_control_message(bytes.fromhex(want)), ids) == [quota]


def _strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for x in node.values():
            yield from _strings(x)
    elif isinstance(node, list):
        for x in node:
            yield from _strings(x)


def test_e2ap_vectors_embed_e2sm_vectors_that_decode(vectors_dir):
    payloads = {v["hex"]: v for v in e2sm_vectors(vectors_dir)}
    e2ap_vectors = load(vectors_dir, "e2ap:")
    assert e2ap_vectors
    for v in e2ap_vectors:
        embedded = [payloads[s] for s in _strings(v["decoded"]) if s in payloads]
        assert embedded, f"{v['name']} embeds no E2SM vector"
        for inner in embedded:
            assert e2sm.decode_json(inner["kind"], bytes.fromhex(inner["hex"])) == inner["decoded"]


def test_kinds_cover_every_top_level_type():
    kinds = set(e2sm.kinds())
    for module in ("kpm-v2.03", "kpm-v3.00"):
        for t in TYPED:
            assert f"{module}:{t}" in kinds
    for t in RC_TYPED:
        assert f"rc-v1.03:{t}" in kinds
    assert "e2ap:E2AP-PDU" in kinds
