"""What the srsRAN oran-sc-ric example xApps and FlexRIC's OAI example put on the wire, rebuilt from their
published ASN.1 with asn1tools the way they do it (tests/vectors/srsran/README.md), not with Weaver's codecs."""
from __future__ import annotations

from functools import cache
from pathlib import Path

import asn1tools

ROOT = Path(__file__).resolve().parents[2]
ASN1 = ROOT / "schemas" / "asn1"


@cache
def kpm():
    """oran-sc-ric `e2sm_kpm_packer`: e2sm-v5.00.asn + e2sm-kpm-v4.00.asn, aligned PER."""
    return asn1tools.compile_files([str(ASN1 / "e2sm-common-v5.00.asn"), str(ASN1 / "e2sm-kpm-v04.00.asn")], "per")


@cache
def rc():
    """oran-sc-ric `e2sm_rc_packer`: e2sm-v5.00.asn + e2sm-rc-v5.00.asn."""
    return asn1tools.compile_files([str(ASN1 / "e2sm-common-v5.00.asn"),
                                    str(ROOT / "tests" / "vectors" / "srsran" / "e2sm-rc-v5.00.asn")], "per")


def _meas_info(names):
    return [{"measType": ("measName", n), "labelInfoList": [{"measLabel": {"noLabel": "true"}}]} for n in names]


def _sub(names, granul):
    return {"measInfoList": _meas_info(names), "granulPeriod": granul}


def _ue(ue_id):
    return ("gNB-DU-UEID", {"gNB-CU-UE-F1AP-ID": ue_id})


# kpm_mon_xapp.py defaults: metrics DRB.UEThpUl,DRB.UEThpDl, report and granularity period 1000 ms, UE 0
METRICS = ["DRB.UEThpUl", "DRB.UEThpDl"]
RSRP_COND = {"testType": ("ul-rSRP", "true"), "testExpr": "lessthan", "testValue": ("valueInt", 1000)}


def event_trigger(period_ms: int = 1000) -> bytes:
    return kpm().encode("E2SM-KPM-EventTriggerDefinition",
                        {"eventDefinition-formats": ("eventDefinition-Format1", {"reportingPeriod": period_ms})})


def action_definition(style: int, ue_ids=(0,), metrics=METRICS, granul: int = 1000) -> bytes:
    """The action definition kpm_mon_xapp.py sends for `--kpm_report_style style`."""
    if style == 1:
        fmt = {"measInfoList": _meas_info(metrics), "granulPeriod": granul}
    elif style == 2:
        fmt = {"ueID": _ue(ue_ids[0]), "subscriptInfo": _sub(metrics, granul)}
    elif style == 3:  # one metric only, with the always-true ul-rSRP < 1000 condition
        fmt = {"measCondList": [{"measType": ("measName", metrics[0]),
                                 "matchingCond": [{"matchingCondChoice": ("testCondInfo", RSRP_COND)}]}],
               "granulPeriod": granul}
    elif style == 4:
        fmt = {"matchingUeCondList": [{"testCondInfo": RSRP_COND}], "subscriptionInfo": _sub(metrics, granul)}
    else:  # style 5 needs two UE IDs: the example adds ue_ids[0] + 1
        ids = list(ue_ids) if len(ue_ids) > 1 else [ue_ids[0], ue_ids[0] + 1]
        fmt = {"matchingUEidList": [{"ueID": _ue(u)} for u in ids], "subscriptionInfo": _sub(metrics, granul)}
    return kpm().encode("E2SM-KPM-ActionDefinition",
                        {"ric-Style-Type": style, "actionDefinition-formats": (f"actionDefinition-Format{style}", fmt)})


def _el(pid, value):
    return {"ranParameter-ID": pid, "ranParameter-valueType": ("ranP-Choice-ElementFalse", {"ranParameter-value": value})}


def _st(pid, children):
    return {"ranParameter-ID": pid, "ranParameter-valueType": (
        "ranP-Choice-Structure", {"ranParameter-Structure": {"sequence-of-ranParameters": children}})}


def _ls(pid, items):
    return {"ranParameter-ID": pid, "ranParameter-valueType": (
        "ranP-Choice-List", {"ranParameter-List": {"list-of-ranParameter": [
            {"sequence-of-ranParameters": i} for i in items]}})}


def srsran_quota(min_ratio: int, max_ratio: int, dedicated: int, ue_id: int = 0) -> tuple[bytes, bytes]:
    """e2sm_rc_module.send_control_request_style_2_action_6: PLMN 00101 (BCD), SST 1, SD 1, nested IDs 1-13."""
    hdr = rc().encode("E2SM-RC-ControlHeader", {"ric-controlHeader-formats": ("controlHeader-Format1", {
        "ueID": _ue(ue_id), "ric-Style-Type": 2, "ric-ControlAction-ID": 6})})
    member = _st(6, [_el(7, ("valueOctS", b"\x00\xf1\x10")),
                     _st(8, [_el(9, ("valueOctS", (1).to_bytes(1, "big"))), _el(10, ("valueOctS", (1).to_bytes(3, "big")))])])
    group = _st(2, [_st(3, [_ls(5, [[member]])]), _el(11, ("valueInt", min_ratio)),
                    _el(12, ("valueInt", max_ratio)), _el(13, ("valueInt", dedicated))])
    msg = rc().encode("E2SM-RC-ControlMessage", {"ric-controlMessage-formats": (
        "controlMessage-Format1", {"ranP-List": [_ls(1, [[group]])]})})
    return hdr, msg


def srsran_control_request(header: bytes, message: bytes, requestor: int = 1, ran_function: int = 3,
                           ack: int = 1) -> bytes:
    """e2sm_rc_module._build_ric_control_request: the E2AP RICcontrolRequest the example builds by hand
    (one-octet lengths; RIC instance 0; ack request `ack << 6`)."""
    total = 33 + len(header) + len(message)
    out = [0x00, 0x04, 0x00, total, 0x00, 0x00, 0x05, 0x00, 0x1d, 0x00, 0x05, 0x00, 0x00, requestor, 0x00, 0x00,
           0x00, 0x05, 0x00, 0x02, 0x00, ran_function,
           0x00, 0x16, 0x00, len(header) + 1, len(header), *header,
           0x00, 0x17, 0x00, len(message) + 1, len(message), *message,
           0x00, 0x15, 0x00, 0x01, ack << 6]
    return bytes(out)


# simple_rc_xapp.py: min 10 and max 30, 50, 70, 100, dedicated 100, UE 0, one control every 5 s
SRSRAN_CONTROLS = ((10, 30, 100), (10, 50, 100), (10, 70, 100), (10, 100, 100))


def flexric_slice_control(dedicated: tuple[int, int] = (70, 70)) -> tuple[bytes, bytes]:
    """FlexRIC xapp_rc_slice_ctrl.c for the OAI gNB: IDs 1-12, no Group/Member wrappers, PLMN "50501" and
    SST/SD as ASCII strings, two slices (SST 1 SD 1 min 70, SST 1 SD 5 min 30), max 51, dedicated 70 each
    as shipped (`dedicated` changes only those two values), header gNB-UEID AMF UE NGAP ID 0 with GUAMI PLMN
    001/01."""
    hdr = rc().encode("E2SM-RC-ControlHeader", {"ric-controlHeader-formats": ("controlHeader-Format1", {
        "ueID": ("gNB-UEID", {"amf-UE-NGAP-ID": 0, "guami": {
            "pLMNIdentity": b"\x00\xf1\x10", "aMFRegionID": (b"\x00", 8), "aMFSetID": (b"\x00\x00", 10),
            "aMFPointer": (b"\x00", 6)}}),
        "ric-Style-Type": 2, "ric-ControlAction-ID": 6})})
    groups = []
    for (sd, min_ratio), ded in zip(((b"1", 70), (b"5", 30)), dedicated, strict=True):
        member = [_el(6, ("valueOctS", b"50501")), _st(7, [_el(8, ("valueOctS", b"1")), _el(9, ("valueOctS", sd))])]
        groups.append([_st(3, [_ls(4, [member])]), _el(10, ("valueInt", min_ratio)), _el(11, ("valueInt", 51)),
                       _el(12, ("valueInt", ded))])
    msg = rc().encode("E2SM-RC-ControlMessage", {"ric-controlMessage-formats": (
        "controlMessage-Format1", {"ranP-List": [_ls(1, groups)]})})
    return hdr, msg
