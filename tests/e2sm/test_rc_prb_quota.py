"""Slice-level PRB quota: parameter IDs resolved by name from a node's RC RAN function definition
(as it arrives on the wire), the two known tables as explicit fallbacks, and the node-side parser."""
from __future__ import annotations

from dataclasses import replace

import pytest

import e2sm
from e2sm import rc

QUOTA = rc.SliceQuota(plmn="00101", sst=1, sd=1, min_ratio=10, max_ratio=60, dedicated_ratio=5)


def over_the_wire(definition: rc.RcRanFunctionDefinition) -> rc.RcRanFunctionDefinition:
    return rc.decode_ran_function_definition(rc.encode_ran_function_definition(definition))


@pytest.mark.parametrize("fallback", ["srsran", "oai"])
def test_srsran_definition_resolves_to_srsran_ids_whatever_the_fallback(fallback):
    d = over_the_wire(rc.node_ran_function_definition(rc.SRSRAN_IDS))
    assert rc.resolve_prb_quota_ids(d, fallback=fallback) == replace(
        rc.SRSRAN_IDS, layout=rc._FALLBACKS[fallback].layout, values=rc._FALLBACKS[fallback].values
    )
    assert rc.resolve_prb_quota_ids(d, fallback="srsran") == rc.SRSRAN_IDS


@pytest.mark.parametrize("fallback", ["srsran", "oai"])
def test_oai_definition_resolves_to_oai_ids_whatever_the_fallback(fallback):
    d = over_the_wire(rc.node_ran_function_definition(rc.OAI_IDS))
    ids = rc.resolve_prb_quota_ids(d, fallback=fallback)
    assert (ids.member_list, ids.member, ids.plmn, ids.ded_ratio) == (4, 5, 6, 12)
    assert rc.resolve_prb_quota_ids(d, fallback="oai") == rc.OAI_IDS


def test_resolution_is_by_name_not_by_position():
    # A vendor with its own numbering, names in odd case and spacing, listed in reverse order.
    custom = {f: 100 + i for i, f in enumerate(rc.PRB_QUOTA_NAMES)}
    params = tuple(
        rc.RanParamDef(custom[f], "  " + rc.PRB_QUOTA_NAMES[f].upper().replace(" ", "  ") + " ")
        for f in reversed(list(rc.PRB_QUOTA_NAMES))
    )
    style = rc.RcControlStyle(2, "Radio Resource Allocation Control", (rc.RcControlAction(6, "Slice-level PRB quota", params),))
    d = over_the_wire(rc.RcRanFunctionDefinition(control_styles=(style,)))
    ids = rc.resolve_prb_quota_ids(d)
    assert all(getattr(ids, f) == custom[f] for f in rc.PRB_QUOTA_NAMES)
    msg = rc.decode_control_message(rc.encode_control_message(rc.build_prb_quota_control([QUOTA], ids)))
    assert msg.params[0].param_id == custom["ratio_list"]
    assert rc.parse_prb_quota_control(msg, ids) == [QUOTA]


def test_nested_parameter_definitions_are_searched():
    s = rc.SRSRAN_IDS
    snssai = rc.RanParamDef(s.snssai, "S-NSSAI", (rc.RanParamDef(s.sst, "SST"), rc.RanParamDef(s.sd, "SD")))
    member = rc.RanParamDef(s.member, "RRM Policy Member", (rc.RanParamDef(s.plmn, "PLMN Identity"), snssai))
    member_list = rc.RanParamDef(s.member_list, "RRM Policy Member List", (member,), is_list=True)
    policy = rc.RanParamDef(s.policy, "RRM Policy", (member_list,))
    group = rc.RanParamDef(
        s.ratio_group,
        "RRM Policy Ratio Group",
        (policy, rc.RanParamDef(s.min_ratio, "Min PRB Policy Ratio"), rc.RanParamDef(s.max_ratio, "Max PRB Policy Ratio"),
         rc.RanParamDef(s.ded_ratio, "Dedicated PRB Policy Ratio")),
    )
    top = rc.RanParamDef(s.ratio_list, "RRM Policy Ratio List", (group,), is_list=True)
    style = rc.RcControlStyle(2, "Radio Resource Allocation Control", (rc.RcControlAction(6, "Slice-level PRB quota", (top,)),))
    d = over_the_wire(rc.RcRanFunctionDefinition(control_styles=(style,)))
    assert rc.resolve_prb_quota_ids(d, fallback="oai") == replace(rc.SRSRAN_IDS)


def test_fallback_when_the_node_does_not_advertise_the_action():
    assert rc.resolve_prb_quota_ids(None) == rc.SRSRAN_IDS
    assert rc.resolve_prb_quota_ids(None, fallback="oai") == rc.OAI_IDS
    weaver_only = over_the_wire(rc.RcRanFunctionDefinition(control_styles=(rc.weaver_control_style(),)))
    assert rc.resolve_prb_quota_ids(weaver_only, fallback="oai-gnb") == rc.OAI_GNB_IDS
    assert rc.resolve_prb_quota_ids(weaver_only, fallback=rc.OAI_IDS) is rc.OAI_IDS
    with pytest.raises(ValueError, match="fallback"):
        rc.resolve_prb_quota_ids(None, fallback="nokia")


def test_flat_oai_gnb_layout_needs_no_group_or_member_names():
    d = over_the_wire(rc.node_ran_function_definition(rc.OAI_GNB_IDS))
    names = {p.name for p in d.control_action(2, 6).params}
    assert "RRM Policy Ratio Group" not in names and "RRM Policy Member" not in names
    assert rc.resolve_prb_quota_ids(d, fallback="oai-gnb") == rc.OAI_GNB_IDS
    # ...but the nested layout does: refuse to guess.
    with pytest.raises(ValueError, match="RRM Policy Ratio Group"):
        rc.resolve_prb_quota_ids(d, fallback="srsran")


def test_oai_gnb_wire_form_uses_ascii_digits_and_no_wrappers():
    msg = rc.build_prb_quota_control([QUOTA], rc.OAI_GNB_IDS)
    value = e2sm.decode_json("rc-v1.03:E2SM-RC-ControlMessage", rc.encode_control_message(msg))
    text = str(value)
    assert "'valueOctS': '3030313031'" in text  # "00101"
    item = value["ric-controlMessage-formats"]["controlMessage-Format1"]["ranP-List"][0]
    first = item["ranParameter-valueType"]["ranP-Choice-List"]["ranParameter-List"]["list-of-ranParameter"][0]
    assert [p["ranParameter-ID"] for p in first["sequence-of-ranParameters"]] == [3, 10, 11, 12]


def test_parser_refuses_a_message_in_another_layout():
    msg = rc.build_prb_quota_control([QUOTA], rc.SRSRAN_IDS)
    with pytest.raises(e2sm.E2DecodeError):
        rc.parse_prb_quota_control(msg, rc.OAI_GNB_IDS)
    with pytest.raises(e2sm.E2DecodeError, match="RRM Policy Ratio List"):
        rc.parse_prb_quota_control(rc.build_envelope_control(10, 5), rc.SRSRAN_IDS)


def test_node_definition_advertises_the_weaver_action():
    d = over_the_wire(rc.node_ran_function_definition())
    action = d.control_action(rc.WEAVER_STYLE, rc.WEAVER_ENVELOPE_ACTION)
    assert action is not None
    assert action.params_by_name() == {"sm envelope": 1, "best-effort delay budget": 2}
    assert d.oid == e2sm.RC_OID
    assert rc.node_ran_function_definition(weaver=False).control_action(rc.WEAVER_STYLE, 1) is None


def test_slice_quota_validation():
    for bad in (
        dict(min_ratio=70, max_ratio=60),
        dict(max_ratio=101),
        dict(sst=256),
        dict(sd=1 << 24),
        dict(plmn="0010"),
        dict(plmn="00a01"),
    ):
        with pytest.raises(ValueError):
            rc.SliceQuota(**bad)
    with pytest.raises(e2sm.E2EncodeError):
        rc.build_prb_quota_control([], rc.SRSRAN_IDS)


def test_control_header_refuses_bad_values():
    with pytest.raises(ValueError):
        rc.RcControlHeader(2, 0)
    with pytest.raises(ValueError):
        rc.RcControlHeader(2, 6, decision="maybe")
    with pytest.raises(ValueError):
        rc.RanParamElement(1, None, key=True)
    with pytest.raises(ValueError):
        rc.RanParamList(1, ())
