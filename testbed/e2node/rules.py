"""How each emulated DU reads a slice-level PRB quota control (RC style 2 action 6): `quotas(...)`.

One reader per ID table, each following the public source of the DU it stands for (the sources and the
rules are in `testbed.e2node.control`'s docstring). A reader returns the slice quotas the message sets,
or the E2AP Cause the DU would answer with; it never touches the RAN.
"""
from __future__ import annotations

import logging

from e2sm import e2ap, rc
from e2sm.common import GnbDuUeId
from e2sm.errors import E2DecodeError

from .config import NodeConfig

log = logging.getLogger("weaver.e2node.control")

MISC_UNSPECIFIED = e2ap.Cause("misc", "unspecified")  # srsRAN's return_ctrl_failure
INVALID = e2ap.Cause("ricRequest", "control-message-invalid")


def _refuse(node: NodeConfig, cause: e2ap.Cause, why: str) -> e2ap.Cause:
    log.info("%s: control refused (%s rule): %s", node.inventory_name, node.rc_table, why)
    return cause


def quotas(node: NodeConfig, hdr: rc.RcControlHeader, msg: rc.RcControlMessage,
           ids: rc.PrbQuotaIds) -> list[rc.SliceQuota] | e2ap.Cause:
    reader = {"srsran": _srsran, "oai-gnb": _oai_gnb}.get(node.rc_table, _weaver)
    try:
        return reader(node, hdr, msg, ids)
    except (E2DecodeError, ValueError, TypeError) as exc:  # a value of the wrong kind for its ID
        return _refuse(node, INVALID, f"{exc}")


def _weaver(node, hdr, msg, ids) -> list[rc.SliceQuota] | e2ap.Cause:
    known = {getattr(ids, f) for f in rc.PRB_QUOTA_NAMES}
    unknown = sorted({p.param_id for p in msg.params} - known)
    if unknown:
        return _refuse(node, INVALID, f"parameter IDs {unknown} are not in the {node.rc_table} table")
    found = rc.parse_prb_quota_control(msg, ids)
    return found or _refuse(node, INVALID, "no RRM policy in the message")


# -- srsRAN ------------------------------------------------------------------------------------------

def _octets(p, what: str) -> bytes:
    if not isinstance(p, rc.RanParamElement) or not isinstance(p.value, bytes):
        raise E2DecodeError(f"{what} (ID {p.param_id}) is not an element with octets")
    return p.value


def _int(p, what: str) -> int:
    if not isinstance(p, rc.RanParamElement) or isinstance(p.value, bool) or not isinstance(p.value, int):
        raise E2DecodeError(f"{what} (ID {p.param_id}) is not an element with an integer")
    return p.value


def _srsran(node, hdr, msg, ids) -> list[rc.SliceQuota] | e2ap.Cause:
    table = {getattr(ids, f) for f in rc.PRB_QUOTA_NAMES}
    unknown = sorted({p.param_id for p in msg.params} - table)
    if unknown:  # ric_control_action_supported: only the top level is checked against the table
        return _refuse(node, INVALID, f"parameter IDs {unknown} are not in the srsRAN table")
    if not isinstance(hdr.ue_id, GnbDuUeId) or node.ues.get(hdr.ue_id.f1ap_id) is None:
        return _refuse(node, MISC_UNSPECIFIED, f"no UE {hdr.ue_id} (gNB-DU-UEID of an existing UE needed)")
    policies: list[dict] = []

    def visit(p) -> None:  # parse_ran_parameter_value: the parameter, then what it holds
        pid = p.param_id
        if pid == ids.ratio_group:
            policies.append({"members": []})
        elif pid == ids.member:
            _last(policies, pid)["members"].append({})
        elif pid == ids.plmn:
            raw = _octets(p, "PLMN Identity")
            if len(raw) == 3:  # srsRAN skips a PLMN of another size
                _member(policies, pid)["plmn"] = rc.plmn_from_bcd(raw)
        elif pid == ids.sst:
            _member(policies, pid)["sst"] = int.from_bytes(_octets(p, "SST"), "big")
        elif pid == ids.sd:
            _member(policies, pid)["sd"] = int.from_bytes(_octets(p, "SD"), "big")
        elif pid in (ids.min_ratio, ids.max_ratio, ids.ded_ratio):
            _last(policies, pid)[pid] = _int(p, "PRB policy ratio")
        if isinstance(p, rc.RanParamStructure):
            for c in p.children:
                visit(c)
        elif isinstance(p, rc.RanParamList):
            for item in p.items:
                for c in item:
                    visit(c)

    for p in msg.params:
        visit(p)
    if not policies:
        return _refuse(node, MISC_UNSPECIFIED, "no RRM Policy Ratio Group")
    out = []
    for pol in policies:
        if not pol["members"] or not all(k in pol for k in (ids.min_ratio, ids.max_ratio, ids.ded_ratio)):
            return _refuse(node, MISC_UNSPECIFIED, "an RRM policy without a member or without min, max and dedicated")
        for m in pol["members"]:
            if "sst" not in m:
                return _refuse(node, MISC_UNSPECIFIED, "an RRM policy member without an S-NSSAI")
            out.append(rc.SliceQuota(plmn=m.get("plmn", node.plmn), sst=m["sst"], sd=m.get("sd"),
                                     min_ratio=pol[ids.min_ratio], max_ratio=pol[ids.max_ratio],
                                     dedicated_ratio=pol[ids.ded_ratio]))
    return out


def _last(policies: list[dict], pid: int) -> dict:
    if not policies:  # srsRAN would index an empty vector here
        raise E2DecodeError(f"parameter {pid} before any RRM Policy Ratio Group")
    return policies[-1]


def _member(policies: list[dict], pid: int) -> dict:
    members = _last(policies, pid)["members"]
    if not members:
        raise E2DecodeError(f"parameter {pid} before any RRM Policy Member")
    return members[-1]


# -- OAI ---------------------------------------------------------------------------------------------

def _ascii(p, pid: int, what: str) -> str:
    if not isinstance(p, rc.RanParamElement) or p.param_id != pid or p.key or not isinstance(p.value, bytes):
        raise E2DecodeError(f"expected {what} (ID {pid}) as an ElementFalse with octets")
    text = p.value.decode("ascii", "replace")
    if not text.isdigit():
        raise E2DecodeError(f"{what} {text!r} is not ASCII digits")
    return text


def _oai_int(p, pid: int, what: str) -> int:
    if not isinstance(p, rc.RanParamElement) or p.param_id != pid or p.key:
        raise E2DecodeError(f"expected {what} (ID {pid}) as an ElementFalse")
    return _int(p, what)


def _struct(p, pid: int, n: int, what: str) -> tuple:
    if not isinstance(p, rc.RanParamStructure) or p.param_id != pid or len(p.children) != n:
        raise E2DecodeError(f"expected {what} (ID {pid}) as a STRUCTURE of {n}")
    return p.children


def _oai_gnb(node, hdr, msg, ids) -> list[rc.SliceQuota] | e2ap.Cause:
    top = msg.find(ids.ratio_list)
    if len(msg.params) != 1 or not isinstance(top, rc.RanParamList):
        return _refuse(node, INVALID, "expected only an RRM Policy Ratio List")
    out = []
    for group in top.items:
        if len(group) != 4:
            raise E2DecodeError(f"an RRM Policy Ratio List item has {len(group)} parameters, OAI expects 4")
        (member_list,) = _struct(group[0], ids.policy, 1, "RRM Policy")
        if not isinstance(member_list, rc.RanParamList) or member_list.param_id != ids.member_list \
                or len(member_list.items) != 1 or len(member_list.items[0]) != 2:
            raise E2DecodeError(f"expected one RRM Policy Member List (ID {ids.member_list}) item of 2 parameters")
        plmn_p, snssai_p = member_list.items[0]
        plmn = _ascii(plmn_p, ids.plmn, "PLMN Identity")
        sst_p, sd_p = _struct(snssai_p, ids.snssai, 2, "S-NSSAI")
        sst, sd = int(_ascii(sst_p, ids.sst, "SST")), int(_ascii(sd_p, ids.sd, "SD"))
        minimum = _oai_int(group[1], ids.min_ratio, "Min PRB Policy Ratio")
        # OAI never reads group[2] (its Max PRB Policy Ratio parsing is commented out), so nothing about it
        # can refuse the control; the emulated MAC still applies a max that fits (min <= max <= 100)
        p2 = group[2]
        maximum = p2.value if isinstance(p2, rc.RanParamElement) and type(p2.value) is int \
            and minimum <= p2.value <= 100 else 100
        dedicated = _oai_int(group[3], ids.ded_ratio, "Dedicated PRB Policy Ratio")
        # OAI reads the PLMN with sscanf("%3d%2d") or "%3d%3d": the digits as sent
        out.append(rc.SliceQuota(plmn=plmn, sst=sst, sd=sd, min_ratio=minimum, max_ratio=maximum,
                                 dedicated_ratio=dedicated))
    return out or _refuse(node, INVALID, "no RRM policy in the message")
