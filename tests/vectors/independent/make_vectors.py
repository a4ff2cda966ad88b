"""Build the E2SM vectors in this folder with pycrate, a codec that shares no code with Weaver's.

Run from the repository root with the xApp venv (pycrate is installed there):

    .venv-xapp/bin/python tests/vectors/independent/make_vectors.py          # rewrite the .json files
    .venv-xapp/bin/python tests/vectors/independent/make_vectors.py --check  # exit 1 if any differs

`--check` also runs the E2SM vectors of tests/vectors/ (made outside this project) through pycrate.

How a vector is made: pycrate's own ASN.1 compiler (pycrate_asn1c) compiles the published module text in
schemas/asn1/ (see PROVENANCE.md there) to Python; the value below, written in the JSON form of
tests/vectors/README.md, is turned into a pycrate value by walking pycrate's compiled type; pycrate's
runtime (pycrate_asn1rt) encodes it as aligned PER; pycrate decodes those bytes again and the value must
come back unchanged; the JSON written to `decoded` is that decoded value converted back by the same
walk. Nothing here imports e2sm: the bytes and the decoded values are pycrate's alone.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
ASN1 = ROOT / "schemas" / "asn1"
COMMON = "e2sm-common-v2.asn"
MODULES = {  # vector `kind` module -> (module file, pycrate module class)
    "kpm-v3.00": ("e2sm-kpm-v03.00.asn", "E2SM_KPM_IEs"),
    "kpm-v2.03": ("e2sm-kpm-v02.03.asn", "E2SM_KPM_IEs"),
    "rc-v1.03": ("e2sm-rc-v01.03.asn", "E2SM_RC_IEs"),
}
SPEC = {"kpm-v3.00": "E2SM-KPM v03.00", "kpm-v2.03": "E2SM-KPM v02.03", "rc-v1.03": "E2SM-RC v01.03"}


# ---------------------------------------------------------------------------------------------
# Compile with pycrate_asn1c


def compile_module(module: str) -> Any:
    from pycrate_asn1c import asnproc

    asnproc.GLOBAL.clear()
    texts = [(ASN1 / COMMON).read_text(), (ASN1 / MODULES[module][0]).read_text()]
    asnproc.compile_text(texts)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"pycrate_{module.replace('-', '_').replace('.', '_')}.py"
        asnproc.generate_modules(asnproc.PycrateGenerator, str(out))
        spec = importlib.util.spec_from_file_location(out.stem, out)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return getattr(mod, MODULES[module][1])


# ---------------------------------------------------------------------------------------------
# JSON form <-> pycrate values, by walking pycrate's compiled types


def _real_to_pycrate(x: float) -> tuple[int, int, int]:
    num, den = float(x).as_integer_ratio()
    if num == 0 or den & (den - 1):
        raise ValueError(f"REAL {x} must be non-zero and binary-exact")
    exp = -(den.bit_length() - 1)
    while num % 2 == 0:
        num //= 2
        exp += 1
    return num, 2, exp


def from_json(t: Any, node: Any) -> Any:
    kind = t.TYPE
    if kind in ("SEQUENCE", "SET"):
        unknown = set(node) - set(t._cont)
        if unknown:
            raise KeyError(f"{t._name}: no components {sorted(unknown)}")
        return {k: from_json(t._cont[k], v) for k, v in node.items()}
    if kind in ("SEQUENCE OF", "SET OF"):
        return [from_json(t._cont, v) for v in node]
    if kind == "CHOICE":
        ((name, v),) = node.items()
        return (name, from_json(t._cont[name], v))
    if kind == "BIT STRING":
        data, length = bytes.fromhex(node["bitstring"]), node["length"]
        return (int.from_bytes(data, "big") >> (8 * len(data) - length), length)
    if kind == "OCTET STRING":
        return bytes.fromhex(node)
    if kind == "NULL":
        return 0
    if kind == "REAL":
        return _real_to_pycrate(node)
    return node   # INTEGER, BOOLEAN, ENUMERATED, character strings


def to_json(t: Any, val: Any) -> Any:
    kind = t.TYPE
    if kind in ("SEQUENCE", "SET"):
        return {k: to_json(t._cont[k], val[k]) for k in t._cont if k in val}   # module component order
    if kind in ("SEQUENCE OF", "SET OF"):
        return [to_json(t._cont, v) for v in val]
    if kind == "CHOICE":
        name, v = val
        return {name: to_json(t._cont[name], v)}
    if kind == "BIT STRING":
        uint, length = val
        n = (length + 7) // 8
        return {"bitstring": (uint << (8 * n - length)).to_bytes(n, "big").hex(), "length": length}
    if kind == "OCTET STRING":
        return val.hex()
    if kind == "NULL":
        return None
    if kind == "REAL":
        mantissa, base, exp = val
        return float(mantissa * base**exp)
    return val


# ---------------------------------------------------------------------------------------------
# The values (JSON form of tests/vectors/README.md)

PLMN = "00f110"                                     # MCC 001, MNC 01
NR_CGI = {"nR-CGI": {"pLMNIdentity": PLMN, "nRCellIdentity": {"bitstring": "0000012340", "length": 36}}}
GUAMI = {"pLMNIdentity": PLMN, "aMFRegionID": {"bitstring": "80", "length": 8},
         "aMFSetID": {"bitstring": "ffc0", "length": 10}, "aMFPointer": {"bitstring": "04", "length": 6}}
UE_GNB = {"gNB-UEID": {"amf-UE-NGAP-ID": 1099511627775, "guami": GUAMI}}          # the 40-bit maximum
UE_GNB_SMALL = {"gNB-UEID": {"amf-UE-NGAP-ID": 7, "guami": GUAMI}}
UE_DU = {"gNB-DU-UEID": {"gNB-CU-UE-F1AP-ID": 17}}
UE_DU_RAN = {"gNB-DU-UEID": {"gNB-CU-UE-F1AP-ID": 4294967295, "ran-UEID": "0102030405060708"}}
NO_LABEL = {"measLabel": {"noLabel": "true"}}
SLICE1 = {"sST": "01", "sD": "000001"}


def meas_info(name_or_id: Any, *labels: dict) -> dict:
    measure = {"measID": name_or_id} if isinstance(name_or_id, int) else {"measName": name_or_id}
    return {"measType": measure, "labelInfoList": list(labels) or [NO_LABEL]}


F1_SIMPLE = {"measInfoList": [meas_info("DRB.UEThpDl")], "granulPeriod": 100}
BINS = {"binRangeListX": [
    {"binIndex": 1, "startValue": {"valueInt": 0}, "endValue": {"valueInt": 10}},
    {"binIndex": 2, "startValue": {"valueReal": 10.5}, "endValue": {"valueReal": 20.25}},
]}
BINS_XY = {"binRangeListX": BINS["binRangeListX"],
           "binRangeListY": [{"binIndex": 1, "startValue": {"valueInt": -5}, "endValue": {"valueInt": 5}}]}


def action(style: int, fmt: int, body: dict) -> dict:
    return {"ric-Style-Type": style, "actionDefinition-formats": {f"actionDefinition-Format{fmt}": body}}


def message(fmt: int, body: dict) -> dict:
    return {"indicationMessage-formats": {f"indicationMessage-Format{fmt}": body}}


def header(ts_hex: str) -> dict:
    return {"indicationHeader-formats": {"indicationHeader-Format1": {
        "colletStartTime": ts_hex, "fileFormatversion": "v3.00", "senderName": "gnb-sim-7", "senderType": "gNB",
        "vendorName": "pycrate"}}}


def rp(param_id: int, value_type: dict) -> dict:
    return {"ranParameter-ID": param_id, "ranParameter-valueType": value_type}


def elem(value: dict) -> dict:
    return {"ranP-Choice-ElementFalse": {"ranParameter-value": value}}


def struct(*params: dict) -> dict:
    return {"ranP-Choice-Structure": {"ranParameter-Structure": {"sequence-of-ranParameters": list(params)}}}


def rlist(*items: list) -> dict:
    return {"ranP-Choice-List": {"ranParameter-List": {
        "list-of-ranParameter": [{"sequence-of-ranParameters": i} for i in items]}}}


def prb_quota_group(sst: str, sd: str | None, lo: int, hi: int, ded: int) -> list:
    """Slice-level PRB quota (control style 2, action 6), srsRAN / OSC parameter IDs (spec numbering)."""
    snssai = [rp(9, elem({"valueOctS": sst}))] + ([rp(10, elem({"valueOctS": sd}))] if sd else [])
    member = rp(6, struct(rp(7, elem({"valueOctS": PLMN})), rp(8, struct(*snssai))))
    policy = rp(3, struct(rp(5, rlist([member]))))
    return [rp(2, struct(policy, rp(11, elem({"valueInt": lo})), rp(12, elem({"valueInt": hi})),
                         rp(13, elem({"valueInt": ded}))))]


VECTORS: list[dict] = [
    # --- KPM v03.00: event trigger, action definitions 1-5
    dict(name="kpm3_event_trigger_f1", module="kpm-v3.00", type="E2SM-KPM-EventTriggerDefinition",
         description="Event trigger format 1: reportingPeriod 1000 ms.",
         value={"eventDefinition-formats": {"eventDefinition-Format1": {"reportingPeriod": 1000}}}),
    dict(name="kpm3_action_def_f1", module="kpm-v3.00", type="E2SM-KPM-ActionDefinition",
         description="Action definition style 1 / format 1: RRU.PrbUsedDl with noLabel and a per-slice label (SST 1, "
                     "SD 000001), measID 3 with fiveQI 9 and the extension-addition label ssbIndex 4; granulPeriod "
                     "1000 ms; NR CGI 001/01, cell 0x000001234.",
         value=action(1, 1, {"measInfoList": [
             meas_info("RRU.PrbUsedDl", NO_LABEL, {"measLabel": {"sliceID": SLICE1}}),
             meas_info(3, {"measLabel": {"fiveQI": 9, "ssbIndex": 4}})],
             "granulPeriod": 1000, "cellGlobalID": NR_CGI})),
    dict(name="kpm3_action_def_f1_bins", module="kpm-v3.00", type="E2SM-KPM-ActionDefinition",
         description="Action definition format 1 with the extension addition distMeasBinRangeInfo: bins of "
                     "RRU.PrbUsedDl.Dist on X (1: 0..10 integers, 2: 10.5..20.25 reals) and Y (1: -5..5).",
         value=action(1, 1, {"measInfoList": [meas_info("RRU.PrbUsedDl.Dist")], "granulPeriod": 100,
                             "distMeasBinRangeInfo": [{"measType": {"measName": "RRU.PrbUsedDl.Dist"},
                                                       "binRangeDef": BINS_XY}]})),
    dict(name="kpm3_action_def_f2", module="kpm-v3.00", type="E2SM-KPM-ActionDefinition",
         description="Action definition style 2 / format 2: one UE (gNB-DU-UEID, F1AP ID 17), DRB.UEThpDl every 100 ms.",
         value=action(2, 2, {"ueID": UE_DU, "subscriptInfo": F1_SIMPLE})),
    dict(name="kpm3_action_def_f3", module="kpm-v3.00", type="E2SM-KPM-ActionDefinition",
         description="Action definition style 3 / format 3: DRB.UEThpDl for UEs of slice SST 1 SD 000001 with the "
                     "min and avg labels, AND (fiveQI = 9 OR qCI < 5) - the first test condition carries logicalOR; "
                     "measID 7 with noLabel and bins on X; granulPeriod 500 ms; NR CGI.",
         value=action(3, 3, {"measCondList": [
             {"measType": {"measName": "DRB.UEThpDl"}, "matchingCond": [
                 {"matchingCondChoice": {"measLabel": {"sliceID": SLICE1, "min": "true", "avg": "true"}}},
                 {"matchingCondChoice": {"testCondInfo": {"testType": {"fiveQI": "true"}, "testExpr": "equal",
                                                          "testValue": {"valueInt": 9}}}, "logicalOR": "true"},
                 {"matchingCondChoice": {"testCondInfo": {"testType": {"qCI": "true"}, "testExpr": "lessthan",
                                                          "testValue": {"valueInt": 5}}}}]},
             {"measType": {"measID": 7}, "matchingCond": [{"matchingCondChoice": NO_LABEL}], "binRangeDef": BINS}],
             "granulPeriod": 500, "cellGlobalID": NR_CGI})),
    dict(name="kpm3_action_def_f4", module="kpm-v3.00", type="E2SM-KPM-ActionDefinition",
         description="Action definition style 4 / format 4: every UE with S-NSSAI = 01000001 OR RSRP > -110 "
                     "(logicalOR on the first condition), DRB.UEThpDl every 100 ms.",
         value=action(4, 4, {"matchingUeCondList": [
             {"testCondInfo": {"testType": {"sNSSAI": "true"}, "testExpr": "equal",
                               "testValue": {"valueOctS": "01000001"}}, "logicalOR": "true"},
             {"testCondInfo": {"testType": {"rSRP": "true"}, "testExpr": "greaterthan",
                               "testValue": {"valueInt": -110}}}],
             "subscriptionInfo": F1_SIMPLE})),
    dict(name="kpm3_action_def_f5", module="kpm-v3.00", type="E2SM-KPM-ActionDefinition",
         description="Action definition style 5 / format 5: two UEs - gNB-UEID (AMF UE NGAP ID 2^40-1, GUAMI 001/01 "
                     "region 0x80 set 0x3ff pointer 1) and gNB-DU-UEID (F1AP ID 2^32-1, RAN UE ID 0102030405060708).",
         value=action(5, 5, {"matchingUEidList": [{"ueID": UE_GNB}, {"ueID": UE_DU_RAN}],
                             "subscriptionInfo": F1_SIMPLE})),
    # --- KPM v03.00: indication header and messages 1-3
    dict(name="kpm3_ind_header_f1", module="kpm-v3.00", type="E2SM-KPM-IndicationHeader",
         description="Indication header format 1: 8-octet colletStartTime (NTP seconds 0xeb1f0400, fraction 0x80000000) "
                     "and all four strings.",
         value=header("eb1f040080000000")),
    dict(name="kpm3_ind_message_f1", module="kpm-v3.00", type="E2SM-KPM-IndicationMessage",
         description="Indication message format 1: 2 records of 4 values (integers incl. 0 and 2^32-1, REALs 15360.5 "
                     "and -0.25, a noValue); the second record has incompleteFlag; measInfoList with noLabel, a slice "
                     "label and a measID; granulPeriod 1000 ms.",
         value=message(1, {
             "measData": [
                 {"measRecord": [{"integer": 0}, {"integer": 4294967295}, {"real": 15360.5}, {"noValue": None}]},
                 {"measRecord": [{"integer": 7}, {"integer": 8}, {"real": -0.25}, {"integer": 9}],
                  "incompleteFlag": "true"}],
             "measInfoList": [meas_info("RRU.PrbUsedDl"), meas_info("RRU.PrbUsedDl", {"measLabel": {"sliceID": SLICE1}}),
                              meas_info("DRB.UEThpDl"), meas_info(5)],
             "granulPeriod": 1000})),
    dict(name="kpm3_ind_message_f2", module="kpm-v3.00", type="E2SM-KPM-IndicationMessage",
         description="Indication message format 2: one record (5, 6); DRB.UEThpDl for slice SST 1 SD 000001 with the "
                     "avg label, matched UE list gNB-UEID (AMF UE NGAP ID 7), per granularity period noUEmatched then "
                     "one gNB-DU-UEID (F1AP 17); measID 2 under test condition gBR present; granulPeriod 1000 ms.",
         value=message(2, {
             "measData": [{"measRecord": [{"integer": 5}, {"integer": 6}]}],
             "measCondUEidList": [
                 {"measType": {"measName": "DRB.UEThpDl"},
                  "matchingCond": [{"matchingCondChoice": {"measLabel": {"sliceID": SLICE1, "avg": "true"}}}],
                  "matchingUEidList": [{"ueID": UE_GNB_SMALL}],
                  "matchingUEidPerGP": [{"matchedPerGP": {"noUEmatched": "true"}},
                                        {"matchedPerGP": {"oneOrMoreUEmatched": [{"ueID": UE_DU}]}}]},
                 {"measType": {"measID": 2},
                  "matchingCond": [{"matchingCondChoice": {"testCondInfo": {"testType": {"gBR": "true"},
                                                                            "testExpr": "present"}}}]}],
             "granulPeriod": 1000})),
    dict(name="kpm3_ind_message_f3", module="kpm-v3.00", type="E2SM-KPM-IndicationMessage",
         description="Indication message format 3: UE gNB-DU-UEID (F1AP 17) reports DRB.UEThpDl = 10 over 100 ms; UE "
                     "gNB-UEID (AMF UE NGAP ID 7) reports the REAL 1.5 without measInfoList.",
         value=message(3, {"ueMeasReportList": [
             {"ueID": UE_DU, "measReport": {"measData": [{"measRecord": [{"integer": 10}]}],
                                            "measInfoList": [meas_info("DRB.UEThpDl")], "granulPeriod": 100}},
             {"ueID": UE_GNB_SMALL, "measReport": {"measData": [{"measRecord": [{"real": 1.5}]}]}}]})),
    dict(name="kpm3_ran_function_description", module="kpm-v3.00", type="E2SM-KPM-RANfunction-Description",
         description="RAN function description: KPM v3 OID, instance 1, periodic event trigger style, report style 1 "
                     "(RRU.PrbUsedDl with measID 1, RRU.PrbTotDl, RRU.PrbUsedDl.Dist with bins) and style 3 (action "
                     "format 3, message format 2).",
         value={"ranFunction-Name": {"ranFunction-ShortName": "ORAN-E2SM-KPM",
                                     "ranFunction-E2SM-OID": "1.3.6.1.4.1.53148.1.3.2.2",
                                     "ranFunction-Description": "KPM Monitor", "ranFunction-Instance": 1},
                "ric-EventTriggerStyle-List": [{"ric-EventTriggerStyle-Type": 1,
                                                "ric-EventTriggerStyle-Name": "Periodic Report",
                                                "ric-EventTriggerFormat-Type": 1}],
                "ric-ReportStyle-List": [
                    {"ric-ReportStyle-Type": 1, "ric-ReportStyle-Name": "E2 Node Measurement", "ric-ActionFormat-Type": 1,
                     "measInfo-Action-List": [{"measName": "RRU.PrbUsedDl", "measID": 1}, {"measName": "RRU.PrbTotDl"},
                                              {"measName": "RRU.PrbUsedDl.Dist", "binRangeDef": BINS}],
                     "ric-IndicationHeaderFormat-Type": 1, "ric-IndicationMessageFormat-Type": 1},
                    {"ric-ReportStyle-Type": 3, "ric-ReportStyle-Name": "Condition-based, UE-level Measurement",
                     "ric-ActionFormat-Type": 3, "measInfo-Action-List": [{"measName": "DRB.UEThpDl"}],
                     "ric-IndicationHeaderFormat-Type": 1, "ric-IndicationMessageFormat-Type": 2}]}),
    # --- KPM v02.03: the header (4-octet TimeStamp) and conditions under the v2 module
    dict(name="kpm2_ind_header_f1", module="kpm-v2.03", type="E2SM-KPM-IndicationHeader",
         description="KPM v02.03 indication header format 1: 4-octet colletStartTime 0x6553f100 and all four strings.",
         value=header("6553f100")),
    dict(name="kpm2_action_def_f3", module="kpm-v2.03", type="E2SM-KPM-ActionDefinition",
         description="KPM v02.03 action definition format 3: DRB.UEThpDl for slice SST 1 SD 000001 OR (logicalOR) "
                     "cQI > 10; granulPeriod 100 ms.",
         value=action(3, 3, {"measCondList": [
             {"measType": {"measName": "DRB.UEThpDl"}, "matchingCond": [
                 {"matchingCondChoice": {"measLabel": {"sliceID": SLICE1}}, "logicalOR": "true"},
                 {"matchingCondChoice": {"testCondInfo": {"testType": {"cQI": "true"}, "testExpr": "greaterthan",
                                                          "testValue": {"valueInt": 10}}}}]}],
             "granulPeriod": 100})),
    dict(name="kpm2_ind_message_f2", module="kpm-v2.03", type="E2SM-KPM-IndicationMessage",
         description="KPM v02.03 indication message format 2: one record (3); noLabel condition; matched UE list "
                     "gNB-DU-UEID (F1AP 17) and gNB-UEID (AMF UE NGAP ID 2^40-1).",
         value=message(2, {"measData": [{"measRecord": [{"integer": 3}]}],
                           "measCondUEidList": [{"measType": {"measName": "DRB.UEThpDl"},
                                                 "matchingCond": [{"matchingCondChoice": NO_LABEL}],
                                                 "matchingUEidList": [{"ueID": UE_DU}, {"ueID": UE_GNB}]}]})),
    # --- RC v01.03: what Weaver sends and reads
    dict(name="rc_control_header_f1", module="rc-v1.03", type="E2SM-RC-ControlHeader",
         description="RC control header format 1: gNB-DU-UEID F1AP ID 0, style 2 (radio resource allocation), action 6 "
                     "(slice-level PRB quota), no decision.",
         value={"ric-controlHeader-formats": {"controlHeader-Format1": {
             "ueID": {"gNB-DU-UEID": {"gNB-CU-UE-F1AP-ID": 0}}, "ric-Style-Type": 2, "ric-ControlAction-ID": 6}}}),
    dict(name="rc_control_header_f1_gnb_ueid_accept", module="rc-v1.03", type="E2SM-RC-ControlHeader",
         description="RC control header format 1: gNB-UEID (AMF UE NGAP ID 7), style 2, action 6, decision accept.",
         value={"ric-controlHeader-formats": {"controlHeader-Format1": {
             "ueID": UE_GNB_SMALL, "ric-Style-Type": 2, "ric-ControlAction-ID": 6, "ric-ControlDecision": "accept"}}}),
    dict(name="rc_control_message_f1_prbquota", module="rc-v1.03", type="E2SM-RC-ControlMessage",
         description="RC control message format 1: slice-level PRB quota, srsRAN/OSC parameter IDs, two policy groups: "
                     "PLMN 001/01 SST 1 SD 000001 min 5 / max 50 / dedicated 0, and SST 2 without SD min 20 / max 100 / "
                     "dedicated 10.",
         value={"ric-controlMessage-formats": {"controlMessage-Format1": {"ranP-List": [
             rp(1, rlist(prb_quota_group("01", "000001", 5, 50, 0), prb_quota_group("02", None, 20, 100, 10)))]}}}),
    dict(name="rc_control_outcome_f1", module="rc-v1.03", type="E2SM-RC-ControlOutcome",
         description="RC control outcome format 1: (1, valueInt 100), (11, valueInt 5), (12, valueInt 50).",
         value={"ric-controlOutcome-formats": {"controlOutcome-Format1": {"ranP-List": [
             {"ranParameter-ID": 1, "ranParameter-value": {"valueInt": 100}},
             {"ranParameter-ID": 11, "ranParameter-value": {"valueInt": 5}},
             {"ranParameter-ID": 12, "ranParameter-value": {"valueInt": 50}}]}}}),
    dict(name="rc_ran_function_definition", module="rc-v1.03", type="E2SM-RC-RANFunctionDefinition",
         description="RC RAN function definition: control style 2 'Radio Resource Allocation Control' with action 6 "
                     "'Slice-level PRB quota' and its parameters (RRM Policy Ratio List > Group > Policy > Member List "
                     "> Member > PLMN / S-NSSAI > SST / SD; min / max / dedicated ratio), outcome parameter 1.",
         value={"ranFunction-Name": {"ranFunction-ShortName": "ORAN-E2SM-RC",
                                     "ranFunction-E2SM-OID": "1.3.6.1.4.1.53148.1.1.2.3",
                                     "ranFunction-Description": "RAN Control"},
                "ranFunctionDefinition-Control": {"ric-ControlStyle-List": [{
                    "ric-ControlStyle-Type": 2, "ric-ControlStyle-Name": "Radio Resource Allocation Control",
                    "ric-ControlAction-List": [{
                        "ric-ControlAction-ID": 6, "ric-ControlAction-Name": "Slice-level PRB quota",
                        "ran-ControlActionParameters-List": [
                            {"ranParameter-ID": 1, "ranParameter-name": "RRM Policy Ratio List",
                             "ranParameter-Definition": {"ranParameter-Definition-Choice": {"choiceLIST": {
                                 "ranParameter-List": [{"ranParameter-ID": 2,
                                                        "ranParameter-name": "RRM Policy Ratio Group"}]}}}},
                            {"ranParameter-ID": 11, "ranParameter-name": "Min PRB Policy Ratio"},
                            {"ranParameter-ID": 12, "ranParameter-name": "Max PRB Policy Ratio"},
                            {"ranParameter-ID": 13, "ranParameter-name": "Dedicated PRB Policy Ratio"}]}],
                    "ric-ControlHeaderFormat-Type": 1, "ric-ControlMessageFormat-Type": 1,
                    "ric-ControlOutcomeFormat-Type": 1,
                    "ran-ControlOutcomeParameters-List": [{"ranParameter-ID": 1,
                                                           "ranParameter-name": "RRM Policy Ratio List"}]}]}}),
]


# ---------------------------------------------------------------------------------------------


def unroll(obj: Any, path: tuple = (), budget: int = 8) -> Any:
    """A copy of a pycrate type graph in which a type met again on its own path is a fresh copy.

    pycrate's compiled types keep the value being encoded on the type object itself, so a recursive
    type (RC's RANParameter-STRUCTURE inside a RANParameter-LIST inside a RANParameter-STRUCTURE) would
    overwrite the outer level's value with the inner one while encoding. Unrolling `budget` levels
    gives every nesting level its own object; the encoding rules are pycrate's, untouched.
    """
    from pycrate_asn1rt.asnobj import ASN1Obj
    from pycrate_asn1rt.dictobj import ASN1Dict

    if path.count(obj) > budget:
        return obj
    clone = copy.copy(obj)
    cont = getattr(obj, "_cont", None)
    if isinstance(cont, ASN1Dict):
        clone._cont = ASN1Dict([(k, unroll(c, path + (obj,), budget)) for k, c in cont.items()])
    elif isinstance(cont, ASN1Obj):
        clone._cont = unroll(cont, path + (obj,), budget)
    return clone


def build(v: dict, spec: Any, provenance: dict) -> dict:
    t = unroll(getattr(spec, v["type"].replace("-", "_")))
    t.set_val(from_json(t, v["value"]))
    data = t.to_aper()
    t.from_aper(data)
    decoded = to_json(t, t.get_val())
    if decoded != v["value"]:
        raise AssertionError(f"{v['name']}: pycrate does not decode its own bytes back to the value")
    return {
        "name": v["name"],
        "kind": f"{v['module']}:{v['type']}",
        "spec": f"{SPEC[v['module']]} / {v['type']}",
        "description": v["description"],
        "hex": data.hex(),
        "decoded": decoded,
        "provenance": provenance[v["module"]],
    }


def check_shared(specs: dict) -> list[str]:
    """The E2SM vectors of tests/vectors/ (made outside this project) against pycrate: the value in
    `decoded` must encode to `hex` and `hex` must decode to `decoded`. Returns the names that differ."""
    bad = []
    for path in sorted(HERE.parent.glob("*.json")):
        v = json.loads(path.read_text())
        module, type_name = v["kind"].split(":")
        if module not in specs:
            continue                                    # E2AP PDUs: not compiled here
        t = unroll(getattr(specs[module], type_name.replace("-", "_")))
        t.set_val(from_json(t, v["decoded"]))
        encoded = t.to_aper().hex()
        t.from_aper(bytes.fromhex(v["hex"]))
        if encoded != v["hex"] or to_json(t, t.get_val()) != v["decoded"]:
            bad.append(path.name)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = ap.parse_args()
    version = importlib.metadata.version("pycrate")
    provenance = {}
    for module, (fname, _) in MODULES.items():
        provenance[module] = {
            "encoder": f"pycrate {version} (pycrate_asn1c compiler, pycrate_asn1rt APER codec)",
            "modules": [f"schemas/asn1/{COMMON}", f"schemas/asn1/{fname}"],
            "module_sha256": [hashlib.sha256((ASN1 / f).read_bytes()).hexdigest() for f in (COMMON, fname)],
            "generator": "tests/vectors/independent/make_vectors.py",
        }
    specs = {m: compile_module(m) for m in MODULES}
    stale = []
    for v in VECTORS:
        out = json.dumps(build(v, specs[v["module"]], provenance), indent=2) + "\n"
        path = HERE / f"{v['name']}.json"
        if args.check:
            if not path.exists() or path.read_text() != out:
                stale.append(path.name)
        else:
            path.write_text(out)
    if stale:
        print("differ from what pycrate builds now:", ", ".join(stale), file=sys.stderr)
        return 1
    if args.check:
        shared = check_shared(specs)
        if shared:
            print("tests/vectors/ vectors pycrate encodes or decodes otherwise:", ", ".join(shared), file=sys.stderr)
            return 1
        print("pycrate also reproduces every E2SM vector of tests/vectors/ byte for byte")
    print(f"{len(VECTORS)} vectors {'match' if args.check else 'written'} (pycrate {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
