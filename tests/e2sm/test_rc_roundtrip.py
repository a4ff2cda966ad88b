"""Property tests for the RC codecs: decode(encode(m)) == m for control headers, messages (the whole
RAN-parameter tree), outcomes and RAN function definitions, plus the JSON form on the same bytes."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import e2sm
from e2sm import rc
from e2sm.common import GnbDuUeId, GnbUeId

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRINTABLE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?"

u32 = st.integers(0, (1 << 32) - 1)
param_id = st.integers(1, (1 << 32) - 1)
tuples = lambda s, lo=1, hi=3: st.lists(s, min_size=lo, max_size=hi).map(tuple)  # noqa: E731


@st.composite
def bit_value(draw):
    length = draw(st.integers(0, 40))
    data = bytearray(draw(st.binary(min_size=(length + 7) // 8, max_size=(length + 7) // 8)))
    if length % 8:  # unused trailing bits are zero on the wire
        data[-1] &= (0xFF << (8 - length % 8)) & 0xFF
    return rc.BitValue(bytes(data), length)


value = st.one_of(
    st.booleans(),
    st.integers(-(1 << 63), 1 << 63),
    st.floats(allow_nan=False, allow_infinity=False),
    bit_value(),
    st.binary(max_size=12),
    st.text(alphabet=PRINTABLE, max_size=12),
)
element = st.one_of(
    st.builds(rc.RanParamElement, param_id, value, st.just(True)),
    st.builds(rc.RanParamElement, param_id, st.none() | value, st.just(False)),
)
tree = st.recursive(
    element,
    lambda children: st.one_of(
        st.builds(rc.RanParamStructure, param_id, tuples(children, 0, 3)),
        st.builds(rc.RanParamList, param_id, tuples(tuples(children, 0, 3), 1, 2)),
    ),
    max_leaves=12,
)
ue_id = st.builds(GnbDuUeId, u32, st.none() | st.binary(min_size=8, max_size=8)) | st.builds(
    GnbUeId, st.integers(0, (1 << 40) - 1), st.sampled_from(["00101", "310410", "99999"]), st.integers(0, 255),
    st.integers(0, 1023), st.integers(0, 63),
)
header = st.builds(
    rc.RcControlHeader, st.integers(0, 1000), st.integers(1, 65535), ue_id, st.none() | st.sampled_from(["accept", "reject"])
)
message = st.builds(rc.RcControlMessage, tuples(tree, 0, 4))
outcome = st.builds(rc.RcControlOutcome, tuples(st.tuples(param_id, value), 0, 5))

name = st.text(alphabet=PRINTABLE, min_size=1, max_size=30)
param_def = st.recursive(
    st.builds(rc.RanParamDef, param_id, name),
    lambda children: st.builds(rc.RanParamDef, param_id, name, tuples(children, 1, 3), st.booleans()),
    max_leaves=8,
)
action = st.builds(rc.RcControlAction, st.integers(1, 65535), name, tuples(param_def, 0, 4))
style = st.builds(
    rc.RcControlStyle,
    st.integers(1, 1000),
    name,
    tuples(action, 0, 3),
    st.integers(1, 2),
    st.integers(1, 2),
    st.none() | st.integers(1, 2),
    st.integers(1, 2),
    tuples(param_def, 0, 2),
)
# One non-control section as a node would send it, carried through untyped.
report_section = st.just(
    (
        "ranFunctionDefinition-Report",
        {
            "ric-ReportStyle-List": [
                {
                    "ric-ReportStyle-Type": 4,
                    "ric-ReportStyle-Name": "UE Information",
                    "ric-SupportedEventTriggerStyle-Type": 4,
                    "ric-ReportActionFormat-Type": 1,
                    "ric-IndicationHeaderFormat-Type": 1,
                    "ric-IndicationMessageFormat-Type": 2,
                    "ran-ReportParameters-List": [{"ranParameter-ID": 12, "ranParameter-name": "RRC State"}],
                }
            ]
        },
    )
)
definition = st.builds(
    rc.RcRanFunctionDefinition,
    oid=st.just(rc.RC_OID),
    short_name=name,
    description=name,
    instance=st.none() | st.integers(0, 10),
    control_styles=tuples(style, 0, 3),
    other_sections=st.just(()) | report_section.map(lambda s: (s,)),
)


def check_json_form(type_name: str, data: bytes) -> None:
    kind = f"rc-v1.03:{type_name}"
    assert e2sm.encode_json(kind, e2sm.decode_json(kind, data)) == data


@SETTINGS
@given(h=header)
def test_control_header(h):
    data = rc.encode_control_header(h)
    assert rc.decode_control_header(data) == h
    check_json_form("E2SM-RC-ControlHeader", data)


@SETTINGS
@given(m=message)
def test_control_message(m):
    data = rc.encode_control_message(m)
    assert rc.decode_control_message(data) == m
    check_json_form("E2SM-RC-ControlMessage", data)


@SETTINGS
@given(o=outcome)
def test_control_outcome(o):
    data = rc.encode_control_outcome(o)
    assert rc.decode_control_outcome(data) == o
    check_json_form("E2SM-RC-ControlOutcome", data)


@SETTINGS
@given(d=definition)
def test_ran_function_definition(d):
    data = rc.encode_ran_function_definition(d)
    assert rc.decode_ran_function_definition(data) == d
    check_json_form("E2SM-RC-RANFunctionDefinition", data)


quota = st.builds(
    rc.SliceQuota,
    plmn=st.text(alphabet="0123456789", min_size=5, max_size=6),
    sst=st.integers(0, 255),
    sd=st.none() | st.integers(0, (1 << 24) - 1),
    min_ratio=st.integers(0, 50),
    max_ratio=st.integers(50, 100),
    dedicated_ratio=st.integers(0, 100),
)


@pytest.mark.parametrize("ids", [rc.SRSRAN_IDS, rc.OAI_IDS, rc.OAI_GNB_IDS], ids=["srsran", "oai", "oai-gnb"])
@SETTINGS
@given(quotas=tuples(quota, 1, 4))
def test_prb_quota_build_then_parse_on_the_wire(ids, quotas):
    data = rc.encode_control_message(rc.build_prb_quota_control(quotas, ids))
    assert rc.parse_prb_quota_control(rc.decode_control_message(data), ids) == list(quotas)


@SETTINGS
@given(envelope=st.none() | st.integers(0, 1000), budget=st.none() | st.integers(0, 100_000))
def test_envelope_control(envelope, budget):
    data = rc.encode_control_message(rc.build_envelope_control(envelope, budget))
    assert rc.parse_envelope_control(rc.decode_control_message(data)) == rc.EnvelopeControl(envelope, budget)
