"""Property tests: for every KPM message kind and both versions, decode(encode(m)) == m, and the
encoding is also accepted by the generic JSON codec (json -> bytes -> json)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import e2sm
from e2sm import kpm
from e2sm.common import GnbDuUeId, GnbUeId, NrCgi

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VERSIONS = [kpm.KpmVersion.V2_03, kpm.KpmVersion.V3_00]

PRINTABLE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?"


def printable(lo, hi):
    return st.text(alphabet=PRINTABLE, min_size=lo, max_size=hi)


u32 = st.integers(0, (1 << 32) - 1)
small_tuple = lambda s, lo=1, hi=3: st.lists(s, min_size=lo, max_size=hi).map(tuple)  # noqa: E731
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
plmn = st.text(alphabet="0123456789", min_size=5, max_size=6)

snssai = st.builds(kpm.Snssai, st.integers(0, 255), st.none() | st.integers(0, (1 << 24) - 1))

# Further MeasurementLabel components, in ASN.1 component order (as decode returns them).
OTHER_LABELS = [
    ("plmnID", st.binary(min_size=3, max_size=3)),
    ("fiveQI", st.integers(0, 255)),
    ("qFI", st.integers(0, 63)),
    ("qCI", st.integers(0, 255)),
    ("sUM", st.just("true")),
    ("avg", st.just("true")),
    ("ssbIndex", st.integers(1, 65535)),               # the extension additions after "..."
    ("mIMO-mode-Index", st.integers(1, 2)),
]


@st.composite
def label_others(draw):
    out = []
    for name, strat in OTHER_LABELS:
        if draw(st.booleans()):
            out.append((name, draw(strat)))
    return tuple(out)


meas_label = st.just(kpm.MeasLabel()) | st.builds(kpm.MeasLabel, st.none() | snssai, label_others())
meas_name = printable(1, 40) | st.integers(1, 65536)
meas_info = st.builds(kpm.MeasInfo, meas_name, small_tuple(meas_label))

ue_id = st.builds(GnbDuUeId, u32, st.none() | st.binary(min_size=8, max_size=8)) | st.builds(
    GnbUeId, st.integers(0, (1 << 40) - 1), plmn, st.integers(0, 255), st.integers(0, 1023), st.integers(0, 63)
)
cgi = st.builds(NrCgi, plmn, st.integers(0, (1 << 36) - 1))

TEST_TYPES = ["gBR", "aMBR", "isStat", "isCatM", "rSRP", "rSRQ", "ul-rSRP", "cQI", "fiveQI", "qCI", "sNSSAI"]
test_value = st.one_of(
    st.tuples(st.just("valueInt"), st.integers(-(1 << 40), 1 << 40)),
    st.tuples(st.just("valueEnum"), st.integers(0, 100)),
    st.tuples(st.just("valueBool"), st.booleans()),
    st.tuples(st.just("valueOctS"), st.binary(max_size=8)),
    st.tuples(st.just("valuePrtS"), printable(0, 10)),
    st.tuples(st.just("valueReal"), finite),
)
test_cond = st.builds(
    kpm.TestCond,
    st.sampled_from(TEST_TYPES),
    st.none() | st.sampled_from(["equal", "greaterthan", "lessthan", "contains", "present"]),
    st.none() | test_value,
)
match_cond = meas_label | test_cond | st.builds(kpm.OrNext, meas_label | test_cond)

bin_value = st.integers(-(1 << 40), 1 << 40) | finite
bin_range = st.builds(kpm.BinRange, st.integers(1, 65535), bin_value, bin_value)
bin_range_def = st.builds(kpm.BinRangeDef, small_tuple(bin_range), st.none() | small_tuple(bin_range),
                          st.none() | small_tuple(bin_range))
dist_bins = st.none() | small_tuple(st.builds(kpm.DistMeasBinRange, meas_name, bin_range_def))

fmt1 = st.builds(kpm.ActionDefFormat1, small_tuple(meas_info), st.integers(1, (1 << 32) - 1), st.none() | cgi,
                 dist_bins)
action_format = st.one_of(
    fmt1,
    st.builds(kpm.ActionDefFormat2, ue_id, fmt1),
    st.builds(
        kpm.ActionDefFormat3,
        small_tuple(st.builds(kpm.MeasCond, meas_name, small_tuple(match_cond), st.none() | bin_range_def)),
        st.integers(1, 10_000),
        st.none() | cgi,
    ),
    st.builds(kpm.ActionDefFormat4, small_tuple(test_cond | st.builds(kpm.OrNext, test_cond)), fmt1),
    st.builds(kpm.ActionDefFormat5, small_tuple(ue_id, 2, 3), fmt1),
)
action_definition = st.builds(kpm.KpmActionDefinition, st.integers(1, 5), action_format)

meas_value = st.none() | u32 | finite


@st.composite
def records_and_incomplete(draw):
    records = draw(small_tuple(small_tuple(meas_value, 1, 5), 1, 4))
    incomplete = tuple(i for i in range(len(records)) if draw(st.booleans()))
    return records, incomplete


@st.composite
def msg_format1(draw):
    records, incomplete = draw(records_and_incomplete())
    info = draw(st.none() | small_tuple(meas_info))
    return kpm.IndicationMessageFormat1(records, info, draw(st.none() | st.integers(1, 10_000)), incomplete)


@st.composite
def msg_format2(draw):
    records, incomplete = draw(records_and_incomplete())
    cond_ue = draw(
        small_tuple(st.builds(kpm.MeasCondUe, meas_name, small_tuple(match_cond), st.none() | small_tuple(ue_id),
                              st.none() | small_tuple(small_tuple(ue_id, 0, 2))))
    )
    return kpm.IndicationMessageFormat2(records, cond_ue, draw(st.none() | st.integers(1, 10_000)), incomplete)


msg_format3 = st.builds(kpm.IndicationMessageFormat3, small_tuple(st.builds(kpm.UeMeasReport, ue_id, msg_format1())))
indication_message = st.one_of(msg_format1(), msg_format2(), msg_format3)


@st.composite
def indication_header(draw, version):
    if version is kpm.KpmVersion.V2_03:
        ts = draw(u32)
    else:
        ntp_2025 = 3_944_678_400
        ts = draw(
            st.one_of(
                u32,  # Unix seconds in the low octets, or zero
                st.integers(ntp_2025, (1 << 32) - 1).flatmap(lambda s: u32.map(lambda f: (s << 32) | f)),  # NTP
                st.integers(1_700_000_000_000_000, 1_900_000_000_000_000),  # Unix microseconds (FlexRIC)
            )
        )
    return kpm.KpmIndicationHeader(
        ts,
        draw(st.none() | printable(0, 15)),
        draw(st.none() | printable(0, 60)),
        draw(st.none() | printable(0, 8)),
        draw(st.none() | printable(0, 32)),
    )


report_style = st.builds(
    kpm.KpmReportStyle,
    st.integers(1, 5),
    printable(1, 30),
    st.integers(1, 5),
    small_tuple(st.builds(kpm.ReportableMeas, printable(1, 30), st.none() | st.integers(1, 65536),
                          st.none() | bin_range_def), 1, 4),
    st.integers(1, 2),
    st.integers(1, 3),
)
ran_function_description = st.builds(
    kpm.KpmRanFunctionDescription,
    oid=st.sampled_from([kpm.KPM_OID_V2, kpm.KPM_OID_V3]),
    short_name=printable(1, 20),
    description=printable(1, 20),
    instance=st.none() | st.integers(0, 1000),
    event_trigger_styles=small_tuple(st.builds(kpm.KpmEventTriggerStyle, st.integers(1, 3), printable(1, 20)), 0, 2),
    report_styles=small_tuple(report_style, 0, 3),
)


def check_json_form(kind: str, data: bytes) -> None:
    value = e2sm.decode_json(kind, data)
    assert e2sm.encode_json(kind, value) == data


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.module)
@SETTINGS
@given(m=st.builds(kpm.KpmEventTrigger, st.integers(1, (1 << 32) - 1)))
def test_event_trigger(version, m):
    data = kpm.encode_event_trigger(m, version)
    assert kpm.decode_event_trigger(data, version) == m
    check_json_form(f"{version.module}:E2SM-KPM-EventTriggerDefinition", data)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.module)
@SETTINGS
@given(m=action_definition)
def test_action_definition(version, m):
    data = kpm.encode_action_definition(m, version)
    assert kpm.decode_action_definition(data, version) == m
    check_json_form(f"{version.module}:E2SM-KPM-ActionDefinition", data)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.module)
@SETTINGS
@given(data=st.data())
def test_indication_header(version, data):
    m = data.draw(indication_header(version))
    raw = kpm.encode_indication_header(m, version)
    assert kpm.decode_indication_header(raw, version) == m
    check_json_form(f"{version.module}:E2SM-KPM-IndicationHeader", raw)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.module)
@SETTINGS
@given(m=indication_message)
def test_indication_message(version, m):
    data = kpm.encode_indication_message(m, version)
    assert kpm.decode_indication_message(data, version) == m
    check_json_form(f"{version.module}:E2SM-KPM-IndicationMessage", data)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.module)
@SETTINGS
@given(m=ran_function_description)
def test_ran_function_description(version, m):
    data = kpm.encode_ran_function_description(m, version)
    assert kpm.decode_ran_function_description(data, version) == m
    check_json_form(f"{version.module}:E2SM-KPM-RANfunction-Description", data)


def test_typed_constructors_refuse_bad_values():
    for build in (
        lambda: kpm.KpmEventTrigger(0),
        lambda: kpm.Snssai(256),
        lambda: kpm.Snssai(1, 1 << 24),
        lambda: kpm.MeasInfo(""),
        lambda: kpm.MeasInfo("x" * 151),
        lambda: kpm.MeasInfo("bad\u00e9name"),
        lambda: kpm.MeasInfo("ok", labels=()),
        lambda: kpm.IndicationMessageFormat1(((1 << 32,),)),
        lambda: kpm.IndicationMessageFormat1(((-1,),)),
        lambda: kpm.IndicationMessageFormat1(((True,),)),
        lambda: kpm.IndicationMessageFormat1(()),
        lambda: kpm.IndicationMessageFormat1(((1,),), incomplete=(3,)),
        lambda: kpm.ActionDefFormat1((kpm.MeasInfo("a"),), 0),
        lambda: kpm.ActionDefFormat5((GnbDuUeId(1),), kpm.ActionDefFormat1((kpm.MeasInfo("a"),), 100)),
        lambda: kpm.KpmIndicationHeader(-1),
        lambda: kpm.KpmIndicationHeader(0, sender_type="x" * 9),
    ):
        with pytest.raises(ValueError):
            build()


def test_encoders_refuse_out_of_range_values():
    with pytest.raises(e2sm.E2EncodeError, match="TimeStamp"):
        kpm.encode_indication_header(kpm.KpmIndicationHeader(1 << 32), kpm.KpmVersion.V2_03)
    with pytest.raises(e2sm.E2EncodeError, match="not finite"):
        kpm.encode_indication_message(kpm.IndicationMessageFormat1(((float("nan"),),)), kpm.KpmVersion.V3_00)
    with pytest.raises(e2sm.E2EncodeError):
        # qCI is INTEGER (0..255) with no extension marker
        label = kpm.MeasLabel(other=(("qCI", 300),))
        kpm.encode_action_definition(
            kpm.KpmActionDefinition(1, kpm.ActionDefFormat1((kpm.MeasInfo("a", (label,)),), 100)),
            kpm.KpmVersion.V3_00,
        )
